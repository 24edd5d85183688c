"""Pure unit tests of the sans-IO rules (:mod:`redlock._core.settings`,
:mod:`redlock._core.tokens`, :mod:`redlock._core.state`, :mod:`redlock._scripts.replies`,
:mod:`redlock._io.failures`): no servers, no sockets.

Quorum, validity and drift, the token rule, reply classification, LockState with an
injected clock, the validators. The protocols (acquire, release, extend, watchdog,
repair) on scripted nodes: the other files of tests/core.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redlock import LockLost, NodeResult, NotHeld, Outcome, RedlockError
from redlock._io.failures import LoginRefused, NoReply, NotSent
from redlock._io.resp import ReplyError
from tests.internals import (
    COUNTER_BUCKETS,
    PENDING,
    TOKEN_LIMIT,
    Keys,
    LockState,
    RedlockCore,
    Settings,
    Status,
    ack_outcome,
    acquire_outcome,
    as_failure,
    bucket,
    choose_token,
    marker_format,
    ours,
    quorum,
    real_environment,
    scripts,
    validate_node_addresses,
    validate_resource,
    validate_seconds,
    validate_timeout,
    validity_left,
)
from tests.scripted import FakeClock

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
# choose_token: the token rule of docs/design.md §3
# ---------------------------------------------------------------------------


def test_choose_token_agreeing_counters_need_no_write_back() -> None:
    choice = choose_token({0: 7, 1: 7, 2: 7})
    assert choice.token == 7
    assert sorted(choice.committed) == [0, 1, 2]
    assert choice.write_back == ()


def test_choose_token_takes_the_max_and_writes_back_only_to_lower_nodes() -> None:
    # The docs/design.md §3 example: counters 10,5,5,5,5; B wins {2,3,4} after A took {0,1,2}.
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


@settings(max_examples=300)
@given(n=st.integers(min_value=1, max_value=7), data=st.data())
def test_committed_tokens_never_go_backwards_in_a_random_history(n: int,
                                                                 data: st.DataObject) -> None:
    """A model of the token rule (docs/design.md §3) over three resources sharing each
    node's one counter (as names of one bucket do).

    Each step, one resource changes hands (sequential holders per resource; resources
    interleave). A holder wins a random quorum; on each granting node the acquire script
    takes max(node counter, floor) + 1 and raises the node counter to it. It takes
    choose_token's max and writes it back (owner-checked, so as its own acquire did) to
    the lower granting nodes; a random subset of write-backs is lost; it commits only
    with >= q nodes at >= token. The floor is any value some node reported. Committed
    tokens must rise strictly per resource.
    """
    q = quorum(n)
    resources = ("a", "b", "c")
    node_counter = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    seen = [0]
    committed: dict[str, list[int]] = {r: [] for r in resources}

    def reply(i: int, floor: int) -> int:
        value = max(node_counter[i], floor) + 1
        node_counter[i] = value
        return value

    for _ in range(data.draw(st.integers(1, 16))):
        r = data.draw(st.sampled_from(resources))
        granting = data.draw(st.sets(st.integers(0, n - 1), min_size=q))
        floor = data.draw(st.sampled_from([0, *seen]))
        replies = {i: reply(i, floor) for i in granting}
        seen.extend(replies.values())
        choice = choose_token(replies)
        acked = 0
        for i in choice.write_back:
            if data.draw(st.booleans()):  # this write-back reached the node
                node_counter[i] = max(node_counter[i], choice.token)
                acked += 1
        if len(choice.committed) + acked >= q:
            committed[r].append(choice.token)
    for tokens in committed.values():
        assert tokens == sorted(set(tokens))


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
        ([scripts.ACQUIRE_OTHER_FORMAT, 2], Outcome.INCOMPATIBLE, None, None),
        ([scripts.ACQUIRE_OTHER_FORMAT, -1], Outcome.INCOMPATIBLE, None, None),
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
def test_acquire_outcome(reply: object, outcome: Outcome, counter: int | None,
                                pttl: int | None) -> None:
    result = acquire_outcome("n1:6379", reply)
    assert result.node == "n1:6379"
    assert result.outcome is outcome
    assert result.counter == counter
    assert result.pttl_ms == pttl
    if outcome is Outcome.ERROR:
        assert result.detail  # says what was unexpected


def test_acquire_outcome_refused_and_amnesiac_say_why() -> None:
    refused = acquire_outcome("a", [scripts.ACQUIRE_REFUSED, 500])
    assert "500 ms" in refused.detail and "another owner" in refused.detail
    amnesiac = acquire_outcome("a", [scripts.ACQUIRE_AMNESIAC, 0])
    assert "marker" in amnesiac.detail
    assert str(refused).startswith("a refused (")


def test_a_marker_of_another_format_is_named_in_the_outcome() -> None:
    """A node whose marker names another format than this client's (docs/design.md
    §4.1): its refusal says which, and what to do; a marker that names none is told
    apart from a newer one. What readers take a marker's format to be."""
    newer = acquire_outcome("a", [scripts.ACQUIRE_OTHER_FORMAT, 3])
    assert str(newer) == ("a incompatible (initialised by a newer format 3 of redlock-fenced"
                          " (this client reads format 1))")
    unreadable = acquire_outcome("a", [scripts.ACQUIRE_OTHER_FORMAT, -1])
    assert unreadable.detail == ("initialised by another release of redlock-fenced: its node"
                                 " marker names no format this client reads (format 1)")
    assert [marker_format(m) for m in (b"format=1 run_id=ab initialised", "format=12 x",
                                       "run_id=ab initialised", "format=x y", "format=٣ z",
                                       "")] == [1, 12, None, None, None, None]
    assert ours(b"format=1 run_id=ab") and not ours("format=2 run_id=ab")
    assert not ours("format=10 run_id=ab") and not ours("run_id=ab initialised")


@pytest.mark.parametrize("exc", [ConnectionRefusedError("refused"), TimeoutError(),
                                 RuntimeError("NOSCRIPT boom")])
def test_acquire_outcome_exception_is_an_error_naming_the_type(exc: Exception) -> None:
    result = acquire_outcome("n", exc)
    assert result.outcome is Outcome.ERROR
    assert result.detail.startswith(type(exc).__name__ + ":")


@pytest.mark.parametrize("reply", [[b"x", 1], [None, None]])
def test_acquire_outcome_malformed_pair_is_an_error_not_a_crash(reply: object) -> None:
    assert acquire_outcome("n", reply).outcome is Outcome.ERROR


def test_ack_outcome() -> None:
    assert ack_outcome("n", 1, refused="gone").outcome is Outcome.GRANTED
    refused = ack_outcome("n", 0, refused="gone")
    assert (refused.outcome, refused.detail) == (Outcome.REFUSED, "gone")
    # Only a 0 the node sent says our key is gone: a reply of another shape, or one that
    # was never read, says nothing about it (reading an unread reply as "gone" made the
    # renewal loop delete healthy locks on a busy event loop).
    assert ack_outcome("n", None, refused="x").outcome is Outcome.ERROR
    unread = ack_outcome("n", PENDING, refused="x")
    assert unread.outcome is Outcome.ERROR and "no reply was read" in unread.detail
    assert acquire_outcome("n", PENDING).outcome is Outcome.ERROR
    error = ack_outcome("n", ConnectionError("down"), refused="x")
    assert error.outcome is Outcome.ERROR and "down" in error.detail


def test_permanent_errors_are_credentials_permissions_and_the_wrong_kind_of_node() -> None:
    """The I/O's errors and error replies, mapped once at its boundary
    (redlock/_io/failures.py)."""
    def permanent(error: Exception) -> bool:
        return as_failure(error).permanent

    assert permanent(LoginRefused("WRONGPASS invalid username-password pair (to AUTH)"))
    assert permanent(ReplyError("WRONGPASS invalid username-password pair"))
    assert permanent(ReplyError("NOPERM this user has no permissions"))
    assert permanent(ReplyError("NOAUTH Authentication required."))
    # A call of more than 10 arguments without a password.
    assert permanent(ReplyError("ERR Protocol error: unauthenticated multibulk length"))
    assert permanent(ReplyError("READONLY You can't write against a read only replica."))
    assert permanent(ReplyError("CROSSSLOT Keys in request don't hash to the same slot"))
    assert not permanent(NoReply("timed out"))
    assert not permanent(ConnectionRefusedError("refused"))
    assert not permanent(ReplyError("BUSY Redis is busy running a script"))
    failure = as_failure(LoginRefused("WRONGPASS invalid password (to AUTH)"))
    assert failure.detail.startswith("LoginRefused: WRONGPASS invalid password (to AUTH)"
                                     " (the node refused the credentials: give the user and"
                                     " password")


def test_a_failed_attempt_releases_wherever_its_acquire_may_have_run() -> None:
    """Not where a node refused (it set nothing), nor where the acquire was never
    written (NotSent: its connection was still opening); everywhere else, a reply not
    read included (docs/design.md §2.4)."""
    from redlock._scripts.replies import NOT_AWAITED, FailureKind, acquire_set_nothing

    unsent = as_failure(NotSent("still connecting (connect_timeout 1 s)"))
    assert unsent.kind is FailureKind.TIMEOUT and unsent.unsent
    assert acquire_set_nothing(unsent)
    assert acquire_set_nothing([scripts.ACQUIRE_REFUSED, 1500])
    assert not acquire_set_nothing(as_failure(NoReply("no reply")))
    assert not acquire_set_nothing(as_failure(ConnectionResetError("reset")))
    assert not acquire_set_nothing(NOT_AWAITED)
    assert not acquire_set_nothing([scripts.ACQUIRE_GRANTED, 7])


# ---------------------------------------------------------------------------
# LockState with an injected clock
# ---------------------------------------------------------------------------


def make_state(clock: FakeClock, ttl: float = 10.0) -> LockState:
    return LockState("res", "owner", ttl, token=5, deadline=clock() + ttl, clock=clock,
                     mutex=threading.Lock())


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
    core = RedlockCore(["a:1"], Settings(max_ttl=60.0), real_environment())
    settings = core.settings
    assert settings.check_ttl(1) == 1.0
    with pytest.raises(ValueError, match="drift"):
        settings.check_ttl(0.002)  # drift alone is 2 ms + 1 %
    with pytest.raises(ValueError, match="maximum"):
        settings.check_ttl(61)


def test_a_resources_bucket_is_part_of_the_format_and_never_changes() -> None:
    """A resource whose name hashed to another bucket in a later release could get a
    token below one it already had (docs/design.md §3.0): the function is pinned."""
    assert COUNTER_BUCKETS == 1024
    assert [bucket(name) for name in ("orders:42", "r", "a", "", "é")] == [
        "197", "925", "579", "0", "318"]
    assert {bucket(f"job:{i}") for i in range(20_000)} == {str(b) for b in range(1024)}


def test_keys_share_one_hash_tag_per_resource_and_a_node_keeps_a_fixed_set() -> None:
    keys = Keys("app")
    assert keys.lock("orders:42") == "app:{orders:42}:lock"
    assert keys.channel("orders:42") == "app:{orders:42}:released"
    assert keys.line("orders:42") == "app:{orders:42}:line"
    assert (keys.counter, keys.marker, keys.episode, keys.repair_guard, keys.members) == (
        "app:node:fence", "app:node:marker", "app:node:amnesia", "app:node:repair",
        "app:node:members")
