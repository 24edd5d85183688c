"""The node format (docs/design.md §4.1; docs/operations.md, "Upgrading: the node format")
on real nodes and both clients: every marker this release writes names format 1; a node
whose marker names a higher format (a newer release initialised it) is one this client
must not use. Its replies do not count, it is neither judged nor repaired, and an
acquire it leaves without a quorum raises ``NodeFormatError`` (a ``QuorumUnavailable``)
naming the node and the format, for every kind of lock; the CLI shows it. The same on
scripted nodes: tests/core/test_node_format.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from redlock import NodeFormatError, Outcome, QuorumUnavailable, Redlock
from redlock.admin import Admin
from redlock.testing import RedisNode, RedisNodes, capture_events
from tests.clients import Actor, Flavour, admin, resolve
from tests.internals import KEYS

NEWER = "initialised by a newer format 2 of redlock-fenced (this client reads format 1)"


def newer_markers(nodes: RedisNodes, which: list[int]) -> dict[int, bytes]:
    """Markers as a release of format 2 might write them, stamped with each node's run."""
    written = {}
    for i in which:
        with nodes[i].client() as client:
            value = (f"format=2 run_id={client.info('server')['run_id']} initialised at=1"
                     " by=0123456789abcdef")
            client.set(KEYS.marker, value)
            written[i] = value.encode()
    return written


def marker_of(node: RedisNode) -> bytes | None:
    with node.client() as client:
        value = client.get(KEYS.marker)
    return value if value is None else bytes(value)


def lock_keys_left(nodes: RedisNodes) -> list[list[bytes]]:
    found = []
    for node in nodes:
        with node.client() as client:
            found.append(sorted(k for k in client.keys("redlock:{*") if b":lock" in k
                                or b":permit:" in k or b":write" in k or b":leader" in k))
    return found


async def test_every_marker_this_client_writes_names_format_1(flavour: Flavour, me: Actor,
                                                              nodes3: RedisNodes) -> None:
    assert await me.cycle(flavour.manager(nodes3).lock("format:new")) == 1
    for node in nodes3:
        value = marker_of(node)
        assert value is not None and value.startswith(b"format=1 run_id=")


async def test_a_cluster_a_newer_release_initialised_is_refused_with_node_format_error(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    written = newer_markers(nodes3, [0, 1, 2])
    lock = me.on(flavour.manager(nodes3).lock("format:refused", ttl=5.0))
    with capture_events() as events, pytest.raises(NodeFormatError) as raised:
        await lock.acquire(timeout=5.0)  # blocking: no retry can help, it ends at once
    error = raised.value
    assert isinstance(error, QuorumUnavailable)
    assert error.resource == "format:refused"
    assert str(error).startswith(f"could not acquire lock on 'format:refused': node"
                                 f" {nodes3[0].host}:{nodes3[0].port} was {NEWER};")
    assert "upgrade this client" in str(error)
    assert [r.outcome for r in error.outcomes] == [Outcome.INCOMPATIBLE] * 3
    assert all(r.detail == NEWER for r in error.outcomes)
    assert sorted(e["node"] for e in events if e["event"] == "redlock.node_incompatible") \
        == sorted(f"{n.host}:{n.port}" for n in nodes3)
    # The nodes are left as they were: markers untouched, no lock key left behind.
    assert {i: marker_of(node) for i, node in enumerate(nodes3)} == written
    assert lock_keys_left(nodes3) == [[], [], []]


async def test_a_node_of_a_newer_format_is_left_out_and_the_others_decide(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    assert await me.cycle(dlm.lock("format:mixed")) == 1  # a cluster of this format
    newer_markers(nodes3, [2])
    late = flavour.manager(nodes3)  # new connections: IDENTIFY shows node 2's marker
    lock = me.on(late.lock("format:mixed", ttl=5.0))
    with capture_events() as events:
        assert await lock.acquire(blocking=False)
        assert await lock.token() == 2
        status = await resolve(admin(late).inspect("format:mixed"))
        await lock.release()
    assert [(n.marker, n.format) for n in status.nodes] == [(True, 1), (True, 1), (True, 2)]
    assert [e["why"] for e in events if e["event"] == "redlock.node_incompatible"] == [NEWER]
    assert "redlock.node_amnesiac" not in [e["event"] for e in events]
    assert status.nodes[2].benched is False  # not amnesiac: another release's node
    reports = await resolve(admin(late).repair())
    assert [(r.status, r.detail) for r in reports] == [("healthy", ""), ("healthy", ""), (
        "failed", f"{NEWER}: upgrade this client")]


@pytest.mark.parametrize(("kind", "fresh"), [
    ("semaphore", False), ("write", False), ("read", False), ("many", False),
    ("election", True), ("lock", True)])
async def test_every_kind_refuses_nodes_of_a_newer_format(
        flavour: Flavour, me: Actor, nodes3: RedisNodes, kind: str, fresh: bool) -> None:
    """On connections opened before the markers changed, the scripts that read the
    marker's format refuse (the lock family's, ACQUIRE_MANY's); ACQUIRE's usual case
    reads only that a marker exists, and a new connection's IDENTIFY tells its format
    (``fresh``: a manager that connects after the change, docs/design.md §4.1)."""
    first = flavour.manager(nodes3)
    assert await me.cycle(first.lock("format:first")) == 1  # a cluster of this format
    newer_markers(nodes3, [1, 2])
    dlm = flavour.manager(nodes3) if fresh else first
    handles: dict[str, Callable[[], Any]] = {
        "semaphore": lambda: dlm.semaphore("format:kind", permits=2, ttl=5.0),
        "write": lambda: dlm.rwlock("format:kind", ttl=5.0).write(),
        "read": lambda: dlm.rwlock("format:kind", ttl=5.0).read(),
        "many": lambda: dlm.lock_many(["format:a", "format:b"], ttl=5.0),
        "election": lambda: dlm.election("format:kind", ttl=5.0).campaign(),
        "lock": lambda: dlm.lock("format:kind", ttl=5.0),
    }
    handle = me.on(handles[kind]())
    with pytest.raises(NodeFormatError, match="newer format 2"):
        await handle.acquire(blocking=False)
    assert lock_keys_left(nodes3) == [[], [], []]


def test_the_cli_shows_a_node_of_a_newer_format(nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls) as dlm, dlm.lock("format:cli"):
        pass
    newer_markers(nodes3, [1])
    nodes = subprocess.run([sys.executable, "-m", "redlock", "nodes", "--json", "--nodes",
                            *nodes3.urls], capture_output=True, text=True, timeout=60,
                           check=False)
    assert nodes.returncode == 3, nodes.stdout + nodes.stderr  # done, with warnings
    shown = json.loads(nodes.stdout)["nodes"]
    assert [n["format"] for n in shown] == [1, 2, 1]
    assert [n["warnings"] for n in shown][1] == [
        f"{NEWER}: clients of this release do not use it (docs/operations.md, \"Upgrading:"
        " the node format\")"]
    status = subprocess.run([sys.executable, "-m", "redlock", "status", "format:cli",
                             "--nodes", *nodes3.urls], capture_output=True, text=True,
                            timeout=60, check=False)
    assert "another format: not used by this client (upgrade it)" in status.stdout


def test_a_membership_change_is_refused_on_a_cluster_with_a_newer_node(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(4)
    with Redlock(nodes.urls[:3], max_ttl=1.0) as old, old.lock("format:members", ttl=1.0):
        pass
    newer_markers(nodes, [2])
    with Redlock(nodes.urls, max_ttl=1.0) as dlm:
        with pytest.raises(Exception, match="newer format 2") as refused:
            Admin(dlm).change_members(nodes.urls, current=nodes.urls[:3])
        assert type(refused.value).__name__ == "MembershipError"
        assert "nothing was changed" in str(refused.value)
        with nodes[3].client() as client:
            assert client.exists(KEYS.members) == 0
