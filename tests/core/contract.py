"""Plays the same calls on a scripted node (tests/scripted.py) and on a real redis-server,
and compares every reply and the whole keyspace after each call.

The scripted node is given the real server's run id and, for each call, the real
server's clock (Redis TIME, read just before the call), so the scripts that stamp or
date what they write agree with the Lua up to the few milliseconds between the two.
What depends on time is compared within :data:`TIME_SLACK` (dates, deadlines) or by its
shape (a refused acquire's PTTL: the scripted node's keys never expire and report
1000 ms), everything else exactly. Entries of a waiting line whose deadline passed are
left out on both sides: the Lua drops them lazily (or the line key expires), the model
at once, and neither counts them.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import redis

from redlock._scripts.replies import hash_fields
from tests.internals import KEYS, Call
from tests.scripted import MARKER, ScriptedNodes, as_text

TIME_SLACK = 250  # ms: dates and deadlines of one call, model and server
TTL_SLACK = 5_000  # ms: a key's TTL left, set some calls ago
EXPIRY_MARGIN = 5  # ms: no call this close to a waiting line's expiry (settled_now)


@dataclass(frozen=True)
class Near:
    """A time in ms, equal to another within ``slack``."""

    ms: int
    slack: int = TIME_SLACK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Near) and abs(self.ms - other.ms) <= self.slack

    def __hash__(self) -> int:  # never put in sets: equality is not transitive
        return 0


def ttl_shape(pttl: object) -> object:
    """A PTTL as both sides can agree on: no key, no expiry, or expires."""
    assert isinstance(pttl, int), pttl
    return {-2: "no key", -1: "no expiry"}.get(pttl, "expires" if pttl > 0 else pttl)


def plain(value: object) -> object:
    """A raw reply with its bulk strings decoded."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def comparable(call: Call, reply: object) -> object:
    """What of a reply must be the same on both sides."""
    if call.script is None and call.args[:1] == ("HGETALL",):  # a list (RESP2) or a map
        return hash_fields(reply)
    reply = plain(reply)
    name = call.script.name if call.script is not None else None
    if name in ("acquire", "acquire_many") and isinstance(reply, list) and reply[0] == 0:
        return [0, ttl_shape(reply[1])]
    if name == "inspect" and isinstance(reply, list):
        pttl, fence, marker, repairing, holder, episode, now = reply
        return [ttl_shape(pttl), fence, marker, repairing, holder,
                string_value(KEYS.episode, str(episode)), Near(now)]
    if name == "owned_pttl" and isinstance(reply, int) and reply > 0:
        return Near(reply, TTL_SLACK)  # the model: the TTL last set
    if name == "open_episode" and isinstance(reply, list) and reply[0] == 1:
        return [1, Near(reply[1]), Near(reply[2]), Near(reply[3])]
    if name == "demote" and isinstance(reply, list) and reply[0] == 1:
        return [1, Near(reply[1]), Near(reply[2])]
    if name == "horizon" and isinstance(reply, list):
        run_id, marker, left, rejoin = reply
        return [run_id, marker, Near(left, TTL_SLACK), rejoin if rejoin < 0 else Near(rejoin)]
    return reply


#: Managers' routes the contract's real node has a listener for (their channels on the
#: resources the sequences use, :func:`listening`), and one it has none for: a release
#: hands the lock only to a waiter whose route is heard (docs/design.md §6.7).
HEARD_ROUTES = ("0badf00d", "C0FFEE42")
UNHEARD_ROUTE = "deadbeef"
ROUTED_RESOURCES = ("a", "b", "c", "d")


@contextlib.contextmanager
def listening(client: redis.Redis) -> Iterator[None]:
    """Subscribe what :data:`HEARD_ROUTES` stand for on ``client``'s server: as a waiter's
    manager does, one connection listening on each routed channel."""
    subscriber = client.pubsub()
    try:
        subscriber.subscribe(*(f"{KEYS.channel(r)}:{route}" for r in ROUTED_RESOURCES
                               for route in HEARD_ROUTES))
        yield
    finally:
        subscriber.close()


class Mirror(ScriptedNodes):
    """One scripted node standing for a real one: its run id, and its clock as last read
    (:attr:`now`), start empty like a flushed server; the routes :func:`listening` hears."""

    def __init__(self, run_id: str) -> None:
        self.real_run_id = run_id
        self.now = 0
        super().__init__(1)
        self.data[0].clear()
        self.unheard_routes = {UNHEARD_ROUTE}

    def run_id(self, node: int) -> str:
        return self.real_run_id

    def now_ms(self, node: int) -> int:
        return self.now


EPISODE_VALUE = re.compile(r"([0-9]+) (\S+) ([0-9]+) (.*)")


def string_value(key: str, text: str) -> object:
    """A string key's value; an episode's start and rejoin time compared as times."""
    found = EPISODE_VALUE.fullmatch(text) if key == KEYS.episode else None
    return ((Near(int(found[1])), found[2], Near(int(found[3])), found[4]) if found
            else text)


class Contract:
    """A flushed real node and its mirror; :meth:`step` plays one call on both and fails
    on any difference. ``sources``: what the real node runs instead of a script's source
    (by that source), to show that a change the model does not follow fails."""

    def __init__(self, client: redis.Redis, sources: dict[str, str] | None = None) -> None:
        self.real = client
        # Replies as the transports read them: no redis-py response callbacks.
        self.raw = redis.Redis(connection_pool=client.connection_pool)
        self.raw.response_callbacks.clear()
        self.sources = sources or {}
        client.flushall()
        info = client.info("server")
        self.model = Mirror(str(info["run_id"]))
        self.played: list[Call] = []

    @property
    def run_id(self) -> str:
        return self.model.real_run_id

    def time_ms(self) -> int:
        seconds, micros = self.real.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def real_reply(self, call: Call) -> object:
        if call.script is None:
            args = call.args
            if args[:1] == ("EVAL",) and args[1] in self.sources:  # IDENTIFY
                args = ("EVAL", self.sources[str(args[1])], *args[2:])
            return self.raw.execute_command(*args)
        source = self.sources.get(call.script.source, call.script.source)
        return self.raw.execute_command("EVAL", source, len(call.keys), *call.keys,
                                         *call.args)

    def resolve(self, call: Call) -> Call:
        """``call`` with ``<run>`` in its arguments replaced by the server's run id and
        ``<marker>`` by the node marker's value now ('' without one)."""
        value = self.model.data[0].get(MARKER)
        current = "" if value is None else as_text(value)
        return call._replace(args=tuple(
            a.replace("<marker>", current).replace("<run>", self.run_id)
            if isinstance(a, str) else a for a in call.args))

    def step(self, call: Call) -> object:
        """Play ``call`` on both (resolved: :meth:`resolve`); the same reply and the same
        keys afterwards, or fail naming the calls played so far. Returns the real node's
        reply."""
        call = self.resolve(call)
        self.played.append(call)
        self.model.now = self.settled_now()
        expected = self.model.reply(call)
        actual = self.real_reply(call)
        assert comparable(call, expected) == comparable(call, actual), self.story(
            f"reply: model {plain(expected)!r}, server {plain(actual)!r}")
        model, server = self.keyspaces()
        assert model == server, self.story("keys differ after the last call: " + ", ".join(
            f"{k}: model {model.get(k)!r}, server {server.get(k)!r}"
            for k in sorted(model.keys() | server.keys()) if model.get(k) != server.get(k)))
        return actual

    def settled_now(self) -> int:
        """The server's clock once no waiting line's keys expire within
        :data:`EXPIRY_MARGIN` of it (waiting if one does). The model reads the clock a
        moment before the server runs the call: keys that expire in between would be
        gone on one side only (a line whose entries all lapsed, which a RELEASE keeping
        its place may bring back)."""
        while True:
            now = self.time_ms()
            near = [e for e in self.model.line_expiry[0].values()
                    if abs(e - now) <= EXPIRY_MARGIN]
            if not near:
                return now
            time.sleep((max(near) + EXPIRY_MARGIN + 1 - now) / 1000)

    def steps(self, calls: Iterable[Call]) -> None:
        for call in calls:
            self.step(call)

    def story(self, what: str) -> str:
        lines = [f"  {describe(c)}" for c in self.played]
        return "\n".join([f"{what}; calls played:", *lines])

    # -- the keyspace, as both sides hold it ------------------------------------------

    def keyspaces(self) -> tuple[dict[str, object], dict[str, object]]:
        now = self.time_ms()
        self.model.now = now
        return self.model_keys(), self.real_keys(now)

    def model_keys(self) -> dict[str, object]:
        keys: dict[str, object] = {}
        for key, value in self.model.data[0].items():
            ttl = self.model.ttl_ms[0].get(key)
            if isinstance(value, dict):  # a hash: the node's fence counters
                if value:
                    keys[key] = {f: str(v) for f, v in value.items()}
                continue
            keys[key] = (string_value(key, as_text(value)),
                         None if ttl is None else Near(ttl, TTL_SLACK))
        for key in list(self.model.lines[0]):
            line = self.model.live_line(0, key)
            if line:
                keys[key] = {w: (t, Near(d)) for w, (t, d) in line.items()}
            records = self.model.live_records(0, key)
            if records:  # hand-off records of live entries (docs/design.md §6.7)
                keys[key + "-ttls"] = records
        return keys

    def real_keys(self, now: int) -> dict[str, object]:
        keys: dict[str, object] = {}
        zsets: dict[str, dict[str, int]] = {}
        records: dict[str, dict[str, str]] = {}
        names = [as_text(k) for k in self.real.scan_iter(count=1000)]
        with self.real.pipeline(transaction=False) as pipe:
            for key in names:
                pipe.type(key)
            kinds = [as_text(kind) for kind in pipe.execute()]
        with self.real.pipeline(transaction=False) as pipe:
            for key, kind in zip(names, kinds, strict=True):
                if kind == "string":
                    pipe.get(key).pttl(key)
                elif kind == "zset":
                    pipe.zrange(key, 0, -1, withscores=True).pttl(key)
                elif kind == "hash":
                    pipe.hgetall(key).pttl(key)
                else:  # "none": a line expired with its last entry meanwhile
                    assert kind == "none", (key, kind)
            replies = iter(pipe.execute())
        for key, kind in zip(names, kinds, strict=True):
            if kind == "string":
                value, pttl = next(replies), next(replies)
                if value is None:  # expired meanwhile: the model's keys never do
                    continue
                assert pttl != 0, key
                keys[key] = (string_value(key, as_text(value)),
                             None if pttl < 0 else Near(pttl, TTL_SLACK))
            elif kind == "zset":
                pairs = cast(list[tuple[bytes, float]], next(replies))
                # A waiting line's keys always expire (bounded state, §3.0, §6.3).
                assert next(replies) != -1, f"{key} has no expiry"
                zsets[key] = {as_text(m): int(s) for m, s in pairs}
            elif kind == "hash":
                found = cast(dict[bytes, bytes], next(replies))
                pttl = next(replies)
                fields = {as_text(f): as_text(v) for f, v in found.items()}
                if key.endswith(":line-ttls"):  # compared for live entries, below
                    assert pttl != -1, f"{key} has no expiry"
                    records[key] = fields
                else:
                    keys[key] = fields
        for key, members in zsets.items():
            if key.endswith(":line-deadlines"):
                continue
            assert key.endswith(":line"), key
            deadlines = zsets.get(key + "-deadlines", {})
            live = {w: (t, Near(deadlines[w])) for w, t in members.items()
                    if deadlines.get(w, now) > now}
            # An entry is in both sets or in neither (the Lua adds and drops both).
            assert {w for w, d in deadlines.items() if d > now} == set(live), key
            if live:
                keys[key] = live
        for key, fields in records.items():
            deadlines = zsets.get(key.removesuffix("-ttls") + "-deadlines", {})
            kept = {w: r for w, r in fields.items() if deadlines.get(w, now) > now}
            if kept:
                keys[key] = kept
        return keys


def describe(call: Call) -> str:
    if call.script is None:
        return " ".join(as_text(a)[:40] for a in call.args)
    return f"{call.script.name.upper()} keys={list(call.keys)} args={list(call.args)}"


class Shown(Call):
    """A call whose repr is :func:`describe`'s (a script's name, not its whole source):
    what Hypothesis prints of a failing sequence."""

    def __repr__(self) -> str:
        return describe(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis's printer
        printer.text(describe(self))


def shown(call: Call) -> Call:
    return Shown(call.node, call.args, call.script, call.keys)
