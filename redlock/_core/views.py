"""Read-only views of the lock family (docs/design.md §12), free of I/O: who leads an election now
(``leader()``, and the waits of ``observe()``), who holds a semaphore's permits, who holds a
read-write lock. Each reads every node and believes only what a quorum of healthy nodes says (by
the membership rule, §13.2): a snapshot, which may be stale by the time it returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redlock._core.algorithm import RedlockCore
from redlock._core.kinds import LEADERSHIP, Permit, ReadWrite
from redlock._core.layout import Layout
from redlock._core.requests import Broadcast, Call, Flow, PauseUntilWoken, Wakeable
from redlock._core.settings import Keys
from redlock._scripts import family
from redlock._scripts.family_replies import (
    Seen,
    leader_seen,
    readers_writer_seen,
    slots_seen,
    term_record,
)
from redlock.errors import NodeResult, Outcome, QuorumUnavailable, describe


@dataclass(frozen=True)
class Leader:
    """Who leads an election, read from a quorum (``Election.leader()``).

    ``identity``: what the leader campaigned as; ``token``: its term (the fencing token
    its writes carry); ``time_left``: seconds its term lasts at least, unless renewed
    (the quorum-th longest key among the nodes that name it, less the drift)."""

    identity: str
    token: int
    time_left: float

    def same_term(self, other: Leader | None) -> bool:
        return other is not None and (self.identity, self.token) == (other.identity, other.token)


def _believed(core: RedlockCore, replies: Sequence[object], what: str,
              name: str) -> list[tuple[int, object]]:
    """The replies of nodes that answered and whose word counts (not being judged after a
    restart, §4.4; not of another format, §4.1), with their node. Where those do not meet
    the quorum rule, what they do not name is unknown, not free: QuorumUnavailable (§12.1),
    naming ``what`` (of ``name``) and each node that did not count."""
    doubted = _doubted(core)
    answered = [(node, reply) for node, reply in enumerate(replies[:core.n])
                if node not in doubted and not isinstance(reply, BaseException)]
    rule = core.membership.rule
    if not rule.met([node for node, _ in answered]):
        raise _unknown(core, replies, f"{what} of {name!r} is unknown: "
                       f"{rule.count([n for n, _ in answered], 'answered')}", name)
    return answered


def _doubted(core: RedlockCore) -> set[int]:
    health = core.amnesia.health
    return set(health.suspect) | set(health.incompatible)


def _unknown(core: RedlockCore, replies: Sequence[object], why: str,
             name: str) -> QuorumUnavailable:
    """The error of a view that cannot tell: ``why``, and each node that did not count."""
    doubted = _doubted(core)
    silent = [NodeResult(core.addresses[node], Outcome.ERROR,
                         "its word does not count until it is judged (a restart or another"
                         " format)" if node in doubted else
                         getattr(reply, "detail", None) or str(reply))
              for node, reply in enumerate(replies[:core.n])
              if node in doubted or isinstance(reply, BaseException)]
    return QuorumUnavailable(f"{why}; what the others hold cannot be told from here (per"
                             f" node: {describe(silent)})", resource=name, outcomes=silent)


#: Per holder, the nodes that name it and the ms its grant has left on each.
Named = dict[str, list[tuple[int, int]]]


def _lasting(core: RedlockCore, named: list[tuple[int, int]], elapsed: float) -> float | None:
    """How long the nodes that name a holder keep naming it by the quorum rule (a
    majority; during a membership change, of both sets, §13.2): the longest grants
    first, until they meet the rule; seconds, less the time the read took and the
    drift. None when they never meet it (not a holder by the rule)."""
    nodes: list[int] = []
    for node, pttl in sorted(named, key=lambda entry: -entry[1]):
        nodes.append(node)
        if core.membership.rule.met(nodes):
            lasts = pttl / 1000
            return max(0.0, lasts - elapsed - core.settings.drift(lasts))
    return None


def leader_calls(layout: Layout, name: str, n: int) -> tuple[Call, ...]:
    calls = []
    for i in range(n):
        keys = layout.of(i, name)
        calls.append(Call(i, (), family.LEADER, (LEADERSHIP.lock_key(keys, name),
                                                 keys.part(name, "term"), keys.marker)))
    return tuple(calls)


def read_leader(core: RedlockCore, name: str) -> Flow[Leader | None]:
    """The leader a quorum of nodes names with time left, with the term its record
    gives (§12.1); None when there is none (vacant, or an election under way)."""
    started = core.clock()
    replies = yield Broadcast(leader_calls(core.layout, name, core.n), core.timeout())
    elapsed = core.clock() - started
    holders: Named = {}
    records: dict[str, list[str]] = {}
    answered = _believed(core, replies, "the leadership", name)
    for node, reply in answered:
        answer = leader_seen(reply)
        if answer is not None:
            (pttl, holder), record = answer
            holders.setdefault(holder, []).append((node, pttl))
            records.setdefault(holder, []).append(record)
    for holder, named in holders.items():
        time_left = _lasting(core, named, elapsed)
        if time_left is None:
            continue
        terms = [term for record in records[holder]
                 if (term := term_record(record, holder)) is not None]
        if not terms:  # elected, its record not written yet: not known as leader yet
            return None
        token, identity = max(terms)
        return Leader(identity, token, time_left)
    # Nobody by the rule among those that answered: vacant only if no holder they name
    # could make a quorum with the nodes that did not answer (§12.1).
    silent = set(range(core.n)) - {node for node, _ in answered}
    rule = core.membership.rule
    for named in holders.values():
        if silent and rule.met({node for node, _ in named} | silent):
            raise _unknown(core, replies, f"the leadership of {name!r} is unknown: a holder"
                           f" is named by {len(named)} of the nodes that answered, and with"
                           f" the {len(silent)} that did not it may hold a quorum", name)
    return None


def next_leader(core: RedlockCore, name: str, last: Leader | None, first: bool,
                ttl: float, wake: Wakeable, closing: Wakeable) -> Flow[Leader | None]:
    """``observe()``'s step: the leadership as soon as it differs from ``last`` (or at
    once, the ``first`` time). Between reads it waits to be woken (a release or a
    proclamation, published on the election's channels), until the current leader's
    time would run out, or at most ``ttl`` (§12.1). Through an outage, nothing (the
    leadership is unknown), read again every ``retry_delay_max``, until the outage has
    lasted ``outage_timeout``: then QuorumUnavailable. Once the manager is ``closing``, at
    once ``last`` (the observer then stops)."""
    unknown_since: float | None = None
    while True:
        wake.clear()  # a message during the read below wakes the next wait at once
        try:
            current = yield from read_leader(core, name)
        except QuorumUnavailable:
            if closing.is_set():
                return last
            now = core.clock()
            if unknown_since is None:
                unknown_since = now
            limit = core.settings.outage_timeout
            if limit is not None and now - unknown_since >= limit:
                raise
            yield PauseUntilWoken(core.settings.retry_delay_max, wake)
            continue
        unknown_since = None
        if first or (current is None) != (last is None) or (
                current is not None and not current.same_term(last)):
            return current
        if closing.is_set():  # (set before close() wakes the waits: none is missed)
            return last
        wait = ttl if current is None else min(ttl, current.time_left + 0.05)
        yield PauseUntilWoken(max(wait, 0.01), wake)


def election_channels(keys: Keys, name: str) -> tuple[str, ...]:
    """What wakes an observer: releases of the leadership, and proclamations."""
    return LEADERSHIP.channel(keys, name), keys.part(name, "elected")


# -- semaphore and read-write lock views (``inspect``, ``redlock status``) ------------------


@dataclass(frozen=True)
class Holder:
    """A holder a quorum of nodes agrees on: the first 12 hex digits of SHA1 of its lock value
    (tells holders apart without revealing it) and the seconds its grant lasts at least."""

    holder: str
    time_left: float


@dataclass(frozen=True)
class SemaphoreStatus:
    """Who holds each permit of a semaphore: ``slots[i]`` is slot i's holder or None."""

    name: str
    permits: int
    slots: tuple[Holder | None, ...]

    @property
    def held(self) -> int:
        return sum(1 for s in self.slots if s is not None)


@dataclass(frozen=True)
class ReadWriteStatus:
    """Who holds a read-write lock: its writer (or None) and its readers."""

    name: str
    writer: Holder | None
    readers: tuple[Holder, ...]


def _count(seen: Named, node: int, grant: Seen | None) -> None:
    if grant is not None:
        pttl, holder = grant
        seen.setdefault(holder, []).append((node, pttl))


def _agreed(core: RedlockCore, seen: Named, elapsed: float) -> list[Holder]:
    """Holders named by a quorum (by the rule), with how long they stay so."""
    out = []
    for holder, named in seen.items():
        time_left = _lasting(core, named, elapsed)
        if time_left is not None:
            out.append(Holder(holder, time_left))
    return sorted(out, key=lambda h: h.holder)


def semaphore_status(core: RedlockCore, name: str, permits: int) -> Flow[SemaphoreStatus]:
    kind = Permit(permits=permits)
    keys = core.keys
    calls = tuple(Call(i, (), family.SEM_INSPECT,
                       tuple(kind.slot_key(keys, name, s) for s in range(permits)))
                  for i in range(core.n))
    started = core.clock()
    replies = yield Broadcast(calls, core.timeout())
    elapsed = core.clock() - started
    per_slot: list[Named] = [{} for _ in range(permits)]
    for node, reply in _believed(core, replies, "the semaphore", name):
        for slot, seen in enumerate(slots_seen(reply, permits) or ()):
            _count(per_slot[slot], node, seen)
    slots = tuple(next(iter(_agreed(core, seen, elapsed)), None) for seen in per_slot)
    return SemaphoreStatus(name, permits, slots)


def rwlock_status(core: RedlockCore, name: str) -> Flow[ReadWriteStatus]:
    keys = core.keys
    writer_key, readers_key = (ReadWrite(mode="w").lock_key(keys, name),
                               ReadWrite(mode="r").lock_key(keys, name))
    calls = tuple(Call(i, (), family.RW_INSPECT, (writer_key, readers_key)) for i in range(core.n))
    started = core.clock()
    replies = yield Broadcast(calls, core.timeout())
    elapsed = core.clock() - started
    writers: Named = {}
    readers: Named = {}
    for node, reply in _believed(core, replies, "the read-write lock", name):
        seen = readers_writer_seen(reply)
        if seen is not None:
            _count(writers, node, seen[0])
            for reader in seen[1]:
                _count(readers, node, reader)
    return ReadWriteStatus(name, next(iter(_agreed(core, writers, elapsed)), None),
                           tuple(_agreed(core, readers, elapsed)))
