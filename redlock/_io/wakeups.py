"""Wake-ups from releases anywhere (docs/design.md §6.4): the bookkeeping shared by the sync and
asyncio listeners, which add the connections and the reading.

A message wakes the local waiter it names, or, naming nobody, the first local waiter on that
channel: one, not the herd. Subscriptions linger :data:`LINGER` seconds after the last wait. A
release before a subscription came up was missed, so its waiters are woken to look again then; a
message that woke nobody is kept a while for a waiter's first watch to claim
(:meth:`WakeRegistry._claim`). Wake-ups are hints: a lost one costs a wait, never safety."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from redlock._core.handoff import Handoffs, Heard, parse_message
from redlock._core.requests import Wakeable
from redlock._observe.log import get_logger

logger = get_logger("redlock.nodes")

# How long a channel stays subscribed after its last waiter stopped waiting.
LINGER = 2.0
# An idle subscription connection is pinged this often; one that does not answer
# within twice that is reconnected (a half-open TCP connection hears nothing).
PING_INTERVAL = 5.0
# A listener with nothing to listen to for this long closes its connections.
IDLE_CLOSE = 30.0
# How many releases that woke nobody are kept per channel (see WakeRegistry._claim).
UNCLAIMED_KEPT = 8
# Reconnecting a node's subscription: the first wait, doubling up to the longest.
RECONNECT_MIN, RECONNECT_MAX = 0.1, 5.0


@dataclass(eq=False)
class Watch:
    """One wait: the channels that may end it, the waiter id a message must name
    (None: woken only by a message naming nobody) and the event to set."""

    channels: tuple[str, ...]
    waiter: str | None
    event: Wakeable
    woken: bool = field(default=False)
    # Hand-offs to this waiter (docs/design.md §6.7): per node the latest, and how many.
    heard: dict[int, Heard] = field(default_factory=dict)
    count: int = 0
    # A wait for more hand-offs: (attempt, k), woken by a hand-off only once k nodes'
    # latest messages are of that attempt (None: by every message).
    expect: tuple[int, int] | None = None

    def expected(self, live: int) -> bool:
        """The wait has the hand-offs it waits for (call under the registry's mutex). ``live``: on
        how many nodes its channel is subscribed now: no more messages than that can come (a cold
        start, nodes whose subscription is down), so it waits for no more than that."""
        if self.expect is None:
            return True
        attempt, nodes = self.expect
        heard = sum(1 for h in self.heard.values() if h.attempt == attempt)
        return heard >= max(1, min(nodes, live))

    def record(self, node: int | None, handoff: tuple[int, int, int] | None,
               subscribed: float | None) -> None:
        """Keep a hand-off message from ``node``, which came by a subscription confirmed
        at ``subscribed`` (call under the registry's mutex)."""
        if node is not None and handoff is not None:
            self.heard[node] = Heard(node, *handoff, subscribed=subscribed)
            self.count += 1


#: The waiter of a watch that every message on its channels wakes, whoever it names: an
#: election's observer (docs/design.md §12.1), not a waiter in line.
EVERY = "*"


def _is_waiter_id(data: str) -> bool:
    return len(data) == 40


class WakeRegistry:
    """The waits of one manager, by channel (thread-safe). ``changed`` is called when
    the set of wanted channels grew, so the listeners subscribe at once."""

    def __init__(self, changed: Callable[[], None] = lambda: None) -> None:
        self.changed = changed
        self._mutex = threading.Lock()
        self._watches: dict[str, list[Watch]] = {}
        self._idle_since: dict[str, float] = {}  # channels without a wait, lingering
        self._live: dict[str, set[int]] = {}  # channel -> nodes it is subscribed on
        # (channel, node) -> when that subscription was confirmed on its connection
        self._live_since: dict[tuple[str, int], float] = {}
        self._refused: set[int] = set()  # nodes that refused SUBSCRIBE (told once)
        # channel -> the last releases that woke nobody here: (heard at, data, node, when
        # the subscription it came by was confirmed)
        self._unclaimed: dict[str, deque[tuple[float, str, int | None, float | None]]] = {}

    # -- the waiters' side ---------------------------------------------------------

    def watch(self, channels: Iterable[str], waiter: str | None, event: Wakeable,
              since: float | None = None) -> Watch:
        """Wake ``event`` on releases from now on; ``since`` (monotonic): when the
        waiter's call started, releases heard since then that woke nobody count too."""
        watch = Watch(tuple(channels), waiter, event)
        grew = False
        with self._mutex:
            for channel in watch.channels:
                waits = self._watches.setdefault(channel, [])
                grew |= not waits and self._idle_since.pop(channel, None) is None
                waits.append(watch)
            missed = since is not None and self._claim(watch.channels, waiter, since)
        if grew:
            self.changed()
        if missed:
            event.set()
        return watch

    def unwatch(self, watch: Watch) -> None:
        now = time.monotonic()
        with self._mutex:
            for channel in watch.channels:
                waits = self._watches.get(channel)
                if waits is None or watch not in waits:
                    continue
                waits.remove(watch)
                if not waits:
                    del self._watches[channel]
                    self._idle_since[channel] = now

    def wake_all(self) -> None:
        """Wake every wait: the manager closes, and its waiters (blocking acquires, an
        election's observers) end now rather than at their next poll."""
        with self._mutex:
            events = [w.event for waits in self._watches.values() for w in waits]
        for event in events:
            event.set()

    # -- the listeners' side -------------------------------------------------------

    def wanted(self) -> set[str]:
        """The channels to be subscribed now (lingering ones included)."""
        now = time.monotonic()
        with self._mutex:
            for channel in [c for c, t in self._idle_since.items() if now - t >= LINGER]:
                del self._idle_since[channel]
                self._unclaimed.pop(channel, None)
            return set(self._watches) | set(self._idle_since)

    def subscribed(self, node: int, channel: str) -> None:
        """``node`` confirmed the subscription. The first node to confirm wakes the
        channel's waiters: a release before it was missed."""
        with self._mutex:
            live = self._live.setdefault(channel, set())
            first = not live
            if node not in live:
                self._live_since[(channel, node)] = time.monotonic()
            live.add(node)
            waits = list(self._watches.get(channel, ())) if first else []
        for watch in waits:
            watch.event.set()

    def unsubscribed(self, node: int, channel: str) -> None:
        with self._mutex:
            live = self._live.get(channel)
            self._live_since.pop((channel, node), None)
            if live is not None:
                live.discard(node)
                if not live:
                    del self._live[channel]

    def node_lost(self, node: int) -> None:
        """The node's subscription connection broke: it hears nothing until resubscribed."""
        with self._mutex:
            for channel in list(self._live):
                self._live[channel].discard(node)
                self._live_since.pop((channel, node), None)
                if not self._live[channel]:
                    del self._live[channel]

    def refused(self, node: int, address: str, error: BaseException, *,
                hint: str = "allow SUBSCRIBE on the namespace's channels") -> None:
        """The node refused SUBSCRIBE (an ACL without channel permissions), or no
        subscription connection can be made with the node's settings: its waiters fall
        back to their backoff. Told once per node."""
        with self._mutex:
            if node in self._refused:
                return
            self._refused.add(node)
        logger.warning("redlock.release_feed_refused", node=address,
                       error=f"{type(error).__name__}: {error}",
                       hint=f"waiters in other processes notice releases by polling ({hint})")

    def handoffs(self, watch: Watch) -> Handoffs:
        """The hand-offs ``watch`` heard so far (docs/design.md §6.7); a wait for more
        is over (every message wakes the watch again)."""
        with self._mutex:
            watch.expect = None
            return Handoffs(watch.heard.values(), watch.count)

    def expect(self, watch: Watch, than: int, wake_at: tuple[int, int] | None) -> bool:
        """A wait for more hand-offs starts on ``watch``: hand-offs wake it only as ``wake_at``
        says (:class:`~redlock._core.requests.Backoff`) until :meth:`handoffs` is asked. True if it
        has that already (more than ``than`` heard, without ``wake_at``): the wait ends at once."""
        with self._mutex:
            watch.expect = wake_at
            if wake_at is None:
                return watch.count > than
            return watch.expected(max(len(self._live.get(c, ())) for c in watch.channels))

    def deliver(self, channel: str, data: str, node: int | None = None,
                wake: list[Wakeable] | None = None) -> None:
        """A release on ``node``: wake the waiter it names, or the first one; a hand-off is
        recorded on its waiter's watch; a message that woke nobody is kept a while (below).
        ``wake``: collects the events to set, for a listener that sets them after the last
        message it read (a waiter then wakes once)."""
        named, handoff = parse_message(data)
        with self._mutex:
            since = None if node is None else self._live_since.get((channel, node))
            waits = [w for w in self._watches.get(channel, []) if w.waiter != EVERY]
            # Named: that waiter (if it waits here); unnamed: the first, one only.
            woken = [w for w in waits if w.waiter == named] if _is_waiter_id(named) \
                else waits[:1]
            for watch in woken:
                watch.record(node, handoff, since)
            if not woken:
                self._unclaimed.setdefault(channel, deque(maxlen=UNCLAIMED_KEPT)).append(
                    (time.monotonic(), data, node, since))
            elif handoff is not None:  # a wait for more wakes once it has enough
                live = len(self._live.get(channel, ()))
                woken = [w for w in woken if w.expected(live)]
            woken += [w for w in self._watches.get(channel, []) if w.waiter == EVERY]
        if wake is not None:
            wake.extend(watch.event for watch in woken)
            return
        for watch in woken:
            watch.event.set()

    def _claim(self, channels: tuple[str, ...], waiter: str | None, since: float) -> bool:
        """A release heard since ``since`` that named ``waiter``, or nobody, and woke no one
        (under the mutex): a release during a waiter's first attempt, before its watch."""
        watch = next((w for c in channels for w in self._watches.get(c, ())
                      if w.waiter == waiter), None)
        claimed = False
        for channel in channels:
            kept = self._unclaimed.get(channel)
            for entry in list(kept or ()):
                heard_at, data, node, subscribed = entry
                named, handoff = parse_message(data)
                if heard_at < since or not (named == waiter or data == ""):
                    continue
                if handoff is not None:  # every hand-off to us is kept (§6.7)
                    kept.remove(entry)  # type: ignore[union-attr]
                    if watch is not None:
                        watch.record(node, handoff, subscribed)
                    claimed = True
                elif not claimed:
                    kept.remove(entry)  # type: ignore[union-attr]
                    claimed = True
        return claimed

    def heard_since(self, channel: str, when: float | None, nodes: int) -> bool:
        """Whether at least ``nodes`` nodes confirmed ``channel`` before ``when``
        (``time.monotonic``; None: never): their releases since then reach us."""
        if when is None:
            return False
        with self._mutex:
            return sum(1 for node in self._live.get(channel, ())
                       if self._live_since.get((channel, node), when) < when) >= nodes

    def live(self, channel: str) -> bool:
        """Subscribed on some node (for tests and inspection)."""
        with self._mutex:
            return bool(self._live.get(channel))


@dataclass
class NodeSubscription:
    """What one node's subscription connection has asked for, and its health: the
    decisions of a listener's loop, apart from its I/O."""

    node: int
    registry: WakeRegistry
    channels: set[str] = field(default_factory=set)
    last_heard: float = field(default_factory=time.monotonic)
    ping_sent: float | None = None
    idle_since: float | None = None

    def commands(self, wanted: set[str] | None = None) -> list[tuple[str, ...]]:
        """SUBSCRIBE / UNSUBSCRIBE to send on the connection so it listens to what is
        wanted (it is taken as sent; ``wanted``: the registry's, if the caller asked
        already), and a PING when due."""
        wanted = self.check_idle(wanted)
        commands: list[tuple[str, ...]] = []
        new, gone = sorted(wanted - self.channels), sorted(self.channels - wanted)
        if new:
            commands.append(("SUBSCRIBE", *new))
        if gone:
            commands.append(("UNSUBSCRIBE", *gone))
        self.channels = wanted
        now = time.monotonic()
        if self.ping_sent is None and now - self.last_heard >= PING_INTERVAL:
            self.ping_sent = now
            commands.append(("PING",))
        return commands

    def check_idle(self, wanted: set[str] | None = None) -> set[str]:
        """The wanted channels; keeps the clock of :meth:`idle` (also while the node is
        down: a listener with nothing to listen to stops either way)."""
        if wanted is None:
            wanted = self.registry.wanted()
        if wanted:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()
        return wanted

    def heard(self, message: Any, wake: list[Wakeable] | None = None) -> None:
        """One message read from the connection (``wake``: see :meth:`WakeRegistry.deliver`)."""
        self.last_heard = time.monotonic()
        if not isinstance(message, list) or not message:
            if message in (b"PONG", "PONG"):  # (a PING before any SUBSCRIBE)
                self.ping_sent = None
            return
        kind = _text(message[0])
        if kind == "message" and len(message) == 3:
            self.registry.deliver(_text(message[1]), _text(message[2]), self.node, wake)
        elif kind == "subscribe" and len(message) >= 2:
            self.registry.subscribed(self.node, _text(message[1]))
        elif kind == "unsubscribe" and len(message) >= 2:
            self.registry.unsubscribed(self.node, _text(message[1]))
        elif kind == "pong":
            self.ping_sent = None

    def silent(self) -> bool:
        """A ping went unanswered for too long: the connection is dead."""
        return (self.ping_sent is not None
                and time.monotonic() - self.ping_sent >= 2 * PING_INTERVAL)

    def idle(self) -> bool:
        """Nothing to listen to for :data:`IDLE_CLOSE`: the listener may stop."""
        return self.idle_since is not None and time.monotonic() - self.idle_since >= IDLE_CLOSE

    def lost(self) -> None:
        """The connection broke: everything is asked for again on the next one."""
        self.registry.node_lost(self.node)
        self.channels = set()
        self.ping_sent = None
        self.last_heard = time.monotonic()


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
