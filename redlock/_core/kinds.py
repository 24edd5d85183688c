"""Kinds of grant (docs/design.md §12.0): what one acquisition holds on each node, and which
scripts grant, commit, renew and release it: :data:`MUTEX` (and sets), :class:`Leadership`
(§12.1), :class:`Permit` (§12.2), :data:`READ` and :data:`WRITE` (§12.3). Each kind's keys are its
own; its tokens come from the counter of :meth:`Kind.token_name`.

ACQUIRE of one resource and RELEASE, which every lock runs, are made from templates only
(:class:`Template`, docs/design.md §2.6): made once per name with a :class:`Hole` for each value
that changes per call, their command packed around the holes. Other calls are built each time."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import NamedTuple

from redlock._core.layout import Layout
from redlock._core.requests import Call, CommandArg
from redlock._core.settings import Keys
from redlock._core.tokens import bucket
from redlock._scripts import family
from redlock._scripts import lock as scripts
from redlock._scripts.command import HEADS, bulk, encode
from redlock._scripts.family_replies import granted_slot, permit_outcome
from redlock._scripts.replies import acquire_outcome, acquire_vote
from redlock._scripts.script import Script
from redlock.errors import NodeResult

#: A call that votes: 1 yes, 0 no, None unknown (see RedlockCore's early decision).
Vote = Callable[[object], "int | None"]


class AcquireArgs(NamedTuple):  # (one per attempt: a third of a frozen dataclass's time)
    """What every kind's acquire call carries (the mutex's ARGV, §2.2)."""

    value: str
    ttl_ms: int
    floor: int
    ticket: str  # '' for a single try: it neither joins nor jumps the line
    patience_ms: int
    attempt: int = 0  # the attempt's number in its call (hand-off records, §6.7)
    route: str = ""  # where a hand-off to it is told: its manager's route (§6.7)


# On a cluster node, the field of a hash slot's fence counters hash: one counter per hash
# slot (docs/design.md §11.4; a standalone node's buckets are its fields, §3.0).
SLOT_COUNTER = "0"


def counter_field(keys: Keys, name: str) -> str:
    """The field of ``keys.counter`` that ``name``'s tokens come from: its bucket (§3.0),
    or on a cluster node its hash slot's one counter."""
    return bucket(name) if keys.hash_slot is None else SLOT_COUNTER


def with_epoch(calls: Iterable[Call], keys: Keys | Layout, epoch: int) -> tuple[Call, ...]:
    """Calls of the scripts that grant, commit or renew, as they are sent: with the
    node's lease horizon and membership record as last keys and the client's epoch as last
    argument (§4.3.1, §13.1; the scripts' EPOCH_CHECK). Every such call a kind builds goes
    out through here. ``keys``: every call's, or the layout that gives each call's."""
    if isinstance(keys, Layout):
        if keys.clusters:
            return tuple(with_epoch((call,), keys.of_call(call), epoch)[0] for call in calls)
        keys = keys.keys
    node_keys = (keys.horizon, keys.members)
    # Calls that shared their keys and arguments still share them: the transports pack
    # a command once per request (redlock._io.wire.Packing).
    made: list[Call] = []
    before: Call | None = None  # the previous call as given
    for call in calls:
        same_args = before is not None and call.args is before.args
        same_keys = before is not None and call.keys is before.keys
        made.append(Call(call.node, made[-1].args if same_args else (*call.args, epoch),
                         call.script, made[-1].keys if same_keys else (*call.keys, *node_keys)))
        before = call
    return tuple(made)


def by_node(requests: Iterable[tuple[tuple[Call, ...], bytes | None]]
            ) -> tuple[tuple[Call, ...], bytes | None]:
    """One request made of the requests built for groups of nodes with their own key
    names (Layout.groups): their calls in the nodes' order (a node's own in theirs), and the
    packed command they all send if there was one group."""
    made = list(requests)
    if len(made) == 1:
        return made[0]
    return tuple(sorted((call for calls, _ in made for call in calls),
                        key=itemgetter(0))), None


class ResourceKeys(NamedTuple):
    """One resource's key names for one kind, as its acquire and release calls send them."""

    lock: str
    channel: str
    line: str
    deadlines: str
    line_ttls: str
    bucket: str


def _places_back(args: tuple[CommandArg, ...]) -> bool:
    """A release's ``args`` (value, leave[, patience, ticket]) are a failed attempt's
    release of a waiter in line, which puts its place back where its grant took it out
    (a permit's, a reader's: §12.2) or never put it in (a mutex's on an empty line: §6.3)."""
    return len(args) == 4 and args[1] == "0" and args[3] != ""


@functools.lru_cache(maxsize=1024)
def _resource_keys(kind: Kind, namespace: str, clustered: bool, resource: str) -> ResourceKeys:
    # Built on every acquire and release of a name: kept for the names used lately
    # (bounded), by the namespace string (cheaper to hash than Keys).
    keys = Keys(namespace)
    line, deadlines = kind.line(keys, resource)
    name = kind.token_name(resource)
    return ResourceKeys(kind.lock_key(keys, resource), kind.channel(keys, resource), line,
                        deadlines, kind.line_ttls(keys, resource),
                        SLOT_COUNTER if clustered else bucket(name))



class Hole:
    """Where a template's calls take one of the values it is filled with: the value at
    ``index`` of those (an acquire's :class:`AcquireArgs`, a release's arguments)."""

    __slots__ = ("index", "name")

    def __init__(self, index: int, name: str) -> None:
        self.index = index
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


class Template:
    """The calls of one script with fixed keys and arguments but for its holes
    (:class:`Hole`), one per node, sharing their tuples; and their command packed around the
    holes, so that filling it in is joining bytes. A hole placed twice, or among the keys, is
    a ValueError; it is filled with ``width`` values."""

    __slots__ = ("_head", "_one", "_pick", "_tails", "args", "holes", "keys", "script", "width")

    def __init__(self, script: Script, keys: tuple[str, ...],
                 args: tuple[CommandArg | Hole, ...], width: int) -> None:
        if any(isinstance(key, Hole) for key in keys):
            raise ValueError("a hole among a template's keys")
        places = [(place, arg.index) for place, arg in enumerate(args) if isinstance(arg, Hole)]
        indexes = [index for _, index in places]
        if len(set(indexes)) != len(indexes) or any(not 0 <= i < width for i in indexes):
            raise ValueError(f"holes {indexes} do not each take one of {width} values")
        self.script = script
        self.keys = keys
        self.args = args
        self.width = width
        self.holes = tuple(indexes)
        # The arguments, made by one C call from ``values + args``: per argument, its
        # hole's value or the template's own argument (one argument: the item itself).
        by_place = dict(places)
        self._pick = itemgetter(*[by_place[p] if p in by_place else width + p
                                  for p in range(len(args))])
        self._one = len(args) == 1
        # The EVALSHA command: its bytes up to the first hole (``_head``) and, per hole
        # in the arguments' order, the index of its value and the bytes after it (which
        # start with the CRLF that ends the value).
        segments, segment = [], b"".join([
            b"*%d\r\n" % (3 + len(keys) + len(args)), bulk("EVALSHA"), bulk(script.sha),
            bulk(len(keys)), *map(bulk, keys)])
        for arg in args:
            if isinstance(arg, Hole):
                segments.append(segment)
                segment = b"\r\n"
            else:
                segment += bulk(arg)
        segments.append(segment)
        self._head = segments[0]
        self._tails = tuple(zip(self.holes, segments[1:], strict=True))

    def filled(self, values: tuple[CommandArg, ...]) -> tuple[CommandArg, ...]:
        """The calls' arguments with ``values`` in the holes."""
        args = self._pick(values + self.args)
        return (args,) if self._one else args

    def fill(self, values: tuple[CommandArg, ...], nodes: Iterable[int]
             ) -> tuple[tuple[Call, ...], bytes]:
        """One call per node of ``nodes`` with ``values`` in the holes, and the command
        each sends, packed (on every attempt and release: kept to plain loops)."""
        args = self._pick(values + self.args)
        if self._one:
            args = (args,)
        script, keys = self.script, self.keys
        calls = []
        for node in nodes:  # (tuple.__new__: Call's generated __new__ is slower)
            calls.append(_new(Call, (node, args, script, keys)))
        parts = [self._head]
        for index, tail in self._tails:
            value = values[index]
            if type(value) is str:  # (the usual two first)
                data = value.encode()
            elif type(value) is int:
                data = b"%d" % value
            else:
                data = encode(value)
            size = len(data)
            parts += (HEADS[size] if size < 256 else b"$%d\r\n" % size, data, tail)
        return tuple(calls), b"".join(parts)


_new = tuple.__new__

# An acquire's values are its AcquireArgs; these holes stand for the fields that change
# per call or attempt (the TTL and the route are a template's own).
_VALUE, _FLOOR, _TICKET, _PATIENCE, _ATTEMPT = (
    Hole(AcquireArgs._fields.index(name), name)
    for name in ("value", "floor", "ticket", "patience_ms", "attempt"))
# A release's values are its arguments (value, leave[, patience[, ticket]]).
_RELEASE_VALUE, _RELEASE_PATIENCE, _RELEASE_TICKET = (
    Hole(0, "value"), Hole(2, "patience"), Hole(3, "ticket"))
_KEPT = 1024  # templates kept, for the names used lately (bounded memory)


@functools.lru_cache(maxsize=_KEPT)
def _acquire_template(kind: Kind, namespace: str, hash_slot: int | None, resource: str,
                      ttl_ms: int, route: str, queued: bool, record: bool,
                      epoch: int | None) -> Template:
    """ACQUIRE of one resource (docs/design.md §2.2): a queued call's (``queued``) with
    its ticket, one that records its attempt for a hand-off (``record``, §6.7) with it
    and its route; with the membership epoch as the last argument and the horizon and the
    record as the last keys (None: without, as :func:`with_epoch` would add them).
    ``namespace`` and ``hash_slot`` make the :class:`Keys` (a cluster node's: its hash slot's)."""
    keys = Keys(namespace, hash_slot)
    named = kind.names(keys, resource)
    args: tuple[CommandArg | Hole, ...] = (
        _VALUE, ttl_ms, _FLOOR, _TICKET if queued else "", _PATIENCE, named.bucket,
        _ATTEMPT if record else "", *((route,) if record and route else ()))
    call_keys: tuple[str, ...] = (named.lock, keys.counter, keys.marker, named.line,
                                  named.deadlines, named.line_ttls)
    if epoch is not None:
        args, call_keys = (*args, epoch), (*call_keys, keys.horizon, keys.members)
    return Template(scripts.ACQUIRE, call_keys, args, len(AcquireArgs._fields))


@functools.lru_cache(maxsize=_KEPT)
def _release_template(kind: Kind, namespace: str, hash_slot: int | None, resource: str,
                      leave: str, patience: bool, places_back: bool) -> Template:
    """RELEASE of one resource (docs/design.md §5.3): ``leave`` '1' ends the call or the
    hold, '0' a failed attempt (with its line entry's ``patience``; ``places_back``: with
    its ticket, to put its place back, §6.3)."""
    keys = Keys(namespace, hash_slot)
    named = kind.names(keys, resource)
    args: tuple[CommandArg | Hole, ...] = (
        _RELEASE_VALUE, leave, _RELEASE_PATIENCE if patience else "", named.bucket,
        *((_RELEASE_TICKET,) if places_back else ()))
    return Template(scripts.RELEASE,
                    (named.lock, named.channel, named.line, named.deadlines,
                     named.line_ttls, keys.counter, keys.marker, keys.members, keys.horizon),
                    args, 4)

class Kind:
    """The mutex: one key per name holding the lock value (``ns:{R}:lock``)."""

    name = "lock"  # in events, spans and the CLI
    noun = "lock on"  # in messages: "lock on 'orders'"
    #: Whether a release hands this kind's lock to the first waiter in line
    #: (docs/design.md §6.7): the mutex only.
    hands_off = True
    #: Whether a quorum must grant the same ``group`` (a permit's slot, §12.2).
    grouped = False
    #: Whether one resource's acquire is filled in from a template (§2.6); the semaphore's
    #: and the read-write lock's are built each time.
    templated = True

    # -- keys --------------------------------------------------------------------------

    def lock_key(self, keys: Keys, resource: str) -> str:
        return keys.lock(resource)

    def channel(self, keys: Keys, resource: str) -> str:
        """Where releases of ``resource`` publish; also its local turns' key."""
        return keys.channel(resource)

    def names(self, keys: Keys, resource: str) -> ResourceKeys:
        """``resource``'s key names for this kind (cached: asked on every call)."""
        return _resource_keys(self, keys.namespace, keys.hash_slot is not None, resource)

    def wait_channels(self, keys: Keys, resources: Sequence[str], route: str) -> tuple[str, ...]:
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

    def acquire_calls(self, keys: Keys, nodes: Sequence[int], resources: tuple[str, ...],
                      args: AcquireArgs) -> tuple[Call, ...]:
        """The acquire's calls, one per node (without the membership epoch: see
        :func:`with_epoch`)."""
        if len(resources) == 1:
            return self._acquire_one(keys, nodes, resources[0], args, None)[0]
        return tuple(Call(i, (args.value, args.ttl_ms, args.floor,
                              *(counter_field(keys, r) for r in resources)),
                          scripts.ACQUIRE_MANY,
                          (keys.marker, keys.counter, *(keys.lock(r) for r in resources)))
                     for i in nodes)

    def acquire_request(self, keys: Keys, nodes: Sequence[int], resources: tuple[str, ...],
                        args: AcquireArgs, epoch: int) -> tuple[tuple[Call, ...], bytes | None]:
        """An attempt's calls as they are sent (with the membership epoch), and the
        command every one of them sends, packed (None: the transports pack them)."""
        if len(resources) == 1 and self.templated:
            return self._acquire_one(keys, nodes, resources[0], args, epoch)
        return with_epoch(self.acquire_calls(keys, nodes, resources, args), keys, epoch), None

    def _acquire_one(self, keys: Keys, nodes: Sequence[int], resource: str,
                     args: AcquireArgs, epoch: int | None) -> tuple[tuple[Call, ...], bytes]:
        # A queued waiter of a kind that hands off records its attempt (§6.7).
        queued = args.ticket != ""
        return _acquire_template(
            self, keys.namespace, keys.hash_slot, resource, args.ttl_ms, args.route, queued,
            self.hands_off and queued and args.attempt != 0, epoch).fill(args, nodes)

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

    def for_call(self, secret: str) -> Kind:
        """The kind an acquire call's first attempt sends."""
        return self

    # -- holding -----------------------------------------------------------------------

    def write_back_call(self, keys: Keys, node: int, resource: str, value: str,
                        token: int) -> Call:
        """Raise a granting node's counter to the token, if it still holds our grant (§3.2)."""
        return Call(node, (value, token, counter_field(keys, self.token_name(resource))),
                    scripts.WRITE_BACK,
                    (self.lock_key(keys, resource), keys.counter, keys.marker))

    def release_call(self, keys: Keys, node: int, resource: str,
                     args: tuple[CommandArg, ...]) -> Call:
        """Give the grant back, value-checked; ``args``: (value, leave[, patience, ticket]). The
        release hands the lock to the first in line if it left a record (§6.7). A failed attempt's
        ticket puts its place back where its grant found the line empty (§6.3)."""
        [call], _ = self.release_request(keys, (node,), (resource,), args)
        return call

    def release_request(self, keys: Keys, nodes: Sequence[int], resources: Sequence[str],
                        args: tuple[CommandArg, ...]) -> tuple[tuple[Call, ...], bytes | None]:
        """A release's calls to ``nodes`` (a set's, one per resource, node by node), and
        for one resource the command each sends, packed (else None)."""
        if len(args) == 2:  # (value, leave): a holder's, or the end of a call
            values: tuple[CommandArg, ...] = (*args, "", "")
            shape = (str(args[1]), False, False)
        else:  # (value, leave, patience[, ticket]): a failed attempt's
            values = (*args, "", "")[:4]
            shape = (str(args[1]), True, _places_back(args))
        namespace, hash_slot = keys.namespace, keys.hash_slot
        if len(resources) == 1:
            return _release_template(self, namespace, hash_slot, resources[0], *shape).fill(
                values, nodes)
        filled = [(t.filled(values), t.script, t.keys) for t in (
            _release_template(self, namespace, hash_slot, r, *shape) for r in resources)]
        return tuple([Call(i, *call) for i in nodes for call in filled]), None

    def extend_call(self, keys: Keys, node: int, resource: str, value: str, ttl_ms: int) -> Call:
        return Call(node, (value, ttl_ms), scripts.EXTEND, (self.lock_key(keys, resource),))

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

    def extend_call(self, keys: Keys, node: int, resource: str, value: str, ttl_ms: int) -> Call:
        return Call(node, (value, ttl_ms), family.EXTEND_LEADER,
                    (self.lock_key(keys, resource), keys.part(resource, "term")))

    def proclaim_call(self, keys: Keys, node: int, resource: str, value: str, term: int) -> Call:
        return Call(node, (value, term, self.identity), family.PROCLAIM,
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
    templated = False
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

    def for_call(self, secret: str) -> Kind:
        # Concurrent callers start on different slots (§12.2).
        return replace(self, slot=None, preferred=zlib.crc32(secret.encode()) % self.permits)

    def release_request(self, keys: Keys, nodes: Sequence[int], resources: Sequence[str],
                        args: tuple[CommandArg, ...]) -> tuple[tuple[Call, ...], bytes | None]:
        return _built_release(self, keys, nodes, resources, args), None

    def acquire_calls(self, keys: Keys, nodes: Sequence[int], resources: tuple[str, ...],
                      args: AcquireArgs) -> tuple[Call, ...]:
        [r] = resources
        slots = range(self.permits)
        line, deadlines = self.line(keys, r)
        call_keys = (keys.marker, keys.counter, line, deadlines, self.channel(keys, r),
                     *(self.slot_key(keys, r, s) for s in slots),
                     self.slot_key(keys, r, self.permits))
        call_args: tuple[CommandArg, ...] = (
            args.value, args.ttl_ms, args.floor, args.ticket, args.patience_ms, self.preferred,
            *(counter_field(keys, self.slot_name(r, s)) for s in slots))
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
        return (replace(self, slot=slot, preferred=slot), {i: replies[i] for i in by_slot[slot]})

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
    templated = False

    @property
    def noun(self) -> str:  # type: ignore[override]
        return "write lock on" if self.mode == "w" else "read lock on"

    def lock_key(self, keys: Keys, resource: str) -> str:
        return keys.part(resource, "write" if self.mode == "w" else "read")

    def channel(self, keys: Keys, resource: str) -> str:
        return keys.part(resource, "rw-released")

    def line(self, keys: Keys, resource: str) -> tuple[str, str]:
        return keys.part(resource, "rw-line"), keys.part(resource, "rw-line-deadlines")

    def release_request(self, keys: Keys, nodes: Sequence[int], resources: Sequence[str],
                        args: tuple[CommandArg, ...]) -> tuple[tuple[Call, ...], bytes | None]:
        if self.mode == "w":
            return super().release_request(keys, nodes, resources, args)
        return _built_release(self, keys, nodes, resources, args), None

    def acquire_calls(self, keys: Keys, nodes: Sequence[int], resources: tuple[str, ...],
                      args: AcquireArgs) -> tuple[Call, ...]:
        [r] = resources
        line, deadlines = self.line(keys, r)
        # The line's score: the ticket's order, its parity the mode (§12.3); made here,
        # where integers are exact.
        score = "" if not args.ticket else str(2 * int(args.ticket) + (self.mode == "w"))
        call_keys = (keys.marker, keys.counter, keys.part(r, "write"), keys.part(r, "read"),
                     line, deadlines, self.channel(keys, r))
        call_args = (self.mode, args.value, args.ttl_ms, args.floor, score,
                     args.patience_ms, counter_field(keys, r))
        return tuple(Call(i, call_args, family.RW_ACQUIRE, call_keys) for i in nodes)

    def write_back_call(self, keys: Keys, node: int, resource: str, value: str,
                        token: int) -> Call:
        if self.mode == "w":
            return super().write_back_call(keys, node, resource, value, token)
        return Call(node, (value, token, counter_field(keys, resource)), family.READ_WRITE_BACK,
                    (keys.part(resource, "read"), keys.counter, keys.marker))

    def release_call(self, keys: Keys, node: int, resource: str,
                     args: tuple[CommandArg, ...]) -> Call:
        if self.mode == "w":
            return super().release_call(keys, node, resource, args)
        line, deadlines = self.line(keys, resource)
        # A reader's place is its score in the line (the ticket, even: §12.3).
        return Call(node, (*args[:3], str(2 * int(args[3]))) if _places_back(args) else args[:2],
                    family.READ_RELEASE,
                    (keys.part(resource, "read"), self.channel(keys, resource), line, deadlines))

    def extend_call(self, keys: Keys, node: int, resource: str, value: str, ttl_ms: int) -> Call:
        if self.mode == "w":
            return super().extend_call(keys, node, resource, value, ttl_ms)
        return Call(node, (value, ttl_ms), family.READ_EXTEND, (keys.part(resource, "read"),))


def _built_release(kind: Kind, keys: Keys, nodes: Sequence[int], resources: Sequence[str],
                   args: tuple[CommandArg, ...]) -> tuple[Call, ...]:
    """The release calls of a kind whose release script has no template: one call per
    resource, the same for every node but its node (so the transports pack each once)."""
    made = [kind.release_call(keys, nodes[0], r, args) for r in resources] if nodes else []
    return tuple([Call(i, call.args, call.script, call.keys) for i in nodes for call in made])


#: A read-write lock's write and read grants.
WRITE = ReadWrite(mode="w")
READ = ReadWrite(mode="r")

__all__ = ["LEADERSHIP", "MUTEX", "READ", "SLOT_COUNTER", "WRITE", "AcquireArgs", "Hole", "Kind",
           "Leadership", "Permit", "ReadWrite", "Template", "by_node", "counter_field",
           "with_epoch"]
