"""Hand-off in the release (docs/design.md §6.7), free of I/O: which messages a waiter
counts, the wake-up registry's collection of them, and the acquire flow completing from
them on scripted nodes (whose RELEASE hands off as the Lua does,
tests/core/test_scripts_contract.py) without an ACQUIRE round, or falling back to one."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence

from redlock._core.members import Members, Rule, stable
from redlock._core.state import AcquireResult
from redlock.testing import capture_events
from tests.internals import (
    KEYS,
    MUTEX,
    Backoff,
    Broadcast,
    Handoffs,
    Heard,
    Invoke,
    RedlockCore,
    Wait,
    WakeRegistry,
    counted,
    drive,
    parse_message,
    scripts,
    waiter_id,
)
from tests.scripted import RESERVED, FakeClock, ScriptedNodes, lock_key, make_core

WAITER = "a" * 40
ABC = ("a:1", "b:1", "c:1")


def test_a_message_names_a_waiter_and_may_carry_a_hand_off() -> None:
    assert parse_message(WAITER) == (WAITER, None)
    assert parse_message("") == ("", None)
    assert parse_message(f"{WAITER} 12 3 7") == (WAITER, (12, 3, 7))
    assert parse_message(f"{WAITER} 12 3") == ("", None)  # malformed: names nobody
    assert parse_message(f"{WAITER} 12 x 7") == ("", None)
    assert parse_message(f"{'b' * 39} 12 3 7") == ("", None)


def test_only_messages_of_the_latest_attempt_under_our_epoch_from_judged_nodes_count() -> None:
    heard = [Heard(0, 5, 0, 2), Heard(1, 6, 0, 1), Heard(2, 7, 1, 2), Heard(3, 8, 0, 2),
             Heard(4, 9, 0, 2), Heard(5, 9, 0, 2)]
    # node 1: an older attempt's (its reservation may have been consumed since);
    # node 2: another epoch; node 4: restarted, not judged yet; node 5: the attempt's
    # reply from it was not read as a refusal (a timeout: its server run unknown).
    every = range(6)
    assert counted(heard, 2, 0, benched={4}, refused={0, 1, 2, 3, 4}) == {0: 5, 3: 8}
    assert counted(heard, 1, 0, benched=(), refused=every) == {1: 6}


def test_a_message_counts_only_by_a_subscription_up_before_the_attempt_went_out() -> None:
    """A node that restarted after the attempt broke the subscription's connection: a
    message by the new one may come from a run nobody judged (docs/design.md §4.4)."""
    heard = Handoffs([Heard(0, 5, 0, 1, subscribed=10.0), Heard(1, 5, 0, 1, subscribed=20.0),
                      Heard(2, 5, 0, 1)], 3)
    assert [h.node for h in heard.since(15.0)] == [0]
    assert heard.since(15.0).total == 3
    assert list(heard.since(None)) == []


def test_the_registry_stamps_each_message_with_its_subscription() -> None:
    registry = WakeRegistry()
    watch = registry.watch(["c"], WAITER, threading.Event())
    registry.subscribed(0, "c")
    registry.deliver("c", f"{WAITER} 5 0 1", node=0)
    [first] = registry.handoffs(watch)
    assert first.subscribed is not None
    registry.node_lost(0)  # the connection broke (the node may have restarted)
    registry.deliver("c", f"{WAITER} 6 0 1", node=0)  # (a stray, before resubscribing)
    assert [h.subscribed for h in registry.handoffs(watch)] == [None]
    registry.subscribed(0, "c")
    registry.deliver("c", f"{WAITER} 6 0 1", node=0)
    [again] = registry.handoffs(watch)
    assert again.subscribed is not None and again.subscribed >= first.subscribed


def test_the_registry_records_hand_offs_by_node_and_wakes_the_waiter_once_named() -> None:
    registry = WakeRegistry()
    event = threading.Event()
    watch = registry.watch(["c"], WAITER, event)
    registry.deliver("c", f"{WAITER} 5 0 1", node=0)
    assert event.is_set()
    registry.deliver("c", f"{'f' * 40} 5 0 1", node=1)  # someone else's
    registry.deliver("c", f"{WAITER} 6 0 2", node=0)  # a later one replaces it
    registry.deliver("c", f"{WAITER} 6 0 2", node=2)
    heard = registry.handoffs(watch)
    assert sorted(heard, key=lambda h: h.node) == [Heard(0, 6, 0, 2), Heard(2, 6, 0, 2)]
    assert heard.total == 3


def test_each_manager_and_each_forked_child_has_its_own_route() -> None:
    """Hand-offs are published on '<channel>:<route>' (docs/design.md §6.7): each
    manager has its own, and a forked child, whose listeners are its own, a new one."""
    core, other = make_core(3), make_core(3)
    assert re.fullmatch("[0-9a-f]{8}", core.route) and core.route != other.route
    before = core.route
    core.after_fork()
    assert re.fullmatch("[0-9a-f]{8}", core.route) and core.route != before


def test_a_hand_off_on_the_route_counts_by_the_route_s_own_subscription() -> None:
    """A waiter watches its resource's channel and its route there: a hand-off that
    came by the route wakes it and is stamped with the route's subscription (the one
    that brought it), a message on the resource's channel with that one's."""
    registry = WakeRegistry()
    registry.subscribed(0, "c")
    registry.subscribed(0, "c:0badf00d")
    event = threading.Event()
    watch = registry.watch(["c", "c:0badf00d"], WAITER, event)
    registry.deliver("c:0badf00d", f"{WAITER} 5 0 1", node=0)
    assert event.is_set()
    [heard] = registry.handoffs(watch)
    assert heard.subscribed == registry._live_since[("c:0badf00d", 0)]
    assert heard.subscribed >= registry._live_since[("c", 0)]


def test_hand_offs_heard_before_the_first_watch_are_claimed_with_it() -> None:
    registry = WakeRegistry()
    other = registry.watch(["c"], "f" * 40, threading.Event())  # keeps the channel wanted
    registry.deliver("c", f"{WAITER} 5 0 1", node=0)  # heard during our first attempt
    registry.deliver("c", f"{WAITER} 5 0 1", node=1)
    event = threading.Event()
    watch = registry.watch(["c"], WAITER, event, since=0.0)
    assert event.is_set()
    assert sorted(h.node for h in registry.handoffs(watch)) == [0, 1]
    registry.unwatch(other)


def test_the_quorum_rule_decides_joint_included() -> None:
    rule = Rule(ABC, Members(1, ABC, ("a:1", "d:1", "e:1")))
    # a majority of the old set, and only one of the new set's three: not enough.
    assert not rule.met(counted([Heard(0, 1, 1, 1), Heard(1, 1, 1, 1)], 1, 1, (), range(3)))
    assert Rule(ABC, stable(ABC)).met(counted([Heard(0, 1, 0, 1), Heard(1, 1, 0, 1)], 1, 0,
                                              (), range(3)))


# -- the flow, on scripted nodes ---------------------------------------------------------


def held_by_another(nodes: ScriptedNodes, resource: str = "r") -> None:
    for i in range(len(nodes.data)):
        nodes.data[i][lock_key(resource)] = "holder"
        nodes.ttl_ms[i][lock_key(resource)] = 30_000


def contended(n: int, counters: list[int]) -> tuple[ScriptedNodes, RedlockCore]:
    """``n`` scripted nodes on a fake clock (``nodes.clock``), with these fence
    ``counters``, whose key of "r" another owner holds; and a core on them."""
    nodes = ScriptedNodes(n, counters=counters, clock=FakeClock())
    held_by_another(nodes)
    return nodes, make_core(n, nodes.clock)


def release_by_holder(core: RedlockCore, nodes: ScriptedNodes, on: range | list[int],
                      resource: str = "r") -> None:
    """The holder's RELEASE (as it sends it) on ``on``: hands off where a record is."""
    for i in on:
        nodes.reply(MUTEX.release_call(core.keys, i, resource, ("holder", "1")))


def waiter_flow(core: RedlockCore, nodes: ScriptedNodes,
                on_wait: Callable[[Backoff, int], Handoffs], *, timeout: float = 10.0,
                ttl: float = 10.0) -> tuple[AcquireResult, list[Backoff]]:
    """A blocking acquire of "r"; each wait is answered by ``on_wait(backoff, its
    number)``: the hand-offs heard."""
    waits: list[Backoff] = []

    def execute(request: Broadcast | Wait | Invoke) -> Sequence[object]:
        if isinstance(request, Backoff):
            waits.append(request)
            reply = on_wait(request, len(waits))
            nodes.clock.advance(0.01)
            return reply
        return nodes.execute(request)

    result = drive(core.acquire("r", ttl, blocking=True, timeout=timeout), execute)
    return result, waits


def counters(nodes: ScriptedNodes) -> list[int]:
    return [nodes.counter(i) for i in range(len(nodes.data))]


def handed_off_everywhere(core: RedlockCore, nodes: ScriptedNodes
                          ) -> Callable[[Backoff, int], Handoffs]:
    """The waiter's first wait: the holder releases on every node, each handing off to
    the waiter (each recorded attempt 1's refusal), and all three messages are heard;
    later waits hear nothing."""
    def hand_off(backoff: Backoff, number: int) -> Handoffs:
        if number > 1:
            return Handoffs()
        release_by_holder(core, nodes, range(3))
        return Handoffs([Heard(i, c, 0, 1) for i, c in enumerate(counters(nodes))], 3)
    return hand_off


def test_a_waiter_handed_the_lock_on_every_node_completes_without_an_acquire_round() -> None:
    nodes, core = contended(3, [4, 4, 4])

    hand_off = handed_off_everywhere(core, nodes)
    with capture_events() as events:
        result, _ = waiter_flow(core, nodes, hand_off)
    assert result.state is not None
    assert result.state.token == 5
    assert nodes.scripts_sent() == ["acquire"]  # the refused attempt, nothing more
    waiter = RESERVED + waiter_id(result.state.value)
    assert [nodes.data[i][lock_key("r")] for i in range(3)] == [waiter] * 3
    assert [e["heard"] for e in events if e["event"] == "redlock.handed_off"] == [3]
    # An ordinary lock: it releases its reservations (and hands off to nobody).
    drive(core.holding.release(result.state), nodes.execute)
    assert all(lock_key("r") not in nodes.data[i] for i in range(3))


def test_counters_that_differ_are_written_back_onto_the_reservations() -> None:
    nodes, core = contended(3, [10, 4, 4])

    hand_off = handed_off_everywhere(core, nodes)
    result, _ = waiter_flow(core, nodes, hand_off)
    assert result.state is not None
    assert result.state.token == 11
    assert nodes.scripts_sent() == ["acquire", "write_back"]
    assert counters(nodes) == [11, 11, 11]
    # WRITE_BACK turned the reservations into the lock value.
    assert [nodes.data[i][lock_key("r")] for i in (1, 2)] == [result.state.value] * 2


def test_messages_that_do_not_count_fall_back_to_an_acquire_that_takes_the_reservations(
        ) -> None:
    for heard in ([Heard(i, 5, 0, 0) for i in range(3)],  # an older attempt's
                  [Heard(i, 5, 1, 1) for i in range(3)]):  # another epoch's
        nodes, core = contended(3, [4, 4, 4])

        def hand_off(backoff: Backoff, number: int, heard: list[Heard] = heard,
                     core: RedlockCore = core, nodes: ScriptedNodes = nodes) -> Handoffs:
            if number == 1:
                release_by_holder(core, nodes, range(3))
                return Handoffs(heard, 3)
            return Handoffs()

        result, _ = waiter_flow(core, nodes, hand_off)
        assert result.state is not None
        assert result.state.token == 5  # the reservation's, as the hand-off raised it
        assert nodes.scripts_sent() == ["acquire", "acquire"]


def test_a_benched_node_is_not_counted() -> None:
    nodes, core = contended(3, [4, 4, 4])

    def hand_off(backoff: Backoff, number: int) -> Handoffs:
        if number == 1:
            release_by_holder(core, nodes, range(3))
            core.amnesia.health.suspect[1] = (b"marker", "run")  # restarted, not judged
            core.amnesia.health.suspect[2] = (b"marker", "run")
            return Handoffs([Heard(i, 5, 0, 1) for i in range(3)], 3)
        core.amnesia.health.suspect.clear()
        return Handoffs()

    result, waits = waiter_flow(core, nodes, hand_off)
    assert result.state is not None
    # node 0 alone is no quorum: a wait for more, then the next attempt.
    assert waits[1].heard_before == 3
    assert nodes.scripts_sent() == ["acquire", "acquire"]


def test_fewer_than_a_quorum_of_messages_waits_a_little_for_more_then_asks_the_nodes(
        ) -> None:
    nodes, core = contended(3, [4, 4, 4])

    def hand_off(backoff: Backoff, number: int) -> Handoffs:
        if number == 1:  # the release reached node 0 only
            release_by_holder(core, nodes, [0])
            return Handoffs([Heard(0, 5, 0, 1)], 1)
        if number == 2:  # the wait for more: nothing came
            assert backoff.heard_before == 1 and backoff.patient is None
            return Handoffs([Heard(0, 5, 0, 1)], 1)
        release_by_holder(core, nodes, [1, 2])
        return Handoffs()

    result, waits = waiter_flow(core, nodes, hand_off)
    assert result.state is not None
    assert waits[1].seconds <= core.timeout(10.0)
    # The fallback's ACQUIRE took the reservation on node 0 and was refused on 1 and 2
    # (still held); released without leave it keeps its place, and a later one wins.
    assert nodes.scripts_sent()[:3] == ["acquire", "acquire", "release"]


def test_messages_heard_one_at_a_time_are_waited_for_until_they_make_a_quorum() -> None:
    """Each message ends a wait: the waiter waits again for the rest (within one
    request timeout) instead of falling back to an ACQUIRE round at the second."""
    nodes, core = contended(5, [4] * 5)

    def hand_off(backoff: Backoff, number: int) -> Handoffs:
        if number == 1:
            release_by_holder(core, nodes, range(5))
        return Handoffs([Heard(i, 5, 0, 1) for i in range(min(number, 3))], min(number, 3))

    result, waits = waiter_flow(core, nodes, hand_off)
    assert result.state is not None and result.state.token == 5
    assert [w.heard_before for w in waits] == [None, 1, 2]
    assert waits[0].wake_at is None  # the first message of a release wakes a waiter
    assert nodes.scripts_sent() == ["acquire"]


def test_a_wait_for_more_ends_when_the_nodes_left_cannot_make_a_quorum() -> None:
    """Nodes whose message for the latest attempt came without counting (their
    subscription was confirmed too late) send no other: nothing is waited for."""
    nodes, core = contended(3, [4, 4, 4])

    def hand_off(backoff: Backoff, number: int) -> Handoffs:
        if number == 1:
            release_by_holder(core, nodes, range(3))
            return Handoffs([Heard(0, 5, 0, 1)], 3, attempts={0: 1, 1: 1, 2: 1})
        return Handoffs()

    result, waits = waiter_flow(core, nodes, hand_off)
    assert result.state is not None and result.state.token == 5
    assert len(waits) == 1  # no wait for more: the next attempt takes the reservations
    assert nodes.scripts_sent() == ["acquire", "acquire"]


def test_a_wait_for_more_is_woken_once_enough_nodes_sent_theirs() -> None:
    """A waiter that heard one of the three messages it needs (N = 5) is not woken by
    the second: the registry wakes it at the third (or at a plain message)."""
    nodes, core = contended(5, [4] * 5)

    def hand_off(backoff: Backoff, number: int) -> Handoffs:
        if number == 1:
            release_by_holder(core, nodes, range(5))
            # node 4's came by a subscription confirmed too late: it does not count
            return Handoffs([Heard(0, 5, 0, 1)], 2, attempts={0: 1, 4: 1})
        heard = [Heard(i, 5, 0, 1) for i in range(3)]
        return Handoffs(heard, 4, attempts={**{h.node: 1 for h in heard}, 4: 1})

    result, waits = waiter_flow(core, nodes, hand_off)
    assert result.state is not None and result.state.token == 5
    assert waits[1].wake_at == (1, 4)  # node 4's, and three that count
    assert nodes.scripts_sent() == ["acquire"]

    registry = WakeRegistry()
    event = threading.Event()
    watch = registry.watch(["c"], WAITER, event)
    for node in range(5):
        registry.subscribed(node, "c")
    registry.deliver("c", f"{WAITER} 5 0 1", node=0)
    assert registry.expect(watch, 1, (1, 3)) is False
    event.clear()
    registry.deliver("c", f"{WAITER} 5 0 1", node=1)
    assert not event.is_set()
    registry.deliver("c", f"{WAITER} 5 0 1", node=2)
    assert event.is_set()
    assert registry.expect(watch, 3, (1, 3)) is True  # it has them: no wait at all
    event.clear()
    registry.deliver("c", WAITER, node=3)  # a plain wake still wakes
    assert event.is_set()
    registry.handoffs(watch)  # the wait is over: every message wakes again
    event.clear()
    registry.deliver("c", f"{WAITER} 6 0 2", node=0)
    assert event.is_set()
    # Subscribed on two nodes only: no third message can come, two wake it.
    for node in range(2, 5):
        registry.unsubscribed(node, "c")
    assert registry.expect(watch, 0, (2, 3)) is False
    event.clear()
    registry.deliver("c", f"{WAITER} 6 0 2", node=1)
    assert event.is_set()


def test_a_hand_off_without_validity_left_is_not_used() -> None:
    nodes, core = contended(3, [4, 4, 4])

    def hand_off(backoff: Backoff, number: int) -> Handoffs:
        if number == 1:
            release_by_holder(core, nodes, range(3))
            nodes.clock.advance(5.0)  # the waiter's thread stalled past its TTL
            return Handoffs([Heard(i, 5, 0, 1) for i in range(3)], 3)
        return Handoffs()

    with capture_events() as events:
        result, _ = waiter_flow(core, nodes, hand_off, ttl=2.0)
    assert [e["event"] for e in events if "hand" in e["event"]] == ["redlock.handoff_unused"]
    assert result.state is not None
    assert nodes.scripts_sent() == ["acquire", "acquire"]


def test_an_election_campaign_records_no_hand_off() -> None:
    from tests.internals import AcquireArgs, Leadership
    args = AcquireArgs("owner", 1000, 0, "5", 1000, attempt=3)
    [leader] = Leadership(identity="me").acquire_calls(KEYS, range(1), ("e",), args)
    [mutex] = MUTEX.acquire_calls(KEYS, range(1), ("e",), args)
    assert leader.script is scripts.ACQUIRE and leader.args[6] == ""
    assert mutex.args[6] == 3
    single = MUTEX.acquire_calls(KEYS, range(1), ("e",),
                                 AcquireArgs("owner", 1000, 0, "", 1000, attempt=3))
    assert single[0].args[6] == ""  # a single try does not queue
