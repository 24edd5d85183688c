"""Bad input fails at the call site; bad nodes fail in bounded time with typed errors.

Every test runs for both clients (``flavour`` = sync / async, tests/clients.py).
Argument errors are the built-in TypeError / ValueError, raised before any I/O.
Unreachable nodes, hung nodes, wrong passwords and TLS mismatches end in a
:class:`QuorumUnavailable` (a :class:`LockNotAcquired`, a :class:`RedlockError`) that
lists every node's outcome, and never take longer than a generous bound (the machine
is shared: no tight timings).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio

from redlock import DurationWarning, Outcome, QuorumUnavailable
from redlock.testing import RedisNodes, capture_events, free_port
from tests.clients import Actor, Flavour, Held, Stopwatch
from tests.peek import assert_outcomes, dead_url, decided_as, lock_keys

# ---------------------------------------------------------------------------
# Bad arguments: TypeError / ValueError at the call site, before any I/O
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("resource", "error"),
                         [("", ValueError), (None, TypeError), (42, TypeError),
                          (b"orders", TypeError), (["a"], TypeError)])
async def test_bad_resource(flavour: Flavour, resource: object, error: type[Exception]) -> None:
    dlm = flavour.bare_manager([dead_url()])
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
async def test_bad_ttl(flavour: Flavour, ttl: object, error: type[Exception]) -> None:
    dlm = flavour.bare_manager([dead_url()])
    with pytest.raises(error):
        dlm.lock("r", ttl=ttl)


@pytest.mark.parametrize("option", ["ttl", "timeout"])
async def test_absurdly_large_int_ttl_or_timeout_is_a_value_error(flavour: Flavour,
                                                                  option: str) -> None:
    dlm = flavour.bare_manager([dead_url()])
    with pytest.raises(ValueError):
        dlm.lock("r", **{option: 10**400})


async def test_ttl_above_a_configured_max_ttl(flavour: Flavour) -> None:
    dlm = flavour.bare_manager([dead_url()], max_ttl=60.0)
    assert dlm.lock("r", ttl=60.0).ttl == 60.0
    with pytest.raises(ValueError, match="maximum"):
        dlm.lock("r", ttl=60.5)


@pytest.mark.parametrize(("timeout", "error"),
                         [(-1, ValueError), (-0.001, ValueError), (math.nan, ValueError),
                          (math.inf, ValueError), ("5", TypeError), (True, TypeError),
                          ([1], TypeError)])
async def test_bad_timeout(flavour: Flavour, me: Actor, timeout: object,
                           error: type[Exception]) -> None:
    dlm = flavour.bare_manager([dead_url()])
    with pytest.raises(error):
        dlm.lock("r", timeout=timeout)
    lock = me.on(dlm.lock("r", ttl=5.0))
    # Checked before any I/O: nothing listens on the node, so I/O would raise
    # QuorumUnavailable instead of the argument error.
    with pytest.raises(error) as caught:
        await lock.acquire(timeout=timeout)
    assert type(caught.value) is error, repr(caught.value)


async def test_good_arguments_are_accepted(flavour: Flavour) -> None:
    dlm = flavour.bare_manager([dead_url()], max_ttl=3600.0)  # (the default is 60 s)
    lock = dlm.lock("orders:42", ttl=2, timeout=0)
    assert (lock.resource, lock.ttl, lock.timeout) == ("orders:42", 2.0, 0.0)
    assert dlm.lock("r", ttl=0.5, timeout=None).timeout is None
    long = flavour.bare_manager([dead_url()], max_ttl=7200.0)
    with pytest.warns(DurationWarning, match=r"ttl is in seconds: ttl=3600 is 60\.0 minutes"):
        assert long.lock("r", ttl=3600).ttl == 3600.0  # allowed (max_ttl), but told


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
async def test_bad_node_lists(flavour: Flavour, nodes: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        flavour.bare_manager(nodes)


async def test_a_client_of_either_flavour_names_its_node(flavour: Flavour) -> None:
    # Only a client's settings are read (docs/design.md §2.4): a blocking client names
    # a node of an AsyncRedlock as well as an asyncio client names one of a Redlock.
    port = free_port()
    clients = [redis.Redis(host="127.0.0.1", port=port),
               redis.asyncio.Redis(host="127.0.0.1", port=port, db=1)]
    try:
        for client in clients:
            dlm = flavour.bare_manager([client])
            assert dlm.nodes == (f"127.0.0.1:{port}" + ("/1" if client is clients[1] else ""),)
    finally:
        clients[0].close()
        await clients[1].aclose()


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
async def test_duplicate_nodes_in_any_spelling(flavour: Flavour, spellings: list[str]) -> None:
    p, q = free_port(), free_port()
    urls = [s.format(p=p, q=q) for s in spellings]
    with pytest.raises(ValueError, match=r"same Redis server|listed twice") as caught:
        flavour.bare_manager(urls)
    assert "secret" not in str(caught.value)  # the message never shows a password


async def test_duplicate_node_given_as_url_and_as_client(flavour: Flavour) -> None:
    port = free_port()
    client: Any = (redis.Redis(host="127.0.0.1", port=port) if flavour.kind == "sync"
                   else redis.asyncio.Redis(host="127.0.0.1", port=port))
    try:
        with pytest.raises(ValueError):
            flavour.bare_manager([client, f"redis://localhost:{port}"])
    finally:
        if isinstance(client, redis.asyncio.Redis):
            await client.aclose()
        else:
            client.close()


async def test_distinct_servers_are_accepted(flavour: Flavour) -> None:
    p = free_port()
    dlm = flavour.bare_manager([f"redis://127.0.0.1:{p}", f"redis://127.0.0.2:{p}",
                f"redis://127.0.0.1:{p + 1 if p < 65535 else p - 1}"])
    assert len(dlm.nodes) == 3
    assert dlm.quorum == 2


@pytest.mark.parametrize("options", [
    {"namespace": "a{b}"}, {"namespace": ""}, {"namespace": 5},
    {"node_timeout": 0}, {"node_timeout": -1}, {"node_timeout": math.nan},
    {"drift_factor": 0.7}, {"max_ttl": 0},
    {"retry_delay_min": 2.0, "retry_delay_max": 1.0},
])
async def test_bad_settings(flavour: Flavour, options: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        flavour.bare_manager([dead_url()], **options)


async def test_tls_urls_are_accepted_by_the_constructor(flavour: Flavour) -> None:
    p = free_port()
    dlm = flavour.bare_manager([f"rediss://alice:s3cret@127.0.0.1:{p}",
                f"rediss://127.0.0.1:{p + 1 if p < 65535 else p - 1}?ssl_cert_reqs=none",
                f"redis://127.0.0.1:{p - 1 if p > 1024 else p + 2}"])
    assert dlm.nodes[0] == f"127.0.0.1:{p}"
    assert all("s3cret" not in address for address in dlm.nodes)


# ---------------------------------------------------------------------------
# Even N: works, but says that it tolerates no more failures than N - 1 nodes would
# ---------------------------------------------------------------------------


async def test_even_node_count_warns_but_works(flavour: Flavour, me: Actor,
                                               nodes3: RedisNodes) -> None:
    with capture_events() as logs:
        dlm = flavour.bare_manager(nodes3.urls[:2])
    warnings = [e for e in logs if e["event"] == "redlock.even_node_count"]
    assert len(warnings) == 1, logs
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["nodes"] == 2 and warnings[0]["quorum"] == 2
    assert await me.cycle(dlm.lock("even", ttl=5.0, timeout=5.0)) >= 1


async def test_odd_node_count_does_not_warn(flavour: Flavour) -> None:
    with capture_events() as logs:
        flavour.bare_manager([dead_url(), dead_url(), dead_url()])
        flavour.bare_manager([dead_url()])
    assert not [e for e in logs if e["event"] == "redlock.even_node_count"]


# ---------------------------------------------------------------------------
# Nodes that cannot answer: bounded time, typed error, per-node outcomes
# ---------------------------------------------------------------------------


async def _one_node_errs_at_once(lock: Held, nodes: Sequence[str]) -> None:
    """A non-blocking acquire of ``lock`` on one node that cannot answer raises
    QuorumUnavailable (that node's outcome: an error) in under 5 s."""
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        await lock.acquire(blocking=False)
    assert_outcomes(caught.value, {Outcome.ERROR: 1}, nodes)
    assert took() < 5.0


async def test_unreachable_node_fails_fast_without_blocking(flavour: Flavour,
                                                           me: Actor) -> None:
    dlm = flavour.bare_manager([dead_url()])
    lock = me.on(dlm.lock("r", ttl=5.0))
    await _one_node_errs_at_once(lock, dlm.nodes)
    assert not await lock.locked()


async def test_unreachable_node_blocking_stops_at_the_deadline(flavour: Flavour,
                                                               me: Actor) -> None:
    dlm = flavour.bare_manager([dead_url()])
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        await me.on(dlm.lock("r", ttl=5.0, timeout=0.5)).acquire()
    assert_outcomes(caught.value, {Outcome.ERROR: 1}, dlm.nodes)
    assert 0.4 <= took() < 8.0


async def test_unreachable_node_in_a_with_block_raises(flavour: Flavour, me: Actor) -> None:
    dlm = flavour.bare_manager([dead_url()])
    with pytest.raises(QuorumUnavailable) as caught:
        async with me.holding(dlm.lock("r", ttl=5.0, timeout=0.3)):
            pytest.fail("entered without a lock")
    assert_outcomes(caught.value, {Outcome.ERROR: 1}, dlm.nodes)


async def test_unreachable_nodes_tolerated_as_a_minority_fail_fast_and_clean_as_a_majority(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    live = nodes3.urls
    # A new cluster is initialised (node markers written) only when every node answers
    # (docs/design.md §4.2: a partial view never counts as fresh), so first with all three.
    assert await me.cycle(flavour.manager(live).lock("init", timeout=5.0)) == 1
    dead = [dead_url(), dead_url()]
    assert dead[0] != dead[1]
    minority = flavour.manager([live[0], live[1], dead[0]])
    assert await me.cycle(minority.lock("dead:x", ttl=5.0, timeout=5.0)) >= 1

    majority = flavour.manager([live[2], *dead])
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        await me.on(majority.lock("dead:x", ttl=5.0)).acquire(blocking=False)
    assert took() < 2.0
    # Two errors decide the attempt: the live node's grant may come after the stragglers'
    # grace (NOT_AWAITED) on a loaded machine; either way its key is released below.
    outcomes = caught.value.outcomes
    assert decided_as(outcomes, [Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR], 2), outcomes
    if outcomes[0].outcome is Outcome.GRANTED:
        assert_outcomes(caught.value, {Outcome.GRANTED: 1, Outcome.ERROR: 2}, majority.nodes)
    assert "Unreachable" in str(caught.value)
    assert lock_keys([nodes3[2]], "dead:x") == [False]  # released on the node that granted
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable):
        async with me.holding(majority.lock("dead:x", timeout=0.5)):
            pytest.fail("entered without a quorum")
    assert took() < 3.0
    assert lock_keys([nodes3[2]], "dead:x") == [False]


async def test_hung_node_times_out_instead_of_hanging(flavour: Flavour, me: Actor,
                                                      nodes1: RedisNodes) -> None:
    dlm = flavour.bare_manager(nodes1.urls, node_timeout=0.1)
    nodes1[0].pause()  # SIGSTOP: the kernel still accepts connections, nothing answers
    lock = me.on(dlm.lock("r", ttl=5.0))
    await _one_node_errs_at_once(lock, dlm.nodes)
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        await lock.acquire(timeout=0.5)
    assert_outcomes(caught.value, {Outcome.ERROR: 1}, dlm.nodes)
    assert took() < 8.0


@pytest.fixture
def secured(fresh_nodes: Callable[..., RedisNodes]) -> Iterator[RedisNodes]:
    nodes = fresh_nodes(1, password="s3cret")
    with nodes[0].client() as client:
        client.acl_setuser("alice", enabled=True, passwords=["+alice-pw"], keys=["*"],
                           channels=["*"], commands=["+@all"])
    yield nodes


@pytest.mark.parametrize("auth", [":wrong@", "", "alice:nope@", "mallory:s3cret@"])
async def test_wrong_credentials_fail_at_once_even_without_a_deadline(
        flavour: Flavour, me: Actor, secured: RedisNodes, auth: str) -> None:
    node = secured[0]
    dlm = flavour.bare_manager([f"redis://{auth}{node.host}:{node.port}"])
    lock = me.on(dlm.lock("r", ttl=5.0, timeout=None))  # no deadline: only "permanent" stops it
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        await lock.acquire()
    assert_outcomes(caught.value, {Outcome.ERROR: 1}, dlm.nodes)
    detail = caught.value.outcomes[0].detail
    assert any(word in detail for word in ("WRONGPASS", "NOAUTH", "Authentication",
                                           "invalid username-password",
                                           "unauthenticated")), detail
    # A missing password reads "HELLO must be called with the client already
    # authenticated" from the server: the detail says what to do.
    assert detail.endswith("(the node refused the credentials: give the user and password"
                           " in the URL (redis://USER:PASSWORD@host:port, or"
                           " redis://:PASSWORD@... for the default user) or to the client;"
                           " a node with a password needs one)"), detail
    assert took() < 5.0
    assert "wrong" not in str(caught.value) and "nope" not in str(caught.value)


@pytest.mark.parametrize("auth", [":s3cret@", "alice:alice-pw@", "default:s3cret@"])
async def test_right_credentials_and_acl_users_work(flavour: Flavour, me: Actor,
                                                    secured: RedisNodes, auth: str) -> None:
    node = secured[0]
    dlm = flavour.bare_manager([f"redis://{auth}{node.host}:{node.port}"])
    assert await me.cycle(dlm.lock("r", ttl=5.0, timeout=5.0)) >= 1


async def test_tls_url_against_a_plain_server_fails_in_bounded_time(
        flavour: Flavour, me: Actor, nodes1: RedisNodes) -> None:
    node = nodes1[0]
    dlm = flavour.bare_manager([f"rediss://{node.host}:{node.port}?ssl_cert_reqs=none"],
                               node_timeout=0.2)
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        await me.on(dlm.lock("r", ttl=5.0, timeout=0.5)).acquire()
    assert_outcomes(caught.value, {Outcome.ERROR: 1}, dlm.nodes)
    assert took() < 8.0
