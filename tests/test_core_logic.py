"""Pure unit tests of the sans-IO core (:mod:`redlock._algorithm`, :mod:`redlock._rules`):
no servers, no sockets.

Quorum, validity and drift, the token rule, reply classification, LockState with an
injected clock, the validators, and the acquire/release protocols driven by a scripted
executor (the protocol only yields requests; these tests play the nodes' replies).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redlock import _scripts as scripts
from redlock._algorithm import RedlockCore
from redlock._protocol import Broadcast, Call, Sleep, drive
from redlock._rules import (
    TOKEN_LIMIT,
    Keys,
    Settings,
    choose_token,
    classify_ack_reply,
    classify_acquire_reply,
    is_permanent_error,
    quorum,
    validate_node_addresses,
    validate_resource,
    validate_seconds,
    validate_timeout,
    validity_left,
)
from redlock._state import LockState, Status
from redlock.errors import LockLost, NodeResult, NotHeld, Outcome, RedlockError
from redlock.testing import capture_events


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ---------------------------------------------------------------------------
# quorum
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "q"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)])
def test_quorum_is_n_div_2_plus_1(n: int, q: int) -> None:
    assert quorum(n) == q


@given(st.integers(min_value=1, max_value=50))
def test_quorum_is_the_smallest_majority_and_any_two_quorums_intersect(n: int) -> None:
    q = quorum(n)
    assert 2 * q > n  # a majority
    assert 2 * (q - 1) <= n  # and the smallest one
    if n <= 9:  # exhaustively: every pair of q-subsets shares a node
        subsets = [set(c) for c in combinations(range(n), q)]
        assert all(a & b for a in subsets for b in subsets)


# ---------------------------------------------------------------------------
# validity and drift
# ---------------------------------------------------------------------------


def test_drift_is_ttl_times_factor_plus_two_ms() -> None:
    settings = Settings()
    assert settings.drift(10.0) == pytest.approx(10.0 * 0.01 + 0.002)
    assert Settings(drift_factor=0.0).drift(10.0) == pytest.approx(0.002)
    assert Settings(drift_factor=0.1).drift(2.0) == pytest.approx(0.202)


def test_validity_left_is_ttl_minus_elapsed_minus_drift() -> None:
    settings = Settings()
    assert validity_left(settings, 10.0, started=100.0, now=100.0) == pytest.approx(9.898)
    assert validity_left(settings, 10.0, started=100.0, now=101.5) == pytest.approx(8.398)
    # Elapsed past ttl - drift: no validity left (the attempt must count as failed).
    assert validity_left(settings, 10.0, started=100.0, now=109.898) == pytest.approx(0.0)
    assert validity_left(settings, 10.0, started=100.0, now=110.0) < 0


@given(ttl=st.floats(min_value=0.01, max_value=3600.0),
       elapsed=st.floats(min_value=0.0, max_value=4000.0))
def test_validity_never_exceeds_ttl_and_shrinks_with_elapsed_time(ttl: float,
                                                                  elapsed: float) -> None:
    settings = Settings()
    left = validity_left(settings, ttl, started=50.0, now=50.0 + elapsed)
    assert left < ttl
    assert left == pytest.approx(ttl - elapsed - settings.drift(ttl), abs=1e-6)


# ---------------------------------------------------------------------------
# choose_token: the token rule of DESIGN.md section 3
# ---------------------------------------------------------------------------


def test_choose_token_agreeing_counters_need_no_write_back() -> None:
    choice = choose_token({0: 7, 1: 7, 2: 7})
    assert choice.token == 7
    assert sorted(choice.committed) == [0, 1, 2]
    assert choice.write_back == ()


def test_choose_token_takes_the_max_and_writes_back_only_to_lower_nodes() -> None:
    # The DESIGN.md example: counters 10,5,5,5,5; B wins {2,3,4} after A took {0,1,2}.
    choice = choose_token({2: 11, 3: 6, 4: 6})
    assert choice.token == 11
    assert choice.committed == (2,)
    assert sorted(choice.write_back) == [3, 4]


def test_choose_token_only_looks_at_granting_nodes() -> None:
    # Node 1 refused (not in the dict): whatever its counter, it is neither chosen nor
    # written back by this round.
    choice = choose_token({0: 3, 2: 5})
    assert choice.token == 5
    assert choice.committed == (2,)
    assert choice.write_back == (0,)
    assert 1 not in choice.committed + choice.write_back


@given(st.dictionaries(st.integers(min_value=0, max_value=6),
                       st.integers(min_value=1, max_value=TOKEN_LIMIT - 1),
                       min_size=1))
def test_choose_token_properties(counters: dict[int, int]) -> None:
    choice = choose_token(counters)
    assert choice.token == max(counters.values())
    assert set(choice.committed) | set(choice.write_back) == set(counters)
    assert not set(choice.committed) & set(choice.write_back)
    assert choice.committed  # the node that returned the max is always committed
    assert all(counters[i] == choice.token for i in choice.committed)
    assert all(counters[i] < choice.token for i in choice.write_back)


@given(n=st.integers(min_value=1, max_value=7), data=st.data())
def test_committed_tokens_never_go_backwards_in_a_random_history(n: int,
                                                                 data: st.DataObject) -> None:
    """A small model of the token rule over one resource, sequential holders.

    Each holder wins a random quorum; on each granting node the acquire script does
    counter = max(counter, floor) + 1; the holder takes choose_token's max and writes it
    back (conditionally: the key is ours on all granting nodes) to the lower nodes. A
    random subset of the write-backs is lost; the holder commits only with >= q nodes
    at >= token. Committed tokens must be strictly increasing.
    """
    q = quorum(n)
    counters = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    committed_tokens: list[int] = []
    for _ in range(data.draw(st.integers(1, 12))):
        granting = data.draw(st.sets(st.integers(0, n - 1), min_size=q, max_size=n))
        replies = {}
        for i in granting:
            counters[i] += 1  # floor 0: the worst case, no client-side help
            replies[i] = counters[i]
        choice = choose_token(replies)
        acked = 0
        for i in choice.write_back:
            if data.draw(st.booleans()):  # this write-back reached the node
                counters[i] = max(counters[i], choice.token)
                acked += 1
        if len(choice.committed) + acked >= q:
            committed_tokens.append(choice.token)
    assert committed_tokens == sorted(set(committed_tokens))


# ---------------------------------------------------------------------------
# reply classification: the one place reply codes become outcomes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "outcome", "counter", "pttl"),
    [
        ([scripts.ACQUIRE_GRANTED, 42], Outcome.GRANTED, 42, None),
        ((scripts.ACQUIRE_GRANTED, 1), Outcome.GRANTED, 1, None),
        ([scripts.ACQUIRE_ALREADY_OURS, 9], Outcome.GRANTED, 9, None),
        ([scripts.ACQUIRE_REFUSED, 1234], Outcome.REFUSED, None, 1234),
        ([scripts.ACQUIRE_AMNESIAC, 0], Outcome.AMNESIAC, None, None),
        ([b"1", b"17"], Outcome.GRANTED, 17, None),  # RESP bulk strings are fine too
        ([7, 1], Outcome.ERROR, None, None),  # unknown code
        ([1], Outcome.ERROR, None, None),  # wrong length
        ([1, 2, 3], Outcome.ERROR, None, None),
        ([], Outcome.ERROR, None, None),
        (None, Outcome.ERROR, None, None),
        (b"OK", Outcome.ERROR, None, None),
        (1, Outcome.ERROR, None, None),
        ("granted", Outcome.ERROR, None, None),
    ],
)
def test_classify_acquire_reply(reply: object, outcome: Outcome, counter: int | None,
                                pttl: int | None) -> None:
    result = classify_acquire_reply("n1:6379", reply)
    assert result.node == "n1:6379"
    assert result.outcome is outcome
    assert result.counter == counter
    assert result.pttl_ms == pttl
    if outcome is Outcome.ERROR:
        assert result.detail  # says what was unexpected


def test_classify_acquire_reply_refused_and_amnesiac_say_why() -> None:
    refused = classify_acquire_reply("a", [scripts.ACQUIRE_REFUSED, 500])
    assert "500 ms" in refused.detail and "another owner" in refused.detail
    amnesiac = classify_acquire_reply("a", [scripts.ACQUIRE_AMNESIAC, 0])
    assert "marker" in amnesiac.detail
    assert str(refused).startswith("a refused (")


@pytest.mark.parametrize("exc", [ConnectionRefusedError("refused"), TimeoutError(),
                                 RuntimeError("NOSCRIPT boom")])
def test_classify_acquire_reply_exception_is_an_error_naming_the_type(exc: Exception) -> None:
    result = classify_acquire_reply("n", exc)
    assert result.outcome is Outcome.ERROR
    assert result.detail.startswith(type(exc).__name__ + ":")


@pytest.mark.parametrize("reply", [[b"x", 1], [None, None]])
def test_classify_acquire_reply_malformed_pair_is_an_error_not_a_crash(reply: object) -> None:
    assert classify_acquire_reply("n", reply).outcome is Outcome.ERROR


def test_classify_ack_reply() -> None:
    assert classify_ack_reply("n", 1, refused="gone").outcome is Outcome.GRANTED
    refused = classify_ack_reply("n", 0, refused="gone")
    assert (refused.outcome, refused.detail) == (Outcome.REFUSED, "gone")
    assert classify_ack_reply("n", None, refused="x").outcome is Outcome.REFUSED
    error = classify_ack_reply("n", ConnectionError("down"), refused="x")
    assert error.outcome is Outcome.ERROR and "down" in error.detail


def test_permanent_errors_are_credentials_and_permissions_only() -> None:
    class AuthenticationError(Exception):
        pass

    assert is_permanent_error(AuthenticationError("invalid"))
    assert is_permanent_error(Exception("WRONGPASS invalid username-password pair"))
    assert is_permanent_error(Exception("NOPERM this user has no permissions"))
    assert is_permanent_error(Exception("NOAUTH Authentication required."))
    assert is_permanent_error(Exception("READONLY You can't write against a read only replica."))
    assert not is_permanent_error(TimeoutError("timed out"))
    assert not is_permanent_error(ConnectionRefusedError("refused"))
    assert not is_permanent_error(Exception("BUSY Redis is busy running a script"))


# ---------------------------------------------------------------------------
# LockState with an injected clock
# ---------------------------------------------------------------------------


def make_state(clock: FakeClock, ttl: float = 10.0) -> LockState:
    return LockState("res", "owner", ttl, token=5, deadline=clock() + ttl, clock=clock)


def test_lock_state_validity_counts_down_on_the_injected_clock() -> None:
    clock = FakeClock()
    state = make_state(clock)
    assert state.validity() == pytest.approx(10.0)
    clock.advance(4.0)
    assert state.validity() == pytest.approx(6.0)
    state.check()  # still valid: no raise
    clock.advance(6.0)
    assert state.validity() == 0.0
    with pytest.raises(LockLost, match="expired") as caught:
        state.check()
    assert caught.value.resource == "res"
    clock.advance(100.0)
    assert state.validity() == 0.0  # never negative


def test_lock_state_mark_lost_once_then_check_raises_with_outcomes() -> None:
    clock = FakeClock()
    state = make_state(clock)
    outcomes = [NodeResult("a", Outcome.REFUSED, "gone")]
    assert state.mark_lost("extend failed", outcomes) is True
    assert state.mark_lost("again", ()) is False  # only the first caller fires callbacks
    assert state.status == Status.LOST
    assert state.validity() == 0.0
    with pytest.raises(LockLost, match="extend failed") as caught:
        state.check()
    assert caught.value.outcomes == tuple(outcomes)


def test_lock_state_released_is_not_held_and_cannot_be_lost() -> None:
    clock = FakeClock()
    state = make_state(clock)
    state.status = Status.RELEASED
    assert state.validity() == 0.0
    with pytest.raises(NotHeld):
        state.check()
    assert state.mark_lost("late watchdog", ()) is False
    assert issubclass(NotHeld, RedlockError)


# ---------------------------------------------------------------------------
# validators
# ---------------------------------------------------------------------------


def test_validate_resource() -> None:
    assert validate_resource("orders:42") == "orders:42"
    with pytest.raises(ValueError):
        validate_resource("")
    for bad in (None, 42, b"orders", ["x"]):
        with pytest.raises(TypeError):
            validate_resource(bad)


def test_validate_seconds_accepts_positive_finite_numbers() -> None:
    assert validate_seconds("ttl", 10) == 10.0
    assert isinstance(validate_seconds("ttl", 10), float)
    assert validate_seconds("ttl", 0.25) == 0.25
    assert validate_seconds("ttl", 3600, upper=3600) == 3600.0


@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (0.0, ValueError), (-1, ValueError), (-0.001, ValueError),
     (math.nan, ValueError), (math.inf, ValueError), (-math.inf, ValueError),
     (3601, ValueError), (1e300, ValueError),
     ("10", TypeError), (None, TypeError), (True, TypeError), (b"1", TypeError)],
)
def test_validate_seconds_rejects(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        validate_seconds("ttl", value, upper=3600)


@pytest.mark.parametrize("check", [lambda v: validate_seconds("ttl", v, upper=3600),
                                   validate_timeout])
def test_validators_reject_an_absurdly_large_int_with_value_error(
        check: Callable[[object], object]) -> None:
    with pytest.raises(ValueError):
        check(10**400)


def test_validate_timeout() -> None:
    assert validate_timeout(None) is None
    assert validate_timeout(0) == 0.0  # a single attempt
    assert validate_timeout(2) == 2.0
    for bad_value in (-1, -0.5, math.nan, math.inf):
        with pytest.raises(ValueError):
            validate_timeout(bad_value)
    for bad_type in ("5", True, [1]):
        with pytest.raises(TypeError):
            validate_timeout(bad_type)


def test_validate_node_addresses() -> None:
    validate_node_addresses(["a:1", "b:1", "a:2"])
    with pytest.raises(ValueError, match="at least one"):
        validate_node_addresses([])
    with pytest.raises(ValueError, match="listed twice"):
        validate_node_addresses(["a:1", "b:1", "a:1"])


@pytest.mark.parametrize(
    "options",
    [{"namespace": ""}, {"namespace": "a{b}"}, {"namespace": "a*"}, {"namespace": "a b"},
     {"node_timeout": 0}, {"node_timeout": math.nan}, {"max_ttl": -1},
     {"drift_factor": 0.5}, {"drift_factor": -0.1},
     {"retry_delay_min": 1.0, "retry_delay_max": 0.5}],
)
def test_settings_reject_bad_values(options: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        Settings(**options)  # type: ignore[arg-type]


def test_ttl_must_exceed_the_drift_allowance_and_max_ttl() -> None:
    settings = Settings(max_ttl=60.0)
    assert settings.check_ttl(1) == 1.0
    with pytest.raises(ValueError, match="drift"):
        settings.check_ttl(0.002)  # drift alone is 2 ms + 1 %
    with pytest.raises(ValueError, match="maximum"):
        settings.check_ttl(61)


def test_keys_share_one_hash_tag_per_resource() -> None:
    keys = Keys("app")
    assert keys.lock("orders:42") == "app:{orders:42}:lock"
    assert keys.fence("orders:42") == "app:{orders:42}:fence"
    assert keys.channel("orders:42") == "app:{orders:42}:released"
    assert keys.marker == "app:node-marker"


# ---------------------------------------------------------------------------
# The acquire / release protocols, driven by a scripted executor
# ---------------------------------------------------------------------------


class ScriptedNodes:
    """Plays N nodes at the protocol level: a dict per node, the scripts' semantics."""

    def __init__(self, n: int, counters: list[int] | None = None,
                 down: frozenset[int] = frozenset()) -> None:
        self.data: list[dict[str, object]] = [{"redlock:node-marker": "x"} for _ in range(n)]
        for i, counter in enumerate(counters or []):
            self.data[i]["redlock:{r}:fence"] = counter
        self.down = down
        self.requests: list[Broadcast | Sleep] = []

    def execute(self, request: Broadcast | Sleep) -> list[object]:
        self.requests.append(request)
        if isinstance(request, Sleep):
            return []
        return [self.reply(call) for call in request.calls]

    def reply(self, call: Call) -> object:
        if call.node in self.down:
            return TimeoutError("no reply")
        db = self.data[call.node]
        if call.script is scripts.ACQUIRE:
            lock, fence, _ = call.keys
            owner = call.args[0]
            if lock in db:
                return [scripts.ACQUIRE_ALREADY_OURS if db[lock] == owner
                        else scripts.ACQUIRE_REFUSED, 1000]
            db[lock] = owner
            db[fence] = max(int(db.get(fence, 0)), int(call.args[2])) + 1  # type: ignore[call-overload]
            return [scripts.ACQUIRE_GRANTED, db[fence]]
        if call.script is scripts.WRITE_BACK:
            lock, fence, _ = call.keys
            if db.get(lock) != call.args[0]:
                return 0
            db[fence] = max(int(db.get(fence, 0)), int(call.args[1]))  # type: ignore[call-overload]
            return 1
        if call.script is scripts.RELEASE:
            lock = call.keys[0]
            if db.get(lock) == call.args[0]:
                del db[lock]
                return 1
            return 0
        if call.script is None and call.args == ("INFO",):
            return b"# Replication\r\nrole:slave\r\n" if call.node == 1 else b"role:master\r\n"
        raise AssertionError(f"unexpected call {call}")

    def scripts_sent(self) -> list[str]:
        return [r.calls[0].script.name for r in self.requests
                if isinstance(r, Broadcast) and r.calls and r.calls[0].script is not None]


def make_core(n: int, clock: FakeClock | None = None) -> RedlockCore:
    """A core past its one-time node inspection (tested on its own below), so each test
    sees only the protocol round trips it is about."""
    core = RedlockCore([f"n{i}:6379" for i in range(n)], Settings(), clock or FakeClock())
    core.amnesia.health.inspected = True
    return core


def test_first_acquire_inspects_every_node_once_then_never_again() -> None:
    nodes = ScriptedNodes(3)
    core = RedlockCore([f"n{i}:6379" for i in range(3)], Settings(), FakeClock())
    with capture_events() as events:
        for _ in range(2):
            result = drive(core.acquire("r", 10.0, blocking=False, timeout=None),
                                       nodes.execute)
            assert result.state is not None
            drive(core.release(result.state), nodes.execute)
    first = nodes.requests[0]
    assert isinstance(first, Broadcast)
    assert [(c.node, c.args) for c in first.calls] == [(i, ("INFO",)) for i in range(3)]
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
    nodes = ScriptedNodes(5, counters=[10, 5, 5, 5, 5])
    nodes.data[0]["redlock:{r}:lock"] = "someone else"
    nodes.data[1]["redlock:{r}:lock"] = "someone else"
    result = drive(make_core(5).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is not None
    assert result.state.token == 6
    assert nodes.scripts_sent() == ["acquire"]  # all three granting nodes returned 6

    nodes = ScriptedNodes(5, counters=[5, 5, 10, 5, 5])
    nodes.data[0]["redlock:{r}:lock"] = "someone else"
    nodes.data[1]["redlock:{r}:lock"] = "someone else"
    result = drive(make_core(5).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is not None
    assert result.state.token == 11
    assert nodes.scripts_sent() == ["acquire", "write_back"]
    write_back = nodes.requests[1]
    assert isinstance(write_back, Broadcast)
    assert sorted(c.node for c in write_back.calls) == [3, 4]
    assert [nodes.data[i]["redlock:{r}:fence"] for i in range(5)] == [5, 5, 11, 11, 11]


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

    def slow(request: Broadcast | Sleep) -> list[object]:
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

    def execute(request: Broadcast | Sleep) -> list[object]:
        if isinstance(request, Sleep):
            assert request.seconds > 0
            clock.advance(request.seconds)
        return nodes.execute(request)

    result = drive(make_core(3, clock).acquire("r", 10.0, blocking=True,
                                                           timeout=1.0), execute)
    assert result.state is None
    assert not result.unavailable  # contention, not an outage
    assert result.attempts > 1
    sleeps = [r for r in nodes.requests if isinstance(r, Sleep)]
    assert sleeps and all(s.line == "redlock:{r}:released" for s in sleeps)
    # Between retry_delay_min and retry_delay_max, except the last one cut at the deadline.
    settings = Settings()
    assert all(settings.retry_delay_min <= s.seconds <= settings.retry_delay_max
               for s in sleeps[:-1])
    assert clock() - 1000.0 == pytest.approx(1.0, abs=0.3)  # stopped at the deadline
