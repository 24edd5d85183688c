"""Call templates: the calls one resource's acquire attempt (or its holder's release)
sends, made once by the kind's own builder and filled in on every call (docs/design.md
§2.6).

Each attempt and each release built its calls anew: the kind's builder, the membership
epoch added (:func:`~redlock._core.kinds.with_epoch`), a call per node. For one name
they are the same every time but for a few values (the owner, the floor, the ticket,
the patience, the attempt's number). A template is made by that same builder, with a
:class:`Marker` standing in for each such value, and remembers only where each marker
landed: what a call is stays defined in one place, and a template that cannot be made
(a builder that does more with a value than place it) is simply not used.

A template also keeps the command its calls send, packed (RESP, EVALSHA) around the
markers' places, and fills in the values' bytes: the transports write those bytes to
every node on a connection that knows the script (:attr:`Broadcast.packed`). Packing the
command anew took more than any other step of the request outside the socket calls.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from operator import itemgetter
from typing import Any

from redlock._core.kinds import MUTEX, AcquireArgs, Kind, with_epoch
from redlock._core.requests import Call, CommandArg
from redlock._core.settings import Keys
from redlock._scripts.command import HEADS, bulk, encode

__all__ = ["CallTemplates", "Marker", "Template", "make"]


class Marker:
    """Stands for one per-call value while a template is made: an object no builder can
    take for a real value (and true, as a value that is given is)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


class Template:
    """Calls that share one script, one tuple of keys and one tuple of arguments (one
    per node, as the builders make them), with markers in some arguments' places."""

    __slots__ = ("_pick", "args", "holes", "keys", "nodes", "places", "script", "segments")

    def __init__(self, calls: Sequence[Call], markers: Sequence[Marker]) -> None:
        first = calls[0]
        if any(c.args is not first.args or c.keys is not first.keys
               or c.script is not first.script for c in calls):
            raise ValueError("the calls do not share their keys and arguments")
        given: tuple[object, ...] = first.args
        places: list[tuple[int, int]] = []  # (argument's place, marker's index)
        for index, marker in enumerate(markers):
            found = [place for place, arg in enumerate(given) if arg is marker]
            if len(found) > 1:
                raise ValueError(f"{marker!r} was placed twice")
            places.extend((place, index) for place in found)
        if any(isinstance(key, Marker) for key in first.keys) or len(places) != sum(
                isinstance(arg, Marker) for arg in first.args):
            raise ValueError("a marker is where no value goes")
        self.args = first.args
        self.keys = first.keys
        self.script = first.script
        self.nodes = tuple(c.node for c in calls)
        self.places = tuple(places)
        # The arguments, made by one C call from ``values + args``: per argument, its
        # marker's value or the builder's own argument.
        by_place = dict(places)
        self._pick = itemgetter(*[by_place[p] if p in by_place else len(markers) + p
                                  for p in range(len(given))])
        # The EVALSHA command, packed: the bytes around the values (``segments``, one more
        # than the values; each after the first starts with the CRLF that ends the value
        # before it) and, per value in the arguments' order, its marker's index.
        self.segments: tuple[bytes, ...] = ()
        self.holes = tuple(index for _, index in sorted(places))
        if first.script is not None:
            segments, segment = [], b"".join([
                b"*%d\r\n" % (3 + len(first.keys) + len(given)), bulk("EVALSHA"),
                bulk(first.script.sha), bulk(len(first.keys)), *map(bulk, first.keys)])
            for arg in given:
                if isinstance(arg, Marker):
                    segments.append(segment)
                    segment = b"\r\n"
                else:
                    segment += bulk(arg)
            self.segments = (*segments, segment)

    def fill(self, values: tuple[CommandArg, ...]) -> tuple[tuple[Call, ...], bytes | None]:
        """The calls with ``values`` (one per marker, in the markers' order) in place, and
        the command they send, packed (EVALSHA; None for a plain command); a value whose
        marker the builder did not place is not sent. Twice per acquire+release: every
        step counts (BENCHMARKS.md, "Issue 21", eleventh session)."""
        shared = self._pick(values + self.args)
        if len(self.args) == 1:  # (itemgetter of one index gives the item itself)
            shared = (shared,)
        script, keys = self.script, self.keys  # (tuple.__new__: Call's own __new__, minus a frame)
        calls = tuple([_new(Call, (node, shared, script, keys)) for node in self.nodes])
        segments = self.segments
        if not segments:
            return calls, None
        parts = [segments[0]]
        for hole, index in enumerate(self.holes, 1):
            value = values[index]
            if type(value) is str:  # (the usual two first)
                data = value.encode()
            elif type(value) is int:
                data = b"%d" % value
            else:
                data = encode(value)
            size = len(data)
            parts += (HEADS[size] if size < 256 else b"$%d\r\n" % size, data, segments[hole])
        return calls, b"".join(parts)


def make(build: Callable[[], Sequence[Call]], markers: Sequence[Marker]) -> Template | None:
    """The template of what ``build()`` returns, given ``markers`` for the values (None
    when there is none: no calls, or a builder that used a value, not only placed it)."""
    try:
        calls = build()
        return Template(calls, markers) if calls else None
    except (TypeError, ValueError, AttributeError):
        return None


_new = tuple.__new__

#: An attempt's values, in :meth:`CallTemplates.acquire`'s order; a release's.
_ACQUIRE = (Marker("owner"), Marker("floor"), Marker("ticket"), Marker("patience"),
            Marker("attempt"))
_RELEASE = (Marker("owner"),)
# Templates kept per core (the names used lately: the client's memory does not grow
# with the names it ever locked; when full, it starts over).
_KEPT = 1024


class CallTemplates:
    """A core's acquire and holder's release calls, from templates where they are the
    mutex's, of one resource (the other kinds build theirs each time: a permit's calls
    differ by the slot each call prefers; readers and writers are rarer). Threads share
    it: a template made twice at once is the same template."""

    def __init__(self, keys: Keys, node_count: int) -> None:
        self.keys = keys
        self.nodes = range(node_count)
        self._made: dict[Hashable, Template | None] = {}

    def acquire(self, kind: Kind, resources: tuple[str, ...], ttl_ms: int, epoch: int,
                route: str, values: tuple[str, int, str, int, int]
                ) -> tuple[tuple[Call, ...], bytes | None]:
        """An attempt's calls, one per node, and from a template the command they all
        send, packed (else None); ``values``: (owner, floor, ticket, patience_ms,
        attempt)."""
        if kind is MUTEX and len(resources) == 1:
            queued = bool(values[2])  # (a ticket: the call waits in line, §6.3)
            key = ("acquire", resources[0], queued, ttl_ms, epoch, route)
            try:
                template = self._made[key]
            except KeyError:
                markers = tuple(m if queued or i != 2 else "" for i, m in enumerate(_ACQUIRE))
                template = self._keep(key, make(lambda: self._acquire_calls(
                    kind, resources, ttl_ms, epoch, route, markers), _ACQUIRE))
            if template is not None:
                return template.fill(values)
        return self._acquire_calls(kind, resources, ttl_ms, epoch, route, values), None

    def _acquire_calls(self, kind: Kind, resources: tuple[str, ...], ttl_ms: int,
                       epoch: int, route: str, values: Sequence[Any]) -> tuple[Call, ...]:
        owner, floor, ticket, patience_ms, attempt = values
        args = AcquireArgs(owner, ttl_ms, floor, ticket, patience_ms, attempt, route)
        return with_epoch(kind.acquire_calls(self.keys, self.nodes, resources, args),
                          self.keys, epoch)

    def release(self, kind: Kind, resource: str, args: tuple[CommandArg, ...],
                build: Callable[[Kind, tuple[str, ...], tuple[CommandArg, ...], range],
                                tuple[Call, ...]]) -> tuple[tuple[Call, ...], bytes | None]:
        """A release of ``resource`` on every node, ``args`` its arguments (the owner
        first), and as :meth:`acquire` the command packed; ``build(kind, resources, args,
        nodes)`` makes a release's calls."""
        if kind is MUTEX:
            key = ("release", resource, args[1:])
            try:
                template = self._made[key]
            except KeyError:
                template = self._keep(key, make(lambda: build(
                    kind, (resource,), (_RELEASE[0], *args[1:]), self.nodes), _RELEASE))  # type: ignore[arg-type]
            if template is not None:
                return template.fill(args[:1])
        return build(kind, (resource,), args, self.nodes), None

    def _keep(self, key: Hashable, template: Template | None) -> Template | None:
        if len(self._made) >= _KEPT:
            self._made.clear()
        self._made[key] = template
        return template
