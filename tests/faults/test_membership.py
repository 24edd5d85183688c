"""Changing the nodes under load (docs/design.md §13, issue 22 "day two"), on real nodes.

Clients on the old configuration and clients on the new one contend on a few names
during the whole change (and a moment after), holding, writing through a fenced store
(a node of its own) and releasing; the history checker (``redlock.testing.history``)
then finds no overlapping holds, no shared and no backwards token, no accepted write
out of order:

1. growing 3 -> 5: old clients given A, B, C; new clients given A..E;
2. shrinking 5 -> 3: old clients given A..E; new clients given A, B, C.

And the naive way, for contrast: new clients simply pointed at 5 nodes whose two new
ones were given markers by hand (``initialise(force=True)``, or a repair after
``max_ttl``), no change procedure. The split is built deterministically with node
pauses: an old client wins on {A, B} while C hangs, then a new client wins on
{C, D, E} while A and B hang: two holders. The same schedule after the procedure finds
the old client refused. (Under random load the split is rare on local nodes, where both
clients' requests reach the nodes in the same order: a first run of the shrink below
with the new clients started before the change found two holders of token 2 at once,
but ten seconds of naive load do not find one reliably; hence the built schedule.)

max_ttl is 1 s so the change's wait is short; the file runs in well under 2 minutes.
Rerun: ``bash scripts/faults -k membership -s``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fencing import RedisFencedStore
from redlock import LockLost, LockNotAcquired, Redlock
from redlock.admin import Admin, MembersChange
from redlock.testing import RedisNodes
from redlock.testing.history import History, Hold
from tests.faults.conftest import recorded_write
from tests.internals import KEYS

OPTIONS: dict[str, Any] = {"max_ttl": 1.0, "node_timeout": 0.25, "outage_timeout": None}
NAMES = ("m:0", "m:1", "m:2")
TTL = 1.0
AFTER = 0.6  # the clients keep going this long after the change


def contend(history: History, store: RedisFencedStore, name: str, urls: Sequence[str],
            stop: threading.Event, counts: dict[str, int], errors: list[BaseException],
            seed: int) -> None:
    """One client: acquire one of NAMES, write, hold a little, release; until ``stop``."""
    rng = random.Random(seed)
    try:
        with Redlock(urls, **OPTIONS) as dlm:
            while not stop.is_set():
                resource = rng.choice(NAMES)
                lock = dlm.lock(resource, ttl=TTL)
                invoked = time.monotonic()
                try:
                    got = lock.acquire(timeout=0.4)
                except LockNotAcquired:
                    got = False
                counts[f"{name}:attempts"] = counts.get(f"{name}:attempts", 0) + 1
                if not got:
                    continue
                start = time.monotonic()
                token, deadline = lock.token, start + lock.validity
                counts[name] = counts.get(name, 0) + 1
                recorded_write(history, store, name, resource, token)
                time.sleep(rng.uniform(0.0, 0.02))
                end = time.monotonic()
                history.held(Hold(name, resource, token, start, min(end, deadline), invoked))
                with contextlib.suppress(LockLost):
                    lock.release()
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


class JointSeen(logging.Handler):
    """Sets ``seen`` once the change logs that its joint record is on the nodes: the
    moment the operator may start clients with the new list (docs/operations.md)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "redlock.members_joint":
            self.seen.set()


def run_change(nodes: RedisNodes, store: RedisFencedStore, old: Sequence[str],
               new: Sequence[str], change: Callable[[Admin], MembersChange],
               ) -> tuple[History, dict[str, int], MembersChange, float]:
    """Old clients from the start; new clients from the moment the joint record is on
    the nodes (starting them earlier is the naive change: below); the change; both
    kinds go on for AFTER seconds after it."""
    history, counts, errors = History(), {}, []  # type: ignore[var-annotated]
    stop = threading.Event()
    joint = JointSeen()
    watched = logging.getLogger("redlock.nodes")
    level = watched.level
    watched.addHandler(joint)
    watched.setLevel(logging.INFO)

    def new_client(i: int) -> None:
        joint.seen.wait(30)
        contend(history, store, f"new{i}", new, stop, counts, errors, 200 + i)

    threads = [threading.Thread(target=contend, args=(
        history, store, f"old{i}", old, stop, counts, errors, 100 + i)) for i in range(2)]
    threads += [threading.Thread(target=new_client, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)
        with Redlock(nodes.urls, **OPTIONS) as dlm:
            started = time.monotonic()
            report = change(Admin(dlm))
            took = time.monotonic() - started
        time.sleep(AFTER)
    finally:
        stop.set()
        joint.seen.set()
        for thread in threads:
            thread.join(10)
        watched.removeHandler(joint)
        watched.setLevel(level)
    assert not errors, errors
    return history, counts, report, took


def test_grow_three_to_five_under_load(fresh_nodes: Callable[..., RedisNodes],
                                       store: RedisFencedStore) -> None:
    nodes = fresh_nodes(5)
    old, new = nodes.urls[:3], nodes.urls
    with Redlock(old, **OPTIONS) as first, first.lock("m:0", ttl=TTL):
        pass  # an initialised 3-node cluster
    history, counts, report, took = run_change(
        nodes, store, old, new,
        lambda admin: admin.change_members(nodes.urls, current=nodes.urls[:3]))
    assert report.epoch == 2 and len(report.members) == 5 and len(report.seeded) == 2
    print(f"\ngrow 3->5: change took {took:.2f} s; acquisitions {counts}")
    assert counts.get("old0", 0) + counts.get("old1", 0) > 0
    assert counts.get("new0", 0) + counts.get("new1", 0) > 0
    assert history.violations(exclusive=True) == []


def test_shrink_five_to_three_under_load(fresh_nodes: Callable[..., RedisNodes],
                                         store: RedisFencedStore) -> None:
    nodes = fresh_nodes(5)
    old, new = nodes.urls, nodes.urls[:3]
    with Redlock(old, **OPTIONS) as first, first.lock("m:0", ttl=TTL):
        pass  # an initialised 5-node cluster
    history, counts, report, took = run_change(
        nodes, store, old, new, lambda admin: admin.change_members(nodes.urls[:3]))
    assert report.epoch == 2 and len(report.members) == 3 and len(report.retired) == 2
    print(f"\nshrink 5->3: change took {took:.2f} s; acquisitions {counts}")
    assert counts.get("old0", 0) + counts.get("old1", 0) > 0
    assert counts.get("new0", 0) + counts.get("new1", 0) > 0
    assert history.violations(exclusive=True) == []


def split(nodes: RedisNodes, old: Redlock, new: Redlock,
          history: History) -> tuple[bool, bool]:
    """The schedule that splits the naive cluster: the old client takes "x" while C
    hangs (A and B grant; its request to C is lost: deleted once C resumes), then the
    new client tries while A and B hang (C, D, E). The holds are recorded; whether
    each client got the lock."""
    nodes[2].pause()
    try:
        held = old.lock("x", ttl=TTL)
        got_old = held.acquire(timeout=0.5)
        start = time.monotonic()
    finally:
        nodes[2].resume()
    with nodes[2].client() as c:
        time.sleep(0.05)  # C runs the queued request, then loses it
        c.delete(KEYS.lock("x"))
    nodes[0].pause()
    nodes[1].pause()
    try:
        other = new.lock("x", ttl=TTL)
        got_new = other.acquire(timeout=0.3)
        now = time.monotonic()
        time.sleep(0.01)  # both work on "x" (the old holder's validity is not over)
        end = time.monotonic()
        if got_new:
            history.held(Hold("new", "x", other.token, now, end))
        if got_old:
            history.held(Hold("old", "x", held.token, start, min(end, start + held.validity)))
    finally:
        nodes[0].resume()
        nodes[1].resume()
    return got_old, got_new


def test_the_naive_way_lets_two_holders_in_and_the_procedure_does_not(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(5)
    with Redlock(nodes.urls[:3], **OPTIONS) as old, Redlock(nodes.urls, **OPTIONS) as new:
        with old.lock("x", ttl=TTL):
            pass
        # Naive: the new nodes get markers by hand, new clients are given all five.
        Admin(new).initialise(force=True)
        naive = History()
        assert split(nodes, old, new, naive) == (True, True)
        assert naive.violations(exclusive=True), "the naive change must show two holders"
    fresh = fresh_nodes(5)
    with Redlock(fresh.urls[:3], **OPTIONS) as old, Redlock(fresh.urls, **OPTIONS) as new:
        with old.lock("x", ttl=TTL):
            pass
        Admin(new).change_members(new.nodes, current=new.nodes[:3])
        safe = History()
        # The old client is refused on A and B, learns the five members, and cannot win
        # on the three it knows while C hangs; the new client then wins on C, D, E.
        assert split(fresh, old, new, safe) == (False, True)
        assert safe.violations(exclusive=True) == []

