"""Call templates (docs/design.md §2.6), pure logic: a filled template is exactly the call
the kind's builder makes, value for value, and its packed command the bytes the transports
would write for that call (hiredis's and the plain packer's); where no exact template can
be made, the builder's own calls go out, unpacked."""

from __future__ import annotations

import threading

import hiredis
import pytest

from tests.internals import (
    KEYS,
    MUTEX,
    AcquireArgs,
    Call,
    CallTemplates,
    Leadership,
    LockState,
    Marker,
    Permit,
    make_template,
    plain_pack,
    render_call,
    scripts,
    with_epoch,
)
from tests.scripted import make_core

TICKET = "1764086400123456"


def built(kind: object, n: int, resources: tuple[str, ...], ttl_ms: int, epoch: int,
          route: str, values: tuple[str, int, str, int, int]) -> tuple[Call, ...]:
    """The calls as the kind's builder makes them, without any template."""
    owner, floor, ticket, patience_ms, attempt = values
    args = AcquireArgs(owner, ttl_ms, floor, ticket, patience_ms, attempt, route)
    return with_epoch(kind.acquire_calls(KEYS, range(n), resources, args),  # type: ignore[attr-defined]
                      KEYS, epoch)


def assert_packed(calls: tuple[Call, ...], packed: bytes | None) -> None:
    """``packed`` is the EVALSHA command every one of ``calls`` sends, as the transports
    would pack it."""
    command = render_call(calls[0], evalsha=True)
    assert packed == hiredis.pack_command(command) == plain_pack(command)
    assert all(render_call(call, evalsha=True) == command for call in calls)


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("queued", [True, False])
@pytest.mark.parametrize(("epoch", "route"), [(0, "0badf00d"), (7, "c0ffee42"), (0, "")])
def test_a_filled_acquire_template_is_the_builders_call(n: int, queued: bool, epoch: int,
                                                          route: str) -> None:
    templates = CallTemplates(KEYS, n)
    first = None
    for attempt in (1, 2, 9, 300):
        values = (f"{attempt:032x}{attempt:08x}", 17 * attempt, TICKET if queued else "",
                  1100 + attempt, attempt)
        calls, packed = templates.acquire(MUTEX, ("orders",), 5000, epoch, route, values)
        assert calls == built(MUTEX, n, ("orders",), 5000, epoch, route, values)
        assert_packed(calls, packed)
        assert [c.node for c in calls] == list(range(n))
        assert all(c.args is calls[0].args for c in calls)  # packed once per request
        first = first or calls
        assert calls[0].keys is first[0].keys  # from the one template, filled in


def test_templates_are_kept_per_name_ttl_epoch_and_route() -> None:
    templates = CallTemplates(KEYS, 3)
    values = ("e" * 40, 0, TICKET, 1100, 1)
    for resource, ttl_ms, epoch, route in [("a", 5000, 0, "r1"), ("b", 5000, 0, "r1"),
                                          ("a", 900, 0, "r1"), ("a", 5000, 3, "r1"),
                                          ("a", 5000, 0, "r2"), ("a", 5000, 0, "r1")]:
        calls, packed = templates.acquire(MUTEX, (resource,), ttl_ms, epoch, route, values)
        assert calls == built(MUTEX, 3, (resource,), ttl_ms, epoch, route, values)
        assert_packed(calls, packed)


def test_other_kinds_and_sets_are_built_each_time() -> None:
    templates = CallTemplates(KEYS, 3)
    values = ("f" * 40, 5, TICKET, 1100, 2)
    for kind, resources in [(Permit(permits=3).for_call("f" * 32), ("jobs",)),
                            (Leadership(identity="a"), ("cron",)),
                            (MUTEX, ("a", "b"))]:
        calls, packed = templates.acquire(kind, resources, 5000, 0, "r", values)
        assert calls == built(kind, 3, resources, 5000, 0, "r", values)
        assert packed is None


@pytest.mark.parametrize("n", [1, 3])
def test_a_holders_release_is_the_builders_call(n: int) -> None:
    core = make_core(n)
    for owner in ("1" * 40, "2" * 40):
        state = LockState("orders", owner, 10.0, 1, 100.0, lambda: 0.0, threading.Lock())
        request = core.release_request(state)
        assert request.calls == tuple(MUTEX.release_call(KEYS, i, "orders", (owner, "1"))
                                      for i in range(n))
        assert request.calls[0].script is scripts.RELEASE
        assert_packed(request.calls, request.packed)


def test_no_template_where_a_builder_uses_a_value() -> None:
    owner, floor = Marker("owner"), Marker("floor")
    # Computing with a value, not only placing it: no template, the builder is used.
    assert make_template(lambda: [Call(0, (owner.encode(),))],  # type: ignore[attr-defined]
                         (owner,)) is None
    # A value placed twice, among the keys, or calls that do not share their arguments.
    assert make_template(lambda: [Call(0, (owner, owner))], (owner,)) is None
    assert make_template(lambda: [Call(0, (owner,), None, (owner,))], (owner,)) is None  # type: ignore[arg-type]
    assert make_template(lambda: [Call(0, (owner,)), Call(1, (owner,))], (owner,)) is None
    # A marker the template was not told of.
    assert make_template(lambda: [Call(0, (owner, floor))], (owner,)) is None
    template = make_template(lambda: [Call(0, (owner, "x", floor))], (owner, floor))
    assert template is not None
    assert template.fill(("o", 3)) == ((Call(0, ("o", "x", 3)),), None)  # (no script)
    template = make_template(lambda: [Call(0, (floor, "é", owner), scripts.RELEASE, ("k",))],
                             (owner, floor))
    assert template is not None
    calls, packed = template.fill(("ö" * 3, 12))
    assert calls == (Call(0, (12, "é", "ö" * 3), scripts.RELEASE, ("k",)),)
    assert_packed(calls, packed)


def test_the_templates_kept_are_bounded() -> None:
    templates = CallTemplates(KEYS, 1)
    for i in range(3000):
        templates.acquire(MUTEX, (f"name-{i}",), 5000, 0, "r", ("a" * 40, 0, "", 1, 1))
    assert len(templates._made) <= 1024
