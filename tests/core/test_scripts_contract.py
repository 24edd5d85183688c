"""The contract between tests/scripted.py and the Lua scripts: every script the scripted
nodes play, and the plain commands the protocols send, run with the same keys and
arguments on a scripted node and on a real redis-server (tests/core/contract.py), which
must give the same replies and hold the same keys (values, TTL or none) after each call.

Random sequences over two resources, three owners and two repair claims (Hypothesis),
and written-out sequences for the cases a random one rarely reaches: lapsed entries of
the waiting line, a node without its marker or with one of another format, episodes of
this and other server runs, repairs too early or forced. A one-line change to any script
that the model does not follow fails the contract (the last test makes sure of it).

In the calls, ``<run>`` stands for the real server's run id and ``<marker>`` for the
marker's current value (see :meth:`Contract.step`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redlock._core.kinds import SLOT_COUNTER
from redlock._core.settings import in_hash_slot as slot_keys
from redlock._io.wire import with_run
from redlock.testing import RedisNodes, free_port
from tests.core.contract import UNHEARD_ROUTE, Contract, listening, plain, shown
from tests.internals import (
    CALL_DIGITS,
    KEYS,
    Call,
    bucket,
    lock_value,
    node_scripts,
    scripts,
    waiter_id,
    with_epoch,
)
from tests.scripted import RESERVED, ScriptedNodes, as_text

K = KEYS
TTL = 60_000
FOREIGN = "0123456789abcdef0123456789abcdef01234567"  # another server run's id
NEWER = "format=2 run_id=<run> initialised by a newer release"  # a marker of another format


@pytest.fixture(scope="module")
def server() -> Iterator[redis.Redis]:
    with RedisNodes(1) as nodes, nodes[0].client() as client, listening(client):
        yield client


# -- the calls, as the protocols send them ---------------------------------------------


def guarded(call: Call, epoch: int) -> Call:
    """A granting, committing or renewing call, with the horizon and membership keys
    and the client's epoch last (docs/design.md §4.3.1, §13.1)."""
    [sent] = with_epoch([call], K, epoch)
    return sent


def acquire(r: str, owner: str, *, ticket: str = "", patience: int = TTL, floor: int = 0,
            ttl: int = TTL, epoch: int = 0, attempt: int | str = "",
            route: str = "") -> Call:
    """``attempt``: a mutex waiter's attempt number, recorded for a hand-off
    (docs/design.md §6.7); '' sends none (a single try, a family kind). ``route``: its
    manager's route, recorded with it ('' sends none, as an earlier release)."""
    routed = (route,) if route else ()
    return guarded(Call(0, (owner, ttl, floor, ticket, patience, bucket(r), attempt, *routed),
                        scripts.ACQUIRE,
                        (K.lock(r), K.counter, K.marker, K.line(r), K.line_deadlines(r),
                         K.line(r) + "-ttls")), epoch)


def acquire_many(resources: list[str], owner: str, floor: int | None = None,
                 ttl: int = TTL, epoch: int = 0) -> Call:
    return guarded(Call(0, (owner, ttl, floor or 0, *map(bucket, resources)),
                        scripts.ACQUIRE_MANY,
                        (K.marker, K.counter, *map(K.lock, resources))), epoch)


def write_back(r: str, owner: str, token: int, epoch: int = 0) -> Call:
    return guarded(Call(0, (owner, token, bucket(r)), scripts.WRITE_BACK,
                        (K.lock(r), K.counter, K.marker)), epoch)


def release(r: str, owner: str, *, leave: bool = True, patience: int | None = None,
            handing: bool = True, ticket: str = "") -> Call:
    """As the protocols send it (``handing``: with the keys a hand-off needs, §6.7; else
    as an earlier release sent it; ``ticket``: a failed attempt's, which puts its place
    back where its grant found the line empty, §6.3)."""
    if not handing:
        args: tuple[object, ...] = (owner, "1") if leave else (owner, "0") if patience is None \
            else (owner, "0", patience)
        return Call(0, args, scripts.RELEASE,  # type: ignore[arg-type]
                    (K.lock(r), K.channel(r), K.line(r), K.line_deadlines(r)))
    args = (owner, "1" if leave else "0", "" if leave or patience is None else patience,
            bucket(r))
    return Call(0, (*args, ticket) if ticket else args, scripts.RELEASE,
                (K.lock(r), K.channel(r), K.line(r), K.line_deadlines(r), K.line(r) + "-ttls",
                 K.counter, K.marker, K.members, K.horizon))


def extend(r: str, owner: str, ttl: int = 2 * TTL, epoch: int = 0) -> Call:
    return guarded(Call(0, (owner, ttl), scripts.EXTEND, (K.lock(r),)), epoch)


def write_members(epoch: int, members: str, joining: str = "", retired: str = "") -> Call:
    return Call(0, (epoch, members, joining, retired), node_scripts.WRITE_MEMBERS,
                (K.members,))


def seed_member(joint_epoch: int, counters: dict[str, int]) -> Call:
    pairs = [a for r, value in counters.items() for a in (bucket(r), value)]
    return Call(0, ("joined at=1", joint_epoch, *pairs), node_scripts.SEED_MEMBER,
                (K.counter, K.marker, K.episode, K.repair_guard, K.members))


def owned_pttl(r: str, owner: str) -> Call:
    return Call(0, (owner,), scripts.OWNED_PTTL, (K.lock(r),))


def force_release(r: str) -> Call:
    return Call(0, (), scripts.FORCE_RELEASE,
                (K.lock(r), K.channel(r), K.line(r), K.line_deadlines(r)))


def inspect(r: str) -> Call:
    return Call(0, (bucket(r),), scripts.INSPECT,
                (K.lock(r), K.counter, K.marker, K.repair_guard, K.episode))


def identify() -> Call:
    return Call(0, K.identify_command())


def server_identity() -> Call:
    """A cluster master's connection's probe (docs/proposals/cluster.md P3.1a)."""
    return Call(0, ("EVAL", node_scripts.SERVER_IDENTITY.source, 0))


def init_marker() -> Call:
    return Call(0, ("initialised at=1",), node_scripts.INIT_MARKER, (K.marker, K.episode))


def restamp(judged: str = "<marker>", run: str = "<run>") -> Call:
    return Call(0, (judged, "restamped", run), node_scripts.RESTAMP, (K.marker,))


def demote(judged: str = "<marker>", wait: int = 5_000) -> Call:
    return Call(0, (judged, "restarted", wait), node_scripts.DEMOTE, (K.marker, K.episode))


def open_episode(wait: int = 5_000) -> Call:
    return Call(0, ("lost its node marker", wait), node_scripts.OPEN_EPISODE,
                (K.marker, K.episode))


def horizon() -> Call:
    return Call(0, (), node_scripts.HORIZON, (K.marker, K.episode, K.horizon))


def claim(repair_id: str) -> Call:
    return Call(0, ("SET", K.repair_guard, repair_id, "NX", "PX", TTL))


def seed(repair_id: str, counters: dict[str, int]) -> Call:
    """Seeds per resource: each one's bucket and value."""
    pairs = [a for r, value in counters.items() for a in (bucket(r), value)]
    return Call(0, (repair_id, *pairs), node_scripts.SEED_COUNTERS, (K.repair_guard, K.counter))


def finish(repair_id: str, waits: bool) -> Call:
    """FINISH_REPAIR: only once the episode's rejoin time has come (``waits``), or forced."""
    return Call(0, (repair_id, "repaired", "1" if waits else "0"), node_scripts.FINISH_REPAIR,
                (K.repair_guard, K.marker, K.episode))


def command(*args: object) -> Call:
    return Call(0, args)  # type: ignore[arg-type]


def marker(value: str = "format=1 run_id=<run> initialised") -> Call:
    return command("SET", K.marker, value)


def episode(since: int, run: str = "<run>", until: int | None = None) -> Call:
    """An amnesia episode that began ``since`` and may end at ``until`` (default: at once)."""
    return command("SET", K.episode,
                   f"{since} {run} {since if until is None else until} lost its node marker")


ANCIENT, FUTURE = 1000, 9_999_999_999_999  # episode times, in ms by the node's clock


# -- written-out sequences ---------------------------------------------------------------


def waiting_line(c: Contract) -> None:
    c.steps([
        marker(),
        acquire("a", "alice"),  # free, nobody in line: granted
        acquire("a", "bob", ticket="2"),  # held: refused, joins the line
        acquire("a", "carol", ticket="1"),  # joins ahead of bob (a smaller ticket)
        acquire("a", "dave", ticket="3", patience=0),  # joins; lapses at once
        acquire("a", "bob", ticket="2", floor=7),  # keeps its place
        release("a", "alice"),
        acquire("a", "erin"),  # free, a single try: not its turn, 2 ahead
        acquire("a", "bob", ticket="2"),  # not its turn: 1 ahead
        acquire("a", "carol", ticket="1", floor=7),  # first in line: granted, keeps its place
        release("a", "carol", leave=False, patience=30_000),  # a failed attempt
        acquire("a", "carol", ticket="1", patience=0),  # granted again, place lapses now
        release("a", "carol", leave=False),
        acquire("a", "bob", ticket="2"),  # first now carol lapsed
        release("a", "bob", leave=False, patience=TTL),
        acquire("a", "bob", patience=0),  # once without its ticket: its entry as it was
        release("a", "bob"),  # leaves the line: empty, its keys go
        acquire("a", "dave", ticket="3", patience=0),  # nobody in line: granted
        release("a", "dave", leave=False, patience=0),
        acquire("a", "dave", ticket="3"),  # nobody in line: granted, not entered
        release("a", "dave", leave=False, patience=TTL, ticket="3"),  # failed: now in line
        acquire("a", "erin"),  # free, but dave is first: not its turn
        acquire("a", "erin", ticket="4"),  # joins behind dave
        release("a", "erin", leave=False, patience=TTL, ticket="4"),  # nothing of erin's
        acquire("a", "dave", ticket="3"),  # first: granted
        release("a", "dave", leave=False, patience=TTL, ticket="3"),  # in line: kept
        release("a", "dave"), release("a", "erin"),  # both leave: empty, its keys go
        acquire("b", "erin", ticket="5"),
        acquire("b", "frank", ticket="4"),
        force_release("b"),  # erin's key deleted, the line kept
        acquire("b", "erin", ticket="5"),  # frank first
        acquire("b", "frank", ticket="4"),
        force_release("b"), force_release("b"),  # frank's key; then nothing to delete
        inspect("a"), inspect("b"),
    ])


def lapsed_places(c: Contract) -> None:
    """An entry past its deadline stays until a script drops it, as long as the line's
    keys live (until its latest deadline): a RELEASE that keeps its waiter's place brings
    it back; once the keys expired, there is nothing to keep."""
    c.steps([
        marker(),
        acquire("a", "alice"),
        acquire("a", "carol", ticket="1"),  # joins: the line's keys live 60 s
        acquire("a", "bob", ticket="2", patience=0),  # joins, lapses at once
        command("DEL", K.lock("a")),  # alice's key expired: nothing dropped bob's entry
        acquire_many(["a"], "bob"),  # does not look at the line
        release("a", "bob", leave=False, patience=TTL),  # its lapsed entry kept again
        release("a", "carol"),  # leaves; the keys still expire with its deadline
        acquire("a", "alice", ticket="3", patience=0),  # bob is first: not its turn
        acquire("a", "bob", ticket="2", patience=0),  # first: granted, lapses at once
        release("a", "bob", leave=False, patience=TTL),  # the keys expired: not kept
        acquire("a", "alice"),  # nobody in line: granted
        inspect("a"),
    ])


def tokens_and_ownership(c: Contract) -> None:
    c.steps([
        marker(),
        acquire("a", "alice", floor=4),  # 0 -> 5
        acquire("a", "alice", ttl=30_000),  # already ours: TTL refreshed, counter as is
        write_back("a", "alice", 9), write_back("a", "alice", 3),  # raised, never lowered
        write_back("a", "bob", 20),  # not the owner: nothing
        extend("a", "alice"), extend("a", "bob"),
        owned_pttl("a", "alice"), owned_pttl("a", "bob"), owned_pttl("z", "alice"),
        command("SET", K.lock("d"), "carol"), owned_pttl("d", "carol"),  # no expiry: -1
        inspect("a"),
        acquire_many(["a", "b"], "bob", 1),  # a is alice's: nothing set
        acquire_many(["b", "c"], "bob", 6),
        acquire_many(["c", "b"], "bob"),  # both ours already
        release("a", "bob"), release("a", "alice"), release("a", "alice"),
        acquire_many(["a", "b"], "alice", 30, ttl=30_000),
        command("DEL", K.lock("c")),  # c's key expired
        acquire_many(["c", "a"], "bob"),
        command("HGETALL", K.counter),
        command("EXISTS", K.lock("a"), K.lock("c"), K.marker),
    ])


def other_formats(c: Contract) -> None:
    """A node whose marker names another format (a newer release's, or none: docs/design.md
    §4.1): every script that reads the marker refuses it, changes nothing of it, and says
    which format it found; ACQUIRE's usual case reads only that a marker exists (the
    client checked its format on the connection: IDENTIFY)."""
    c.steps([
        marker(NEWER),
        identify(), server_identity(), inspect("a"),
        acquire("a", "alice"),  # the usual case (no line, no record): granted
        acquire("a", "bob", ticket="1", attempt=1),  # held: refused, joins the line
        acquire("a", "alice"),  # a line now: the marker is read, refused with format 2
        acquire("a", "carol", ticket="2"),  # refused with format 2, not in line
        acquire_many(["c"], "alice"), write_back("a", "alice", 9),  # refused, not counted
        release("a", "alice"),  # no hand-off on such a node: a plain wake
        command("HGETALL", K.counter), inspect("a"),
        restamp(judged=NEWER), demote(judged=NEWER),  # not this client's marker to change
        open_episode(), init_marker(),  # marked: nothing
        write_members(1, "a:1", "a:1\nb:1"), seed_member(1, {"a": 5}),  # refused: -1
        marker("run_id=<run> a marker naming no format"),
        write_members(2, "a:1"),
        acquire("a", "dave", epoch=2), inspect("a"),  # -1: none this client reads
        marker("format=01 run_id=<run> x"), acquire("a", "dave", epoch=2),
        marker("format=0 run_id=<run> x"), acquire("a", "dave", epoch=2),
        marker("format=12 run_id=<run> x"), acquire_many(["a"], "dave", epoch=2),
        marker(), acquire("a", "dave", epoch=2),  # this format's: granted
        seed_member(1, {"a": 5}),  # this format's marker: not the change's epoch any more
    ])


def without_a_marker(c: Contract) -> None:
    c.steps([
        acquire("a", "alice"), acquire("a", "alice", ticket="1"), acquire_many(["a"], "alice"),
        identify(), open_episode(), open_episode(),  # kept: the same server run
        init_marker(),  # refused: an episode
        command("DEL", K.episode), init_marker(), init_marker(),  # written, then there
        identify(),
        acquire("a", "alice"), command("DEL", K.marker),
        write_back("a", "alice", 10),  # no marker: not counted
        extend("a", "alice"), inspect("a"), release("a", "alice"),  # no marker needed
        open_episode(), inspect("a"),
    ])


def judging(c: Contract) -> None:
    c.steps([
        marker(f"format=1 run_id={FOREIGN} initialised"),
        restamp(run=FOREIGN),  # another server answers now
        restamp(judged="format=1 run_id=unknown x"),  # the marker changed meanwhile
        restamp(), identify(), restamp(),
        demote(judged="something else"), demote(),  # marker gone, episode begun
        demote(), restamp(), identify(),
        marker("format=1 run_id=unknown initialised by a user who may not run INFO"),
        restamp(), demote(), open_episode(),
    ])


def episodes_and_repair(c: Contract) -> None:
    c.steps([
        open_episode(),  # begun now
        episode(ANCIENT, FOREIGN), open_episode(),  # another run's: begun anew
        episode(ANCIENT, "<run>zz"), open_episode(),  # not this run either
        episode(ANCIENT, "unknown"), open_episode(),
        episode(ANCIENT), open_episode(),  # this run's: kept (its rejoin time is earlier)
        episode(ANCIENT, until=FUTURE), open_episode(),  # this run's: its rejoin time lowered
        open_episode(wait=60_000),  # kept: the earlier rejoin time stays
        horizon(),  # in an episode: how long until it may rejoin
        episode(ANCIENT, FOREIGN, until=FUTURE), horizon(),  # another run's: not its own
        claim("g1"), claim("g2"),  # taken
        seed("g2", {"a": 5}), seed("g1", {"a": 5, "b": 3}), seed("g1", {"a": 2, "c": 1}),
        finish("g2", False),  # not its claim
        episode(ANCIENT, until=FUTURE), finish("g1", True),  # its rejoin time has not come
        episode(ANCIENT, FOREIGN), finish("g1", True),  # another run's
        episode(ANCIENT, "<run>zz"), finish("g1", True),
        command("DEL", K.episode), finish("g1", True),  # none
        episode(ANCIENT), finish("g1", True),  # its rejoin time has come: marker back
        finish("g1", False), open_episode(), identify(), horizon(),
        command("DEL", K.marker), claim("g1"), finish("g1", False),  # forced: no episode
        claim("g2"), command("DEL", K.repair_guard), seed("g2", {"a": 9}),  # claim gone
        inspect("a"), inspect("b"),
    ])


def lease_horizons(c: Contract) -> None:
    """Every grant and renewal of a lease raises the node's lease horizon to its end; a
    shorter lease leaves it, and HORIZON reads it (docs/design.md §4.3.1)."""
    c.steps([
        marker(), horizon(),  # no lease yet: within the slack
        acquire("a", "alice", ttl=200), horizon(),  # within the slack: no key
        acquire("b", "bob"), horizon(),  # the horizon is b's lease
        acquire("c", "carol", ttl=1_000),  # shorter: left as it is
        extend("b", "bob", ttl=3 * TTL), horizon(),  # a renewal moves it
        acquire_many(["d", "e"], "dave", ttl=4 * TTL), horizon(),
        acquire("b", "bob", ttl=5 * TTL), horizon(),  # our own key refreshed
        inspect("b"),
        acquire("h", "hal"), acquire("h", "ivy", ticket="2", attempt=1, ttl=6 * TTL),
        release("h", "hal"), horizon(),  # a hand-off's reservation is a lease too (§6.7)
    ])


def membership(c: Contract) -> None:
    """Records only go up; a stale epoch or a retired node is refused with the record;
    a node being added is seeded and marked once, by its change's joint epoch."""
    c.step(write_members(1, "a:1\nb:1"))
    c.step(write_members(1, "a:1\nb:1"))  # the same record: written (idempotent)
    c.step(write_members(1, "a:1"))  # same epoch, another record: refused
    c.step(acquire("r", "o1", epoch=1))  # no marker yet: amnesiac
    c.step(seed_member(2, {"r": 5}))  # not this change's epoch
    c.step(write_members(2, "a:1\nb:1", "a:1\nb:1\nc:1"))
    c.step(seed_member(2, {"r": 5, "s": 2}))
    c.step(acquire("r", "o1", epoch=0))  # below the node's epoch: refused with the record
    c.step(acquire("r", "o1", epoch=2))
    c.step(extend("r", "o1", epoch=1))
    c.step(extend("r", "o1", epoch=2))
    c.step(write_back("r", "o1", 9, epoch=1))
    c.step(write_back("r", "o1", 9, epoch=3))
    c.step(acquire_many(["r", "s"], "o2", epoch=1))
    c.step(seed_member(2, {"r": 3, "s": 7}))  # marked already: counters only rise
    c.step(marker())
    c.step(seed_member(2, {"s": 8}))
    c.step(write_members(1, "a:1"))  # lower: refused
    c.step(write_members(3, "a:1\nb:1", "", "1"))  # retired
    c.step(acquire("r", "o3", epoch=3))
    c.step(extend("r", "o1", epoch=9))
    c.step(release("r", "o1"))  # releases are never checked


def hand_offs(c: Contract) -> None:
    """A release hands the lock to the first in line that left a record (docs/design.md
    §6.7): a reservation with its TTL, the counter raised with its floor, its deadline
    cut to the TTL; a reservation is its waiter's key for ACQUIRE, WRITE_BACK, EXTEND,
    OWNED_PTTL and RELEASE (with *leave* only), and a held key for anyone else."""
    c.steps([
        marker(),
        acquire("a", "alice"),  # granted
        acquire("a", "bob", ticket="2", attempt=1, floor=4, ttl=30_000,
                route="0badf00d"),  # refused: record, with bob's route
        acquire("a", "carol", ticket="3", attempt=1, route="not-hex!"),  # behind bob (no
        # route recorded: not 8 hex digits)
        acquire("a", "dave", ticket="4"),  # no attempt number: no record
        release("a", "alice"),  # hands off to bob: 'handoff:<bob>', counter 5, cut deadline
        acquire("a", "erin"),  # a single try: refused, the key is held
        acquire_many(["a"], "erin"),  # refused as well
        acquire("a", "carol", ticket="3", attempt=2),  # refused: held (record: attempt 2)
        inspect("a"),  # bob's prefix
        owned_pttl("a", "bob"), owned_pttl("a", "carol"),
        release("a", "bob", leave=False, patience=TTL),  # a failed attempt: kept
        write_back("a", "carol", 9),  # not carol's
        write_back("a", "bob", 9),  # bob's: becomes his key, PTTL kept, counter 9
        release("a", "bob"),  # hands off to carol (floor 0): counter 10
        extend("a", "carol"),  # carol's: becomes her key
        release("a", "carol"),  # dave first, no record: a plain wake
        acquire("a", "dave", ticket="4", attempt=3),  # free, first: granted
        acquire("a", "frank", ticket="5", attempt=1, ttl=20_000, patience=10_000,
                route="C0FFEE42"),  # record, the route in capitals
        release("a", "dave"),  # hands off to frank
        acquire("a", "frank", ticket="5", attempt=2,
                floor=50),  # frank's reservation: granted, the counter raised to its floor
        acquire("b", "gina"),
        acquire("b", "hugo", ticket="1", attempt=1, patience=0),  # lapses at once
        acquire("b", "ivan", ticket="2", attempt=1),
        release("b", "gina"),  # hugo lapsed: ivan gets it
        release("b", "ivan", leave=False),  # without leave: the reservation stays
        release("b", "ivan"),  # with leave: deleted, nobody left
        acquire("d", "nina"),
        acquire("d", "omar", ticket="1", attempt=1),
        acquire("d", "nina", ticket="0", attempt=1),  # nina's own key: already ours
        release("d", "nina", leave=False),  # nina first in line: nobody handed to
        acquire("d", "nina", ticket="0", attempt=2),  # granted again
        release("d", "nina"),  # leaves; omar handed the lock
        force_release("d"),  # deletes the reservation: a plain wake
        acquire("c", "jack"),
        acquire("c", "kate", ticket="1", attempt=1),
        release("c", "jack", handing=False),  # an earlier release's call: a plain wake
        write_members(3, "x"),
        acquire("c", "kate", ticket="1", attempt=2, epoch=3),  # free, first: granted
        acquire("c", "liam", ticket="2", attempt=1, epoch=3),  # refused: record
        command("DEL", K.marker),
        release("c", "kate"),  # no marker: no hand-off
        marker(),
        acquire("c", "liam", ticket="2", attempt=2, epoch=3),  # free, first: granted
        acquire("c", "mona", ticket="3", attempt=1, epoch=3),  # refused: record
        write_members(4, "x", "", "1"),
        release("c", "liam"),  # a retired node does not hand off
        inspect("a"), inspect("b"), inspect("c"), inspect("d"),
    ])


def unheard_hand_offs(c: Contract) -> None:
    """A waiter whose manager does not listen on the node (its route's channel has no
    subscriber: it died, or has not subscribed there yet) is not handed the lock
    (docs/design.md §6.7): the key stays free, the waiter first in line with its record
    and its deadline; its next attempt is granted as the first in line, or its entry
    lapses and the next waiter's is."""
    c.steps([
        marker(),
        acquire("a", "alice"),  # granted
        acquire("a", "bob", ticket="2", attempt=1, ttl=30_000, patience=20_000,
                route=UNHEARD_ROUTE),  # refused: record, with a route nobody hears
        acquire("a", "carol", ticket="3", attempt=1, route="0badf00d"),  # behind bob
        release("a", "alice"),  # bob unheard: no reservation, a plain wake naming bob
        acquire("a", "carol", ticket="3", attempt=2, route="0badf00d"),  # not her turn
        acquire("a", "bob", ticket="2", attempt=2, route=UNHEARD_ROUTE),  # first: granted
        release("a", "bob"),  # leaves; carol is heard: handed off
        inspect("a"),
        acquire("b", "dave"),
        acquire("b", "erin", ticket="1", attempt=1, patience=0,
                route=UNHEARD_ROUTE),  # lapses at once
        acquire("b", "frank", ticket="2", attempt=1, route=UNHEARD_ROUTE),
        release("b", "dave"),  # erin lapsed; frank first, unheard: the key stays free
        acquire("b", "gina"),  # a single try: not its turn (frank is in line)
        inspect("b"),
    ])


# One acquire call's attempts (docs/design.md §2.1): its secret, then the attempt's number.
CALL = "0123456789abcdef" * 2
FIRST, SECOND, THIRD = (lock_value(CALL, n) for n in (1, 2, 3))


def attempts_of_one_call(c: Contract) -> None:
    """A later attempt takes over what an earlier one of its call set; a command of an
    earlier attempt that arrives late (a lost reply, a stalled connection) changes
    nothing a later one set; a release that ends the call takes whatever any attempt
    set."""
    c.steps([
        marker(),
        acquire("a", FIRST, ticket="1", attempt=1),  # free: granted
        acquire("a", SECOND, ticket="1", attempt=2),  # the first's key: taken over
        acquire("a", FIRST, ticket="1", attempt=1),  # late: refused, line untouched
        release("a", FIRST, leave=False, patience=TTL),  # late: the second's key stays
        extend("a", FIRST), owned_pttl("a", FIRST), write_back("a", FIRST, 9),  # not its
        extend("a", SECOND), write_back("a", SECOND, 9),
        acquire("a", "bob", ticket="2", attempt=1),  # held: bob waits, with a record
        release("a", FIRST),  # the call is over: the second's key goes, bob handed it
        acquire("a", THIRD, ticket="1", attempt=3),  # held (a reservation): refused
        release("a", THIRD),  # leaves the line
        acquire("b", SECOND), acquire_many(["b", "c"], THIRD),  # b taken over, c set
        acquire_many(["c"], FIRST),  # late: nothing set
        acquire_many(["c", "d"], SECOND),  # late: nothing set
        release("b", SECOND, leave=False), release("c", FIRST),  # b stays; c goes
        command("SET", K.lock("e"), CALL, "PX", TTL),  # an older client's value: no attempt
        acquire("e", FIRST), release("e", FIRST),  # somebody else's
        inspect("a"), inspect("b"), inspect("c"), inspect("e"),
        command("MGET", K.lock("a"), K.lock("b"), K.lock("c"), K.lock("d"), K.lock("e")),
    ])


# A cluster node's keys of resource "a"'s hash slot (docs/design.md §11.4): the same
# scripts, on keys with a hash tag (a real standalone server runs them as a cluster's
# master would; the stamp check looks at the marker's name, not the server's mode).
C = K.beside("a")


def in_hash_slot(owner: str, *, run: str = "", write_back_to: int = 0) -> Call:
    """An acquire (or with ``write_back_to``, a write-back) of "a" on a cluster node; ``run``:
    the run its connection identified, passed after the epoch ('' on a first write)."""
    if write_back_to:
        call = Call(0, (owner, write_back_to, SLOT_COUNTER), scripts.WRITE_BACK,
                    (C.lock("a"), C.counter, C.marker))
    else:
        call = Call(0, (owner, TTL, 0, "", TTL, SLOT_COUNTER, ""), scripts.ACQUIRE,
                    (C.lock("a"), C.counter, C.marker, C.line("a"), C.line_deadlines("a"),
                     C.line("a") + "-ttls"))
    [sent] = with_epoch([call], C, 0)
    return with_run((sent,), run)[0] if run else sent


def hash_slot_stamps(c: Contract) -> None:
    """docs/proposals/cluster.md P3.1a: a cluster node's hash slot grants and commits only
    under a marker stamped by the server's run, the one its client's connection identified
    (passed after the epoch) or, not passed, the one INFO gives; a standalone marker's stamp
    is not looked at (other_formats, judging)."""
    c.steps([
        in_hash_slot("alice", run="<run>"),  # no marker: refused
        command("SET", C.marker, "format=1 run_id=<run> initialised"),
        in_hash_slot("alice", run="<run>"),  # the usual case, the run passed: granted
        in_hash_slot("bob"),  # (a first write: INFO) held by alice
        in_hash_slot("alice", run="<run>", write_back_to=5),  # committed
        in_hash_slot("alice", run=FOREIGN),  # a run this server is not: refused
        command("SET", C.marker, f"format=1 run_id={FOREIGN} migrated in"),
        in_hash_slot("alice", run="<run>"),  # another server's stamp: refused, as unmarked
        release("a", "alice"),
        in_hash_slot("bob", run="<run>"),  # free, and still refused
        in_hash_slot("alice", run="<run>"),
        in_hash_slot("carol"),  # also through INFO
        in_hash_slot("alice", run="<run>", write_back_to=9),  # not counted
        # The script trusts the run passed (the transport passes its connection's): the
        # run the stamp names, passed, is accepted.
        in_hash_slot("alice", run=FOREIGN),
    ])


SEQUENCES: list[Callable[[Contract], None]] = [
    waiting_line, lapsed_places, tokens_and_ownership, other_formats, without_a_marker,
    judging, episodes_and_repair, lease_horizons, membership, hand_offs, unheard_hand_offs,
    attempts_of_one_call, hash_slot_stamps]


@pytest.mark.parametrize("sequence", SEQUENCES, ids=lambda s: s.__name__)
def test_written_out_sequences_agree(server: redis.Redis,
                                     sequence: Callable[[Contract], None]) -> None:
    sequence(Contract(server))


def test_plain_commands_agree(server: redis.Redis) -> None:
    """The commands the repair and the node checks send, other than script calls: INFO and
    CONFIG GET (as far as the model knows them), SET NX PX, SCAN (every page) and MGET."""
    c = Contract(server)
    c.model.durable = set() if server.config_get("appendonly")["appendonly"] in (
        "no", b"no") else {0}
    where = server.connection_pool.connection_kwargs
    for protocol in (2, 3):  # a pair, or a map
        c.model.resp3 = protocol == 3
        with redis.Redis(where["host"], where["port"], protocol=protocol) as client:
            client.response_callbacks.clear()
            for setting in ("appendonly", "appendfsync"):
                asked = command("CONFIG", "GET", setting)
                assert c.model.reply(asked) == client.execute_command(*asked.args)
    for section in ("server", "replication"):
        model, real = (str(plain(reply(command("INFO", section))))
                       for reply in (c.model.reply, c.real_reply))
        wanted = ("run_id:",) if section == "server" else ("role:", "second_repl_offset:")
        assert [line for line in model.splitlines() if line.startswith(wanted)] == [
            line for line in real.splitlines() if line.startswith(wanted)]
    c.steps([marker(), claim("g1"), claim("g1"), command("DEL", K.repair_guard),
             claim("g2")])
    c.steps(acquire(f"r{i}", "alice", floor=i) for i in range(30))
    c.steps([command("SET", "app:1", "theirs"),
             command("MGET", K.lock("r3"), "app:1"), command("HGETALL", K.counter)])
    for pattern in ("redlock:*", "*"):
        found: list[set[str]] = []
        for reply in (c.model.reply, c.real_reply):
            keys, cursor = set(), b"0"
            while True:
                page = plain(reply(command("SCAN", cursor, "MATCH", pattern, "COUNT", 7)))
                assert isinstance(page, list)
                keys |= set(page[1])
                cursor = page[0].encode()
                if page[0] == "0":
                    break
            found.append(keys)
        assert found[0] == found[1] and found[0]


# -- random sequences ------------------------------------------------------------------

RESOURCES = st.sampled_from(["a", "a", "a", "b"])
CALLERS = ("alice", "bob", "carol", CALL)  # (the last with attempts of its own)
OWNERS = ("alice", "bob", "carol", FIRST, SECOND)
REPAIRS = st.sampled_from(["g1", "g2"])
PATIENCE = st.sampled_from([0, TTL, TTL])
TTLS = st.sampled_from([TTL, 2 * TTL])
FLOORS = st.sampled_from([0, 2, 10])
RUNS = st.sampled_from(["<run>", FOREIGN, "unknown", "<run>zz"])


@functools.cache
def owners(involved: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Any owner, half the time one that holds a key or waits in a line now."""
    anyone = st.sampled_from(OWNERS)
    return st.one_of(st.sampled_from(involved), anyone) if involved else anyone


Tickets = tuple[tuple[str, str], ...]  # (owner, its ticket or '')


@functools.cache
def lock_calls(tickets: Tickets, owner: str) -> st.SearchStrategy[Call]:
    """The lock scripts on a node that has its marker, mostly, as the protocols send them:
    an owner with a ticket (a blocking acquire) sends it on every attempt, releases after
    a failed attempt keep its place for its patience, and the last release leaves the
    line; an owner without one tries once."""
    ticket = dict(tickets)[owner[:CALL_DIGITS]]  # (every attempt of a call: the same)

    def attempt(r: str, patience: int, floor: int, ttl: int, number: int,
                route: str) -> Call:
        return acquire(r, owner, ticket=ticket, patience=patience, floor=floor, ttl=ttl,
                       attempt=number if ticket else "", route=route if ticket else "")

    def let_go(r: str, over: bool, patience: int, handing: bool) -> Call:
        return release(r, owner, leave=over or not ticket, patience=patience,
                       handing=handing)

    acquires = st.builds(attempt, RESOURCES, PATIENCE, FLOORS, TTLS, st.integers(1, 3),
                         st.sampled_from(["", "0badf00d"]))
    releases = st.builds(let_go, RESOURCES, st.booleans(), PATIENCE,
                         st.sampled_from([True, True, True, False]))
    return st.one_of(
        acquires, acquires, acquires, acquires, releases, releases,
        st.builds(acquire_many, st.lists(RESOURCES, min_size=1, max_size=2, unique=True),
                  st.just(owner), st.none(), TTLS),
        st.builds(write_back, RESOURCES, st.just(owner), st.integers(0, 12)),
        st.builds(extend, RESOURCES, st.just(owner), TTLS),
        st.builds(owned_pttl, RESOURCES, st.just(owner)),
        st.builds(force_release, RESOURCES),
        st.builds(inspect, RESOURCES),
        st.builds(lambda r: command("DEL", K.lock(r)), RESOURCES),  # its key expired
        st.sampled_from([command("DEL", K.marker), marker(), marker(NEWER)]))


@functools.cache
def node_calls(tickets: Tickets, owner: str) -> st.SearchStrategy[Call]:
    """The node identity and repair scripts, among acquires and releases that leave keys
    and counters for them to find."""
    return st.one_of(
        st.builds(acquire, RESOURCES, st.just(owner), floor=FLOORS),
        st.builds(release, RESOURCES, st.just(owner)),
        st.builds(inspect, RESOURCES),
        st.sampled_from([identify(), server_identity(), init_marker(), open_episode(),
                         command("DEL", K.marker),
                         restamp(), restamp(run=FOREIGN), demote(), demote("other"),
                         command("DEL", K.repair_guard), command("DEL", K.episode)]),
        st.builds(marker, st.sampled_from(["format=1 run_id=<run> initialised",
                                           f"format=1 run_id={FOREIGN} initialised",
                                           NEWER])),
        st.builds(episode, st.sampled_from([ANCIENT, FUTURE]), RUNS),
        st.builds(claim, REPAIRS),
        st.builds(seed, REPAIRS, st.dictionaries(RESOURCES, st.integers(0, 12), min_size=1)),
        st.builds(finish, REPAIRS, st.sampled_from([0, 3_600_000])))


TICKETS = st.tuples(*(st.tuples(st.just(o), st.sampled_from(["", "1", "2", "3"]))
                      for o in CALLERS))


def involved(model: ScriptedNodes) -> tuple[str, ...]:
    """The owners that hold a key or wait in a line now, as the model has it."""
    holders = {as_text(v) for k, v in model.data[0].items() if k.endswith(":lock")}
    waiting = {w for key in model.lines[0] for w in model.live_line(0, key)}
    # A reservation (docs/design.md §6.7) names its waiter by id.
    waiting |= {h.removeprefix(RESERVED) for h in holders if h.startswith(RESERVED)}
    return tuple(sorted({h for h in holders if not h.startswith(RESERVED)} | {
        o for o in OWNERS if waiter_id(o) in waiting}))


def play(server: redis.Redis, data: st.DataObject,
         calls: Callable[[Tickets, str], st.SearchStrategy[Call]]) -> None:
    """A marker, then 10 to 40 calls, each by an owner drawn knowing who is involved so
    far. Each owner has a ticket, which ties may share, or none ('': it tries once)."""
    tickets = data.draw(TICKETS, label="tickets")
    contract = Contract(server)
    contract.step(marker())
    for _ in range(data.draw(st.integers(10, 40), label="calls")):
        owner = data.draw(owners(involved(contract.model)))
        contract.step(shown(data.draw(calls(tickets, owner))))


@pytest.mark.parametrize("calls", [lock_calls, node_calls], ids=["lock", "node"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_calls_agree(server: redis.Redis, calls: Callable[[Tickets, str],
                            st.SearchStrategy[Call]], data: st.DataObject) -> None:
    play(server, data, calls)


# -- the contract holds the model to the scripts ---------------------------------------

MUTATIONS = [  # (script, a line of it, that line changed)
    (scripts.EXTEND, "    if epoch > CLIENT_EPOCH or record[4] == '1' then",
     "    if epoch > CLIENT_EPOCH then"),
    (node_scripts.WRITE_MEMBERS, "if epoch >= wanted then", "if epoch > wanted then"),
    (node_scripts.SEED_MEMBER, "if not marker then", "if true then"),
    (node_scripts.SEED_MEMBER, "if marker and not ours(marker) then", "if false then"),
    (scripts.ACQUIRE, "        if floor + 1 > raised then", "        if false then"),
    (scripts.ACQUIRE, "    if floor > counter then\n", "    if false then\n"),
    (scripts.ACQUIRE,
     "if not usual and not queued and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
     "if not usual and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"),
    # The usual case, tried before the rest: a line must take an acquire out of it, and
    # its token respects the floor.
    (scripts.ACQUIRE, "'EXISTS', marker, line, line, record,", "'EXISTS', marker, record,"),
    (scripts.ACQUIRE, "local usual = present == 1", "local usual = present % 2 == 1"),
    (scripts.ACQUIRE, "local queued = present % 4 >= 2", "local queued = false"),
    # ...and a membership record (the usual case runs before the membership check).
    (scripts.ACQUIRE, "local usual = present == 1", "local usual = present % 4 == 1"),
    # A marker of another format (docs/design.md §4.1), outside the usual case.
    (scripts.ACQUIRE, "elseif format ~= 1 then", "elseif false then"),
    (scripts.ACQUIRE, "    return (other and other > 1) and other or -1",
     "    return other or -1"),
    (scripts.ACQUIRE_MANY, "elseif format ~= 1 then", "elseif false then"),
    (scripts.WRITE_BACK, "if node_format(KEYS[3], CLIENT_RUN) ~= 1 then",
     "if node_format(KEYS[3], CLIENT_RUN) == 0 then"),
    (scripts.ACQUIRE, "    local token = math.max(raised, tonumber(ARGV[3]) + 1)",
     "    local token = raised"),
    (scripts.RELEASE, "if holder == ARGV[1] and not queued and ticket == '' then",
     "if holder == ARGV[1] and ticket == '' then"),
    (scripts.RELEASE, "if holder == ARGV[1] and not queued and ticket == '' then",
     "if holder == ARGV[1] and not queued then"),
    (scripts.ACQUIRE, "    wait_in_line(now + tonumber(ARGV[5]))",
     "    wait_in_line(now + 1000 + tonumber(ARGV[5]))"),
    (scripts.ACQUIRE_MANY, "    token = token + 1", "    token = token + 2"),
    (scripts.WRITE_BACK, "if holder ~= ARGV[1] then", "if false then"),
    (scripts.WRITE_BACK, "        redis.call('SET', KEYS[1], ARGV[1], 'PX', pttl)",
     "        redis.call('SET', KEYS[1], ARGV[1])"),
    (scripts.ACQUIRE,
     "        local record = ARGV[2] .. ' ' .. attempt .. ' ' .. ARGV[3]",
     "        local record = ARGV[2] .. ' ' .. attempt .. ' 0'"),
    (scripts.ACQUIRE, "        if route and string.match(route, '^%x%x%x%x%x%x%x%x$') then",
     "        if route then"),
    (scripts.RELEASE, "string.match(record, '^(%d+) (%d+) (%d+) ?(%x*)$')",
     "string.match(record, '^(%d+) (%d+) (%d+)$')"),
    (scripts.ACQUIRE, "    if holder == reservation(me) then", "    if false then"),
    (scripts.ACQUIRE,
     "        return {1, settle(KEYS[2], ARGV[6], tonumber(ARGV[3]), 0)}",
     "        return {1, settle(KEYS[2], ARGV[6], tonumber(ARGV[3]), 1)}"),
    (scripts.RELEASE, "            if deadline and deadline < cut then",
     "            if false then"),
    (scripts.RELEASE, "    if record and node_format(KEYS[7]) == 1 and members[2] ~= '1' then",
     "    if record and node_format(KEYS[7]) == 1 then"),
    (scripts.RELEASE, "    if record and node_format(KEYS[7]) == 1 and members[2] ~= '1' then",
     "    if record and members[2] ~= '1' then"),
    # A waiter nobody hears is not handed the lock (§6.7).
    (scripts.RELEASE, "if type(heard) == 'table' and heard[2] == 0 then",
     "if false then"),
    (scripts.RELEASE, "if type(heard) == 'table' and heard[2] == 0 then",
     "if type(heard) == 'table' and heard[2] <= 1 then"),
    (scripts.RELEASE,
     "if holder == ARGV[1] or (ARGV[2] == '1' and holder and (call_of(holder)",
     "if holder == ARGV[1] or (holder and (call_of(holder)"),
    (scripts.RELEASE, "(call_of(holder) == call_of(ARGV[1])", "(holder == ARGV[1]"),
    # Attempts of one call (§2.1): a late one must not take a later one's key back.
    (scripts.ACQUIRE, "    return held < value and 1 or -1", "    return 1"),
    (scripts.ACQUIRE, "elseif ours == -1 then", "elseif false then"),
    (scripts.ACQUIRE_MANY, "    if holder and kin(holder, ARGV[1]) ~= 1 then",
     "    if holder and holder ~= ARGV[1] then"),
    (scripts.EXTEND, "    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])",
     "    redis.call('PEXPIRE', KEYS[1], ARGV[2])"),
    (scripts.RELEASE, "if ARGV[2] == '1' and queued then", "if ARGV[2] == '0' and queued then"),
    (scripts.RELEASE,
     "            enter_line(KEYS[3], KEYS[4], me, ticket, now + tonumber(ARGV[3]), now, ttls)",
     "            keep_until(KEYS[3], KEYS[4], me, now + tonumber(ARGV[3]), now, ttls)"),
    (scripts.EXTEND, "    redis.call('PEXPIRE', KEYS[1], ARGV[2])",
     "    redis.call('PERSIST', KEYS[1])"),
    (scripts.OWNED_PTTL, "return -2", "return -1"),
    (scripts.FORCE_RELEASE, "return 0", "return 1"),
    (scripts.INSPECT, "highest(KEYS[2], ARGV[1], 0)", "highest(KEYS[2], ARGV[1], 0) + 1"),
    (node_scripts.IDENTIFY, "return {server_run(), redis.call('GET', KEYS[1])}",
     "return {'unknown', redis.call('GET', KEYS[1])}"),
    (node_scripts.SERVER_IDENTITY, "return {server_run(), false}", "return {'unknown', false}"),
    # A cluster node's hash slot stamp (docs/proposals/cluster.md P3.1a): the usual case and
    # node_format.
    (scripts.ACQUIRE,
     "        and string.find(redis.call('GET', marker), ' run_id=' .. run .. ' ', 1, true) ~= nil",
     "        and true"),
    (scripts.ACQUIRE,
     "                and not string.find(value, ' run_id=' .. (run or server_run()) .. ' ',"
     " 1, true) then", "                and false then"),
    (node_scripts.INIT_MARKER, "if redis.call('EXISTS', KEYS[2]) == 1 then",
     "if redis.call('EXISTS', KEYS[2]) == 2 then"),
    (node_scripts.RESTAMP, "if run_id ~= ARGV[3] then", "if false then"),
    (node_scripts.RESTAMP, "if found ~= ARGV[1] or not ours(found) then",
     "if found ~= ARGV[1] then"),
    (node_scripts.DEMOTE, "redis.call('DEL', KEYS[1])", "redis.call('EXISTS', KEYS[1])"),
    (node_scripts.DEMOTE, "if found ~= ARGV[1] or not ours(found) then",
     "if found ~= ARGV[1] then"),
    (node_scripts.OPEN_EPISODE, "    if rid == run_id then", "    if rid then"),
    (node_scripts.OPEN_EPISODE, "        if tonumber(was) <= until_ms then",
     "        if true then"),
    (node_scripts.HORIZON, "local left = redis.call('PTTL', KEYS[3])", "local left = 0"),
    (scripts.EXTEND, "redis.call('SET', HORIZON_KEY, '1', 'PX', ARGV[2])",
     "redis.call('GET', HORIZON_KEY)"),
    (scripts.ACQUIRE_MANY, "redis.call('SET', HORIZON_KEY, '1', 'PX', ARGV[2])",
     "redis.call('GET', HORIZON_KEY)"),
    (scripts.ACQUIRE, "redis.call('SET', horizon, '1', 'PX', ARGV[2])",
     "redis.call('GET', horizon)"),
    (scripts.RELEASE, "redis.call('SET', KEYS[9], '1', 'PX', ttl)", "redis.call('GET', KEYS[9])"),
    (node_scripts.HORIZON, "    if rid == run_id then", "    if rid then"),
    (node_scripts.SEED_COUNTERS, "if seed > current then", "if seed < current then"),
    (node_scripts.FINISH_REPAIR, "if rid ~= run_id or now < tonumber(until_ms) then",
     "if now < tonumber(until_ms) then"),
    (node_scripts.FINISH_REPAIR, "if rid ~= run_id or now < tonumber(until_ms) then",
     "if rid ~= run_id then"),
]


def test_every_script_is_covered_by_a_mutation() -> None:
    every = {v.name for module in (scripts, node_scripts) for v in vars(module).values()
             if isinstance(v, scripts.Script)}
    assert {script.name for script, _, _ in MUTATIONS + CLUSTER_MUTATIONS} == every


@pytest.mark.parametrize(("script", "line", "changed"), MUTATIONS,
                         ids=[f"{s.name}-{i}" for i, (s, _, _) in enumerate(MUTATIONS)])
def test_a_script_changed_without_the_model_breaks_the_contract(
        server: redis.Redis, script: scripts.Script, line: str, changed: str) -> None:
    """The real node runs a copy of ``script`` with one line changed; the model is left
    as is: some written-out sequence must tell them apart."""
    assert_noticed(server, SEQUENCES, script, line, changed)


def assert_noticed(server: redis.Redis, sequences: list[Callable[[Contract], None]],
                   script: scripts.Script, line: str, changed: str) -> None:
    """Some of ``sequences`` fails with ``script``'s ``line`` changed on the server."""
    assert script.source.count(line) >= 1, f"{script.name} no longer has: {line}"
    source = script.source.replace(line, changed, 1)
    failed = []
    for sequence in sequences:
        try:
            sequence(Contract(server, {script.source: source}))
        except (AssertionError, redis.ResponseError):  # (the changed script failed)
            failed.append(sequence.__name__)
    assert failed, f"no sequence noticed {script.name}: {line!r} -> {changed!r}"


# -- the scripts that read a cluster's state, on a one-node Redis Cluster ---------------


@pytest.fixture(scope="module")
def cluster_server() -> Iterator[redis.Redis]:
    """One cluster-mode server serving every hash slot, its configEpoch 7: SEED_EPOCH
    reads ``CLUSTER INFO`` (a standalone server refuses it)."""
    with RedisNodes(1, extra_args=["--cluster-enabled", "yes",
                                   "--cluster-port", str(free_port())]) as nodes, \
            nodes[0].client() as client:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", 7)
        deadline = time.monotonic() + 10.0
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "the one-node cluster did not come up"
            time.sleep(0.05)
        yield client


def seed_epoch(slot: int, repair_id: str) -> Call:
    keys = slot_keys(K.namespace, slot)
    return Call(0, (repair_id,), node_scripts.SEED_EPOCH, (keys.repair_guard, keys.counter))


def epoch_seeding(c: Contract) -> None:
    """A lone cluster node's hash slot re-seeded from its master's epoch (docs/design.md
    §11.4): only with the repair's claim, once per epoch, never below its counter."""
    c.model.epochs[0] = 7
    first, second = (slot_keys(K.namespace, slot) for slot in (1234, 9999))
    c.step(command("SET", first.repair_guard, "r1", "NX", "PX", TTL))
    c.step(seed_epoch(1234, "r0"))  # not the claim's
    assert c.step(seed_epoch(1234, "r1")) == [1, 7, 7 * node_scripts.EPOCH_RANGE]
    assert c.step(seed_epoch(1234, "r1"))[0] == node_scripts.EPOCH_NOT_ABOVE  # same epoch
    # A counter already at the epoch's range: the tokens lost could be above it.
    c.step(command("SET", second.repair_guard, "r2", "NX", "PX", TTL))
    c.step(Call(0, ("r2", SLOT_COUNTER, 7 * node_scripts.EPOCH_RANGE),
                node_scripts.SEED_COUNTERS, (second.repair_guard, second.counter)))
    assert c.step(seed_epoch(9999, "r2"))[0] == node_scripts.EPOCH_OVERFLOW


CLUSTER_SEQUENCES = [epoch_seeding]
CLUSTER_MUTATIONS = [
    (node_scripts.SEED_EPOCH, "if epoch <= recorded or", "if epoch < recorded or"),
    (node_scripts.SEED_EPOCH, "if counter >= floor then", "if counter > floor then"),
    (node_scripts.SEED_EPOCH, "if redis.call('GET', KEYS[1]) ~= ARGV[1] then",
     "if false then"),
]


@pytest.mark.parametrize("sequence", CLUSTER_SEQUENCES, ids=lambda s: s.__name__)
def test_the_cluster_scripts_agree(cluster_server: redis.Redis,
                                   sequence: Callable[[Contract], None]) -> None:
    sequence(Contract(cluster_server))


@pytest.mark.parametrize(("script", "line", "changed"), CLUSTER_MUTATIONS,
                         ids=[f"{s.name}-{i}" for i, (s, _, _) in enumerate(CLUSTER_MUTATIONS)])
def test_a_cluster_script_changed_without_the_model_breaks_the_contract(
        cluster_server: redis.Redis, script: scripts.Script, line: str, changed: str) -> None:
    assert_noticed(cluster_server, CLUSTER_SEQUENCES, script, line, changed)
