"""What the sync and asyncio transports share (docs/design.md §2.4, §5.5): rendering
calls (EVALSHA; EVAL with the body on a connection that has not run scripts yet, and
after NOSCRIPT), one node's share of a request (:class:`Exchange`: which reply is whose,
the identity probe, NOSCRIPT), a request's end (:class:`Gathering`: its deadline, the
timeout a first request learns, the early decision, the stragglers' grace), and late
connections: one whose replies were not all read is kept, read in the background and
given back; an acquire still unanswered on it gets the release of its lock value written
*behind* it, so the node runs them in order (§5.5)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from redlock._core.requests import (
    NOT_AWAITED,
    PENDING,
    SENT_LATE,
    Broadcast,
    Call,
    NotAwaited,
    Replies,
    learnt_deadline,
)
from redlock._io import resp
from redlock._io.failures import NotReplicated, Redirected, answered
from redlock._io.resp import ReplyError
from redlock._io.routing import (
    MAX_HOPS,
    REDIRECTS,
    UNROUTED,
    Routes,
    redirect_of,
    retry_delay,
)
from redlock._scripts import lock as scripts
from redlock._scripts import node as node_scripts
from redlock._scripts.replies import identity

__all__ = ["DONE", "IDENTIFIED", "MORE", "NOT_AWAITED", "PENDING", "RESEND", "SENT_LATE",
           "Exchange", "Gathering", "Late", "LateConnections", "NotAwaited", "Packing", "Silence",
           "exchanges_of", "fill_pending", "follow", "is_noscript", "late_sendable", "render",
           "run_of", "with_run"]

Conn = TypeVar("Conn")
E = TypeVar("E", bound="Exchange")

# Late connections kept per target; beyond this the oldest is closed.
LATE_PER_TARGET = 16
# What goes before a call an ASK redirect sent to a hash slot's importing master.
ASKING = resp.pack_one(("ASKING",))
# What identifies a new connection to a cluster node's master: its server's run (its hash
# slots' markers are each checked by the scripts, docs/proposals/cluster.md P3.1a).
SERVER_PROBE = resp.pack_one(("EVAL", node_scripts.SERVER_IDENTITY.source, 0))

# Once a request is decided, the stragglers get as long again as the decision took, at
# least this long: their replies are usually right behind, and reading them keeps the
# connection out of the late pool.
STRAGGLER_GRACE_MIN = 0.001
# ... unless every straggler is silent: it owed replies and answered nothing, on any
# connection, for this many graces (Silence).
SILENT_AFTER_GRACES = 10
# After a connection attempt to a node failed fast (refused, reset), the next waits this
# long, doubling with each failure up to the maximum (Refusals): a node that comes back
# is asked again within RETRY_CONNECT_MAX.
RETRY_CONNECT_MIN = 0.005
RETRY_CONNECT_MAX = 0.05
# An idle connection given back more recently than this is reused without a look for
# bytes nobody asked for: its replies were read to the end a moment ago, and the look
# would only narrow a window the server can hit after it as well, for a system call.
FRESH = 0.001


class Packing:
    """A request's commands packed once: the nodes of a request get the same calls (the
    same keys and arguments), so each distinct command is packed for the first node and
    its bytes reused for the others (a call template's come packed: Broadcast.packed)."""

    __slots__ = ("_args", "_bytes", "_evalsha", "_keys", "_script")

    def __init__(self, request: Broadcast | None = None) -> None:
        # What _bytes is the command of (nothing yet: a call has no such args).
        self._args: object = None
        self._keys: object = None
        self._script: object = None
        self._evalsha = True  # EVALSHA, or EVAL with the body
        self._bytes = b""
        if request is not None and request.packed is not None:
            call = request.calls[0]
            self._args, self._keys, self._script = call.args, call.keys, call.script
            self._bytes = request.packed

    def calls(self, calls: Sequence[Call], evalsha: bool) -> bytes:
        if len(calls) != 1:
            return resp.pack([render(call, evalsha=evalsha) for call in calls])
        call = calls[0]
        if call.args is self._args and call.keys is self._keys \
                and call.script is self._script and evalsha is self._evalsha:
            return self._bytes
        self._bytes = resp.pack_one(render(call, evalsha=evalsha))
        self._args, self._keys, self._script = call.args, call.keys, call.script
        self._evalsha = evalsha
        return self._bytes


# What Exchange.take says of a reply: more are owed; every call has its result now; the
# calls that answered NOSCRIPT are to be sent again with their bodies (Exchange.bodies);
# it was the identity probe's (Exchange.identity).
MORE, DONE, RESEND, IDENTIFIED = 0, 1, 2, 3


def is_noscript(reply: object) -> bool:
    """A NOSCRIPT error reply: the server lost its scripts (SCRIPT FLUSH, a restart)."""
    return isinstance(reply, ReplyError) and str(reply).startswith("NOSCRIPT")


class Exchange:
    """One node's calls of one request, written on one connection (pipelined), and what came back.
    A transport hands it each reply as it is parsed (:meth:`take`), which says whose it is: on a
    new connection the identity probe's first (IDENTIFY, docs/ design.md §4.4), then one per call
    in order, each written into the request's replies at once (none once the request is over:
    ``replies`` None). A call answered NOSCRIPT (the server lost its scripts: SCRIPT FLUSH, a
    restart) is written again with its script's body once every call answered (:meth:`bodies`), and
    its reply to that is the call's. For a node with ``replica_acks``, a WAIT goes behind the
    calls that grant, commit or renew (and behind their bodies), and their replies are held
    until its reply says whether they count (:meth:`replicated`). On a cluster node
    (``routed``) its ``target`` is the master of its calls' hash slot, and a call answered
    MOVED, ASK or TRYAGAIN did not run: it is kept aside (``redirected``) and, once every
    call answered, sent again to the master named (:func:`follow`). Both transports run their
    requests through it; they differ only in how bytes come and go."""

    __slots__ = ("acks", "ask", "asking", "calls", "conn", "done", "heard", "held", "hops",
                 "indexes", "lane", "next", "node", "probed", "redirected", "replies",
                 "routed", "sent_at", "target", "timeout", "tries", "unknown", "wait", "wait_ms")

    def __init__(self, node: int, replies: Replies | None, index: int, call: Call,
                 lane: str | None = None) -> None:
        self.node = node  # what the core counts its replies as
        self.target = node  # where it is written: its node, or a cluster node's master
        self.routed = False  # a cluster node's: redirects are followed
        self.ask = False  # ASK: each sending writes ASKING before its call
        self.asking = False  # ASKING's reply is owed (before the calls')
        self.hops = 0  # how many times its calls were sent elsewhere (MOVED, ASK)
        self.tries = 0  # how many times in a row they were answered TRYAGAIN
        self.redirected: list[tuple[int, object]] | None = None  # (position, reply)
        # The request's replies while it waits (None once it is over): each reply, the
        # identity and the round trip go there at once, for the request's early decision.
        self.replies = replies
        self.lane = lane  # its request's lane of connections (None: the shared ones)
        # Its calls and their places among the request's (tuples: few objects per request).
        self.indexes: tuple[int, ...] = (index,)
        self.calls: tuple[Call, ...] = (call,)
        self.conn: Any = None  # the connection it is written on, once it has one
        self.probed = False  # IDENTIFY went first: the next reply is the identity
        self.next = 0  # the next reply's position: the calls', then the resent ones'
        self.unknown: list[int] | None = None  # the calls (positions) that answered NOSCRIPT
        self.sent_at = 0.0
        self.timeout = 0.0  # its request's (exchanges_of): how long a WAIT may block
        self.done = False  # every call has its result (a reply or a failure)
        # The node replied (set by the asyncio transport, whose gathering clears the node's
        # silence as an exchange finishes), or failed other than by a timeout.
        self.heard = False
        # replica_acks (docs/design.md §11.3): the replicas WAIT must report (0: no WAIT),
        # the WAIT command's bytes, and the replies held until its reply.
        self.acks = 0
        self.wait = b""
        self.wait_ms = 0
        self.held: list[tuple[int, object]] | None = None

    def add(self, index: int, call: Call) -> None:
        self.indexes += (index,)
        self.calls += (call,)

    def replicated(self, acks: int) -> bytes:
        """What to write behind its calls for a node with ``replica_acks`` = ``acks``: where
        a call grants, commits or renews, ``WAIT acks t``, whose reply its replies then
        wait for; else nothing. ``t``: half its request's timeout (the other half carries
        the round trip, so that a refusal arrives in time), at least 1 ms (``WAIT k 0``
        blocks for ever)."""
        if not any(call.script is not None and call.script.replicated for call in self.calls):
            return b""
        self.acks, self.held = acks, []
        self.wait_ms = max(1, int(self.timeout * 500))
        self.wait = resp.pack_one(("WAIT", acks, self.wait_ms))
        return self.wait

    def take(self, reply: object) -> int:
        """The next reply on its connection: MORE, DONE, RESEND (write :meth:`bodies`
        now) or IDENTIFIED. Replies come in this order: the calls', the WAIT's behind them
        (replica_acks), then those of the calls sent again and their WAIT."""
        replies = self.replies
        if self.probed:
            self.probed = False
            if replies is not None and not self.routed:  # at once: the early decision must
                replies.identities[self.node] = reply  # not count a restarted node's grant
            return IDENTIFIED
        if self.asking:  # (an error says nothing: the call's own reply will)
            self.asking = False
            return MORE
        position = self.next
        self.next = position + 1
        count = len(self.calls)
        wait = self.acks > 0
        if position < count:
            if position == 0 and replies is not None and not wait:
                replies.round_trips[self.node] = time.monotonic() - self.sent_at
            if isinstance(reply, ReplyError) and self._aside(position, reply):
                pass
            elif self.held is not None:
                self._hold(position, reply)
            elif replies is not None:
                replies[self.indexes[position]] = reply
            if position + 1 < count or wait:
                return MORE
            if self.unknown:
                return RESEND
        elif wait and position == count:  # the WAIT behind the calls
            self._acknowledged(reply)
            if self.unknown:
                return RESEND
        else:
            unknown = self.unknown or []
            again = position - count - wait  # among the calls sent again
            if again < len(unknown):
                if self.routed and self._redirect(unknown[again], reply):
                    pass
                elif self.held is not None:
                    self._hold(unknown[again], reply)
                elif replies is not None:
                    replies[self.indexes[unknown[again]]] = reply
                if again + 1 < len(unknown) or wait:
                    return MORE
            else:  # their WAIT
                self._acknowledged(reply)
        self.done = True
        return DONE

    def _aside(self, position: int, reply: object) -> bool:
        """An error reply that is no result: NOSCRIPT (the call goes again with its body) or,
        on a cluster node, a redirect (True)."""
        if str(reply).startswith("NOSCRIPT"):
            if self.unknown is None:
                self.unknown = []
            self.unknown.append(position)
            return True
        return self.routed and self._redirect(position, reply)

    def _redirect(self, position: int, reply: object) -> bool:
        """A cluster node's MOVED, ASK or TRYAGAIN: the call did not run (True)."""
        if not (isinstance(reply, ReplyError) and str(reply).startswith(REDIRECTS)):
            return False
        if self.redirected is None:
            self.redirected = []
        self.redirected.append((position, reply))
        return True

    def _hold(self, position: int, reply: object) -> None:
        """(replica_acks) A call's reply: held until WAIT's if the call grants, commits or
        renews, else the request's at once."""
        script = self.calls[position].script
        if script is not None and script.replicated:
            assert self.held is not None
            self.held.append((self.indexes[position], reply))
        elif self.replies is not None:
            self.replies[self.indexes[position]] = reply

    def _acknowledged(self, reply: object) -> None:
        """WAIT's reply: the replies held for it are the calls' if ``acks`` replicas have
        their writes, else each is a :class:`~redlock._io.failures.NotReplicated`."""
        held, self.held = self.held or [], []
        replies = self.replies
        if replies is None:
            return
        replies.round_trips[self.node] = time.monotonic() - self.sent_at
        if type(reply) is not int or reply < self.acks:
            got = (f"WAIT answered {reply}" if type(reply) is int else
                   f"WAIT failed: {reply}")
            failure = NotReplicated(
                f"not on {self.acks} replica{'s' if self.acks > 1 else ''} within"
                f" {self.wait_ms} ms ({got}): what it granted or renewed does not count"
                " (replica_acks); check the node's replicas (INFO replication)")
            for index, _ in held:
                replies[index] = failure
            return
        for index, value in held:
            replies[index] = value

    def bodies(self) -> bytes:
        """The calls that answered NOSCRIPT, with their scripts' bodies (EVAL), and the
        WAIT behind them (replica_acks)."""
        return resp.pack([render(self.calls[i], evalsha=False)
                          for i in self.unknown or ()]) + self.wait

    def resent(self) -> int:
        """How many replies :meth:`bodies` asks for."""
        return len(self.unknown or ()) + (self.acks > 0)

    def owed(self) -> int:
        """How many replies its connection still owes it (written, not read)."""
        first = len(self.calls) + (self.acks > 0)  # the calls, and their WAIT
        if self.next < first:
            return self.probed + self.asking + first - self.next
        return first + (self.resent() if self.unknown else 0) - self.next

    def fail(self, exc: BaseException) -> None:
        """Every call still without a result gets ``exc``; the exchange is done."""
        self.heard = self.heard or answered(exc)
        if self.replies is not None:
            fill_pending(self.indexes, self.replies, exc)
        self.done = True


def run_of(reply: object) -> str | None:
    """The server run an identity reply ({run, marker}) names (``replies.identity``)."""
    found = identity(reply)
    return None if found is None else found[0]


def with_run(calls: tuple[Call, ...], run: str) -> tuple[Call, ...]:
    """A cluster node's calls as written on a connection whose server run is known: the last
    argument of each granting, committing or renewing call (the client's epoch) followed by
    the run, which the scripts compare with their hash slot's stamp instead of asking INFO
    (docs/proposals/cluster.md P3.1a; a connection reaches one server run for its life)."""
    made = []
    for call in calls:
        if call.script is not None and call.script.replicated:
            epoch = call.args[-1]
            shown = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
            call = Call(call.node, (*call.args[:-1], f"{shown} {run}"), call.script, call.keys)
        made.append(call)
    return tuple(made)


def exchanges_of(calls: Sequence[Call], replies: Replies, lane: str | None,
                 make: type[E], timeout: float, routes: Routes | None = None) -> list[E]:
    """A request's calls as exchanges, one per node (in the order of their first call),
    or with a cluster node among the ``routes``, one per target; ``timeout``: the
    request's."""
    if routes is not None and routes.clustered:
        return _routed(calls, replies, lane, make, timeout, routes)
    exchanges: list[E] = []
    by_node: dict[int, E] | None = None
    last = -1
    for index, call in enumerate(calls):
        node = call.node
        if node > last:  # (the usual request: one call per node, in the nodes' order)
            last = node
            exchange = make(node, replies, index, call, lane)
            exchange.timeout = timeout
            exchanges.append(exchange)
            if by_node is not None:
                by_node[node] = exchange
            continue
        if by_node is None:
            by_node = {exchange.node: exchange for exchange in exchanges}
        found = by_node.get(node)
        if found is None:
            found = by_node[node] = make(node, replies, index, call, lane)
            found.timeout = timeout
            exchanges.append(found)
        else:
            found.add(index, call)
    return exchanges


def _routed(calls: Sequence[Call], replies: Replies, lane: str | None, make: type[E],
            timeout: float, routes: Routes) -> list[E]:
    """exchanges_of with a cluster node: one exchange per target (UNROUTED: a cluster
    node's calls whose hash slot has no known master, one exchange per node)."""
    exchanges: list[E] = []
    by_target: dict[tuple[int, int], E] = {}
    for index, call in enumerate(calls):
        target = routes.target_of(call)
        found = by_target.get((call.node, target))
        if found is not None:
            found.add(index, call)
            continue
        exchange = by_target[(call.node, target)] = make(call.node, replies, index, call, lane)
        exchange.timeout = timeout
        exchange.target = target
        exchange.routed = routes.maps[call.node] is not None
        exchanges.append(exchange)
    return exchanges


def follow(exchange: E, routes: Routes, make: type[E], now: float,
           deadline: float) -> list[tuple[float, E]]:
    """A done exchange's calls that a cluster redirected (they did not run), as new exchanges
    of the same request, each with when to write it: MOVED to the master named (the map
    updated first), ASK to the importing master behind ASKING (one call each: ASKING
    admits one command), TRYAGAIN (its hash slot migrating) to the same master after 1, 2,
    4 ... ms, until the ``deadline``. A call that cannot go before the deadline or was sent
    elsewhere MAX_HOPS times already gets the redirect itself as its reply."""
    redirected, exchange.redirected = exchange.redirected or [], None
    replies = exchange.replies
    if replies is None:  # its request is over
        return []
    followers: list[tuple[float, E]] = []
    grouped: dict[tuple[int, float], E] = {}
    for position, reply in redirected:
        index, call = exchange.indexes[position], exchange.calls[position]
        redirect = redirect_of(reply)
        again = redirect is not None and redirect.kind == "TRYAGAIN"
        hops, tries = exchange.hops + (not again), exchange.tries + 1 if again else 0
        if redirect is None:
            replies[index] = reply
            continue
        if hops > MAX_HOPS:
            replies[index] = Redirected(f"{reply} (sent on {MAX_HOPS} times already: the"
                                        " cluster's hash slot map keeps changing)")
            continue
        at = now
        if redirect.kind == "MOVED":
            target = routes.moved(exchange.node, redirect)
        elif redirect.kind == "ASK":
            target = routes.target(exchange.node, redirect.host, redirect.port)
        else:
            target = routes.target_of(call)
            at = now + retry_delay(tries)
        if at >= deadline or target == UNROUTED:
            replies[index] = Redirected(f"{reply} (not followed: the request's deadline"
                                        " came first)" if target != UNROUTED else
                                        f"{reply} (no master known for the hash slot)")
            continue
        ask = redirect.kind == "ASK"
        found = None if ask else grouped.get((target, at))
        if found is not None:
            found.add(index, call)
            continue
        follower = make(exchange.node, replies, index, call, exchange.lane)
        follower.target, follower.routed, follower.ask = target, True, ask
        follower.hops, follower.tries, follower.timeout = hops, tries, exchange.timeout
        if not ask:
            grouped[(target, at)] = follower
        followers.append((at, follower))
    return followers


class Gathering:
    """When a request is over: its deadline, moved earlier by the timeout a first
    request learns from its own replies (``Broadcast.learn``) and, once its replies
    decide it (``Broadcast.enough``, early quorum), by the stragglers' grace
    (:meth:`Silence.until`). Both transports end their requests by it."""

    __slots__ = ("deadline", "decided", "enough", "learn", "replies", "request", "silence",
                 "started")

    def __init__(self, request: Broadcast, replies: Replies, started: float, deadline: float,
                 silence: Silence) -> None:
        self.request = request
        self.replies = replies
        self.enough = request.enough
        self.learn = request.learn  # 0 once learnt (or when it does not learn)
        self.started = started
        self.deadline = deadline
        self.silence = silence  # its transport's: the nodes that stopped answering
        self.decided = 0.0  # when the replies decided the request

    def learnt(self) -> bool:
        """A first request: once ``learn`` nodes answered, its deadline is the one their
        round trips give (True then)."""
        learnt = learnt_deadline(self.request, self.started, time.monotonic(),
                                 len(self.replies.round_trips))
        if learnt is None:
            return False
        self.learn = 0
        self.deadline = min(self.deadline, learnt)
        return True

    def decide(self, stragglers: Callable[[], Iterable[int]]) -> bool:
        """Asked as replies come in: once the replies decide the request, the stragglers
        (the nodes not read yet, asked only then) get as long again as the decision took
        (a healthy cluster's replies come in together), and none once they are all
        silent. True: nothing is left to wait for."""
        if not self.decided and (self.enough is None or not self.enough(
                self.replies, self.replies.identities)):
            return False
        now = time.monotonic()
        self.decided = self.decided or now
        self.deadline = min(self.deadline, self.silence.until(self.started, self.decided,
                                                              now, stragglers()))
        return self.deadline <= now


class Silence:
    """Per target (a node, or a cluster node's master), since when it has owed a reply
    without answering anything: set when a request is written to it, cleared by any reply
    and by any failure but a timeout
    (:func:`answered`). A decided request waits the stragglers' grace only for a target
    that may still answer in it, not one silent for many graces (hung, blackholed). The
    grace changes no decision, so this rule cannot either. Threads race on it without a
    lock: the error is a thread's delay between writing and noting, far below 10 graces."""

    __slots__ = ("since",)

    def __init__(self, count: int) -> None:
        self.since = [0.0] * count  # 0.0: it answered since it was last written to

    def grow(self) -> None:
        """One more target (redlock._io.routing.Routes)."""
        self.since.append(0.0)

    def owed(self, target: int, at: float) -> None:
        """A request was written to ``target`` at ``at``."""
        if not self.since[target]:
            self.since[target] = at

    def heard(self, target: int) -> None:
        self.since[target] = 0.0

    def failed(self, target: int, exc: BaseException) -> None:
        """A request to ``target`` failed with ``exc`` (see :func:`answered`)."""
        if answered(exc):
            self.since[target] = 0.0

    def until(self, started: float, decided: float, now: float,
              stragglers: Iterable[int]) -> float:
        """Until when a request started at ``started`` and decided at ``decided`` waits
        for ``stragglers`` (the targets it has not read yet), asked at ``now``: as long
        again as the decision took, at least STRAGGLER_GRACE_MIN; not at all (``now``)
        once every straggler is silent."""
        grace = max(decided - started, STRAGGLER_GRACE_MIN)
        cutoff = now - SILENT_AFTER_GRACES * grace
        for target in stragglers:
            since = self.since[target]
            if not since or since > cutoff:
                return decided + grace
        return now


class Refusals:
    """Per target, a connection attempt that failed fast (any failure but a timeout,
    :func:`answered`), and when the next may be made: until then a request fails that
    target's calls at once with the same error instead of opening a connection that would
    fail the same way (which changes no decision). The wait doubles from
    RETRY_CONNECT_MIN up to RETRY_CONNECT_MAX; any connection made clears it."""

    __slots__ = ("errors", "retry_at", "waits")

    def __init__(self, count: int) -> None:
        self.errors: list[BaseException | None] = [None] * count
        self.retry_at = [0.0] * count
        self.waits = [0.0] * count

    def grow(self) -> None:
        """One more target (redlock._io.routing.Routes)."""
        self.errors.append(None)
        self.retry_at.append(0.0)
        self.waits.append(0.0)

    def failed(self, target: int, exc: BaseException, now: float) -> None:
        """A connection attempt to ``target`` failed with ``exc`` at ``now``."""
        if not answered(exc):
            return
        wait = min(max(self.waits[target] * 2, RETRY_CONNECT_MIN), RETRY_CONNECT_MAX)
        self.errors[target], self.waits[target], self.retry_at[target] = exc, wait, now + wait
        # (Threads race here: the latest failure wins, which is as good as any.)

    def connected(self, target: int) -> None:
        if self.errors[target] is not None:
            self.errors[target], self.waits[target], self.retry_at[target] = None, 0.0, 0.0

    def refusing(self, target: int, now: float) -> BaseException | None:
        """The error to fail ``target``'s calls with now, or None: try to connect."""
        error = self.errors[target]
        return error if error is not None and now < self.retry_at[target] else None


def fill_pending(indexes: Sequence[int], replies: list[object], exc: BaseException) -> None:
    """Give the calls at ``indexes`` that have no reply yet ``exc`` instead."""
    for index in indexes:
        if replies[index] is PENDING:
            replies[index] = exc


def render(call: Call, *, evalsha: bool) -> tuple[Any, ...]:
    """The command for a call: EVALSHA, or EVAL with the script's body."""
    if call.script is None:
        return call.args
    head = ("EVALSHA", call.script.sha) if evalsha else ("EVAL", call.script.source)
    return (*head, len(call.keys), *call.keys, *call.args)


class Late(Generic[Conn]):
    """A connection with ``outstanding`` replies nobody waits for any more."""

    __slots__ = ("acquires", "closed", "conn", "deadline", "mutex", "outstanding", "target")

    def __init__(self, conn: Conn, target: int, calls: Sequence[Call], outstanding: int,
                 deadline: float) -> None:
        self.conn = conn
        self.target = target
        self.outstanding = outstanding
        self.deadline = deadline  # give up (close it) after this
        # The (lock key, lock value) of acquires among its unread calls: releases go behind.
        self.acquires = {key for call in calls for key in acquire_keys(call)}
        self.closed = False  # drained and given back: nothing more may be written behind
        self.mutex = threading.Lock()  # one reader or writer at a time


def acquire_keys(call: Call) -> list[tuple[object, object]]:
    """What a release must match to go behind an acquire: (lock key, lock value) pairs."""
    if call.script is scripts.ACQUIRE:
        return [(call.keys[0], call.args[0])]
    if call.script is scripts.ACQUIRE_MANY:
        # KEYS: 2 of the node's (marker, counters), the lock keys, and the horizon and
        # membership record (redlock._core.kinds.with_epoch)
        return [(key, call.args[0]) for key in call.keys[2:-2]]
    return []


def late_sendable(call: Call) -> bool:
    """May this call still be sent once its request is over (its connection came up late)? A
    release that ends an acquire call or a held lock (leave '1'), or an extend: they touch only
    their own key, and nothing else would free it before its TTL. Never an acquire (nobody would
    wait for its reply, and its release may have gone), and never the release of a failed attempt
    (leave '0'): the call's next attempt takes over what it would delete, and the call's final
    release deletes it (docs/design.md §2.1)."""
    if call.script is scripts.RELEASE:
        return len(call.args) > 1 and call.args[1] == "1"
    return call.script is scripts.EXTEND


def release_key(call: Call) -> tuple[object, object] | None:
    return (call.keys[0], call.args[0]) if call.script is scripts.RELEASE else None


class LateConnections(Generic[Conn]):
    """Per target, the late connections (thread-safe)."""

    def __init__(self, count: int) -> None:
        self._late: list[list[Late[Conn]]] = [[] for _ in range(count)]
        self._mutex = threading.Lock()
        # How many there are (an attribute: every request looks whether there are any).
        self.total = 0

    def add(self, late: Late[Conn]) -> Late[Conn] | None:
        """Keep a late connection; returns an evicted one for the caller to close."""
        with self._mutex:
            entries = self._late[late.target]
            entries.append(late)
            if len(entries) > LATE_PER_TARGET:
                return entries.pop(0)
            self.total += 1
            return None

    def remove(self, late: Late[Conn]) -> None:
        with self._mutex:
            entries = self._late[late.target]
            if late in entries:
                entries.remove(late)
                self.total -= 1

    def grow(self) -> None:
        """One more target (redlock._io.routing.Routes)."""
        with self._mutex:
            self._late.append([])

    def count(self, target: int) -> int:
        return len(self._late[target])

    def entries(self) -> list[Late[Conn]]:
        with self._mutex:
            return [late for entries in self._late for late in entries]

    def behind(self, release: Call, target: int) -> list[Late[Conn]]:
        """The late connections on the release's target carrying an acquire of its lock
        value: the release is written behind each (and their acquire is forgotten)."""
        key = release_key(release)
        if key is None:
            return []
        with self._mutex:
            mine = [late for late in self._late[target] if key in late.acquires]
        for late in mine:
            late.acquires.discard(key)
        return mine

    def drain(self) -> list[Late[Conn]]:
        """Every entry (removed), for closing."""
        with self._mutex:
            entries = [late for target in self._late for late in target]
            for target in self._late:
                target.clear()
            self.total = 0
        return entries
