"""Bad input fails at the call site; bad nodes fail in bounded time with typed errors.

Every test runs for both clients (``kind`` = sync / async). Argument errors are the
built-in TypeError / ValueError, raised before any I/O. Unreachable nodes, hung nodes,
wrong passwords and TLS mismatches end in a :class:`QuorumUnavailable` (a
:class:`LockNotAcquired`, a :class:`RedlockError`) that lists every node's outcome, and
never take longer than a generous bound (the machine is shared: no tight timings).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from redlock import (
    AsyncLock,
    AsyncRedlock,
    Lock,
    LockNotAcquired,
    NodeResult,
    Outcome,
    QuorumUnavailable,
    Redlock,
    RedlockError,
)
from redlock.testing import RedisNodes, capture_events, free_port

HANG_LIMIT = 15.0  # far above any expected figure: a hang, not a slow machine, fails


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Managers:
    """Builds Redlock or AsyncRedlock and closes everything it built."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.made: list[Redlock | AsyncRedlock] = []

    @property
    def cls(self) -> type[Redlock] | type[AsyncRedlock]:
        return Redlock if self.kind == "sync" else AsyncRedlock

    def __call__(self, nodes: Any, **options: Any) -> Any:
        dlm = self.cls(nodes, **options)
        self.made.append(dlm)
        return dlm

    async def close(self) -> None:
        for dlm in self.made:
            if isinstance(dlm, AsyncRedlock):
                await dlm.close()
            else:
                dlm.close()


@pytest.fixture
async def make(kind: str) -> Any:
    managers = Managers(kind)
    yield managers
    await managers.close()


async def bounded(work: Callable[[], Any], limit: float = HANG_LIMIT) -> tuple[Any, float]:
    """Run ``work`` (sync, or async as made by for_lock) with a hard limit.

    Returns (its result or the exception it raised, seconds taken). Sync work runs in a
    daemon thread so that a hang fails this test instead of blocking the suite.
    """
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any) -> None:
        if not done.done():
            done.set_result(value)

    def target() -> None:
        try:
            value: Any = work()
        except BaseException as exc:
            value = exc
        loop.call_soon_threadsafe(settle, value)

    async def run_async() -> None:
        try:
            settle(await work())
        except Exception as exc:
            settle(exc)

    runner = None
    if getattr(work, "is_async", False):
        runner = asyncio.create_task(run_async())  # a task of its own owns any lock taken
    else:
        threading.Thread(target=target, daemon=True).start()
    try:
        value = await asyncio.wait_for(asyncio.shield(done), limit)
    except asyncio.TimeoutError:
        if runner is not None:
            runner.cancel()
        pytest.fail(f"hung: no answer within {limit} s")
    if runner is not None:
        await runner
    return value, time.monotonic() - started


def for_lock(lock: Lock | AsyncLock, action: Callable[[Any], Any]) -> Callable[[], Any]:
    """``action(lock)`` as bounded() work; async for AsyncLock."""
    if isinstance(lock, AsyncLock):
        async def run() -> Any:
            return await action(lock)
        run.is_async = True  # type: ignore[attr-defined]
        return run
    return lambda: action(lock)


async def acquire_release(lock: Lock | AsyncLock) -> int:
    """Acquire, read the token, release; for the sync lock all in one thread."""
    def sync_cycle(held: Lock) -> int:
        assert held.acquire(blocking=True, timeout=5.0)
        token = held.token
        held.release()
        return token

    async def async_cycle(held: AsyncLock) -> int:
        assert await held.acquire(blocking=True, timeout=5.0)
        token = held.token
        await held.release()
        return token

    action: Any = async_cycle if isinstance(lock, AsyncLock) else sync_cycle
    value, _ = await bounded(for_lock(lock, action))
    if isinstance(value, BaseException):
        raise value
    return int(value)


def assert_outcomes(exc: object, expected: dict[Outcome, int], nodes: list[str]) -> None:
    assert isinstance(exc, QuorumUnavailable), repr(exc)
    assert isinstance(exc, LockNotAcquired) and isinstance(exc, RedlockError)
    assert all(isinstance(r, NodeResult) for r in exc.outcomes)
    assert [r.node for r in exc.outcomes] == nodes
    counts = {o: sum(1 for r in exc.outcomes if r.outcome is o) for o in expected}
    assert counts == expected, exc.outcomes
    for result in exc.outcomes:
        assert result.node in str(exc)  # the message says why, node by node
        if result.outcome is Outcome.ERROR:
            assert result.detail


def dead_url() -> str:
    return f"redis://127.0.0.1:{free_port()}"


# ---------------------------------------------------------------------------
# Bad arguments: TypeError / ValueError at the call site, before any I/O
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("resource", "error"),
                         [("", ValueError), (None, TypeError), (42, TypeError),
                          (b"orders", TypeError), (["a"], TypeError)])
async def test_bad_resource(make: Managers, resource: object, error: type[Exception]) -> None:
    dlm = make([dead_url()])
    with pytest.raises(error):
        dlm.lock(resource)


@pytest.mark.parametrize(
    ("ttl", "error"),
    [(0, ValueError), (0.0, ValueError), (-1, ValueError), (-0.5, ValueError),
     (math.nan, ValueError), (math.inf, ValueError), (-math.inf, ValueError),
     (3601, ValueError), (1e9, ValueError), (10**20, ValueError), (1e308, ValueError),
     (0.001, ValueError),  # smaller than the clock-drift allowance
     ("10", TypeError), (None, TypeError), (True, TypeError)],
)
async def test_bad_ttl(make: Managers, ttl: object, error: type[Exception]) -> None:
    dlm = make([dead_url()])
    with pytest.raises(error):
        dlm.lock("r", ttl=ttl)


@pytest.mark.parametrize("option", ["ttl", "timeout"])
async def test_absurdly_large_int_ttl_or_timeout_is_a_value_error(make: Managers,
                                                                  option: str) -> None:
    dlm = make([dead_url()])
    with pytest.raises(ValueError):
        dlm.lock("r", **{option: 10**400})


async def test_ttl_above_a_configured_max_ttl(make: Managers) -> None:
    dlm = make([dead_url()], max_ttl=60.0)
    assert dlm.lock("r", ttl=60.0).ttl == 60.0
    with pytest.raises(ValueError, match="maximum"):
        dlm.lock("r", ttl=60.5)


@pytest.mark.parametrize(("timeout", "error"),
                         [(-1, ValueError), (-0.001, ValueError), (math.nan, ValueError),
                          (math.inf, ValueError), ("5", TypeError), (True, TypeError),
                          ([1], TypeError)])
async def test_bad_timeout(make: Managers, timeout: object, error: type[Exception]) -> None:
    dlm = make([dead_url()])
    with pytest.raises(error):
        dlm.lock("r", timeout=timeout)
    lock = dlm.lock("r", ttl=5.0)
    # Checked before any I/O: nothing listens on the node, so I/O would raise
    # QuorumUnavailable instead of the argument error.
    value, _ = await bounded(for_lock(lock, lambda held: held.acquire(timeout=timeout)))
    assert type(value) is error, repr(value)


async def test_good_arguments_are_accepted(make: Managers) -> None:
    dlm = make([dead_url()])
    lock = dlm.lock("orders:42", ttl=2, timeout=0)
    assert (lock.resource, lock.ttl, lock.timeout) == ("orders:42", 2.0, 0.0)
    assert dlm.lock("r", ttl=0.5, timeout=None).timeout is None
    assert dlm.lock("r", ttl=3600).ttl == 3600.0


@pytest.mark.parametrize(("nodes", "error"), [
    ([], ValueError),
    ((), ValueError),
    (None, TypeError),
    ("redis://127.0.0.1:6379", TypeError),  # a bare string is not a list of nodes
    (b"redis://127.0.0.1:6379", TypeError),
    ([42], TypeError),
    ([None], TypeError),
    (["not a url"], ValueError),
    (["http://127.0.0.1:6379"], ValueError),
    (["127.0.0.1:6379"], ValueError),
    ([""], ValueError),
    (["redis://127.0.0.1:notaport"], ValueError),
    (["redis://127.0.0.1:99999"], ValueError),
])
async def test_bad_node_lists(make: Managers, nodes: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        make(nodes)


async def test_client_of_the_other_world_is_a_type_error(make: Managers) -> None:
    wrong: Any
    if make.kind == "sync":
        wrong = redis.asyncio.Redis(host="127.0.0.1", port=free_port())
    else:
        wrong = redis.Redis(host="127.0.0.1", port=free_port())
    try:
        with pytest.raises(TypeError):
            make([wrong])
    finally:
        if isinstance(wrong, redis.asyncio.Redis):
            await wrong.aclose()
        else:
            wrong.close()


@pytest.mark.parametrize("spellings", [
    ["redis://127.0.0.1:{p}", "redis://127.0.0.1:{p}"],
    ["redis://127.0.0.1:{p}", "redis://127.0.0.1:{q}", "redis://127.0.0.1:{p}"],
    ["redis://127.0.0.1:{p}", "redis://127.0.0.1:{p}/0"],
    ["redis://127.0.0.1:{p}", "redis://127.0.0.1:{p}/1"],  # two dbs: one server
    ["redis://127.0.0.1:{p}", "redis://:secret@127.0.0.1:{p}"],
    ["redis://127.0.0.1:{p}", "redis://user:pw@127.0.0.1:{p}/2"],
    ["redis://localhost:{p}", "redis://127.0.0.1:{p}"],
    ["redis://LocalHost:{p}", "redis://localhost.:{p}"],
    ["redis://127.0.0.1:{p}", "rediss://127.0.0.1:{p}"],
    ["redis://[::1]:{p}", "redis://[0:0:0:0:0:0:0:1]:{p}"],
    ["unix:///tmp/redlock-x.sock", "unix:///tmp/./redlock-x.sock?db=3"],
])
async def test_duplicate_nodes_in_any_spelling(make: Managers, spellings: list[str]) -> None:
    p, q = free_port(), free_port()
    urls = [s.format(p=p, q=q) for s in spellings]
    with pytest.raises(ValueError, match=r"same Redis server|listed twice") as caught:
        make(urls)
    assert "secret" not in str(caught.value)  # the message never shows a password


async def test_duplicate_node_given_as_url_and_as_client(make: Managers) -> None:
    port = free_port()
    client: Any = (redis.Redis(host="127.0.0.1", port=port) if make.kind == "sync"
                   else redis.asyncio.Redis(host="127.0.0.1", port=port))
    try:
        with pytest.raises(ValueError):
            make([client, f"redis://localhost:{port}"])
    finally:
        if isinstance(client, redis.asyncio.Redis):
            await client.aclose()
        else:
            client.close()


async def test_distinct_servers_are_accepted(make: Managers) -> None:
    p = free_port()
    dlm = make([f"redis://127.0.0.1:{p}", f"redis://127.0.0.2:{p}",
                f"redis://127.0.0.1:{p + 1 if p < 65535 else p - 1}"])
    assert len(dlm.nodes) == 3
    assert dlm.quorum == 2


@pytest.mark.parametrize("options", [
    {"namespace": "a{b}"}, {"namespace": ""}, {"namespace": 5},
    {"node_timeout": 0}, {"node_timeout": -1}, {"node_timeout": math.nan},
    {"drift_factor": 0.7}, {"max_ttl": 0},
    {"retry_delay_min": 2.0, "retry_delay_max": 1.0},
])
async def test_bad_settings(make: Managers, options: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        make([dead_url()], **options)


async def test_tls_urls_are_accepted_by_the_constructor(make: Managers) -> None:
    p = free_port()
    dlm = make([f"rediss://alice:s3cret@127.0.0.1:{p}",
                f"rediss://127.0.0.1:{p + 1 if p < 65535 else p - 1}?ssl_cert_reqs=none",
                f"redis://127.0.0.1:{p - 1 if p > 1024 else p + 2}"])
    assert dlm.nodes[0] == f"127.0.0.1:{p}"
    assert all("s3cret" not in address for address in dlm.nodes)


# ---------------------------------------------------------------------------
# Even N: works, but says that it tolerates no more failures than N - 1 nodes would
# ---------------------------------------------------------------------------


async def test_even_node_count_warns_but_works(make: Managers, nodes3: RedisNodes) -> None:
    with capture_events() as logs:
        dlm = make(nodes3.urls[:2])
    warnings = [e for e in logs if e["event"] == "redlock.even_node_count"]
    assert len(warnings) == 1, logs
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["nodes"] == 2 and warnings[0]["quorum"] == 2
    token = await acquire_release(dlm.lock("even", ttl=5.0))
    assert token >= 1


async def test_odd_node_count_does_not_warn(make: Managers) -> None:
    with capture_events() as logs:
        make([dead_url(), dead_url(), dead_url()])
        make([dead_url()])
    assert not [e for e in logs if e["event"] == "redlock.even_node_count"]


# ---------------------------------------------------------------------------
# Nodes that cannot answer: bounded time, typed error, per-node outcomes
# ---------------------------------------------------------------------------


async def test_unreachable_node_fails_fast_without_blocking(make: Managers) -> None:
    url = dead_url()
    dlm = make([url])
    lock = dlm.lock("r", ttl=5.0)
    value, took = await bounded(for_lock(lock, lambda held: held.acquire(blocking=False)))
    assert_outcomes(value, {Outcome.ERROR: 1}, list(dlm.nodes))
    assert took < 5.0
    assert not lock.locked()


async def test_unreachable_node_blocking_stops_at_the_deadline(make: Managers) -> None:
    dlm = make([dead_url()])
    lock = dlm.lock("r", ttl=5.0, timeout=0.5)
    value, took = await bounded(for_lock(lock, lambda held: held.acquire()))
    assert_outcomes(value, {Outcome.ERROR: 1}, list(dlm.nodes))
    assert 0.4 <= took < 8.0


async def test_unreachable_node_in_a_with_block_raises(make: Managers) -> None:
    dlm = make([dead_url()])
    lock = dlm.lock("r", ttl=5.0, timeout=0.3)

    def sync_enter(held: Lock) -> None:
        with held:
            raise AssertionError("entered without a lock")

    async def async_enter(held: AsyncLock) -> None:
        async with held:
            raise AssertionError("entered without a lock")

    action: Any = async_enter if isinstance(lock, AsyncLock) else sync_enter
    value, _ = await bounded(for_lock(lock, action))
    assert_outcomes(value, {Outcome.ERROR: 1}, list(dlm.nodes))


async def test_minority_unreachable_still_acquires_majority_unreachable_fails_clean(
        make: Managers, nodes3: RedisNodes) -> None:
    live = nodes3.urls
    # A new cluster is initialised (node markers written) only when every node answers
    # (DESIGN.md section 3: a partial view never counts as fresh), so first with all three.
    assert await acquire_release(make(live).lock("init", ttl=5.0)) == 1
    ok = make([live[0], live[1], dead_url()])
    assert await acquire_release(ok.lock("r", ttl=5.0)) >= 1

    bad = make([live[2], dead_url(), dead_url()])
    lock = bad.lock("s", ttl=5.0)
    value, took = await bounded(for_lock(lock, lambda held: held.acquire(blocking=False)))
    assert_outcomes(value, {Outcome.GRANTED: 1, Outcome.ERROR: 2}, list(bad.nodes))
    assert took < 5.0
    with nodes3[2].client() as client:  # released on the node that granted
        assert client.exists("redlock:{s}:lock") == 0


async def test_hung_node_times_out_instead_of_hanging(make: Managers,
                                                      nodes1: RedisNodes) -> None:
    dlm = make(nodes1.urls, node_timeout=0.1)
    nodes1[0].pause()  # SIGSTOP: the kernel still accepts connections, nothing answers
    try:
        lock = dlm.lock("r", ttl=5.0)
        value, took = await bounded(for_lock(lock, lambda held: held.acquire(blocking=False)))
        assert_outcomes(value, {Outcome.ERROR: 1}, list(dlm.nodes))
        assert took < 5.0
        value, took = await bounded(for_lock(lock, lambda held: held.acquire(timeout=0.5)))
        assert_outcomes(value, {Outcome.ERROR: 1}, list(dlm.nodes))
        assert took < 8.0
    finally:
        nodes1[0].resume()


@pytest.fixture
def secured(fresh_nodes: Callable[..., RedisNodes]) -> Iterator[RedisNodes]:
    nodes = fresh_nodes(1, password="s3cret")
    with nodes[0].client() as client:
        client.acl_setuser("alice", enabled=True, passwords=["+alice-pw"], keys=["*"],
                           channels=["*"], commands=["+@all"])
    yield nodes


@pytest.mark.parametrize("auth", [":wrong@", "", "alice:nope@", "mallory:s3cret@"])
async def test_wrong_credentials_fail_at_once_even_without_a_deadline(
        make: Managers, secured: RedisNodes, auth: str) -> None:
    node = secured[0]
    dlm = make([f"redis://{auth}{node.host}:{node.port}"])
    lock = dlm.lock("r", ttl=5.0, timeout=None)  # no deadline: only "permanent" can stop it
    value, took = await bounded(for_lock(lock, lambda held: held.acquire()))
    assert_outcomes(value, {Outcome.ERROR: 1}, list(dlm.nodes))
    assert isinstance(value, QuorumUnavailable)
    detail = value.outcomes[0].detail
    assert any(word in detail for word in ("WRONGPASS", "NOAUTH", "Authentication",
                                           "invalid username-password")), detail
    assert took < 5.0
    assert "wrong" not in str(value) and "nope" not in str(value)


@pytest.mark.parametrize("auth", [":s3cret@", "alice:alice-pw@", "default:s3cret@"])
async def test_right_credentials_and_acl_users_work(make: Managers, secured: RedisNodes,
                                                    auth: str) -> None:
    node = secured[0]
    dlm = make([f"redis://{auth}{node.host}:{node.port}"])
    assert await acquire_release(dlm.lock("r", ttl=5.0)) >= 1


async def test_tls_url_against_a_plain_server_fails_in_bounded_time(
        make: Managers, nodes1: RedisNodes) -> None:
    node = nodes1[0]
    dlm = make([f"rediss://{node.host}:{node.port}?ssl_cert_reqs=none"], node_timeout=0.2)
    lock = dlm.lock("r", ttl=5.0, timeout=0.5)
    value, took = await bounded(for_lock(lock, lambda held: held.acquire()))
    assert_outcomes(value, {Outcome.ERROR: 1}, list(dlm.nodes))
    assert took < 8.0
