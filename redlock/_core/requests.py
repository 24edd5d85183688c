"""Requests that the algorithm yields, and the two drivers that execute them.

The algorithm (:mod:`redlock._core.algorithm`) is free of I/O: each operation is a
*protocol*, a generator that yields requests and receives their replies (the
"sans-I/O" shape, see docs/design.md §10)::

    request = next(protocol)
    while True:
        reply = <run request.calls on their nodes in parallel> or <sleep> or <invoke>
        request = protocol.send(reply)        # StopIteration carries the result

A :class:`Broadcast` asks for some calls on some nodes *in parallel*, each bounded
by ``timeout``; its reply holds, per call, the node's reply or the exception it
raised (never raised into the protocol). A :class:`Sleep` asks for a wait, an
:class:`Invoke` for a user callback; both reply with an empty tuple. If executing a
request raises (asyncio cancellation, KeyboardInterrupt, a callback's error), the
driver throws the exception into the protocol, which cleans up (releases keys it
may have set) and re-raises or handles it.

:func:`drive` and :func:`drive_async` are the only protocol loops: the sync and
asyncio shells pass them an executor that knows their transport and how to wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from typing import Protocol as TypingProtocol

from redlock._scripts.lock import Script

T = TypeVar("T")

CommandArg = str | bytes | int | float


class Wakeable(TypingProtocol):
    """What a sleep may be cut short by: a ``threading.Event`` or an ``asyncio.Event``."""

    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class Call:
    """One command for one node: a script (EVALSHA, EVAL on NOSCRIPT) or a plain command."""

    node: int
    args: tuple[CommandArg, ...]
    script: Script | None = None
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Broadcast:
    """Run ``calls`` in parallel; each must answer within ``timeout`` seconds.

    ``enough`` lets the request end before every node answered (early quorum,
    docs/design.md §2.4).

    ``line``: the local line (a resource's key, see :mod:`redlock._client.lines`) of an
    acquire attempt. With ``turns``, attempts on it from one manager take turns instead
    of overlapping: two attempts racing from the same process would split the nodes
    between them (each wins some, neither a quorum) and both fail. Attempts of waiters
    in the nodes' waiting line do not take turns (``turns=False``): the line already
    decides who may win (only its first), and serialising the others' attempts, which
    only keep their places, made a hundred waiters of one busy event loop queue for
    seconds behind each other while the lock sat free (docs/design.md §6.5).
    """

    calls: tuple[Call, ...]
    timeout: float
    line: str | None = None
    turns: bool = True
    # A lane of connections of its own (one per node, kept between requests): the
    # renewal loop's, so that a renewal never waits for a connection behind a burst of
    # other requests (on a busy event loop it waited 80-170 ms for one, and a lock with
    # a 1 s TTL was lost). None: the shared connections.
    lane: str | None = None
    # True once the replies so far decide the request (unread ones are PENDING): the
    # transport returns at once, NOT_AWAITED standing for the rest (read later, off the
    # hot path). None: wait for every reply, or the timeout.
    enough: Callable[[Sequence[object]], bool] | None = None


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``.

    ``line``: a blocking acquire's backoff; the shell keeps the caller's place in that
    local line and wakes it early when a handle of the same manager releases.
    ``channels``: the release channels that may end the wait early (a release anywhere
    publishes on them); ``waiter``: the waiter id a wake-up must name (the first in the
    nodes' waiting line), None to be woken by a release that names nobody.
    ``patient``: how long to wait instead, once releases on ``channels`` are heard.
    ``until``: an event that ends the wait early when set (a watchdog's stop signal).
    """

    seconds: float
    line: str | None = None
    until: Wakeable | None = None
    channels: tuple[str, ...] = ()
    waiter: str | None = None
    patient: float | None = None


@dataclass(frozen=True)
class Invoke:
    """Call a user callback; the asyncio driver awaits what it returns if awaitable."""

    function: Callable[..., object]
    args: tuple[object, ...] = ()


class Pending:
    """The marker of a reply not read yet (None is a real reply)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = Pending()


class NotAwaited(Exception):
    """The request was decided without this node's reply (it is read in the background)."""


NOT_AWAITED = NotAwaited("the request was decided without this reply (read in the background)")
#: A final release whose connection was still opening (or not free) when its request
#: ended: it is sent once the connection is open (docs/design.md §2.4), so the node is
#: not counted as failed.
SENT_LATE = NotAwaited("sent once its connection is open (the request did not wait for it)")


Request = Broadcast | Sleep | Invoke
Replies = Sequence[object]  # per call: the reply, or the exception the node raised
Protocol = Generator[Request, Replies, T]
NO_REPLY: Replies = ()


def drive(protocol: Protocol[T], execute: Callable[[Request], Replies]) -> T:
    """Run a protocol to its end with a blocking executor (the sync shell, unit tests)."""
    try:
        request = next(protocol)
        while True:
            try:
                reply = execute(request)
            except BaseException as exc:  # interrupted or failed: the protocol decides
                request = protocol.throw(exc)
                continue
            request = protocol.send(reply)
    except StopIteration as stop:  # the protocol returned (maybe before any request)
        return stop.value  # type: ignore[no-any-return]


async def drive_async(protocol: Protocol[T],
                      execute: Callable[[Request], Awaitable[Replies]]) -> T:
    """Run a protocol to its end with an asyncio executor (the asyncio shell)."""
    try:
        request = next(protocol)
        while True:
            try:
                reply = await execute(request)
            except BaseException as exc:  # cancelled or failed: the protocol decides
                request = protocol.throw(exc)
                continue
            request = protocol.send(reply)
    except StopIteration as stop:  # the protocol returned (maybe before any request)
        return stop.value  # type: ignore[no-any-return]


def ask_one(call: Call, timeout: float) -> Protocol[object]:
    """One call on one node: its reply, or the exception it raised."""
    replies = yield Broadcast((call,), timeout)
    return replies[0]
