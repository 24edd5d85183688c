"""What the restart scenarios share (tests/faults/test_restarts.py,
test_rolling_restarts.py, test_cluster_failover.py): a Run records acquisitions, holds and
fenced writes into one history (redlock/testing/history.py) and into a scenario's figures;
Load keeps clients acquiring, writing and releasing in threads of their own; Workload does
a read-modify-write under each lock and counts lost updates."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fencing import RedisFencedStore, StaleTokenError
from redlock import (
    ClusterAmnesiaError,
    Lock,
    LockLost,
    LockNotAcquired,
    QuorumUnavailable,
    Redlock,
)
from redlock.testing.history import ACCEPTED, ERROR, REJECTED, History, Hold, Write
from tests.faults.conftest import fenced_write
from tests.faults.fault_figures import Figures, scenario

MAX_TTL = 1.0  # the restart scenarios' TTLs (and max_ttl): nodes rejoin within a test


@dataclass
class Held:
    client: str
    lock: Lock
    token: int
    invoked: float
    acquired: float
    valid_until: float  # the validity the client was told, on time.monotonic()


class Run:
    """One scenario's acquisitions (figures and history), fenced writes and releases."""

    def __init__(self, figures: Figures, store: RedisFencedStore) -> None:
        self.figures = figures
        self.store = store
        self.history = History()
        self.last_failure: BaseException | None = None
        self.outages = 0  # failures for want of a quorum of (judged) nodes, not contention
        self._mutex = threading.Lock()

    def _count(self, field: str) -> None:
        with self._mutex:
            setattr(self.figures, field, getattr(self.figures, field) + 1)

    def acquire(self, dlm: Redlock, client: str, resource: str, *, ttl: float = MAX_TTL,
                blocking: bool = True, timeout: float = 5.0) -> Held | None:
        """One acquire; None when it failed cleanly (its error in ``last_failure``)."""
        self._count("attempted")
        lock = dlm.lock(resource, ttl=ttl)
        invoked = time.monotonic()
        try:
            got = lock.acquire(blocking=blocking, timeout=timeout if blocking else None)
            failure: BaseException | None = lock.last_failure
        except (LockNotAcquired, ClusterAmnesiaError) as exc:
            got, failure = False, exc
        acquired = time.monotonic()
        if not got:
            self._count("failed_cleanly")
            if isinstance(failure, QuorumUnavailable):
                with self._mutex:
                    self.outages += 1
            self.last_failure = failure
            return None
        self._count("succeeded")
        # Measured now, so a little before the real end: conservative for the overlaps.
        return Held(client, lock, lock.token, invoked, acquired, acquired + lock.validity)

    def write(self, held: Held) -> None:
        resource = held.lock.resource
        invoked = time.monotonic()
        outcome = fenced_write(self.store, held.client, resource, held.token)
        self.history.wrote(Write(held.client, resource, held.token, invoked,
                                 time.monotonic(), outcome))

    def release(self, held: Held) -> None:
        released = time.monotonic()
        # LockLost: its validity ran out; the hold ended there (recorded below).
        with contextlib.suppress(LockLost):
            held.lock.release()
        self.history.held(Hold(held.client, held.lock.resource, held.token, held.acquired,
                               min(released, held.valid_until), held.invoked))

    def cycle(self, dlm: Redlock, client: str, resource: str, **options: Any) -> int | None:
        """Acquire, write to the fenced store, release; the token, or None."""
        held = self.acquire(dlm, client, resource, **options)
        if held is None:
            return None
        try:
            self.write(held)
        finally:
            self.release(held)
        return held.token

    def until_acquired(self, dlm: Redlock, client: str, resource: str, *,
                       within: float) -> int | None:
        """Non-blocking cycles, 50 ms apart, until one succeeds or ``within`` seconds
        passed; its token, or None. (Each call lets the manager start its background
        maintenance when it ends; a blocking acquire would not, see
        test_blocking_acquire_gets_a_restarted_durable_node_judged.)"""
        deadline = time.monotonic() + within
        while True:
            token = self.cycle(dlm, client, resource, blocking=False)
            if token is not None or time.monotonic() > deadline:
                return token
            time.sleep(0.05)

    def violations(self) -> list[str]:
        """The checker's findings (nodes are paused and restarted here, never clients or
        clocks: holds must not overlap either), counted into the figures."""
        problems = self.history.violations(exclusive=True)
        self.figures.violations = len(problems)
        self.figures.extra.update(writes_accepted=self.history.count(ACCEPTED),
                                  writes_rejected=self.history.count(REJECTED),
                                  writes_error=self.history.count(ERROR))
        return problems


@contextmanager
def recorded(name: str, store: RedisFencedStore) -> Iterator[tuple[Figures, Run]]:
    """``scenario(name)``'s figures and a Run recording into them. When the block ends
    the history checker's findings are counted into the figures (also when the block
    failed: its figures are emitted then too) and, if the block passed, there must be
    none."""
    with scenario(name) as figures:
        run = Run(figures, store)
        try:
            yield figures, run
        finally:
            problems = run.violations()
        assert not problems, problems


class Load:
    """Clients that keep acquiring, writing and releasing (one thread each) until the
    block ends; a crash of a thread fails the test. ``blocking=False``: one attempt at a
    time, 10 ms apart, each a request of its own."""

    def __init__(self, run: Run, clients: Sequence[tuple[str, Redlock]],
                 resources: Sequence[str], *, timeout: float = 3.0,
                 blocking: bool = True) -> None:
        self.run = run
        self.clients = list(clients)
        self.resources = list(resources)
        self.timeout = timeout
        self.blocking = blocking
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._loop, args=(name, dlm), daemon=True)
                        for name, dlm in self.clients]

    def _loop(self, name: str, dlm: Redlock) -> None:
        try:
            turn = 0
            while not self.stop.is_set():
                resource = self.resources[turn % len(self.resources)]
                self.run.cycle(dlm, name, resource, timeout=self.timeout,
                               blocking=self.blocking)
                turn += 1
                self.stop.wait(0.01)
        except BaseException as exc:  # surfaced in the test thread
            self.errors.append(exc)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.timeout + 30)
        assert not any(thread.is_alive() for thread in self.threads), "a client thread hung"
        assert not self.errors, self.errors


class Workload:
    """``threads`` clients, each its own manager over the nodes at ``urls`` (default
    settings, but for ``options``), locking ``names`` names in turn (TTL ``ttl``) and
    incrementing the name's value in the fenced store under the lock (read, then a
    fenced write of value + 1). Records acquisitions, holds and writes (``run``), the
    times of the successful acquires, and the failures by type."""

    def __init__(self, urls: Sequence[str], run: Run, store: RedisFencedStore,
                 prefix: str, *, threads: int = 4, names: int = 8, ttl: float = 5.0,
                 **options: Any) -> None:
        self.run = run
        self.store = store
        self.ttl = ttl
        self.names = [f"{prefix}:{i}" for i in range(names)]
        self.managers = [Redlock(list(urls), **options) for _ in range(threads)]
        self.successes: list[float] = []
        self.increments = 0
        # Every accepted increment: (resource, token, value read, time written), so a lost
        # update can be shown where it happened.
        self.accepted: list[tuple[str, int, int, float]] = []
        self.failures: dict[str, int] = {}
        self.examples: dict[str, str] = {}
        self.errors: list[BaseException] = []
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                         for i in range(threads)]

    def _failed(self, exc: BaseException) -> None:
        name = type(exc).__name__
        with self._mutex:
            self.failures[name] = self.failures.get(name, 0) + 1
            self.examples.setdefault(name, str(exc)[:300])

    def _loop(self, index: int) -> None:
        client, dlm, turn = f"c{index}", self.managers[index], index
        try:
            while not self._stop.is_set():
                resource = self.names[turn % len(self.names)]
                turn += 1
                try:
                    held = self.run.acquire(dlm, client, resource, ttl=self.ttl, timeout=3.0)
                except ClusterAmnesiaError as exc:  # (counted by run.acquire too)
                    self._failed(exc)
                    continue
                if held is None:
                    if self.run.last_failure is not None:
                        self._failed(self.run.last_failure)
                    self._stop.wait(0.01)
                    continue
                with self._mutex:
                    self.successes.append(held.acquired)
                try:
                    self._increment(client, resource, held.token)
                finally:
                    self.run.release(held)
        except BaseException as exc:
            self.errors.append(exc)

    def _increment(self, client: str, resource: str, token: int) -> None:
        """Read-modify-write under the lock: the fence first (a stale holder can no
        longer slip a write in between, docs/design.md §7), then value + 1."""
        invoked = time.monotonic()
        try:
            current = self.store.fence(resource, token)
            value = int(current or b"0") + 1
            self.store.write(resource, token, str(value).encode())
            outcome = ACCEPTED
        except StaleTokenError:
            outcome = REJECTED
        except Exception:  # the store's own node did not answer
            outcome = ERROR
        if outcome == ACCEPTED:
            with self._mutex:
                self.increments += 1
                self.accepted.append((resource, token, value - 1, time.monotonic()))
        self.run.history.wrote(Write(client, resource, token, invoked, time.monotonic(),
                                     outcome))

    def __enter__(self) -> Workload:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        for dlm in self.managers:
            dlm.close()
        assert not any(t.is_alive() for t in self._threads), "a client thread hung"
        assert not self.errors, self.errors

    def longest_gap(self, since: float, until: float) -> float:
        """The longest stretch in [since, until] without a successful acquire."""
        times = sorted(t for t in self.successes if since <= t <= until)
        points = [since, *times, until]
        return max(b - a for a, b in itertools.pairwise(points))

    def lost_updates(self) -> int:
        total = sum(int(self.store.read(name) or b"0") for name in self.names)
        return self.increments - total

    def where_lost(self) -> list[str]:
        """Accepted increments that read the value another accepted increment read (by
        token order per resource): the lost updates, with their tokens."""
        found = []
        for name in self.names:
            mine = sorted((t, v, at) for r, t, v, at in self.accepted if r == name)
            for (t1, v1, at1), (t2, v2, at2) in itertools.pairwise(mine):
                if v2 != v1 + 1:
                    found.append(f"{name}: token {t1} read {v1} at {at1:.3f}, token {t2}"
                                 f" read {v2} at {at2:.3f}")
        return found[:5]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition`` until true; the seconds it took. Fails after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - started


