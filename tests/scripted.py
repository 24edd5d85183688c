"""Scripted nodes for unit tests of the sans-IO protocols: no servers, no sockets.

A protocol (a generator on RedlockCore) yields requests; :class:`ScriptedNodes` plays
N nodes at the protocol level, each a dict of keys with the Lua scripts' semantics
(the scripts themselves run on real nodes in the behaviour tests), and answers them.
A :class:`FakeClock` moves only when the test, a wait or a round trip moves it; each
node's clock (Redis TIME, in ms) is derived from it, optionally skewed per node.

Each node has a server run id, changed by :meth:`ScriptedNodes.restart`; the scripts
that stamp the node marker stamp it with the run id of the node that runs them, as
``string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')`` does on a real node.
Keys never expire here: a key lives until a call or the test deletes it (a refused
acquire reports 1000 ms left); only a waiting line's keys do, 1 ms after its latest
deadline, as the Lua sets them. tests/core/test_scripts_contract.py holds the scripted
nodes to the real scripts.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Callable, Iterable

from redlock._core.kinds import SLOT_COUNTER
from redlock._io.resp import ReplyError
from tests.internals import (
    CALL_DIGITS,
    KEYS,
    Broadcast,
    Call,
    Invoke,
    PauseUntilWoken,
    RedlockCore,
    Settings,
    Wait,
    bucket,
    map_failures,
    node_scripts,
    real_environment,
    scripts,
    waiter_id,
)

MARKER = KEYS.marker
GUARD = KEYS.repair_guard
EPISODE = KEYS.episode
HORIZON = KEYS.horizon  # the node's lease horizon (docs/design.md §4.3.1)
COUNTER = KEYS.counter  # the node's fence counters: a hash, one field per bucket
EPOCH_MS = 1_700_000_000_000  # what a node's clock reads when the FakeClock reads 0


#: The prefix of a reservation: the value a release's hand-off sets (docs/design.md §6.7).
RESERVED = "handoff:"


def lock_key(resource: str) -> str:
    return f"redlock:{{{resource}}}:lock"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


PASS = object()  # from an interceptor: answer as the node would


def kin(held: str | None, value: str) -> int:
    """The scripts' ``kin`` (redlock/_scripts/shared.py, docs/design.md §2.1): 1 when
    ``held`` is ``value`` or an earlier attempt's value of its call, -1 a later
    attempt's, 0 someone else's or nothing."""
    if held == value:
        return 1
    if held is None or len(held) != len(value) or held[:CALL_DIGITS] != value[:CALL_DIGITS]:
        return 0
    return 1 if held < value else -1


def as_text(value: object) -> str:
    """What Redis stores for an argument (redis-py sends str as UTF-8, numbers as text)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class ScriptedNodes:
    """Plays N nodes: a dict per node, the scripts' semantics.

    Every node starts initialised: its marker stamped with its current run id (the
    cluster a test finds after its first acquire); ``counters`` seed the fence counter of
    resource ``r``. ``down``: nodes that answer every call with a TimeoutError.
    ``intercept(call)``, if set, may answer a call itself (return anything but PASS): a
    reply out of script. A wait advances the clock by its seconds (unless its ``wake``
    event is set: it returns at once), every broadcast by ``round_trip`` seconds; without
    a ``clock`` the nodes keep one of their own. ``ttl_ms[node][key]`` records the TTL
    last set on a key. ``resp3``: CONFIG GET answers a map, as on a RESP3 connection.

    Persistence and replication, as CONFIG GET and INFO report them: ``durable`` nodes
    run ``appendonly yes`` / ``appendfsync always`` (the default), the others
    ``appendonly no`` / ``appendfsync everysec``; ``promoted`` nodes are replicas
    promoted to primary (``second_repl_offset`` is not -1); ``replicas`` answer
    ``role:slave``. ``skew[node]``: seconds that node's clock runs ahead of the others.
    ``epochs[node]``: the configEpoch of a node in cluster mode (``CLUSTER INFO``'s
    ``cluster_my_epoch``; a node without one is not in cluster mode).

    Transports send IDENTIFY ahead of the first call on each new connection: a test
    plays that with :meth:`connect` (now) or :meth:`attach` (from now on, as requests
    go out).
    """

    def __init__(self, n: int, counters: list[int] | None = None,
                 down: Iterable[int] = frozenset(), *, clock: FakeClock | None = None,
                 round_trip: float = 0.0, scan_page: int = 1000, resp3: bool = False) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self.runs = [0] * n  # restarts so far, per node: the run id derives from it
        self.data: list[dict[str, object]] = [{} for _ in range(n)]
        for i in range(n):
            self.data[i][MARKER] = self.stamp(i, "initialised by the test")
        self.ttl_ms: list[dict[str, int]] = [{} for _ in range(n)]
        # Waiting lines: waiter id -> (ticket, deadline ms), as the Lua keeps them (lapsed
        # entries stay until a script drops them); when each line's keys expire (ms).
        self.lines: list[dict[str, dict[str, tuple[int, int]]]] = [{} for _ in range(n)]
        self.line_expiry: list[dict[str, int]] = [{} for _ in range(n)]
        # A mutex line's hand-off records (docs/design.md §6.7): waiter id -> '<ttl_ms>
        # <attempt> <floor>', by line key (the Lua's '<line>-ttls' hash).
        self.handoff_records: list[dict[str, dict[str, str]]] = [{} for _ in range(n)]
        for i, counter in enumerate(counters or []):
            self.data[i][COUNTER] = {bucket("r"): counter}
        self.down = set(down)
        self.durable = set(range(n))
        self.promoted: set[int] = set()
        self.replicas: set[int] = set()
        self.skew: dict[int, float] = {}
        self.epochs: dict[int, int] = {}
        # Routes (a manager's, in a hand-off record) whose channel nobody subscribes to:
        # a release does not hand the lock to their waiters (docs/design.md §6.7). Every
        # other route is heard.
        self.unheard_routes: set[str] = set()
        self.round_trip = round_trip
        self.scan_page = scan_page
        self.resp3 = resp3
        self.intercept: Callable[[Call], object] | None = None
        self.requests: list[Broadcast | Wait] = []
        self.attached: RedlockCore | None = None  # see attach()
        self.new_connections: set[int] = set()

    # -- what the test controls ---------------------------------------------------

    def run_id(self, node: int) -> str:
        """The node's current server run id (40 hex digits, like Redis's)."""
        return hashlib.sha1(f"node {node} run {self.runs[node]}".encode()).hexdigest()

    def stamp(self, node: int, text: str) -> str:
        """A marker value as the node's current server run writes it (this format)."""
        return f"{node_scripts.FORMAT_PREFIX}run_id={self.run_id(node)} {text}"

    def now_ms(self, node: int) -> int:
        """The node's clock (Redis TIME) in ms."""
        return EPOCH_MS + round((self.clock() + self.skew.get(node, 0.0)) * 1000)

    def restart(self, node: int, *, keep_data: bool, durable: bool | None = None,
                promoted: bool = False) -> None:
        """The server restarts (or a replica takes its place: ``promoted``): a new run id;
        its data kept (loaded from disk, or the replica's copy) or gone. ``durable``:
        its persistence settings from now on (None: unchanged)."""
        self.runs[node] += 1
        self.new_connections.add(node)  # its connections broke
        if not keep_data:
            self.data[node].clear()
            self.lines[node].clear()
            self.line_expiry[node].clear()
            self.handoff_records[node].clear()
            self.ttl_ms[node].clear()
        if durable is not None:
            (self.durable.add if durable else self.durable.discard)(node)
        (self.promoted.add if promoted else self.promoted.discard)(node)

    def begin_episode(self, node: int, ago: float = 0.0, lasts: float = 60.0,
                      why: str = "lost its node marker") -> str:
        """An amnesia episode, as DEMOTE or OPEN_EPISODE writes it, begun ``ago`` seconds
        ago by the node's clock in its current server run (another client opened it),
        ``lasts`` seconds from its beginning."""
        since = self.now_ms(node) - round(ago * 1000)
        value = f"{since} {self.run_id(node)} {since + round(lasts * 1000)} {why}"
        self.data[node][EPISODE] = value
        return value

    def episode(self, node: int) -> tuple[int, str, int, str] | None:
        """The node's episode: (since ms by its clock, run id, until ms, why), or None."""
        value = self.data[node].get(EPISODE)
        if value is None:
            return None
        since, run_id, until, why = as_text(value).split(" ", 3)
        return int(since), run_id, int(until), why

    def lease_horizon(self, seconds: float, nodes: Iterable[int] | None = None) -> None:
        """Each of ``nodes`` (default: all) granted leases that run out within ``seconds``
        by its HORIZON (docs/design.md §4.3.1): its horizon key set for that, less the
        slack HORIZON adds."""
        for node in range(len(self.data)) if nodes is None else nodes:
            self.data[node][HORIZON] = "1"
            self.ttl_ms[node][HORIZON] = round(seconds * 1000) - node_scripts.HORIZON_SLACK_MS

    def healthy(self, node: int) -> bool:
        """The node holds a marker stamped by the server run that answers."""
        marker = self.data[node].get(MARKER)
        return marker is not None and as_text(marker).startswith(self.stamp(node, ""))

    def attach(self, core: RedlockCore) -> None:
        """Identify nodes as the transports do from now on: IDENTIFY ahead of the first
        call on every new connection (to every node at first, to a node again after it
        restarted or failed to answer), the replies passed to ``core``'s amnesia guard
        once the request's replies are in, before the protocol sees them."""
        self.attached = core
        self.new_connections = set(range(len(self.data)))

    def connect(self, core: RedlockCore, nodes: Iterable[int] | None = None) -> dict[int, object]:
        """What a transport does on new connections to ``nodes`` (default: all): IDENTIFY
        ahead of the first call, the replies passed to the core's amnesia guard. A node
        that does not answer is left out, as the transports leave out an unread reply.
        Not recorded in :attr:`requests` (it rides on another request's connection)."""
        targets = range(len(self.data)) if nodes is None else nodes
        identities: dict[int, object] = {}
        for node in targets:
            reply = self.reply(core.amnesia.identify_call(node))
            if not isinstance(reply, BaseException):
                identities[node] = reply
        core.amnesia.identified(identities)
        return identities

    # -- playing the nodes ----------------------------------------------------------

    def execute(self, request: Broadcast | Wait | Invoke) -> list[object]:
        assert not isinstance(request, Invoke), "no protocol here calls user code"
        self.requests.append(request)
        if isinstance(request, Wait):
            if not (isinstance(request, PauseUntilWoken) and request.wake.is_set()):
                self.clock.advance(request.seconds)
            return []
        identities: dict[int, object] = {}
        if self.attached is not None:
            for node in sorted({c.node for c in request.calls} & self.new_connections):
                identity = self.reply(self.attached.amnesia.identify_call(node))
                if not isinstance(identity, BaseException):  # read: a known connection
                    identities[node] = identity
                    self.new_connections.discard(node)
        replies = [self.reply(call) for call in request.calls]
        map_failures(replies)  # as the transports do: the core sees node failures only
        if identities:
            assert self.attached is not None
            self.attached.amnesia.identified(identities)
        self.clock.advance(self.round_trip)
        return replies

    def reply(self, call: Call) -> object:
        if self.intercept is not None:
            answer = self.intercept(call)
            if answer is not PASS:
                return answer
        if call.node in self.down:
            return TimeoutError("no reply")
        if call.script is None:
            return self.command(call.node, call.args)
        return self.run_script(call.node, call.script, call.keys, call.args)

    def run_script(self, node: int, script: object, keys: tuple[str, ...],
                   args: tuple[object, ...]) -> object:
        """The Lua scripts of redlock/_scripts/lock.py and redlock/_scripts/node.py, step
        for step (tests/core/test_scripts_contract.py plays both and compares)."""
        db = self.data[node]

        def get(key: str) -> str | None:
            value = db.get(key)
            return None if value is None else as_text(value)

        def ours(value: str) -> bool:
            return value.startswith(node_scripts.FORMAT_PREFIX)

        # The run a granting call names after its epoch (a cluster master's connection's,
        # docs/proposals/cluster.md P3.1a); '' asks the node's own.
        client_run = ""

        def node_format(marker: str) -> int:
            """0 no marker (on a cluster node: or one stamped by another run than the
            client's or the node's), 1 this format, else the other format it names (-1:
            none)."""
            value = get(marker)
            if value is None:
                return 0
            if ours(value):
                if "{" in marker and f" run_id={client_run or self.run_id(node)} " not in value:
                    return 0
                return 1
            found = re.match(r"format=([0-9]+) ", value)
            return int(found[1]) if found and int(found[1]) > node_scripts.FORMAT else -1

        def fields(key: str) -> dict[str, int]:
            found = db.get(key)
            assert found is None or isinstance(found, dict), (key, found)
            return {} if found is None else found

        def highest(fence: str, field: str, floor: int = 0) -> int:
            return max(fields(fence).get(field, 0), floor)

        def settle(fence: str, field: str, floor: int, step: int) -> int:
            """max(bucket, floor) + step; HINCRBY only when it goes up (a counter at 0 is
            no field)."""
            value = max(fields(fence).get(field, 0), floor) + step
            if value > fields(fence).get(field, 0):
                db[fence] = {**fields(fence), field: value}
            return value

        # The horizon a script declares (a cluster node's: of its resource's hash slot).
        horizon = HORIZON

        def raise_horizon(ttl: object) -> None:
            """The node's lease horizon (docs/design.md §4.3.1): a key SET with a lease's
            TTL when the lease ends past it by more than the slack (its TTL here is the
            one it was set with: keys never expire)."""
            left = self.ttl_ms[node].get(horizon, -2) if horizon in db else -2
            if left < int(as_text(ttl)) - node_scripts.HORIZON_SLACK_MS:
                db[horizon] = "1"
                self.ttl_ms[node][horizon] = int(as_text(ttl))

        def record(key: str) -> list[object]:  # HMGET epoch members joining retired
            found = db.get(key) or {}
            assert isinstance(found, dict), (key, found)
            return [found.get(f) for f in ("epoch", "members", "joining", "retired")]

        had_record = False
        if isinstance(script, scripts.Script) and scripts.EPOCH_CHECK in script.source:
            # (ACQUIRE's usual case comes before the check, where it would pass.)
            # The membership check (docs/design.md §13.1): the last two keys (the horizon
            # and the record) and the last argument.
            *key_list, horizon, members_key = keys
            assert horizon.endswith(":horizon"), horizon
            *arg_list, client_view = args
            client_epoch, _, client_run = as_text(client_view).partition(" ")
            had_record = members_key in db
            epoch, members, joining, retired = record(members_key)
            if int(str(epoch or 0)) > int(as_text(client_epoch)) or retired == "1":
                return [scripts.STALE_EPOCH, int(str(epoch or 0)), members or "",
                        joining or "", retired or ""]
            keys, args = tuple(key_list), tuple(arg_list)

        if script is node_scripts.WRITE_MEMBERS:
            [members_key] = keys
            wanted = [as_text(a) for a in args]
            epoch, members, joining, retired = record(members_key)
            stored = int(str(epoch or 0))
            if [str(stored), members or "", joining or "", retired or ""] == wanted:
                return [node_scripts.MEMBERS_WRITTEN]
            if stored >= int(wanted[0]):
                return [node_scripts.MEMBERS_NEWER, stored, members or "", joining or "",
                        retired or ""]
            db[members_key] = {f: v for f, v in zip(("epoch", "members", "joining", "retired"),
                                                     wanted, strict=True) if v}
            return [node_scripts.MEMBERS_WRITTEN]
        if script is node_scripts.SEED_MEMBER:
            fence, marker, episode_key, guard, members_key = keys
            text, joint_epoch, *pairs = args
            if record(members_key)[0] != as_text(joint_epoch):
                return 0
            if marker in db and not ours(as_text(db[marker])):
                return -1
            for field, seed in zip(pairs[::2], pairs[1::2], strict=True):
                if int(as_text(seed)) > fields(fence).get(as_text(field), 0):
                    db[fence] = {**fields(fence), as_text(field): int(as_text(seed))}
            if marker not in db:
                db[marker] = self.stamp(node, as_text(text))
                db.pop(episode_key, None)
                db.pop(guard, None)
            return 1
        if script is scripts.ACQUIRE:
            lock, fence, marker, line_key, _, *handoffs = keys
            value, ticket, field = as_text(args[0]), as_text(args[3]), as_text(args[5])
            attempt = as_text(args[6]) if len(args) > 6 and handoffs else ""
            records = self.handoff_records[node].setdefault(line_key, {})
            # The usual case (a marker, no line, no membership record) reads only that the
            # marker exists; the rest of the script reads its format.
            usual = (marker in db and not self._line(node, line_key) and not had_record
                     and ("{" not in marker or node_format(marker) == 1))
            format = 1 if usual else node_format(marker)
            if not format:
                return [scripts.ACQUIRE_AMNESIAC, 0]
            if format != 1:
                return [scripts.ACQUIRE_OTHER_FORMAT, format]
            holder = get(lock)
            ours = kin(holder, value)
            if ours == 1:  # ours, or an earlier attempt's of our call (§2.1)
                db[lock] = value
                self.ttl_ms[node][lock] = int(as_text(args[1]))
                raise_horizon(args[1])
                return [scripts.ACQUIRE_ALREADY_OURS, settle(fence, field, 0, 0)]
            if ours == -1:  # a later attempt's: this acquire came late, changes nothing
                return [scripts.ACQUIRE_REFUSED, 1000]
            if holder == RESERVED + waiter_id(value):
                # A release handed the lock to us (§6.7): granted, first in line, with
                # the counter as the hand-off raised it.
                me, line = waiter_id(value), self._line(node, line_key)
                if ticket and me in line:
                    self._keep_until(node, line_key, me, self.now_ms(node) + min(
                        int(as_text(args[4])), int(as_text(args[1]))), line[me][0])
                if handoffs:
                    records.pop(me, None)
                db[lock] = value
                self.ttl_ms[node][lock] = int(as_text(args[1]))
                raise_horizon(args[1])
                return [scripts.ACQUIRE_GRANTED,
                        settle(fence, field, int(as_text(args[2])), 0)]

            def grant() -> list[object]:
                db[lock] = value
                self.ttl_ms[node][lock] = int(as_text(args[1]))
                raise_horizon(args[1])
                return [scripts.ACQUIRE_GRANTED,
                        settle(fence, field, int(as_text(args[2])), 1)]

            line = self._line(node, line_key)
            if holder is None and not line:  # free, nobody in line
                return grant()
            me = waiter_id(value)
            patience, now = int(as_text(args[4])), self.now_ms(node)
            self._drop_lapsed(node, line_key, records=bool(handoffs))

            def record_handoff() -> None:
                if ticket and attempt:
                    records[me] = f"{as_text(args[1])} {attempt} {as_text(args[2])}"
                    route = as_text(args[7]) if len(args) > 7 else ""
                    if re.fullmatch("[0-9a-fA-F]{8}", route):  # (Lua's %x: either case)
                        records[me] += f" {route}"

            def wait_in_line(until: int) -> None:  # the ticket is the same on every attempt
                if ticket:
                    self._keep_until(node, line_key, me, until, int(ticket))

            def in_order() -> list[str]:  # ZRANGE: by ticket, then by id
                line = self._line(node, line_key)
                return sorted(line, key=lambda w: (line[w][0], w))

            if holder is not None:
                record_handoff()
                wait_in_line(now + patience)
                return [scripts.ACQUIRE_REFUSED, 1000]
            order = in_order()
            if order and order[0] != me:
                record_handoff()
                wait_in_line(now + patience)
                order = in_order()
                return [scripts.ACQUIRE_NOT_YOUR_TURN,
                        order.index(me) if me in order else len(order)]
            if order:  # first in line: its place kept until the call is over
                wait_in_line(now + min(patience, int(as_text(args[1]))))
                if handoffs:
                    records.pop(me, None)
            return grant()
        if script is scripts.ACQUIRE_MANY:
            marker, fence, *locks = keys
            value = as_text(args[0])
            format = node_format(marker)
            if not format:
                return [scripts.ACQUIRE_AMNESIAC, 0]
            if format != 1:
                return [scripts.ACQUIRE_OTHER_FORMAT, format]
            if any(get(lock) is not None and kin(get(lock), value) != 1 for lock in locks):
                return [scripts.ACQUIRE_REFUSED, 1000]
            buckets = [as_text(a) for a in args[3:]]
            token = max([int(as_text(args[2])), *(highest(fence, f) for f in buckets)])
            token += any(get(lock) is None for lock in locks)
            reply: list[object] = [scripts.ACQUIRE_GRANTED]
            for lock, field in zip(locks, buckets, strict=True):
                self.ttl_ms[node][lock] = int(as_text(args[1]))
                db[lock] = value
                reply.append(settle(fence, field, token, 0))
            raise_horizon(args[1])
            return reply
        if script is scripts.WRITE_BACK:
            lock, fence, marker = keys
            if node_format(marker) != 1 or not self._ours(node, lock, as_text(args[0])):
                return 0
            db[lock] = as_text(args[0])  # a reservation for us becomes our key (§6.7)
            settle(fence, as_text(args[2]), int(as_text(args[1])), 0)
            return 1
        if script is scripts.RELEASE:
            lock, _, line_key, _, *handoffs = keys
            value, leave = as_text(args[0]), as_text(args[1])
            kept_for = as_text(args[2]) if len(args) > 2 else ""
            ticket = as_text(args[4]) if len(args) > 4 else ""
            me = waiter_id(value)
            records = self.handoff_records[node].setdefault(line_key, {})
            holder = get(lock)
            # '1' (the call is over): any attempt's value of the call; '0': this one's.
            released = holder == value or (leave == "1" and holder is not None and (
                holder[:CALL_DIGITS] == value[:CALL_DIGITS] or holder == RESERVED + me))
            if released:
                del db[lock]
            # As the Lua: the entry left or kept before the lapsed ones are dropped (a
            # lapsed entry not dropped yet is kept again).
            line, left = self._line(node, line_key), False
            if leave == "1" and line:
                left = line.pop(me, None) is not None
                if handoffs:
                    records.pop(me, None)
                self._emptied(node, line_key)
            elif kept_for and released and (ticket or me in line):  # keeps its place
                # (or, with its ticket, gets it where a grant found the line empty)
                self._keep_until(node, line_key, me, self.now_ms(node) + int(kept_for),
                                 int(ticket) if ticket else line[me][0])
            if not (released or (left and lock not in db)):
                return int(released)
            self._drop_lapsed(node, line_key, records=bool(handoffs))
            line = self._line(node, line_key)
            first = min(line, key=lambda w: (line[w][0], w)) if line else ""
            if first and first != me and handoffs:
                _, fence, marker, members_key, horizon = handoffs
                assert horizon.endswith(":horizon"), horizon
                record_of = records.get(first)
                parts = record_of.split(" ") if record_of else []
                if (record_of and node_format(marker) == 1 and record(members_key)[3] != "1"
                        and not (len(parts) > 3 and parts[3] in self.unheard_routes)):
                    ttl, _, floor = (int(x) for x in parts[:3])
                    db[lock] = RESERVED + first
                    self.ttl_ms[node][lock] = ttl
                    raise_horizon(ttl)
                    settle(fence, as_text(args[3]), floor, 1)
                    place, deadline = line[first]
                    self._keep_until(node, line_key, first,
                                     min(deadline, self.now_ms(node) + ttl), place)
                    del records[first]
            return int(released)
        if script is scripts.EXTEND:
            lock = keys[0]
            if not self._ours(node, lock, as_text(args[0])):
                return 0
            db[lock] = as_text(args[0])  # a reservation for us becomes our key (§6.7)
            self.ttl_ms[node][lock] = int(as_text(args[1]))
            raise_horizon(args[1])
            return 1
        if script is scripts.OWNED_PTTL:
            lock = keys[0]
            if not self._ours(node, lock, as_text(args[0])):
                return -2
            return self.ttl_ms[node].get(lock, -1)
        if script is scripts.FORCE_RELEASE:
            lock, _, line_key, _ = keys
            if db.pop(lock, None) is None:
                return 0
            self._drop_lapsed(node, line_key)  # (and publishes the first)
            return 1
        if script is scripts.INSPECT:
            lock, fence, marker, guard, episode_key = keys
            holder = get(lock)
            return [-2 if holder is None else self.ttl_ms[node].get(lock, -1),
                    highest(fence, as_text(args[0])), node_format(marker),
                    int(guard in db),
                    b"" if holder is None else holder[len(RESERVED):][:12].encode()
                    if holder.startswith(RESERVED) else
                    waiter_id(holder)[:12].encode(),
                    (get(episode_key) or "").encode(), self.now_ms(node)]
        if script is node_scripts.SEED_COUNTERS:
            guard, fence = keys
            repair_id, *pairs = args
            if get(guard) != as_text(repair_id):
                return 0
            for field, seed in zip(pairs[::2], pairs[1::2], strict=True):
                if int(as_text(seed)) > fields(fence).get(as_text(field), 0):
                    db[fence] = {**fields(fence), as_text(field): int(as_text(seed))}
            return 1
        if script is node_scripts.SEED_EPOCH:
            guard, fence = keys
            [repair_id] = args
            if get(guard) != as_text(repair_id):
                return [0, 0, 0]
            if node not in self.epochs:
                return ReplyError("ERR This instance has cluster support disabled")
            epoch, counters = self.epochs[node], fields(fence)
            recorded = counters.get("epoch", 0)
            if epoch <= recorded or epoch > node_scripts.EPOCH_LIMIT:
                return [-1, epoch, recorded]
            floor, counter = epoch * node_scripts.EPOCH_RANGE, counters.get(SLOT_COUNTER, 0)
            if counter >= floor:
                return [-2, epoch, counter]
            db[fence] = {**counters, SLOT_COUNTER: floor, "epoch": epoch}
            return [1, epoch, floor]
        if script is node_scripts.FINISH_REPAIR:
            guard, marker, episode_key = keys
            repair_id, text, waits = args
            if get(guard) != as_text(repair_id):
                return 0
            if as_text(waits) != "0":
                episode = get(episode_key)
                if episode is None:
                    return -1
                _, run_id, until = _episode(episode)
                if run_id != self.run_id(node) or self.now_ms(node) < int(until or 0):
                    return -1
            db[marker] = self.stamp(node, as_text(text))
            db.pop(guard, None)
            self.ttl_ms[node].pop(guard, None)
            db.pop(episode_key, None)
            return 1
        if script is node_scripts.INIT_MARKER:
            marker, episode_key = keys
            if marker in db:
                return 0
            if episode_key in db:
                return -1
            db[marker] = self.stamp(node, as_text(args[0]))
            return 1
        if script is node_scripts.RESTAMP:
            [marker] = keys
            judged, text, judged_run = args
            found = get(marker)
            if (found != as_text(judged) or not ours(found)
                    or as_text(judged_run) != self.run_id(node)):
                return 0
            db[marker] = self.stamp(node, as_text(text))
            return 1
        if script is node_scripts.DEMOTE:
            marker, episode_key = keys
            judged, why, wait = args
            found = get(marker)
            if found != as_text(judged) or not ours(found):
                return [0]
            now = self.now_ms(node)
            until = now + int(as_text(wait))
            db.pop(marker, None)
            db[episode_key] = f"{now} {self.run_id(node)} {until} {as_text(why)}"
            return [1, now, until]
        if script is node_scripts.OPEN_EPISODE:
            marker, episode_key = keys
            why, wait = as_text(args[0]), int(as_text(args[1]))
            if marker in db:
                return [0, get(marker)]
            now = self.now_ms(node)
            until = now + wait
            episode = get(episode_key)
            if episode is not None:
                since, run_id, was = _episode(episode)
                if run_id == self.run_id(node):
                    if int(was or 0) <= until:
                        return [1, int(since or 0), now, int(was or 0)]
                    rest = episode.split(" ", 3)[3]
                    db[episode_key] = f"{since} {run_id} {until} {rest}"
                    return [1, int(since or 0), now, until]
            db[episode_key] = f"{now} {self.run_id(node)} {until} {why}"
            return [1, now, now, until]
        if script is node_scripts.HORIZON:
            marker, episode_key, horizon_key = keys
            left = self.ttl_ms[node].get(horizon_key, -2) if horizon_key in db else -2
            rejoin = -1
            episode = get(episode_key)
            if episode is not None:
                _, run_id, until = _episode(episode)
                if run_id == self.run_id(node):
                    rejoin = max(0, int(until or 0) - self.now_ms(node))
            return [self.run_id(node), get(marker), max(left, 0) + node_scripts.HORIZON_SLACK_MS,
                    rejoin]
        raise AssertionError(f"unexpected script {script!r} on node {node}")

    def counter(self, node: int, resource: str = "r") -> int:
        """The node's fence counter that ``resource``'s tokens come from (its bucket)."""
        found = self.data[node].get(COUNTER) or {}
        assert isinstance(found, dict), found
        return int(found.get(bucket(resource), 0))

    def set_counter(self, node: int, value: int, resource: str = "r") -> None:
        found = self.data[node].get(COUNTER) or {}
        assert isinstance(found, dict), found
        self.data[node][COUNTER] = {**found, bucket(resource): value}

    def _line(self, node: int, key: str) -> dict[str, tuple[int, int]]:
        """A waiting line's entries, lapsed ones included (the Lua drops them only in
        :meth:`_drop_lapsed`); {} once its keys expired (a Redis key is gone once its
        expiry time is past)."""
        line = self.lines[node].setdefault(key, {})  # empty: no key
        expiry = self.line_expiry[node].get(key)
        if expiry is not None and self.now_ms(node) > expiry:
            line.clear()
            del self.line_expiry[node][key]
            self.handoff_records[node].get(key, {}).clear()  # expired with the line
        return line

    def _drop_lapsed(self, node: int, key: str, *, records: bool = False) -> None:
        """The Lua's ``drop_lapsed``: the entries whose deadline passed go (and, with
        ``records``, their hand-off records)."""
        line, now = self._line(node, key), self.now_ms(node)
        for waiter in [w for w, (_, deadline) in line.items() if deadline <= now]:
            del line[waiter]
            if records:
                self.handoff_records[node].get(key, {}).pop(waiter, None)
        self._emptied(node, key)

    def _ours(self, node: int, lock: str, value: str) -> bool:
        """The key holds ``value``, or a reservation for it (docs/design.md §6.7)."""
        holder = self.data[node].get(lock)
        return holder is not None and as_text(holder) in (
            value, RESERVED + waiter_id(value))

    def live_records(self, node: int, key: str) -> dict[str, str]:
        """A line's hand-off records of its live entries (what counts)."""
        live = self.live_line(node, key)
        return {w: r for w, r in self.handoff_records[node].get(key, {}).items() if w in live}

    def _keep_until(self, node: int, key: str, waiter: str, until: int, ticket: int) -> None:
        """ZADD and the Lua's ``keep_until``: the entry's ticket and deadline; both keys
        expire 1 ms after the latest deadline."""
        line = self._line(node, key)
        line[waiter] = (ticket, until)
        self.line_expiry[node][key] = max(d for _, d in line.values()) + 1

    def _emptied(self, node: int, key: str) -> None:
        """A sorted set without members is no key (its expiry goes with it)."""
        if not self.lines[node].get(key):
            self.line_expiry[node].pop(key, None)

    def live_line(self, node: int, key: str) -> dict[str, tuple[int, int]]:
        """The entries of a line whose deadline has not passed (what counts), unchanged."""
        now = self.now_ms(node)
        return {w: e for w, e in self.lines[node].get(key, {}).items() if e[1] > now}

    def command(self, node: int, args: tuple[object, ...]) -> object:
        """The plain commands the protocols send, as Redis answers them (raw replies, as
        the transports read them: bytes, lists, maps under RESP3)."""
        db = self.data[node]
        name, *rest = args
        if name == "EVAL" and rest[0] == node_scripts.SERVER_IDENTITY.source:
            assert rest[1] == 0, rest
            return [self.run_id(node).encode(), None]
        if name == "EVAL" and rest[0] == node_scripts.IDENTIFY.source:
            assert rest[1] == 1, rest
            marker = db.get(as_text(rest[2]))
            return [self.run_id(node).encode(),
                    None if marker is None else as_text(marker).encode()]
        if name == "INFO":
            sections = {"server": f"# Server\r\nredis_version:7.0.15\r\n"
                                  f"run_id:{self.run_id(node)}\r\n",
                        "replication": self._replication(node)}
            wanted = [as_text(s).lower() for s in rest] or list(sections)
            return "\r\n".join(sections[s] for s in wanted).encode()
        if name == "CONFIG":
            assert as_text(rest[0]).upper() == "GET", args
            parameter = as_text(rest[1])
            durable = node in self.durable
            value = {"appendonly": "yes" if durable else "no",
                     "appendfsync": "always" if durable else "everysec"}[parameter]
            if self.resp3:
                return {parameter.encode(): value.encode()}
            return [parameter.encode(), value.encode()]
        if name == "EXISTS":
            return sum(1 for key in rest if as_text(key) in db)
        if name == "DEL":
            for key in rest:
                self.ttl_ms[node].pop(as_text(key), None)
            return sum(1 for key in rest if db.pop(as_text(key), None) is not None)
        if name == "SET":
            key, value, *options = (as_text(a) for a in rest)
            if "NX" in options and key in db:
                return None
            db[key] = value
            if "PX" in options:
                self.ttl_ms[node][key] = int(options[options.index("PX") + 1])
            else:  # a SET without PX (or KEEPTTL) clears the TTL
                self.ttl_ms[node].pop(key, None)
            return b"OK"
        if name == "SCAN":
            # As Redis does: a page of the whole keyspace (``scan_page`` keys, whatever
            # COUNT asks), then MATCH filters it; the cursor is 0 after the last page.
            cursor, _, pattern, _, _ = rest
            keys = sorted(db)
            start = int(as_text(cursor))
            end = start + self.scan_page
            return [str(end if end < len(keys) else 0).encode(),
                    [k.encode() for k in keys[start:end]
                     if fnmatch.fnmatchcase(k, as_text(pattern))]]
        if name == "HGETALL":
            found = db.get(as_text(rest[0])) or {}
            assert isinstance(found, dict), found
            if self.resp3:
                return {f.encode(): str(v).encode() for f, v in found.items()}
            return [x for f, v in found.items() for x in (f.encode(), str(v).encode())]
        if name == "MGET":
            return [None if db.get(as_text(k)) is None else as_text(db[as_text(k)]).encode()
                    for k in rest]
        raise AssertionError(f"unexpected command {args}")

    def _replication(self, node: int) -> str:
        role = "slave" if node in self.replicas else "master"
        second = "4711" if node in self.promoted else "-1"
        return (f"# Replication\r\nrole:{role}\r\nconnected_slaves:0\r\n"
                f"master_repl_offset:4711\r\nsecond_repl_offset:{second}\r\n")

    # -- what the protocols sent ------------------------------------------------------

    def broadcasts(self) -> list[Broadcast]:
        return [r for r in self.requests if isinstance(r, Broadcast)]

    def sleeps(self) -> list[float]:
        return [r.seconds for r in self.requests if isinstance(r, Wait)]

    def scripts_sent(self) -> list[str]:
        return [r.calls[0].script.name for r in self.broadcasts()
                if r.calls and r.calls[0].script is not None]

    def commands_sent(self) -> list[str]:
        """Each broadcast's first call: its script name, or its command name (IDENTIFY,
        a plain EVAL, shows as "identify")."""
        return [describe(r.calls[0]) for r in self.broadcasts() if r.calls]


def describe(call: Call) -> str:
    """A call's script name, or its command name ("identify" for IDENTIFY's EVAL)."""
    if call.script is not None:
        return call.script.name
    if call.args[:2] == ("EVAL", node_scripts.IDENTIFY.source):
        return "identify"
    return str(call.args[0])


_EPISODE = re.compile(r"([0-9]+) (\S+) ([0-9]+)")


def _episode(episode: str) -> tuple[str | None, str | None, str | None]:
    """``string.match(episode, '^(%d+) (%S+) (%d+)')``: (since, run id, until), or Nones."""
    found = _EPISODE.match(episode)
    return (found[1], found[2], found[3]) if found else (None, None, None)


def make_core(n: int, clock: FakeClock | None = None, **settings: object) -> RedlockCore:
    """A core past its one-time node inspection (tested on its own), so each test sees
    only the protocol round trips it is about."""
    core = RedlockCore([f"n{i}:6379" for i in range(n)], Settings(**settings),  # type: ignore[arg-type]
                       real_environment(clock or FakeClock()))
    core.amnesia.health.inspected = True
    return core
