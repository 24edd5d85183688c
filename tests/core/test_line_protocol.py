"""The waiting line in the acquire protocol (scripted nodes, tests/scripted.py) and the
wake-up bookkeeping (redlock._io.wakeups) on their own: who gets a ticket, what a failed
attempt releases, who leaves the line when, and whom a release message wakes."""

from __future__ import annotations

import re
import threading

import pytest

from tests.internals import (
    LINE_POLL_MAX,
    Backoff,
    Broadcast,
    Invoke,
    Wait,
    WakeRegistry,
    drive,
    scripts,
)
from tests.internals import (
    waiter_id as internal_waiter_id,
)
from tests.scripted import FakeClock, ScriptedNodes, make_core


def waiter_id(owner: object) -> str:
    return internal_waiter_id(str(owner))


def held_by_another(nodes: ScriptedNodes) -> None:
    for db in nodes.data:
        db["redlock:{r}:lock"] = "holder"


def acquire_calls(nodes: ScriptedNodes) -> list[Broadcast]:
    return [r for r in nodes.requests if isinstance(r, Broadcast)
            and r.calls and r.calls[0].script is scripts.ACQUIRE]


def release_calls(nodes: ScriptedNodes) -> list[Broadcast]:
    return [r for r in nodes.requests if isinstance(r, Broadcast)
            and r.calls and r.calls[0].script is scripts.RELEASE]


def run_blocking(nodes: ScriptedNodes, clock: FakeClock, timeout: float,
                 free_after: int | None = None) -> object:
    """A blocking acquire whose sleeps advance the clock; the holder's keys go after
    ``free_after`` sleeps (None: never)."""
    sleeps = [0]

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        if isinstance(request, Wait):
            clock.advance(request.seconds)
            sleeps[0] += 1
            if sleeps[0] == free_after:
                for db in nodes.data:
                    db.pop("redlock:{r}:lock", None)
        return nodes.execute(request)

    return drive(make_core(3, clock).acquire("r", 10.0, blocking=True, timeout=timeout),
                 execute)


def test_a_single_try_has_no_ticket_and_a_blocking_acquire_keeps_one() -> None:
    nodes = ScriptedNodes(3)
    held_by_another(nodes)
    drive(make_core(3).acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    drive(make_core(3).acquire("r", 10.0, blocking=True, timeout=0), nodes.execute)
    assert [call.args[3] for b in acquire_calls(nodes) for call in b.calls] == [""] * 6
    assert not any(line for lines in nodes.lines for line in lines.values())  # no queue

    nodes = ScriptedNodes(3)
    held_by_another(nodes)
    clock = FakeClock()
    result = run_blocking(nodes, clock, timeout=2.0, free_after=3)
    assert result.state is not None  # type: ignore[attr-defined]
    tickets = {call.args[3] for b in acquire_calls(nodes) for call in b.calls}
    assert len(tickets) == 1 and str(tickets.pop()).isdigit()  # one ticket, every attempt
    assert all(int(call.args[4]) > 0 for b in acquire_calls(nodes) for call in b.calls)


def test_a_failed_attempt_releases_only_where_it_may_have_set_a_key_and_keeps_its_place(
        ) -> None:
    nodes = ScriptedNodes(3, down={2})
    nodes.data[1]["redlock:{r}:lock"] = "holder"
    clock = FakeClock()
    result = run_blocking(nodes, clock, timeout=0.05)
    assert result.state is None  # type: ignore[attr-defined]
    releases = release_calls(nodes)
    # Per attempt: node 0 granted, node 1 refused (sets nothing), node 2 did not answer.
    assert all(sorted(c.node for c in b.calls) == [0, 2] for b in releases[:-1])
    assert all(c.args[1] == "0" for b in releases[:-1] for c in b.calls)
    # The call is over: it leaves the line on every node.
    assert sorted(c.node for c in releases[-1].calls) == [0, 1, 2]
    assert all(c.args[1] == "1" for c in releases[-1].calls)
    assert not any(line for lines in nodes.lines for line in lines.values())


def test_waits_in_line_name_the_waiter_and_may_be_patient() -> None:
    nodes = ScriptedNodes(3)
    held_by_another(nodes)
    run_blocking(nodes, FakeClock(), timeout=1.0)
    sleeps = [r for r in nodes.requests if isinstance(r, Wait)]
    owner, route = (acquire_calls(nodes)[0].calls[0].args[i] for i in (0, 7))
    assert sleeps and all(s.waiter == waiter_id(owner) for s in sleeps)
    # The resource's channel, and its manager's route there, where hand-offs to it are
    # told (docs/design.md §6.7): the route its attempts record on the nodes.
    assert isinstance(route, str) and re.fullmatch("[0-9a-f]{8}", route)
    assert all(s.channels == ("redlock:{r}:released", f"redlock:{{r}}:released:{route}")
               for s in sleeps)
    # Patient: up to the holder's key expiry (1 s left in the scripted reply) or the poll
    # that keeps its place, whichever is first; cut at the deadline at the end.
    assert all(s.patient is not None and s.patient <= LINE_POLL_MAX for s in sleeps)


def test_an_interrupted_wait_leaves_the_line() -> None:
    nodes = ScriptedNodes(3)
    held_by_another(nodes)
    protocol = make_core(3).acquire("r", 10.0, blocking=True, timeout=None)
    request = next(protocol)
    while not isinstance(request, Wait):
        request = protocol.send(nodes.execute(request))
    assert any(nodes.lines[i]["redlock:{r}:line"] for i in range(3))
    leave = protocol.throw(KeyboardInterrupt())
    assert isinstance(leave, Broadcast) and leave.calls[0].script is scripts.RELEASE
    assert all(c.args[1] == "1" for c in leave.calls)
    nodes.execute(leave)
    with pytest.raises(KeyboardInterrupt):
        protocol.send([])
    assert all(not nodes.lines[i]["redlock:{r}:line"] for i in range(3))


class Cancelled(BaseException):
    """An interruption, as asyncio's cancellation is (not an Exception)."""


def test_an_interruption_while_a_failed_attempt_gives_back_leaves_the_line() -> None:
    """Cancelled while a refused attempt gives back what it may have set on a node that
    did not answer (a release that keeps the waiter's place): the call still leaves the
    line. An entry left behind is first in line for the holder's release, which hands
    it the lock (§6.7): the lock then stays for the waiter's TTL, for nobody (seen on a
    busy event loop: a waiter cancelled there left its reservation on every node)."""
    nodes = ScriptedNodes(3)
    held_by_another(nodes)
    protocol = make_core(3).acquire("r", 10.0, blocking=True, timeout=None)
    request = next(protocol)
    assert isinstance(request, Broadcast)
    replies = nodes.execute(request)
    replies[2] = TimeoutError("no reply")  # node 2 ran it (refused), its reply was lost
    give_back = protocol.send(replies)
    assert isinstance(give_back, Broadcast) and give_back.calls[0].script is scripts.RELEASE
    assert [c.node for c in give_back.calls] == [2] and give_back.calls[0].args[1] == "0"
    nodes.execute(give_back)
    assert all(nodes.lines[i]["redlock:{r}:line"] for i in range(3))  # places kept
    leave = protocol.throw(Cancelled())  # interrupted at that release
    assert isinstance(leave, Broadcast) and leave.calls[0].script is scripts.RELEASE
    assert sorted(c.node for c in leave.calls) == [0, 1, 2]
    assert all(c.args[1] == "1" for c in leave.calls)
    nodes.execute(leave)
    with pytest.raises(Cancelled):
        protocol.send([])
    assert all(not nodes.lines[i]["redlock:{r}:line"] for i in range(3))


def test_a_set_does_not_queue() -> None:
    nodes = ScriptedNodes(3)
    held_by_another(nodes)
    clock = FakeClock()
    run_blocking_set = make_core(3, clock).acquire(("a", "r"), 10.0, blocking=True,
                                                   timeout=0.01)

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        if isinstance(request, Wait):
            clock.advance(request.seconds)
        return nodes.execute(request)

    drive(run_blocking_set, execute)
    sleeps = [r for r in nodes.requests if isinstance(r, Wait)]
    assert all(s.waiter is None and s.patient is None for s in sleeps)
    assert all(s.channels == ("redlock:{a}:released", "redlock:{r}:released") for s in sleeps)


# ---------------------------------------------------------------------------
# WakeRegistry: whom a message wakes
# ---------------------------------------------------------------------------


def test_a_message_naming_a_waiter_wakes_only_that_waiter() -> None:
    registry = WakeRegistry()
    first, second = threading.Event(), threading.Event()
    registry.watch(["c"], "a" * 40, first)
    registry.watch(["c"], "b" * 40, second)
    registry.deliver("c", "b" * 40)
    assert (first.is_set(), second.is_set()) == (False, True)
    registry.deliver("c", "f" * 40)  # a waiter of another process
    assert not first.is_set()


def test_a_message_naming_nobody_wakes_the_first_waiter_only() -> None:
    registry = WakeRegistry()
    events = [threading.Event() for _ in range(3)]
    for event in events:
        registry.watch(["c"], None, event)
    registry.deliver("c", "")
    assert [e.is_set() for e in events] == [True, False, False]


def test_a_release_during_a_waiters_first_attempt_wakes_its_first_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter watches from its first wait on; a release heard while its first attempt
    was still out (naming it, or nobody) woke no one and must end that wait at once,
    not after the patient wait (found by the compose stack: 0.5 s per hand-off)."""
    now = [100.0]
    monkeypatch.setattr("redlock._io.wakeups.time.monotonic", lambda: now[0])
    registry = WakeRegistry()
    call_started = now[0]
    now[0] += 0.01
    registry.deliver("c", "a" * 40)  # names our waiter, who does not watch yet
    registry.deliver("c", "b" * 40)  # names a waiter of another process
    now[0] += 0.01
    ours, theirs = threading.Event(), threading.Event()
    registry.watch(["c"], "a" * 40, ours, since=call_started)
    assert ours.is_set()
    registry.watch(["c"], "c" * 40, theirs, since=call_started)
    assert not theirs.is_set()  # named somebody else
    again = threading.Event()
    registry.watch(["c"], "a" * 40, again, since=call_started)
    assert not again.is_set()  # a release is claimed once
    registry.deliver("d", "")  # nobody in line, nobody waiting here
    later = threading.Event()
    registry.watch(["d"], "e" * 40, later, since=now[0] + 1.0)
    assert not later.is_set()  # heard before this call started
    early = threading.Event()
    registry.watch(["d"], "e" * 40, early, since=call_started)
    assert early.is_set()


def test_the_first_confirmed_subscription_wakes_every_waiter_to_look_again() -> None:
    registry = WakeRegistry()
    events = [threading.Event() for _ in range(2)]
    for event in events:
        registry.watch(["c"], "a" * 40, event)
    registry.subscribed(0, "c")
    assert all(e.is_set() for e in events)
    for event in events:
        event.clear()
    registry.subscribed(1, "c")  # already heard: nothing can have been missed
    assert not any(e.is_set() for e in events)
    assert registry.live("c")
    registry.node_lost(0)
    registry.node_lost(1)
    assert not registry.live("c")
    registry.subscribed(1, "c")  # heard again after nobody heard: look again
    assert all(e.is_set() for e in events)


def test_a_waiter_sleeps_its_patient_wait_only_once_releases_since_its_attempt_are_heard(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A release between a waiter's attempt and its subscription on a node was not
    heard there, and may have handed the lock to this very waiter: it waits its short
    backoff and tries again (its attempt takes the reservation) instead of its patient
    wait. A cold start of 8 threads on one lock slept 0.5 s that way in 3 of 33
    benchmark runs (BENCHMARKS.md, "Issue 21: where a contended hand-off spends its
    time"). Patient once a quorum of nodes was subscribed before its latest attempt."""
    from tests.internals import Waiter, WaitingRoom

    now = [100.0]
    monkeypatch.setattr("redlock._io.wakeups.time.monotonic", lambda: now[0])

    class Core:  # what the waiting room asks of the core here
        quorum = 2

    class Listener:
        def ensure_running(self) -> None:
            pass

        def poke(self) -> None:
            pass

    room = WaitingRoom(Core(), threading.Event, threading.Lock,  # type: ignore[arg-type]
                       lambda _registry: Listener(), threading.Event())
    waiter: Waiter[threading.Event] = Waiter()
    waiter.wake, waiter.sent = threading.Event(), 100.0
    backoff = Backoff(0.01, turns_key="c", channels=("c",), waiter="a" * 40, patient=0.5)
    assert room.watch_releases(backoff, waiter) == 0.01  # nothing subscribed yet
    now[0] = 100.2
    room.wakeups.subscribed(0, "c")
    room.wakeups.subscribed(1, "c")
    # Subscribed on a quorum, but after the attempt went out: not patient yet.
    assert room.watch_releases(backoff, waiter) == 0.01
    waiter.sent = 100.3  # its next attempt
    assert room.watch_releases(backoff, waiter) == 0.5
    room.wakeups.node_lost(1)  # one node short of a quorum heard: not patient
    assert room.watch_releases(backoff, waiter) == 0.01
    assert not room.wakeups.heard_since("c", None, 1)
    # A backoff longer than the patient wait (retry_delay_min of seconds) is cut to it
    # while the channel is live: the next attempt then counts on the subscriptions.
    slow = Backoff(2.0, turns_key="c", channels=("c",), waiter="a" * 40, patient=0.5)
    assert room.watch_releases(slow, waiter) == 0.5
    room.wakeups.node_lost(0)  # nothing heard at all: it polls as configured
    assert room.watch_releases(slow, waiter) == 2.0


def test_wanted_channels_linger_after_the_last_wait_then_go(monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    now = [100.0]
    monkeypatch.setattr("redlock._io.wakeups.time.monotonic", lambda: now[0])
    changes: list[int] = []
    registry = WakeRegistry(changed=lambda: changes.append(1))
    watch = registry.watch(["c", "d"], None, threading.Event())
    assert registry.wanted() == {"c", "d"} and changes == [1]
    registry.unwatch(watch)
    now[0] += 1.0
    assert registry.wanted() == {"c", "d"}  # lingering
    registry.watch(["c"], None, threading.Event())
    assert changes == [1]  # still subscribed: nothing to do
    now[0] += 5.0
    assert registry.wanted() == {"c"}
