"""``close()`` while the application's threads (tasks) still hold and take locks.

An application shutting down closes its manager while worker threads are still busy:
some hold auto-extended locks, others keep acquiring and releasing. After ``close()``
returns the manager must be really closed:

- none of its threads (``redlock-*``) or asyncio tasks is still running (a renewal
  loop that outlives ``close()`` keeps a closed manager's locks "alive" in memory and
  keeps the process from being clean at exit);
- nothing more reaches the nodes (seen with ``MONITOR``, and by the lock keys' PTTL
  falling instead of being refreshed), and its connections to them are closed (as
  ``close()`` promises; read from ``/proc``);
- the auto-extended locks it held are no longer believed held by their holders
  (``check()`` raises ``LockLost``, or ``locked()`` is False): nobody renews them any
  more, so a holder that went on trusting them would work unprotected once they expire.

Real redis-server nodes (``redlock.testing.RedisNodes``); only the public API.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field

import redis

import redlock
from redlock import AsyncLock, AsyncRedlock, Lock, LockLost, Redlock, RedlockError
from redlock.testing import RedisNodes
from tests.apps.proc_support import Command, Monitor, tcp_connections, wait_until

HOLDERS = 4  # threads (tasks) holding an auto-extended lock each, and churning
HELD_TTL = 3.0  # renewed every ~1 s; at close() about 2 s of validity are left
GRACE = 0.05  # s after close() returned: a command logged later was sent after it
REDLOCK_DIR = os.path.dirname(redlock.__file__)


@dataclass
class HolderReport:
    """What one worker saw: its held lock right after close(), and its churn."""

    name: str
    held_key: str
    churned: int = 0
    churn_errors: list[str] = field(default_factory=list)
    believed_held: bool | None = None  # locked() right after close()
    check: str = "not run"  # "ok" (still believed valid), "LockLost", or another error
    release: str = "not run"

    def note_belief(self, held: Lock | AsyncLock) -> None:
        """What the holder believes about its lock now (right after close())."""
        self.believed_held = held.locked()
        try:
            held.check()
            self.check = "ok"
        except LockLost:
            self.check = "LockLost"
        except Exception as error:  # reported, not hidden
            self.check = f"{type(error).__name__}: {error}"


def _held_key(resource: str) -> str:
    return f"redlock:{{{resource}}}:lock"


def _renewals_of(commands: list[Command], key: str) -> list[Command]:
    """Renewals of ``key`` as the node ran them (EXTEND's PEXPIRE inside the script)."""
    return [c for c in commands if c.client == "lua" and c.name == "PEXPIRE" and c.args[1] == key]


def _after_a_renewal_round(monitor: Monitor, probe: redis.Redis, keys: list[str]) -> None:
    """Return just after every held key that node 0 holds was renewed once (seen there),
    so that ``close()`` comes between two renewal rounds (the next is ~1 s away): the
    test then sees what close() does, not what an interrupted round happens to do. (A
    lock is held on a quorum: node 0 may not have a key, when the attempt was decided by
    the other two while its connection to node 0 was still opening; its renewals then
    find nothing there to renew. They go out together, so the others' show the round.)"""
    on_node0 = [key for key in keys if probe.exists(key)]
    assert on_node0, "node 0 holds none of the held locks"
    renewed = wait_until(lambda: all(_renewals_of(list(monitor.commands), key)
                                     for key in on_node0), 5.0)
    assert renewed, "the held locks were not renewed within 5 s"
    time.sleep(0.2)  # the round's replies from the other nodes are in


def _probe_address(client: redis.Redis) -> str:
    return str(client.client_info()["addr"])


def _after_close(monitor: Monitor, closed_at: float, own: set[str]) -> list[Command]:
    """Commands the node ran after ``close()`` returned, other than the test's own."""
    return [c for c in list(monitor.commands)
            if c.at > closed_at + GRACE and c.client not in own]


def _open_to(nodes: RedisNodes, own: set[str]) -> list[tuple[str, str]]:
    """This process's connections to the nodes, but the test's own (probe, MONITOR)."""
    return [c for c in tcp_connections(node.port for node in nodes) if c[0] not in own]


def _pttl_checks(probe: redis.Redis, keys: list[str]
                 ) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """PTTL of each held key on node 0 now and 1.3 s later (more than one renewal
    interval): without renewals it must have fallen by about that much, or the key expired
    meanwhile (-2: a renewal would have set it to the TTL again)."""
    problems: list[str] = []
    seen: dict[str, tuple[int, int]] = {}
    first = {key: int(probe.pttl(key)) for key in keys}
    time.sleep(1.3)
    second = {key: int(probe.pttl(key)) for key in keys}
    for key in keys:
        seen[key] = (first[key], second[key])
        if first[key] > 0 and second[key] != -2 and second[key] > first[key] - 1000:
            problems.append(f"{key}: PTTL {first[key]} ms right after close(), {second[key]} ms "
                            "1.3 s later: it was refreshed after close()")
    return problems, seen


def _after_close_problems(survivors: list[str], sockets: list[tuple[str, str]],
                         monitor: Monitor, closed_at: float, own: set[str],
                         pttl_problems: list[str], reports: list[HolderReport],
                         hung: list[str], workers: str) -> list[str]:
    """What both clients' close() tests check once close() has returned."""
    problems = []
    if survivors:
        problems.append(f"threads alive after close() returned: {survivors}")
    if sockets:
        problems.append(f"{len(sockets)} connections to the nodes still open after close() "
                        f"returned (local, node): {sockets[:6]}")
    late = _after_close(monitor, closed_at, own)
    if late:
        shown = [" ".join(c.args[:4]) for c in late[:5]]
        problems.append(f"{len(late)} command(s) reached node 0 after close() returned "
                        f"(first: {shown})")
    problems += pttl_problems
    believed = [f"{r.name}: check()={r.check}, locked()={r.believed_held}" for r in reports
                if r.check == "ok" or r.believed_held]
    if believed:
        problems.append(f"{len(believed)} of {HOLDERS} holders still believe they hold their "
                        f"auto-extended lock after close(): {believed}")
    if hung:
        problems.append(f"worker {workers} still running 15 s after close(): {hung}")
    return problems


def test_sync_close_while_threads_hold_and_churn() -> None:
    """Four threads each hold an auto-extended lock (ttl 3 s) and keep acquiring and
    releasing two contended resources; the main thread calls ``dlm.close()``. Proves
    that after ``close()`` returns no ``redlock-*`` thread is alive, no connection to a
    node is left open, no command reaches node 0 (MONITOR), the held keys' PTTL falls
    (no renewal), every holder sees its lock as not held any more (``check()`` raises
    ``LockLost`` or ``locked()`` is False), and every worker thread finishes promptly."""
    problems: list[str] = []
    with RedisNodes(3) as nodes, Monitor(nodes[0].host, nodes[0].port) as monitor, \
            nodes[0].client() as own_probe:
        own = {_probe_address(own_probe)}
        dlm = Redlock(nodes.urls)
        with dlm.lock("close:warmup", ttl=2.0, timeout=5.0):  # the new cluster is set up
            pass  # before the threads race (see tests/apps/test_proc_startup.py)
        ready = threading.Barrier(HOLDERS + 1, timeout=20.0)
        closed = threading.Event()
        reports = [HolderReport(f"app-holder-{i}", _held_key(f"close:held:{i}"))
                   for i in range(HOLDERS)]

        def worker(index: int) -> None:
            report = reports[index]
            held = dlm.lock(f"close:held:{index}", ttl=HELD_TTL, auto_extend=True)
            if not held.acquire(timeout=10.0):
                report.check = "never acquired"
                ready.abort()
                return
            ready.wait()
            while not closed.is_set():
                try:
                    with dlm.lock(f"close:churn:{index % 2}", ttl=1.0, timeout=1.0):
                        report.churned += 1
                except RedlockError as error:
                    if not closed.is_set():
                        report.churn_errors.append(type(error).__name__)
            # close() has returned: what does this holder now believe about its lock?
            report.note_belief(held)
            try:
                held.release()
                report.release = "ok"
            except Exception as error:
                report.release = type(error).__name__

        threads = [threading.Thread(target=worker, args=(i,), name=reports[i].name,
                                    daemon=True) for i in range(HOLDERS)]
        try:
            for thread in threads:
                thread.start()
            ready.wait()
            _after_a_renewal_round(monitor, own_probe, [r.held_key for r in reports])
            started = time.time()
            dlm.close()
            closed_at = time.time()
            survivors = sorted(t.name for t in threading.enumerate()
                               if t.name.startswith("redlock"))
            sockets = _open_to(nodes, own | {monitor.local_address})
            closed.set()
            pttl_problems, pttls = _pttl_checks(own_probe, [r.held_key for r in reports])
        finally:
            closed.set()
            for thread in threads:
                thread.join(15.0)
            # A failure before close() must not leave the manager's threads to the next
            # tests (its listener stops only after 30 s without waits); a second close()
            # does nothing.
            dlm.close()
        hung = [t.name for t in threads if t.is_alive()]

    problems += _after_close_problems(survivors, sockets, monitor, closed_at, own,
                                      pttl_problems, reports, hung, "threads")
    assert not problems, (f"close() took {closed_at - started:.3f} s; PTTLs (ms, now and 1.3 s "
                          f"later): {pttls}\n" + "\n".join(problems))


async def test_async_close_while_tasks_hold_and_churn() -> None:
    """The asyncio twin: four tasks each hold an auto-extended lock and keep acquiring
    and releasing; ``await dlm.close()``. Proves that afterwards no library task (named
    ``redlock*``, or running the library's code) is left on the loop, no
    ``redlock-*`` thread is alive, no connection to a node is left open, no command
    reaches node 0, the held keys' PTTL falls,
    and every holder sees its lock as not held any more."""
    problems: list[str] = []
    with RedisNodes(3) as nodes, Monitor(nodes[0].host, nodes[0].port) as monitor, \
            nodes[0].client() as own_probe:
        own = {_probe_address(own_probe)}
        dlm = AsyncRedlock(nodes.urls)
        async with dlm.lock("aclose:warmup", ttl=2.0, timeout=5.0):
            pass
        closed = asyncio.Event()
        reports = [HolderReport(f"app-holder-{i}", _held_key(f"aclose:held:{i}"))
                   for i in range(HOLDERS)]
        acquired = 0
        all_acquired = asyncio.Event()

        async def worker(index: int) -> None:
            nonlocal acquired
            report = reports[index]
            held = dlm.lock(f"aclose:held:{index}", ttl=HELD_TTL, auto_extend=True)
            if not await held.acquire(timeout=10.0):
                report.check = "never acquired"
                return
            acquired += 1
            if acquired == HOLDERS:
                all_acquired.set()
            while not closed.is_set():
                try:
                    async with dlm.lock(f"aclose:churn:{index % 2}", ttl=1.0, timeout=1.0):
                        report.churned += 1
                        await asyncio.sleep(0)
                except RedlockError as error:
                    if not closed.is_set():
                        report.churn_errors.append(type(error).__name__)
            report.note_belief(held)
            try:
                await held.release()
                report.release = "ok"
            except Exception as error:
                report.release = type(error).__name__

        tasks = [asyncio.create_task(worker(i), name=reports[i].name) for i in range(HOLDERS)]
        leftover_tasks: list[asyncio.Task[object]] = []
        try:
            await asyncio.wait_for(all_acquired.wait(), 20.0)
            await asyncio.to_thread(_after_a_renewal_round, monitor, own_probe,
                                    [r.held_key for r in reports])
            started = time.time()
            await dlm.close()
            closed_at = time.time()
            me = asyncio.current_task()
            leftover_tasks = [
                t for t in asyncio.all_tasks() if t is not me and t not in tasks and (
                    t.get_name().startswith("redlock")
                    or getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "")
                    .startswith(REDLOCK_DIR))]
            leftover = sorted(f"{t.get_name()} ({t.get_coro()!r})" for t in leftover_tasks
                              if not t.done())
            survivors = sorted(t.name for t in threading.enumerate()
                               if t.name.startswith("redlock"))
            sockets = _open_to(nodes, own | {monitor.local_address})
            closed.set()
            pttl_problems, pttls = await asyncio.to_thread(
                _pttl_checks, own_probe, [r.held_key for r in reports])
        finally:
            closed.set()
            _, pending = await asyncio.wait(tasks, timeout=15.0)
            for task in [*pending, *leftover_tasks]:  # leave the loop clean either way
                task.cancel()
            await asyncio.gather(*pending, *leftover_tasks, return_exceptions=True)
            await dlm.close()  # (after a failure before close(); else it does nothing)
        hung = sorted(t.get_name() for t in pending)

    if leftover:
        problems.append(f"library tasks still running after close() returned: {leftover}")
    problems += _after_close_problems(survivors, sockets, monitor, closed_at, own,
                                      pttl_problems, reports, hung, "tasks")
    assert not problems, (f"close() took {closed_at - started:.3f} s; PTTLs (ms, now and 1.3 s "
                          f"later): {pttls}\n" + "\n".join(problems))
