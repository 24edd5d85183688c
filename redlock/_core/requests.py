"""Requests that flows yield, and the two drivers that run flows.

The core (:mod:`redlock._core`) is free of I/O: each operation is a *flow*, a generator
that yields *requests* and receives their replies (the "sans-I/O" shape, see
docs/design.md §10)::

    request = next(flow)
    while True:
        reply = <run request.calls on their nodes in parallel> or <wait> or <invoke>
        request = flow.send(reply)        # StopIteration carries the result

A :class:`Broadcast` asks for some *calls* on some nodes in parallel, each bounded by
``timeout``; its reply (:class:`Replies`) holds, per call, the node's reply or the
exception it raised (never raised into the flow), and what the I/O learnt on the way
(the identity of servers met on new connections, round trips measured). A wait
(:class:`Pause`, :class:`PauseUntilWoken`, :class:`Backoff`) asks to wait, an
:class:`Invoke` for a user callback; both reply with an empty tuple. If executing a
request raises (asyncio cancellation, KeyboardInterrupt, a callback's error), the driver
throws the exception into the flow, which cleans up (releases keys it may have set) and
re-raises or handles it.

:func:`drive` and :func:`drive_async` are the only flow loops: the sync and asyncio
clients pass them an executor that knows their transport and how to wait, and the core's
``absorb``, told what each broadcast learnt before its flow goes on.
"""

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
    """One command for one node: a script (EVALSHA, EVAL on NOSCRIPT) or a plain command.
    (A named tuple: a request makes one per node and call, and a tuple is made in less
    than half the time of a frozen dataclass.)"""

    node: int
    args: tuple[CommandArg, ...]
    script: Script | None = None
    keys: tuple[str, ...] = ()


#: An early decision on a broadcast's replies so far (PENDING where none yet), given the
#: identities of the servers its new connections met (node -> IDENTIFY reply).
Decision = Callable[[Sequence[object], Mapping[int, object]], bool]


# Not frozen: made twice per acquire+release, and a frozen dataclass takes three times
# as long to make (its fields are set through object.__setattr__). Nothing changes one
# once made: a request with another timeout is a new one (dataclasses.replace).
@dataclass(slots=True)
class Broadcast:
    """Run ``calls`` in parallel; each must answer within ``timeout`` seconds.

    ``enough`` lets the request end before every node answered (early quorum,
    docs/design.md §2.4): a pure function of the replies so far, decided as soon as it
    is true.

    ``turns_key``: the key of an acquire attempt's local turns (its resource's release
    channel, :mod:`redlock._client.waiting_room`). With ``turns``, attempts on it from
    one manager take turns instead of splitting the nodes; waiters in the nodes' line
    do not (``turns=False``): the line already decides who may win (docs/design.md
    §6.5).

    ``learn``: for a request made before the nodes' round trips are known (a manager's
    first), which therefore waits up to its ceiling: once ``learn`` nodes (a quorum)
    answered, the others get as long again as that took, and at least
    ``TIMEOUT_FLOOR`` in all: the timeout the adaptive rule would have set from these
    replies (docs/design.md §2.4). Without it, a new manager's first attempt waited its
    whole ceiling for nodes that hung or lost their data, where a warm one waits 50 ms.
    0: the timeout as given.

    ``lane``: a lane of connections of its own (one per node, kept between requests):
    the renewal loop's, so that a renewal never waits for a connection behind a burst of
    other requests (on a busy event loop it waited 80-170 ms for one, and a lock with a
    1 s TTL was lost). None: the shared connections.
    """

    calls: tuple[Call, ...]
    timeout: float
    turns_key: str | None = None
    turns: bool = True
    lane: str | None = None
    enough: Decision | None = None
    learn: int = 0
    # The command every call sends, packed (RESP, EVALSHA), when they all send one: a
    # template's (redlock._core.kinds.Template). None: the transports pack the calls.
    packed: bytes | None = None


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
    """A blocking acquire's wait between two attempts, ``seconds``.

    The client keeps the caller's place in the local turns (``turns_key``) and wakes it early when a
    handle of the same manager releases; a release published on one of ``channels`` (a
    release anywhere) wakes it too, if it names ``waiter`` (the first in the nodes'
    waiting line), or names nobody when ``waiter`` is None. ``patient``: how long to wait
    instead, once releases on ``channels`` are heard (docs/design.md §6.4).

    The reply: the hand-offs to ``waiter`` heard so far (a
    :class:`~redlock._core.handoff.Handoffs`, docs/design.md §6.7; empty when the
    client collects none). ``heard_before``: a wait for more of them, which returns at
    once if more than that many were heard already. ``wake_at``: (attempt, k), hand-offs
    end such a wait only once k nodes' latest messages are hand-offs of that attempt (a
    message that is no hand-off still ends it, and so does its time): a waiter that
    needs three nodes is not woken by each of them in turn.
    """

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
    """A broadcast's replies, one per call: the node's reply or the exception it raised;
    and what the I/O learnt on the way, as data for the core (``absorb``):
    ``identities``, node -> the IDENTIFY reply of a new connection (docs/design.md §4.4),
    and ``round_trips``, node -> seconds from sending to its first reply."""

    def __init__(self, replies: Sequence[object] = ()) -> None:
        super().__init__(replies)
        self.identities: dict[int, object] = {}
        self.round_trips: dict[int, float] = {}


Request = Broadcast | Wait | Invoke

# The least a request waits for the nodes when its timeout adapts to their round trips
# (RoundTrips, or a request that learns it, Broadcast.learn): a busy machine's hiccup is
# not an outage.
TIMEOUT_FLOOR = 0.05


def learnt_deadline(request: Broadcast, started: float, now: float,
                    answered: int) -> float | None:
    """The deadline a request that learns its timeout (``Broadcast.learn``) takes once
    ``answered`` nodes replied by ``now`` (None: not yet, or it does not learn)."""
    if not request.learn or answered < request.learn:
        return None
    return started + max(TIMEOUT_FLOOR, 2 * (now - started))


# A round that starts at (or after) its caller's deadline still gets this long: its
# calls go out (an asyncio exchange needs a turn of the event loop to write) and the
# replies already on their way are read. On the acquire path that is the release of a
# failed attempt, or an attempt that a wait cut to the deadline brought there.
LAST_ROUND = 0.01


class Deadline:
    """When a caller's operation must be over, by the core's monotonic ``clock`` (``at``
    None: no limit). Every request a flow makes on the caller's behalf is bounded by
    what is left (docs/design.md §2.5), so no phase (a first connection, a hung node, a
    new cluster's initialisation, a second look at a node) can run past it."""

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
    """Run a flow to its end with a blocking executor (the sync client, unit tests): each
    request's outcome goes back into the flow, its replies handed to ``absorb`` first;
    an exception it raised (an interruption, a failure), or that ``absorb`` raised, is
    thrown into the flow, which decides (raised out of the driver, it passed the flow's
    own handlers: the renewal loop died without telling its holders, docs/design.md
    §5.2)."""
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
                      absorb: Absorb | None = None,
                      end: Callable[[], None] | None = None) -> T:
    """Run a flow to its end with an asyncio executor (the asyncio client), as
    :func:`drive` does; ``end()`` once it is over, whichever way. (The executor's own
    bookkeeping goes in ``end`` rather than in a coroutine around this one: every
    resumption of a request passes through each coroutine of the chain.)"""
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
