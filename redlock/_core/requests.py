"""Requests that flows yield, and the two drivers that run flows.

The core (:mod:`redlock._core`) is free of I/O: each operation is a *flow*, a generator
that yields *requests* and receives their replies (the "sans-I/O" shape, see
docs/design.md §10)::

    request = next(flow)
    while True:
        reply = <run request.calls on their nodes in parallel> or <wait> or <invoke>
        request = flow.send(reply)        # StopIteration carries the result

A :class:`Broadcast` asks for *calls* on nodes in parallel; its reply (:class:`Replies`) holds, per
call, the node's reply or the exception it raised (never raised into the flow). A wait
(:class:`Pause`, :class:`PauseUntilWoken`, :class:`Backoff`) or an :class:`Invoke` replies with an
empty tuple. If executing a request raises (cancellation, KeyboardInterrupt, a callback's error),
the driver throws it into the flow, which releases what it may have set and re-raises or handles
it. :func:`drive` and :func:`drive_async` are the only flow loops."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol, TypeVar, cast

from redlock._scripts.replies import NOT_AWAITED, PENDING, SENT_LATE, NotAwaited, Pending
from redlock._scripts.script import Script

__all__ = ["LAST_ROUND", "NOT_AWAITED", "NO_REPLY", "PENDING", "SENT_LATE", "TIMEOUT_FLOOR",
           "Absorb", "Backoff", "Broadcast", "Call", "CommandArg", "Deadline", "Decision",
           "Flow", "Invoke", "NotAwaited", "Pause", "PauseUntilWoken", "Pending", "Replies",
           "Request", "Wait", "Wakeable", "ask_one", "drive", "drive_async", "learnt_deadline"]

T = TypeVar("T")

CommandArg = str | bytes | int | float


class Wakeable(Protocol):
    """What a wait may be cut short by: a ``threading.Event`` or an ``asyncio.Event``."""

    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...


class Call(NamedTuple):
    """One command for one node: a script (EVALSHA, EVAL on NOSCRIPT) or a plain command
    (a named tuple: made per node and call, it is cheaper than a dataclass)."""

    node: int
    args: tuple[CommandArg, ...]
    script: Script | None = None
    keys: tuple[str, ...] = ()


#: An early decision on a broadcast's replies so far (PENDING where none yet), given the
#: identities of the servers its new connections met (node -> IDENTIFY reply).
Decision = Callable[[Sequence[object], Mapping[int, object]], bool]


# Not frozen (cheaper to make), but never changed: another timeout is a new request.
@dataclass(slots=True)
class Broadcast:
    """Run ``calls`` in parallel; each must answer within ``timeout`` seconds.

    ``enough`` lets the request end before every node answered (early quorum, docs/design.md §2.4):
    a pure function of the replies so far, decided as soon as it is true.

    ``turns_key``: the key of an acquire attempt's local turns (its resource's release channel,
    :mod:`redlock._client.waiting_room`). With ``turns``, attempts on it from one manager take
    turns instead of splitting the nodes; waiters in the nodes' line do not (``turns=False``): the
    line already decides who may win (docs/design.md §6.5).

    ``learn``: for a request made before the nodes' round trips are known (a manager's first): once
    ``learn`` nodes (a quorum) answered, the others get as long again as that took, at least
    ``TIMEOUT_FLOOR`` (docs/design.md §2.4), instead of the whole ceiling. 0: the timeout as given.

    ``lane``: connections of its own (one per node, kept between requests): the renewal
    loop's, so that a renewal never waits for a connection behind a burst of other
    requests. None: the shared connections."""

    calls: tuple[Call, ...]
    timeout: float
    turns_key: str | None = None
    turns: bool = True
    lane: str | None = None
    enough: Decision | None = None
    learn: int = 0
    packed: bytes | None = None  # every call's command, packed by a template (kinds.py)


@dataclass(frozen=True)
class Pause:
    """Wait ``seconds`` (an extend's backoff, a second look at a node)."""

    seconds: float


@dataclass(frozen=True)
class PauseUntilWoken:
    """Wait ``seconds``, or until ``wake`` is set (the renewal loop until its next
    renewal is due, the background maintenance until its next step)."""

    seconds: float
    wake: Wakeable


@dataclass(frozen=True)
class Backoff:
    """A blocking acquire's wait between two attempts, ``seconds`` (docs/design.md §6.4).

    The client keeps the caller's place in its local turns (``turns_key``) and wakes it
    early when a handle of the manager releases, or when a release on one of ``channels``
    names ``waiter`` (or nobody, when ``waiter`` is None). ``patient``: how long to wait
    instead, once releases on ``channels`` are heard.

    The reply: the hand-offs to ``waiter`` heard so far (a
    :class:`~redlock._core.handoff.Handoffs`, §6.7). ``heard_before``: a wait for more of
    them, which returns at once if more were heard already. ``wake_at``: (attempt, k):
    such a wait ends only once k nodes' latest messages are hand-offs of that attempt (or
    a message that is no hand-off, or its time)."""

    seconds: float
    turns_key: str
    channels: tuple[str, ...] = ()
    waiter: str | None = None
    patient: float | None = None
    heard_before: int | None = None
    wake_at: tuple[int, int] | None = None


Wait = Pause | PauseUntilWoken | Backoff


@dataclass(frozen=True)
class Invoke:
    """Call a user callback; the asyncio driver awaits what it returns if awaitable."""

    function: Callable[..., object]
    args: tuple[object, ...] = ()


class Replies(list[object]):
    """A broadcast's replies, one per call (the node's reply or the exception it raised),
    and what the I/O learnt on the way, for the core's ``absorb``: ``identities`` (node ->
    a new connection's IDENTIFY reply, §4.4) and ``round_trips`` (node -> seconds)."""

    def __init__(self, replies: Sequence[object] = ()) -> None:
        super().__init__(replies)
        self.identities: dict[int, object] = {}
        self.round_trips: dict[int, float] = {}


Request = Broadcast | Wait | Invoke

# The least a request waits for the nodes when its timeout adapts to their round trips (RoundTrips,
# or a request that learns it, Broadcast.learn): a busy machine's hiccup is not an outage.
TIMEOUT_FLOOR = 0.05


def learnt_deadline(request: Broadcast, started: float, now: float, answered: int) -> float | None:
    """The deadline a request that learns its timeout (``Broadcast.learn``) takes once
    ``answered`` nodes replied by ``now`` (None: not yet, or it does not learn)."""
    if not request.learn or answered < request.learn:
        return None
    return started + max(TIMEOUT_FLOOR, 2 * (now - started))


# A round that starts at (or after) its caller's deadline still gets this long: its
# calls go out (a failed attempt's release) and replies on their way are read.
LAST_ROUND = 0.01


class Deadline:
    """When a caller's operation must be over, by the core's monotonic ``clock`` (``at``
    None: no limit); every request made on the caller's behalf is bounded by what is
    left (docs/design.md §2.5)."""

    __slots__ = ("_clock", "at")

    def __init__(self, clock: Callable[[], float], at: float | None) -> None:
        self._clock = clock
        self.at = at

    def left(self) -> float | None:
        """Seconds left (negative once passed), or None without a limit."""
        return None if self.at is None else self.at - self._clock()

    def passed(self) -> bool:
        return self.at is not None and self._clock() >= self.at

    def bound(self, timeout: float) -> float:
        """A request's ``timeout`` cut to what is left, but never below LAST_ROUND."""
        left = self.left()
        return timeout if left is None else min(timeout, max(left, LAST_ROUND))

    def cap(self, request: Broadcast) -> Broadcast:
        """``request`` with its timeout bounded (see :meth:`bound`)."""
        timeout = self.bound(request.timeout)
        return request if timeout == request.timeout else replace(request, timeout=timeout)

    def pause(self, seconds: float) -> float:
        """A wait of ``seconds`` cut to what is left (0: no time to wait)."""
        left = self.left()
        return seconds if left is None else max(0.0, min(seconds, left))

Flow = Generator[Request, Sequence[object], T]
NO_REPLY: Sequence[object] = ()
Absorb = Callable[[Replies], None]


def drive(flow: Flow[T], execute: Callable[[Request], Sequence[object]],
          absorb: Absorb | None = None) -> T:
    """Run a flow to its end with a blocking executor: each request's outcome goes back
    into the flow, its replies handed to ``absorb`` first; an exception raised by either
    is thrown into the flow, which decides (raised past it, it would skip the flow's own
    handlers, docs/design.md §5.2)."""
    try:
        request = next(flow)
        while True:
            try:
                reply = execute(request)
                if absorb is not None and isinstance(reply, Replies):
                    absorb(reply)
            except BaseException as exc:  # interrupted (KeyboardInterrupt) or failed
                request = flow.throw(exc)
                continue
            request = flow.send(reply)
    except StopIteration as stop:  # the flow returned
        return cast(T, stop.value)


async def drive_async(flow: Flow[T], execute: Callable[[Request], Awaitable[Sequence[object]]],
                      absorb: Absorb | None = None, end: Callable[[], None] | None = None) -> T:
    """:func:`drive` with an asyncio executor; ``end()`` once it is over, whichever way
    (a callback, not a coroutine around this one, which every resumption would cross)."""
    try:
        request = next(flow)
        while True:
            try:
                reply = await execute(request)
                if absorb is not None and isinstance(reply, Replies):
                    absorb(reply)
            except BaseException as exc:  # cancelled or failed
                request = flow.throw(exc)
                continue
            request = flow.send(reply)
    except StopIteration as stop:  # the flow returned
        return cast(T, stop.value)
    finally:
        if end is not None:
            end()


def ask_one(call: Call, timeout: float) -> Flow[object]:
    """One call on one node: its reply, or the exception it raised."""
    replies = yield Broadcast((call,), timeout)
    return replies[0]
