"""How an acquire call opens and what each of its attempts sends: made once, shared by
the flow (:mod:`redlock._core.algorithm`) and the quick lane (:mod:`redlock._core.quick`),
so that both start a call and ask the nodes the same way (docs/design.md §2.6). A mixin
of :class:`~redlock._core.algorithm.RedlockCore`, as :class:`~redlock._core.holding.Holding`
is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.commit import grant_enough
from redlock._core.environment import Environment
from redlock._core.kinds import MUTEX, Kind
from redlock._core.members import Rule
from redlock._core.quick import Opening, Sent
from redlock._core.requests import Broadcast, Deadline
from redlock._core.settings import Keys, Settings
from redlock._core.state import RoundTrips
from redlock._core.templates import CallTemplates
from redlock._core.tokens import TokenFloors, attempt_owner
from redlock._core.waiting import patience

__all__ = ["Attempts"]


class Attempts:
    """An acquire call's opening and its attempts' requests (a mixin: the state is the
    core's)."""

    # Set by RedlockCore.__init__.
    env: Environment
    settings: Settings
    keys: Keys
    clock: Callable[[], float]
    rule: Rule
    amnesia: AmnesiaGuard
    round_trips: RoundTrips
    floors: TokenFloors
    templates: CallTemplates
    quorum: int
    n: int
    route: str
    _mutex_names: dict[tuple[str, ...], tuple[str, tuple[str, ...]]]

    if TYPE_CHECKING:
        def timeout(self, ttl: float | None = None) -> float: ...

    def open_acquire(self, resources: tuple[str, ...], ttl: float, *, blocking: bool,
                     timeout: float | None, kind: Kind = MUTEX) -> Opening:
        """An acquire call's start, made once whichever way it goes (the flow,
        :meth:`RedlockCore.acquire`, or the quick lane first, :mod:`redlock._core.quick`).

        Every round and wait ends by the caller's deadline: ``timeout`` after the start
        for a blocking acquire, one request ceiling for a single try
        (:meth:`Settings.single_try`); docs/design.md §2.5."""
        owner = self.env.random_hex(16)  # 128 bits, secret: only we can release our key
        # A blocking acquire of one resource waits in the nodes' line for it; its ticket
        # (wall-clock microseconds: comparable across hosts, see docs/design.md §6) is
        # its place, the same on every node and every attempt. A single try, or a set,
        # does not queue.
        queued = blocking and timeout != 0 and len(resources) == 1
        ticket = str(int(self.env.wall_clock() * 1_000_000)) if queued else ""
        started = self.clock()
        single = not blocking or timeout == 0
        deadline = Deadline(self.clock, started + self.settings.single_try(ttl) if single
                            else None if timeout is None else started + timeout)
        return Opening(resources, owner, kind.for_call(owner), ticket, started, single,
                       deadline)

    def line(self, resources: Sequence[str], kind: Kind = MUTEX) -> str:
        """The local line of an acquisition: a resource's release channel (a set has one
        of its own). Attempts in one line from one manager take turns."""
        if kind is MUTEX:
            return self._mutex_name(resources)[0]
        return kind.channel(self.keys, resources[0] if len(resources) == 1
                            else "\x00".join(resources))

    def _mutex_name(self, resources: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """A mutex's (line, buckets) of ``resources``, kept for the names used lately."""
        key = tuple(resources)
        try:
            return self._mutex_names[key]
        except KeyError:
            if len(self._mutex_names) >= 1024:
                self._mutex_names.clear()
            made = self._mutex_names[key] = (
                MUTEX.channel(self.keys, key[0] if len(key) == 1 else "\x00".join(key)),
                MUTEX.buckets(key))
            return made

    def attempt_request(self, opening: Opening, ttl: float, kind: Kind,
                        attempt: int) -> Sent:
        """An attempt's request (not sent yet), made when it starts. (On every attempt:
        what it asks of other objects is asked once.)"""
        resources, settings, rule, health = opening.resources, self.settings, self.rule, \
            self.amnesia.health
        rule.check()  # MembershipError: our nodes cannot form a quorum (§13.2)
        epoch, started = rule.epoch, self.clock()
        # A manager's first attempt also reads every node's INFO (docs/design.md §4.7),
        # behind the acquire calls on the same connections: no round of its own.
        inspect = () if health.inspected else self.amnesia.inspect_calls()
        # Before the round trips are known (a new manager), the round learns its timeout
        # from its own replies, as later ones have it from RoundTrips (docs/design.md §2.4).
        learn = self.quorum if (settings.node_timeout is None
                                and self.round_trips.measured() < self.quorum) else 0
        timeout = self.timeout(ttl)  # (the attempt's, its line entry's patience from it)
        line, buckets = (self._mutex_name(resources) if kind is MUTEX
                         else (self.line(resources, kind), kind.buckets(resources)))
        values = (attempt_owner(opening.owner, attempt), self.floors.get(buckets),
                  opening.ticket, int(patience(settings, timeout) * 1000), attempt)
        calls, packed = self.templates.acquire(kind, resources, max(1, int(ttl * 1000)),
                                               epoch, self.route, values)
        # Whose grants do not count: restarted nodes being judged (§4.4), nodes of
        # another format (§4.1).
        uncounted = (health.suspect if not health.incompatible
                     else {**health.suspect, **health.incompatible})
        return Sent(Broadcast(calls + inspect, opening.deadline.bound(timeout), line=line,
                              turns=not opening.ticket,
                              enough=grant_enough(self.n, uncounted, rule, kind.vote,
                                                  kind.group if kind.grouped else None),
                              learn=learn, packed=None if inspect else packed),
                    started, epoch, buckets)
