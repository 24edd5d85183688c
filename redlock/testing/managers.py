"""A manager with a test's clock and sleep: the seam for tests that need time in their
hands, kept out of the public constructor (docs/design.md §10).

    from redlock.testing import manager

    dlm = manager(urls, clock=fake.now, sleep=fake.advance, node_timeout=0.2)
    adlm = manager(urls, asynchronous=True, sleep=fake.asleep)    # an AsyncRedlock

Everything else is ``Redlock(nodes, **options)`` (``AsyncRedlock``) as applications build it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, overload

from redlock._client.manager import Hooks, with_hooks

if TYPE_CHECKING:
    from redlock.aio import AsyncRedlock
    from redlock.client import Redlock


@overload
def manager(nodes: Iterable[Any], *, clock: Callable[[], float] | None = None,
            sleep: Callable[[float], Any] | None = None,
            asynchronous: Literal[False] = False, **options: Any) -> Redlock: ...


@overload
def manager(nodes: Iterable[Any], *, clock: Callable[[], float] | None = None,
            sleep: Callable[[float], Any] | None = None,
            asynchronous: Literal[True], **options: Any) -> AsyncRedlock: ...


def manager(nodes: Iterable[Any], *, clock: Callable[[], float] | None = None,
            sleep: Callable[[float], Any] | None = None, asynchronous: bool = False,
            **options: Any) -> Redlock | AsyncRedlock:
    """A :class:`redlock.Redlock` (``asynchronous=True``: an :class:`redlock.AsyncRedlock`) built
    as ``Redlock(nodes, **options)`` builds it, with a test's clock and sleep.

    Args:
        nodes: the nodes, as the constructor takes them.
        clock: a monotonic clock in seconds, read for every validity, deadline and
            backoff (default ``time.monotonic``). With another clock the manager renews
            auto-extended locks in this process, not in its renewer process (which keeps
            ``time.monotonic``), and its first auto-extended lock logs why.
        sleep: how the manager waits, given the seconds (a coroutine function for
            ``asynchronous=True``): between attempts and in every other pause of its
            calls, but not in the waits of its background work that an event ends early
            (the renewal loop, the maintenance, ``Election.observe()``). Default: the
            real waits, between attempts in the manager's local turns, where a release
            wakes the first waiter.
        asynchronous: an :class:`redlock.AsyncRedlock` instead of a
            :class:`redlock.Redlock`.
        **options: the constructor's other options (``namespace``, ``node_timeout``,
            ``max_ttl``...)."""
    hooks = Hooks(time.monotonic if clock is None else clock, sleep)
    if asynchronous:
        from redlock.aio import AsyncRedlock

        return with_hooks(AsyncRedlock, nodes, hooks, options)
    from redlock.client import Redlock

    return with_hooks(Redlock, nodes, hooks, options)
