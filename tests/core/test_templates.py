"""Call templates (docs/design.md §2.6), pure logic: the hot scripts' calls (ACQUIRE of one
resource, RELEASE) are made from templates only, and a filled template is exactly the call
the script's header describes, value for value, and its packed command the bytes the
transports would write for that call (hiredis's and the plain packer's). A template is
checked when it is made: a hole in the wrong place is an error, never a silent way
around the template. The other scripts' calls are built each time, unpacked."""

from __future__ import annotations

import threading

import hiredis
import pytest

from tests.internals import (
    KEYS,
    MUTEX,
    AcquireArgs,
    Call,
    Hole,
    Leadership,
    LockState,
    Permit,
    Template,
    acquire_templates_kept,
    bucket,
    plain_pack,
    render_call,
    scripts,
    with_epoch,
)
from tests.scripted import make_core

TICKET = "1764086400123456"


def expected_acquire(n: int, resource: str, args: AcquireArgs, epoch: int) -> tuple[Call, ...]:
    """ACQUIRE's calls as its header says (KEYS: lock, counters, marker, line, its
    deadlines, its hand-off records, the membership record; ARGV: owner, ttl, floor,
    ticket, patience, bucket, attempt and route for a queued waiter, the epoch)."""
    queued = args.ticket != ""
    record = queued and args.attempt != 0
    call_args = (args.value, args.ttl_ms, args.floor, args.ticket, args.patience_ms,
                 bucket(resource), args.attempt if record else "",
                 *((args.route,) if record and args.route else ()), epoch)
    keys = (KEYS.lock(resource), KEYS.counter, KEYS.marker, KEYS.line(resource),
            KEYS.line_deadlines(resource), KEYS.line(resource) + "-ttls", KEYS.horizon,
            KEYS.members)
    return tuple(Call(i, call_args, scripts.ACQUIRE, keys) for i in range(n))


def assert_packed(calls: tuple[Call, ...], packed: bytes | None) -> None:
    """``packed`` is the EVALSHA command every one of ``calls`` sends, as the transports
    would pack it."""
    command = render_call(calls[0], evalsha=True)
    assert packed == hiredis.pack_command(command) == plain_pack(command)
    assert all(render_call(call, evalsha=True) == command for call in calls)


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("queued", [True, False])
@pytest.mark.parametrize(("epoch", "route"), [(0, "0badf00d"), (7, "c0ffee42"), (0, "")])
def test_a_filled_acquire_template_is_the_scripts_call(n: int, queued: bool, epoch: int,
                                                         route: str) -> None:
    first = None
    for attempt in (1, 2, 9, 300):
        args = AcquireArgs(f"{attempt:032x}{attempt:08x}", 5000, 17 * attempt,
                           TICKET if queued else "", 1100 + attempt, attempt, route)
        calls, packed = MUTEX.acquire_request(KEYS, range(n), ("orders",), args, epoch)
        assert calls == expected_acquire(n, "orders", args, epoch)
        assert_packed(calls, packed)
        assert [c.node for c in calls] == list(range(n))
        assert all(c.args is calls[0].args for c in calls)  # packed once per request
        first = first or calls
        assert calls[0].keys is first[0].keys  # from the one template, filled in
    # The calls without the epoch (what with_epoch adds) are the same template's.
    plain = MUTEX.acquire_calls(KEYS, range(n), ("orders",), args)
    assert with_epoch(plain, KEYS, epoch) == calls


def test_templates_are_kept_per_name_ttl_epoch_and_route() -> None:
    for resource, ttl_ms, epoch, route in [("a", 5000, 0, "r1"), ("b", 5000, 0, "r1"),
                                          ("a", 900, 0, "r1"), ("a", 5000, 3, "r1"),
                                          ("a", 5000, 0, "r2"), ("a", 5000, 0, "r1")]:
        args = AcquireArgs("e" * 40, ttl_ms, 0, TICKET, 1100, 1, route)
        calls, packed = MUTEX.acquire_request(KEYS, range(3), (resource,), args, epoch)
        assert calls == expected_acquire(3, resource, args, epoch)
        assert_packed(calls, packed)


def test_an_election_takes_the_locks_template_the_other_kinds_are_built_each_time() -> None:
    args = AcquireArgs("f" * 40, 5000, 5, TICKET, 1100, 2, "r")
    leader = Leadership(identity="a")
    calls, packed = leader.acquire_request(KEYS, range(3), ("cron",), args, 0)
    assert calls[0].script is scripts.ACQUIRE and calls[0].keys[0] == KEYS.part("cron", "leader")
    assert calls == with_epoch(leader.acquire_calls(KEYS, range(3), ("cron",), args), KEYS, 0)
    assert_packed(calls, packed)
    for kind, resources in [(Permit(permits=3).for_call("f" * 32), ("jobs",)),
                            (MUTEX, ("a", "b"))]:
        calls, packed = kind.acquire_request(KEYS, range(3), resources, args, 0)
        assert calls == with_epoch(kind.acquire_calls(KEYS, range(3), resources, args), KEYS, 0)
        assert packed is None


@pytest.mark.parametrize("n", [1, 3])
def test_a_holders_release_is_the_scripts_call(n: int) -> None:
    core = make_core(n)
    for owner in ("1" * 40, "2" * 40):
        state = LockState("orders", owner, 10.0, 1, 100.0, lambda: 0.0, threading.Lock())
        request = core.holding.release_request(state)
        # RELEASE's header: KEYS lock, channel, line, deadlines, hand-off records,
        # counters, marker, membership record, horizon; ARGV owner, leave, patience, bucket.
        assert request.calls == tuple(Call(
            i, (owner, "1", "", bucket("orders")), scripts.RELEASE,
            (KEYS.lock("orders"), KEYS.channel("orders"), KEYS.line("orders"),
             KEYS.line_deadlines("orders"), KEYS.line("orders") + "-ttls", KEYS.counter,
             KEYS.marker, KEYS.members, KEYS.horizon)) for i in range(n))
        assert request.calls == tuple(MUTEX.release_call(KEYS, i, "orders", (owner, "1"))
                                      for i in range(n))
        assert_packed(request.calls, request.packed)


def test_a_failed_attempts_release_keeps_or_puts_back_its_place() -> None:
    kept = MUTEX.release_call(KEYS, 2, "orders", ("o" * 40, "0", 1100, ""))
    assert kept.node == 2 and kept.args == ("o" * 40, "0", 1100, bucket("orders"))
    back = MUTEX.release_call(KEYS, 0, "orders", ("o" * 40, "0", 1100, TICKET))
    assert back.args == ("o" * 40, "0", 1100, bucket("orders"), TICKET)
    calls, packed = MUTEX.release_request(KEYS, [0, 2], ("orders",), ("o" * 40, "0", 1100,
                                                                        TICKET))
    assert [c.node for c in calls] == [0, 2] and calls[0].args == back.args
    assert_packed(calls, packed)


def test_a_template_is_checked_when_made() -> None:
    owner, floor = Hole(0, "owner"), Hole(1, "floor")
    # A value placed twice, among the keys, or one the template is not filled with.
    with pytest.raises(ValueError, match="holes"):
        Template(scripts.RELEASE, ("k",), (owner, owner), 2)
    with pytest.raises(ValueError, match="keys"):
        Template(scripts.RELEASE, (owner,), ("x",), 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="holes"):
        Template(scripts.RELEASE, ("k",), (owner, Hole(2, "ticket")), 2)
    template = Template(scripts.RELEASE, ("k",), (floor, "é", owner), 2)
    calls, packed = template.fill(("ö" * 3, 12), range(1))
    assert calls == (Call(0, (12, "é", "ö" * 3), scripts.RELEASE, ("k",)),)
    assert_packed(calls, packed)
    [call], _ = Template(scripts.RELEASE, ("k",), (owner,), 1).fill(("o",), [4])
    assert call == Call(4, ("o",), scripts.RELEASE, ("k",))


def test_the_templates_kept_are_bounded() -> None:
    for i in range(3000):
        MUTEX.acquire_request(KEYS, range(1), (f"name-{i}",),
                              AcquireArgs("a" * 40, 5000, 0, "", 1, 1), 0)
    assert acquire_templates_kept() <= 1024
