"""The lock's keys read and written straight on the nodes, with plain redis-py clients
(the node must be running): what each node really holds, whatever the client says."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis

from redlock import (
    ClusterAmnesiaError,
    LockLost,
    LockNotAcquired,
    NodeResult,
    Outcome,
    QuorumUnavailable,
    RedlockError,
)
from redlock.testing import RedisNode, free_port
from tests.internals import KEYS, bucket


def on_nodes(nodes: Sequence[RedisNode], command: Callable[[redis.Redis], Any]) -> list[Any]:
    """``command`` run on each node with its own short-lived client."""
    results = []
    for node in nodes:
        with node.client() as client:
            results.append(command(client))
    return results


@contextlib.contextmanager
def paused(nodes: Sequence[RedisNode], indexes: Sequence[int]) -> Iterator[None]:
    """SIGSTOP the nodes at ``indexes`` for the block; SIGCONT whatever happens."""
    try:
        for i in indexes:
            nodes[i].pause()
        yield
    finally:
        for i in indexes:
            nodes[i].resume()


def get(node: RedisNode, key: str) -> bytes | None:
    with node.client() as client:
        value = client.get(key)
    assert value is None or isinstance(value, bytes)
    return value


def lock_values(nodes: Sequence[RedisNode], resource: str) -> list[bytes | None]:
    """Each node's lock key value (its owner), None where there is none."""
    return [get(node, KEYS.lock(resource)) for node in nodes]


def lock_keys(nodes: Sequence[RedisNode], resource: str) -> list[bool]:
    """Which nodes hold a lock key for ``resource`` (any owner)."""
    return [value is not None for value in lock_values(nodes, resource)]


def any_lock_keys(nodes: Sequence[RedisNode]) -> list[list[bytes]]:
    """Every lock key of the default namespace, per node."""
    return on_nodes(nodes, lambda c: sorted(c.scan_iter(match=KEYS.lock("*"))))


def lock_pttls(nodes: Sequence[RedisNode], resource: str) -> list[int]:
    return on_nodes(nodes, lambda c: int(c.pttl(KEYS.lock(resource))))


def delete_lock_keys(nodes: Sequence[RedisNode], resource: str) -> None:
    """Someone breaks the lock on these nodes."""
    on_nodes(nodes, lambda c: c.delete(KEYS.lock(resource)))


def fence_counters(nodes: Sequence[RedisNode], resource: str) -> list[int]:
    """Per node, the counter the token rule counts for ``resource``: its bucket's, as
    INSPECT shows it."""
    found = []
    for node in nodes:
        with node.client() as client:
            found.append(int(client.hget(KEYS.counter, bucket(resource)) or 0))
    return found


def set_fence_counters(nodes: Sequence[RedisNode], resource: str,
                       values: Sequence[int]) -> None:
    """Set each node's counter of ``resource``'s bucket (shared with the resources whose
    names hash to the same one)."""
    for node, value in zip(nodes, values, strict=True):
        with node.client() as client:
            client.hset(KEYS.counter, bucket(resource), value)


def markers(nodes: Sequence[RedisNode]) -> list[bytes | None]:
    """Each node's marker (None: new, or it lost its data)."""
    return [get(node, KEYS.marker) for node in nodes]


def write_markers(nodes: Sequence[RedisNode], text: str = "initialised by a test") -> None:
    """Node markers as the library writes them: stamped with the run id of the server
    (a marker stamped by another run means a restart, docs/design.md §4)."""
    for node in nodes:
        with node.client() as client:
            run_id = client.info("server")["run_id"]
            client.set(KEYS.marker, f"format=1 run_id={run_id} {text}")


def resume_and_settle(nodes: Sequence[RedisNode], resource: str | None = None) -> None:
    """SIGCONT, then one round trip per node so the commands queued while it was stopped
    (an acquire script whose reply timed out, a release) have run; optionally drop a
    stray lock key such a late acquire left behind."""
    for node in nodes:
        node.resume()
        with node.client() as client:
            client.ping()
            if resource is not None:
                client.delete(KEYS.lock(resource))


def outcomes_by_node(error: LockNotAcquired | LockLost | ClusterAmnesiaError,
                     nodes: Sequence[RedisNode]) -> list[Outcome]:
    by_address = {result.node: result.outcome for result in error.outcomes}
    return [by_address[node_address(node)] for node in nodes]


def assert_outcomes(exc: object, expected: dict[Outcome, int], nodes: Sequence[str]) -> None:
    """``exc`` is a QuorumUnavailable that lists every node's outcome, in the nodes'
    order, with these counts, and says why node by node."""
    assert isinstance(exc, QuorumUnavailable), repr(exc)
    assert isinstance(exc, LockNotAcquired) and isinstance(exc, RedlockError)
    assert all(isinstance(r, NodeResult) for r in exc.outcomes)
    assert [r.node for r in exc.outcomes] == list(nodes)
    counts = {o: sum(1 for r in exc.outcomes if r.outcome is o) for o in expected}
    assert counts == expected, exc.outcomes
    for result in exc.outcomes:
        assert result.node in str(exc)
        if result.outcome is Outcome.ERROR:
            assert result.detail


def decided_as(outcomes: Sequence[NodeResult], expected: Sequence[Outcome],
               quorum: int) -> bool:
    """Each node's outcome is the expected one, or NOT_AWAITED: a request ends once its
    replies decide it (a quorum granted, or enough refused or failed to rule one out),
    and a node still to answer then gets a short grace (docs/design.md §2.4). On a
    loaded machine the last node's answer can miss it, so which node is NOT_AWAITED is
    a race; the awaited outcomes must have decided the request by themselves."""
    actual = [r.outcome for r in outcomes]
    if len(actual) != len(expected) or not all(
            got is want or got is Outcome.NOT_AWAITED
            for got, want in zip(actual, expected, strict=True)):
        return False
    granted = actual.count(Outcome.GRANTED)
    not_granted = len(actual) - granted - actual.count(Outcome.NOT_AWAITED)
    return (Outcome.NOT_AWAITED not in actual or granted >= quorum
            or not_granted > len(actual) - quorum)


def dead_url() -> str:
    """A node URL where nothing listens."""
    return f"redis://127.0.0.1:{free_port()}"


def node_address(node: RedisNode) -> str:
    """The node as the client names it in outcomes and ``dlm.nodes``."""
    return f"{node.host}:{node.port}"


def strictly_increasing(values: Sequence[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


BUSY_SCRIPT = """
local start = redis.call('TIME')
while true do
    local now = redis.call('TIME')
    if (now[1] - start[1]) * 1000000 + (now[2] - start[2]) >= tonumber(ARGV[1]) then
        return 1
    end
end
"""


def keep_busy(nodes: Sequence[RedisNode], seconds: float) -> list[threading.Thread]:
    """Each node runs a script for ``seconds``: a slow node, which still reads its socket
    afterwards (unlike CLIENT PAUSE, which drops a blocked client's command on close)."""
    # Connected first, then started together: a thread that was slow to connect under
    # load (docker tests before, CPU burners beside) started its node's script up to a
    # few 100 ms after the other's, and two nodes were never busy at once.
    clients = [node.client(socket_timeout=30) for node in nodes]
    for client in clients:
        client.ping()
    start = threading.Barrier(len(clients))

    def run(client: redis.Redis) -> None:
        with client:
            start.wait(10)
            client.eval(BUSY_SCRIPT, 0, int(seconds * 1_000_000))

    threads = [threading.Thread(target=run, args=(client,), daemon=True)
               for client in clients]
    for thread in threads:
        thread.start()
    return threads
