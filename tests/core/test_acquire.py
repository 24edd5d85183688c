"""The acquire protocol (``RedlockCore.acquire``, docs/design.md §2, §3) on scripted nodes:
the one-time node inspection, one round trip in the steady state, the token's commit
(write-back to the lower granting nodes only), releases after a failed or interrupted
attempt, no lock handed out already expired, the blocking retries up to the deadline.

The waiting line on the acquire path: tests/core/test_line_protocol.py; amnesia on it:
tests/core/test_amnesia_detection.py."""

from __future__ import annotations

import pytest

from redlock import Outcome
from redlock.testing import capture_events
from tests.internals import (
    Broadcast,
    Invoke,
    RedlockCore,
    Settings,
    Wait,
    drive,
    real_environment,
    scripts,
)
from tests.scripted import (
    FakeClock,
    ScriptedNodes,
    make_core,
)


def test_first_acquire_inspects_every_node_once_then_never_again() -> None:
    nodes = ScriptedNodes(3)
    nodes.replicas = {1}
    core = RedlockCore([f"n{i}:6379" for i in range(3)], Settings(),
                       real_environment(FakeClock()))
    with capture_events() as events:
        for _ in range(2):
            result = drive(core.acquire("r", 10.0, blocking=False, timeout=None),
                                       nodes.execute)
            assert result.state is not None
            drive(core.holding.release(result.state), nodes.execute)
    # No round of its own: INFO rides behind the first attempt's acquire calls, on the
    # same connections (a round waiting for a quorum cost a whole request timeout when
    # a majority hung, past the caller's deadline).
    first, second = nodes.requests[0], nodes.requests[2]
    assert isinstance(first, Broadcast) and isinstance(second, Broadcast)
    assert [c.node for c in first.calls] == [0, 1, 2, 0, 1, 2]
    assert [c.script for c in first.calls[:3]] == [scripts.ACQUIRE] * 3
    assert [c.args for c in first.calls[3:]] == [("INFO",)] * 3
    assert [c.script for c in second.calls] == [scripts.ACQUIRE] * 3
    assert nodes.scripts_sent() == ["acquire", "release", "acquire", "release"]
    warnings = [e for e in events if e["event"] == "redlock.node_unsafe_config"]
    assert [e["node"] for e in warnings] == ["n1:6379"]


def test_acquire_protocol_steady_state_is_one_round_trip() -> None:
    nodes = ScriptedNodes(3, counters=[4, 4, 4])
    result = drive(make_core(3).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is not None
    assert result.state.token == 5
    assert nodes.scripts_sent() == ["acquire"]
    broadcast = nodes.requests[0]
    assert isinstance(broadcast, Broadcast)
    assert sorted(c.node for c in broadcast.calls) == [0, 1, 2]  # all nodes at once


def test_acquire_protocol_diverged_counters_write_back_to_lower_nodes_only() -> None:
    def granted_by_2_3_4(counters: list[int]) -> tuple[ScriptedNodes, int]:
        """Nodes 0 and 1 held by someone else: the token the other three grant."""
        nodes = ScriptedNodes(5, counters=counters)
        nodes.data[0]["redlock:{r}:lock"] = "someone else"
        nodes.data[1]["redlock:{r}:lock"] = "someone else"
        result = drive(make_core(5).acquire("r", 10.0, blocking=False, timeout=None),
                       nodes.execute)
        assert result.state is not None
        return nodes, result.state.token

    nodes, token = granted_by_2_3_4([10, 5, 5, 5, 5])
    assert token == 6
    assert nodes.scripts_sent() == ["acquire"]  # all three granting nodes returned 6

    nodes, token = granted_by_2_3_4([5, 5, 10, 5, 5])
    assert token == 11
    assert nodes.scripts_sent() == ["acquire", "write_back"]
    write_back = nodes.requests[1]
    assert isinstance(write_back, Broadcast)
    assert sorted(c.node for c in write_back.calls) == [3, 4]
    assert [nodes.counter(i) for i in range(5)] == [5, 5, 11, 11, 11]


def test_acquire_protocol_failure_releases_on_every_node() -> None:
    nodes = ScriptedNodes(3, down=frozenset({1, 2}))
    result = drive(make_core(3).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is None
    assert result.unavailable
    assert [r.outcome for r in result.outcomes] == [Outcome.GRANTED, Outcome.ERROR,
                                                     Outcome.ERROR]
    assert nodes.scripts_sent() == ["acquire", "release"]
    release = nodes.requests[-1]
    assert isinstance(release, Broadcast)
    # Released everywhere, including the nodes that did not answer.
    assert sorted(c.node for c in release.calls) == [0, 1, 2]
    assert "redlock:{r}:lock" not in nodes.data[0]


def test_acquire_protocol_never_returns_an_expired_lock() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3)

    def slow(request: Broadcast | Wait | Invoke) -> list[object]:
        clock.advance(10.0)  # the round trip ate the whole ttl
        return nodes.execute(request)

    result = drive(make_core(3, clock).acquire("r", 10.0, blocking=False,
                                                           timeout=None), slow)
    assert result.state is None
    assert "validity" in result.reason
    assert all("redlock:{r}:lock" not in db for db in nodes.data)


def test_acquire_protocol_interrupted_after_sending_releases_then_reraises() -> None:
    nodes = ScriptedNodes(3)
    protocol = make_core(3).acquire("r", 10.0, blocking=False, timeout=None)
    first = next(protocol)
    assert isinstance(first, Broadcast)
    nodes.execute(first)  # the SETs happened; the replies never came back
    cleanup = protocol.throw(KeyboardInterrupt())
    assert isinstance(cleanup, Broadcast)
    assert cleanup.calls[0].script is scripts.RELEASE
    assert sorted(c.node for c in cleanup.calls) == [0, 1, 2]
    nodes.execute(cleanup)
    with pytest.raises(KeyboardInterrupt):
        protocol.send([1, 1, 1])
    assert all("redlock:{r}:lock" not in db for db in nodes.data)


def test_acquire_protocol_blocking_backs_off_and_stops_at_the_deadline() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db["redlock:{r}:lock"] = "holder"

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        if isinstance(request, Wait):
            assert request.seconds > 0
            clock.advance(request.seconds)
        return nodes.execute(request)

    result = drive(make_core(3, clock).acquire("r", 10.0, blocking=True,
                                                           timeout=1.0), execute)
    assert result.state is None
    assert not result.unavailable  # contention, not an outage
    assert result.attempts > 1
    sleeps = [r for r in nodes.requests if isinstance(r, Wait)]
    assert sleeps and all(s.turns_key == "redlock:{r}:released" for s in sleeps)
    # Between retry_delay_min and retry_delay_max, except the last one cut at the deadline.
    settings = Settings()
    assert all(settings.retry_delay_min <= s.seconds <= settings.retry_delay_max
               for s in sleeps[:-1])
    assert clock() - 1000.0 == pytest.approx(1.0, abs=0.3)  # stopped at the deadline
