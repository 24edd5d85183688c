"""Kinds of grant (docs/design.md §12.0): what one acquisition holds on each node.

The algorithm (:mod:`redlock._core.algorithm`, :mod:`redlock._core.holding`) is one for
every kind; a kind only says which keys of a name it uses and which scripts grant,
commit (write back), renew and give back a grant:

- :data:`MUTEX`, the lock (and a set of locks, ``lock_many``);
- :class:`Leadership`, an election's leader (a mutex on the election's own key, with a
  term record written after the grant, §12.1);
- :class:`Permit`, one of a semaphore's K slots (§12.2);
- :data:`READ` and :data:`WRITE`, a read-write lock's two modes (§12.3).

Each kind's keys are its own, so a name can be a lock, an election, a semaphore and a
read-write lock at once. A kind's tokens come from the counter of a name
(:meth:`Kind.token_name`): the name itself, or for a permit its slot's name.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from redlock._core.requests import Call, CommandArg
from redlock._core.settings import Keys
from redlock._core.tokens import bucket
from redlock._scripts import family
from redlock._scripts import lock as scripts
from redlock._scripts.family_replies import granted_slot, permit_outcome
from redlock._scripts.replies import acquire_outcome, acquire_vote
from redlock.errors import NodeResult

#: A call that votes: 1 yes, 0 no, None unknown (see redlock._core.commit.grant_enough).
Vote = Callable[[object], "int | None"]


class AcquireArgs(NamedTuple):  # (one per attempt: a third of a frozen dataclass's time)
    """What every kind's acquire call carries (the mutex's ARGV, §2.2)."""

    owner: str
    ttl_ms: int
    floor: int
    ticket: str  # '' for a single try: it neither joins nor jumps the line
    patience_ms: int
    attempt: int = 0  # the attempt's number in its call (hand-off records, §6.7)
    route: str = ""  # where a hand-off to it is told: its manager's route (§6.7)


def with_epoch(calls: Iterable[Call], keys: Keys, epoch: int) -> tuple[Call, ...]:
    """Calls of the scripts that grant, commit or renew, as they are sent: with the
    node's membership record as last key and the client's epoch as last argument (§13.1;
    the scripts' EPOCH_CHECK). Every such call a kind builds goes out through here."""
    members = keys.members
    # Calls that shared their keys and arguments (one per node, in a row) still share
    # them: the transports pack a command once per request and reuse it for the next
    # node when it is the same (redlock._io.wire.Packing).
    made: list[Call] = []
    before: Call | None = None  # the previous call as given
    for call in calls:
        same_args = before is not None and call.args is before.args
        same_keys = before is not None and call.keys is before.keys
        made.append(Call(call.node, made[-1].args if same_args else (*call.args, epoch),
                         call.script, made[-1].keys if same_keys else (*call.keys, members)))
        before = call
    return tuple(made)


class ResourceKeys(NamedTuple):
    """One resource's key names for one kind, as its acquire and release calls send them."""

    lock: str
    channel: str
    line: str
    deadlines: str
    line_ttls: str
    bucket: str


def _places_back(args: tuple[CommandArg, ...]) -> bool:
    """A release's ``args`` (owner, leave[, patience, ticket]) are a failed attempt's
    give-back of a waiter in line, which puts its place back where its grant took it out
    (a permit's, a reader's: §12.2) or never put it in (a mutex's on an empty line: §6.3)."""
    return len(args) == 4 and args[1] == "0" and args[3] != ""


@functools.lru_cache(maxsize=1024)
def _resource_keys(kind: Kind, namespace: str, resource: str) -> ResourceKeys:
    # Built on every acquire and release of a name: kept for the names used lately (a
    # bounded cache: the client's memory does not grow with the names ever locked), by
    # the namespace (a string hashes in C, a Keys dataclass in Python).
    keys = Keys(namespace)
    line, deadlines = kind.line(keys, resource)
    name = kind.token_name(resource)
    return ResourceKeys(kind.lock_key(keys, resource), kind.channel(keys, resource), line,
                        deadlines, kind.line_ttls(keys, resource), bucket(name))


class Kind:
    """The mutex: one key per name holding the owner value (``ns:{R}:lock``)."""

    name = "lock"  # in events, spans and the CLI
    noun = "lock on"  # in messages: "lock on 'orders'"
    #: Whether a release hands this kind's lock to the first waiter in line
    #: (docs/design.md §6.7): the mutex only.
    hands_off = True
    #: Whether a quorum must grant the same ``group`` (a permit's slot, §12.2).
    grouped = False

    # -- keys --------------------------------------------------------------------------

    def lock_key(self, keys: Keys, resource: str) -> str:
        return keys.lock(resource)

    def channel(self, keys: Keys, resource: str) -> str:
        """Where releases of ``resource`` publish; also its local line's key."""
        return keys.channel(resource)

    def names(self, keys: Keys, resource: str) -> ResourceKeys:
        """``resource``'s key names for this kind (cached: asked on every call)."""
        return _resource_keys(self, keys.namespace, resource)

    def wait_channels(self, keys: Keys, resources: Sequence[str],
                      route: str) -> tuple[str, ...]:
        """Where a waiter hears releases: each resource's channel, and, for a queued
        waiter (``route``: its manager's) of a kind that hands off, the route's (§6.7)."""
        channels = tuple(self.channel(keys, r) for r in resources)
        if route and self.hands_off:
            channels += tuple(f"{c}:{route}" for c in channels)
        return channels

    def line(self, keys: Keys, resource: str) -> tuple[str, str]:
        """The waiting line and its deadlines (§6.3)."""
        return keys.line(resource), keys.line_deadlines(resource)

    def line_ttls(self, keys: Keys, resource: str) -> str:
        """The waiting line's hand-off records (§6.7)."""
        return self.line(keys, resource)[0] + "-ttls"

    def token_name(self, resource: str) -> str:
        """The name whose counter this grant's tokens come from (its bucket, §3.0)."""
        return resource

    def buckets(self, resources: Sequence[str]) -> tuple[str, ...]:
        """The buckets whose floors an attempt sends (the largest is sent)."""
        return tuple(bucket(self.token_name(r)) for r in resources)

    # -- acquire -----------------------------------------------------------------------

    def acquire_calls(self, keys: Keys, nodes: range, resources: tuple[str, ...],
                      args: AcquireArgs) -> tuple[Call, ...]:
        if len(resources) == 1:
            named = self.names(keys, resources[0])
            # A queued waiter of a kind that hands off records its grant (§6.7).
            attempt = args.attempt if self.hands_off and args.ticket and args.attempt else ""
            call_args: tuple[CommandArg, ...] = (
                args.owner, args.ttl_ms, args.floor, args.ticket, args.patience_ms,
                named.bucket, attempt, *((args.route,) if attempt and args.route else ()))
            call_keys = (named.lock, keys.counter, keys.marker, named.line, named.deadlines,
                         named.line_ttls)
            return tuple([Call(i, call_args, scripts.ACQUIRE, call_keys) for i in nodes])
        return tuple(Call(i, (args.owner, args.ttl_ms, args.floor,
                              *(bucket(r) for r in resources)),
                          scripts.ACQUIRE_MANY,
                          (keys.marker, keys.counter, *(keys.lock(r) for r in resources)))
                     for i in nodes)

    vote: Vote = staticmethod(acquire_vote)

    def outcome(self, address: str, reply: object, resources: int) -> NodeResult:
        return acquire_outcome(address, reply, resources)

    def granted(self, replies: Mapping[int, object]) -> tuple[Kind, dict[int, object]]:
        """Of the granting nodes' replies, those this attempt keeps, and the kind its
        acquisition holds (a permit: of which slot, §12.2)."""
        return self, dict(replies)

    def stray(self, replies: Mapping[int, object]) -> tuple[int, ...]:
        """Granting nodes whose grant the attempt does not keep (released at once)."""
        return ()

    def group(self, reply: object) -> object:
        """Which grant a granting reply is (a permit: its slot): an attempt needs a
        quorum of grants of one group."""
        return None

    def next_attempt(self, replies: Sequence[object]) -> Kind:
        """The kind the next attempt of this call sends (a permit: which slot it
        prefers, from this attempt's grants)."""
        return self

    def for_call(self, owner: str) -> Kind:
        """The kind an acquire call's first attempt sends."""
        return self

    # -- holding -----------------------------------------------------------------------

    def write_back_call(self, keys: Keys, node: int, resource: str, owner: str,
                        token: int) -> Call:
        """Raise a granting node's counter to the token, if it still holds our grant
        (§3.2)."""
        return Call(node, (owner, token, bucket(self.token_name(resource))), scripts.WRITE_BACK,
                    (self.lock_key(keys, resource), keys.counter, keys.marker))

    def release_call(self, keys: Keys, node: int, resource: str,
                     args: tuple[CommandArg, ...]) -> Call:
        """Give the grant back, owner-checked; ``args``: (owner, leave[, patience,
        ticket]). The release hands the lock to the first in line if it left a record
        (§6.7). A failed attempt's ticket puts its place back where its grant found the
        line empty (§6.3)."""
        named = self.names(keys, resource)
        owner, leave, *rest = args
        return Call(node, (owner, leave, rest[0], named.bucket, rest[1]) if _places_back(args)
                    else (owner, leave, rest[0] if rest else "", named.bucket),
                    scripts.RELEASE,
                    (named.lock, named.channel, named.line, named.deadlines,
                     named.line_ttls, keys.counter, keys.marker, keys.members))

    def extend_call(self, keys: Keys, node: int, resource: str, owner: str,
                    ttl_ms: int) -> Call:
        return Call(node, (owner, ttl_ms), scripts.EXTEND, (self.lock_key(keys, resource),))

    def describe(self, resources: Sequence[str]) -> str:
        """The acquisition in messages: ``lock on 'orders'``."""
        shown = repr(resources[0]) if len(resources) == 1 else (
            "[" + ", ".join(repr(r) for r in resources) + "]")
        return f"{self.noun} {shown}"


#: The mutex: ``dlm.lock(...)`` and ``dlm.lock_many(...)``.
MUTEX = Kind()


@dataclass(frozen=True, eq=False)
class Leadership(Kind):
    """An election's leadership (§12.1): a mutex on ``ns:{R}:leader``, whose holder
    writes the term record ``ns:{R}:term`` once its term is committed."""

    identity: str = ""
    name = "election"
    noun = "leadership of"
    hands_off = False  # a leader proclaims its term after the grant: a plain wake

    def lock_key(self, keys: Keys, resource: str) -> str:
        return keys.part(resource, "leader")

    def channel(self, keys: Keys, resource: str) -> str:
        return keys.part(resource, "leader-released")

    def line(self, keys: Keys, resource: str) -> tuple[str, str]:
        return keys.part(resource, "leader-line"), keys.part(resource, "leader-line-deadlines")

    def extend_call(self, keys: Keys, node: int, resource: str, owner: str,
                    ttl_ms: int) -> Call:
        return Call(node, (owner, ttl_ms), family.EXTEND_LEADER,
                    (self.lock_key(keys, resource), keys.part(resource, "term")))

    def proclaim_call(self, keys: Keys, node: int, resource: str, owner: str,
                      term: int) -> Call:
        return Call(node, (owner, term, self.identity), family.PROCLAIM,
                    (self.lock_key(keys, resource), keys.part(resource, "term"),
                     keys.part(resource, "elected")))


#: Where a leadership's kind is needed without an identity (views, releases).
LEADERSHIP = Leadership()


@dataclass(frozen=True, eq=False)
class Permit(Kind):
    """One of a semaphore's ``permits`` slots (§12.2). ``slot`` is the slot held (None
    before a grant: any slot); ``preferred`` the slot an attempt asks for first."""

    permits: int = 1
    slot: int | None = None
    preferred: int = 0
    name = "semaphore"
    hands_off = False
    grouped = True
    noun = "permit of"

    def slot_key(self, keys: Keys, resource: str, slot: int) -> str:
        return keys.part(resource, f"permit:{slot}")

    def lock_key(self, keys: Keys, resource: str) -> str:
        assert self.slot is not None, "a permit's key is known once a slot is granted"
        return self.slot_key(keys, resource, self.slot)

    def channel(self, keys: Keys, resource: str) -> str:
        return keys.part(resource, "permit-released")

    def line(self, keys: Keys, resource: str) -> tuple[str, str]:
        return keys.part(resource, "permit-line"), keys.part(resource, "permit-line-deadlines")

    def slot_name(self, resource: str, slot: int) -> str:
        """The name of slot ``slot``: its tokens' counter, and the resource a fenced
        store keeps the slot's mark under (§12.2)."""
        return f"{resource}:permit:{slot}"

    def token_name(self, resource: str) -> str:
        assert self.slot is not None
        return self.slot_name(resource, self.slot)

    def buckets(self, resources: Sequence[str]) -> tuple[str, ...]:
        [r] = resources
        slots = range(self.permits) if self.slot is None else (self.slot,)
        return tuple(bucket(self.slot_name(r, s)) for s in slots)

    def for_call(self, owner: str) -> Kind:
        # Concurrent callers start on different slots (§12.2).
        return replace(self, slot=None, preferred=zlib.crc32(owner.encode()) % self.permits)

    def acquire_calls(self, keys: Keys, nodes: range, resources: tuple[str, ...],
                      args: AcquireArgs) -> tuple[Call, ...]:
        [r] = resources
        slots = range(self.permits)
        line, deadlines = self.line(keys, r)
        call_keys = (keys.marker, keys.counter, line, deadlines, self.channel(keys, r),
                     *(self.slot_key(keys, r, s) for s in slots),
                     self.slot_key(keys, r, self.permits))
        call_args: tuple[CommandArg, ...] = (
            args.owner, args.ttl_ms, args.floor, args.ticket, args.patience_ms, self.preferred,
            *(bucket(self.slot_name(r, s)) for s in slots))
        return tuple(Call(i, call_args, family.SEM_ACQUIRE, call_keys) for i in nodes)

    def outcome(self, address: str, reply: object, resources: int) -> NodeResult:
        return permit_outcome(address, reply, self.permits)

    @staticmethod
    def _slot(reply: object) -> int:
        """The slot of a granting reply (-1: not one, never kept)."""
        slot = granted_slot(reply)
        return -1 if slot is None else slot

    def granted(self, replies: Mapping[int, object]) -> tuple[Kind, dict[int, object]]:
        by_slot: dict[int, list[int]] = {}
        for node, reply in replies.items():
            by_slot.setdefault(self._slot(reply), []).append(node)
        # The slot most nodes granted (ties: the preferred one, then the lowest).
        slot = max(by_slot, key=lambda s: (len(by_slot[s]), s == self.preferred, -s))
        return (replace(self, slot=slot, preferred=slot),
                {i: replies[i] for i in by_slot[slot]})

    def stray(self, replies: Mapping[int, object]) -> tuple[int, ...]:
        kept = self.slot
        return tuple(i for i, reply in replies.items() if self._slot(reply) != kept)

    def next_attempt(self, replies: Sequence[object]) -> Kind:
        counts: dict[int, int] = {}
        for reply in replies:
            slot = granted_slot(reply)
            if slot is not None:
                counts[slot] = counts.get(slot, 0) + 1
        if not counts:
            return replace(self, slot=None)
        best = max(counts, key=lambda s: (counts[s], s == self.preferred, -s))
        return replace(self, slot=None, preferred=best)

    def group(self, reply: object) -> object:
        return self._slot(reply)

    def release_call(self, keys: Keys, node: int, resource: str,
                     args: tuple[CommandArg, ...]) -> Call:
        slots = range(self.permits) if self.slot is None else (self.slot,)
        line, deadlines = self.line(keys, resource)
        return Call(node, args if _places_back(args) else args[:2], family.SEM_RELEASE,
                    (self.channel(keys, resource), line, deadlines,
                     *(self.slot_key(keys, resource, s) for s in slots)))

    def describe(self, resources: Sequence[str]) -> str:
        which = "" if self.slot is None else f" (slot {self.slot})"
        return f"permit of {resources[0]!r}{which}"


@dataclass(frozen=True, eq=False)
class ReadWrite(Kind):
    """A read-write lock's read (``mode='r'``) or write (``'w'``) grant (§12.3)."""

    mode: str = "w"
    name = "rwlock"
    hands_off = False

    @property
    def noun(self) -> str:  # type: ignore[override]
        return "write lock on" if self.mode == "w" else "read lock on"

    def lock_key(self, keys: Keys, resource: str) -> str:
        return keys.part(resource, "write" if self.mode == "w" else "read")

    def channel(self, keys: Keys, resource: str) -> str:
        return keys.part(resource, "rw-released")

    def line(self, keys: Keys, resource: str) -> tuple[str, str]:
        return keys.part(resource, "rw-line"), keys.part(resource, "rw-line-deadlines")

    def acquire_calls(self, keys: Keys, nodes: range, resources: tuple[str, ...],
                      args: AcquireArgs) -> tuple[Call, ...]:
        [r] = resources
        line, deadlines = self.line(keys, r)
        # The line's score: the ticket's order, its parity the mode (§12.3); made here,
        # where integers are exact.
        score = "" if not args.ticket else str(2 * int(args.ticket) + (self.mode == "w"))
        call_keys = (keys.marker, keys.counter, keys.part(r, "write"), keys.part(r, "read"),
                     line, deadlines, self.channel(keys, r))
        call_args = (self.mode, args.owner, args.ttl_ms, args.floor, score,
                     args.patience_ms, bucket(r))
        return tuple(Call(i, call_args, family.RW_ACQUIRE, call_keys) for i in nodes)

    def write_back_call(self, keys: Keys, node: int, resource: str, owner: str,
                        token: int) -> Call:
        if self.mode == "w":
            return super().write_back_call(keys, node, resource, owner, token)
        return Call(node, (owner, token, bucket(resource)), family.READ_WRITE_BACK,
                    (keys.part(resource, "read"), keys.counter, keys.marker))

    def release_call(self, keys: Keys, node: int, resource: str,
                     args: tuple[CommandArg, ...]) -> Call:
        if self.mode == "w":
            return super().release_call(keys, node, resource, args)
        line, deadlines = self.line(keys, resource)
        # A reader's place is its score in the line (the ticket, even: §12.3).
        return Call(node, (*args[:3], str(2 * int(args[3]))) if _places_back(args)
                    else args[:2], family.READ_RELEASE,
                    (keys.part(resource, "read"), self.channel(keys, resource), line,
                     deadlines))

    def extend_call(self, keys: Keys, node: int, resource: str, owner: str,
                    ttl_ms: int) -> Call:
        if self.mode == "w":
            return super().extend_call(keys, node, resource, owner, ttl_ms)
        return Call(node, (owner, ttl_ms), family.READ_EXTEND, (keys.part(resource, "read"),))


#: A read-write lock's write and read grants.
WRITE = ReadWrite(mode="w")
READ = ReadWrite(mode="r")

__all__ = ["LEADERSHIP", "MUTEX", "READ", "WRITE", "AcquireArgs", "Kind", "Leadership",
           "Permit", "ReadWrite", "with_epoch"]
