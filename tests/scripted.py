"""Scripted nodes for unit tests of the sans-IO protocols: no servers, no sockets.

A protocol (a generator on RedlockCore) yields requests; :class:`ScriptedNodes` plays
N nodes at the protocol level, each a dict of keys with the Lua scripts' semantics
(the scripts themselves run on real nodes in the behaviour tests), and answers them.
A :class:`FakeClock` moves only when the test, a Sleep or a round trip moves it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

from tests.internals import Broadcast, Call, RedlockCore, Settings, Sleep, scripts

MARKER = "redlock:node-marker"
GUARD = "redlock:node-repair"


def lock_key(resource: str) -> str:
    return f"redlock:{{{resource}}}:lock"


def fence_key(resource: str) -> str:
    return f"redlock:{{{resource}}}:fence"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


PASS = object()  # from an interceptor: answer as the node would


class ScriptedNodes:
    """Plays N nodes: a dict per node, the scripts' semantics.

    ``down``: nodes that answer every call with a TimeoutError. ``intercept(call)``, if
    set, may answer a call itself (return anything but PASS): a reply out of script.
    With a ``clock``, a Sleep advances it by its seconds and every broadcast by
    ``round_trip`` seconds. ``ttl_ms[node][key]`` records the TTL last set on a key.
    """

    def __init__(self, n: int, counters: list[int] | None = None,
                 down: frozenset[int] | set[int] = frozenset(), *, clock: FakeClock | None = None,
                 round_trip: float = 0.0, scan_page: int = 1000) -> None:
        self.data: list[dict[str, object]] = [{MARKER: "x"} for _ in range(n)]
        self.ttl_ms: list[dict[str, int]] = [{} for _ in range(n)]
        for i, counter in enumerate(counters or []):
            self.data[i][fence_key("r")] = counter
        self.down = set(down)
        self.clock = clock
        self.round_trip = round_trip
        self.scan_page = scan_page
        self.intercept: Callable[[Call], object] | None = None
        self.requests: list[Broadcast | Sleep] = []

    def execute(self, request: Broadcast | Sleep) -> list[object]:
        self.requests.append(request)
        if isinstance(request, Sleep):
            if self.clock is not None:
                self.clock.advance(request.seconds)
            return []
        replies = [self.reply(call) for call in request.calls]
        if self.clock is not None:
            self.clock.advance(self.round_trip)
        return replies

    def reply(self, call: Call) -> object:
        if self.intercept is not None:
            answer = self.intercept(call)
            if answer is not PASS:
                return answer
        if call.node in self.down:
            return TimeoutError("no reply")
        db = self.data[call.node]
        if call.script is None:
            return self.command(call.node, call.args)
        if call.script is scripts.ACQUIRE:
            lock, fence, marker = call.keys
            owner = call.args[0]
            if marker not in db:
                return [scripts.ACQUIRE_AMNESIAC, 0]
            if lock in db:
                return [scripts.ACQUIRE_ALREADY_OURS if db[lock] == owner
                        else scripts.ACQUIRE_REFUSED, 1000]
            db[lock] = owner
            self.ttl_ms[call.node][lock] = int(call.args[1])
            db[fence] = max(int(db.get(fence, 0)), int(call.args[2])) + 1  # type: ignore[call-overload]
            return [scripts.ACQUIRE_GRANTED, db[fence]]
        if call.script is scripts.WRITE_BACK:
            lock, fence, _ = call.keys
            if db.get(lock) != call.args[0]:
                return 0
            db[fence] = max(int(db.get(fence, 0)), int(call.args[1]))  # type: ignore[call-overload]
            return 1
        if call.script is scripts.RELEASE:
            lock = call.keys[0]
            if db.get(lock) == call.args[0]:
                del db[lock]
                return 1
            return 0
        if call.script is scripts.EXTEND:
            lock = call.keys[0]
            if db.get(lock) != call.args[0]:
                return 0
            self.ttl_ms[call.node][lock] = int(call.args[1])
            return 1
        if call.script is scripts.SEED_COUNTERS:
            guard, *fences = call.keys
            repair_id, *values = call.args
            if db.get(guard) != repair_id:
                return 0
            for key, value in zip(fences, values, strict=True):
                db[key] = max(int(db.get(key, 0)), int(value))  # type: ignore[call-overload]
            return 1
        if call.script is scripts.FINISH_REPAIR:
            guard, marker = call.keys
            repair_id, marker_value = call.args
            if db.get(guard) != repair_id:
                return 0
            db[marker] = marker_value
            del db[guard]
            return 1
        raise AssertionError(f"unexpected call {call}")

    def command(self, node: int, args: tuple[object, ...]) -> object:
        """The plain commands the protocols send, as Redis answers them."""
        db = self.data[node]
        name, *rest = args
        if name == "INFO":
            return b"# Replication\r\nrole:slave\r\n" if node == 1 else b"role:master\r\n"
        if name == "EXISTS":
            return int(rest[0] in db)
        if name == "DEL":
            return int(db.pop(str(rest[0]), None) is not None)
        if name == "SET":
            key, value, *options = rest
            if "NX" in options and key in db:
                return None
            db[str(key)] = value
            if "PX" in options:
                self.ttl_ms[node][str(key)] = int(options[options.index("PX") + 1])  # type: ignore[call-overload]
            return b"OK"
        if name == "SCAN":
            cursor, _, pattern, _, _ = rest
            keys = sorted(k for k in db if fnmatch.fnmatchcase(k, str(pattern)))
            start = int(cursor)  # type: ignore[call-overload]
            end = start + self.scan_page
            return [end if end < len(keys) else 0, [k.encode() for k in keys[start:end]]]
        if name == "MGET":
            return [None if db.get(str(k)) is None else str(db[str(k)]).encode() for k in rest]
        raise AssertionError(f"unexpected command {args}")

    def broadcasts(self) -> list[Broadcast]:
        return [r for r in self.requests if isinstance(r, Broadcast)]

    def sleeps(self) -> list[float]:
        return [r.seconds for r in self.requests if isinstance(r, Sleep)]

    def scripts_sent(self) -> list[str]:
        return [r.calls[0].script.name for r in self.broadcasts()
                if r.calls and r.calls[0].script is not None]

    def commands_sent(self) -> list[str]:
        """Each broadcast's first call: its script name, or its command name."""
        return [str(r.calls[0].script.name if r.calls[0].script is not None
                    else r.calls[0].args[0]) for r in self.broadcasts() if r.calls]


def make_core(n: int, clock: FakeClock | None = None, **settings: object) -> RedlockCore:
    """A core past its one-time node inspection (tested on its own), so each test sees
    only the protocol round trips it is about."""
    core = RedlockCore([f"n{i}:6379" for i in range(n)], Settings(**settings),  # type: ignore[arg-type]
                       clock or FakeClock())
    core.amnesia.health.inspected = True
    return core
