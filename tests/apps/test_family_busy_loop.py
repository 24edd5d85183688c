"""The lock family (docs/design.md §12) in an asyncio application whose event loop also
does CPU work, as ``test_busy_loop.py`` does it for the mutex.

A coroutine blocks the loop 3 ms at a time while tasks take permits of a semaphore,
read and write a read-write lock, and campaign in an election, all on ``AsyncRedlock``'s
default settings over real redis-server nodes, with renewals on (each hold lasts longer
than the TTL, so it only survives if the renewals get through a late loop). The nodes
are healthy: nothing may be lost, refused or overlap because the loop answers late.
Every hold goes into a history (redlock.testing.history) that checks the kind's rule.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from redlock import AsyncRedlock
from redlock.testing import RedisNodes
from redlock.testing.history import History, Hold
from tests.apps.support import BusyLoop, Tally, nothing_left, within

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TTL = 1.0  # every hold below lasts longer: it needs its renewals
WAIT = 30.0  # any one acquire, at most (a line of holds of about a second each)


async def _on_a_busy_loop(nodes: RedisNodes,
                          work: Callable[[AsyncRedlock], list[Awaitable[None]]],
                          seconds: float, tally: Tally, what: str) -> tuple[int, list[str]]:
    """Run ``work(dlm)`` on a fresh ``AsyncRedlock`` (after one lock cycle, as an
    application's first request: the nodes are flushed before each test and the first
    acquire of an empty cluster initialises it) while the loop is kept busy, within
    ``seconds``; close the manager. How many times the loop was blocked, and what of
    the library is still running after the close."""
    baseline = asyncio.all_tasks()
    async with AsyncRedlock(nodes.urls) as dlm:
        async with dlm.lock("family:busy:warm-up", timeout=10.0):
            pass
        async with BusyLoop() as busy:
            await within(seconds, asyncio.gather(*work(dlm)), tally, what)
    return busy.blocks, await nothing_left(baseline)


def _problems(tally: Tally, expected: int, told_lost: list[str], left: list[str]) -> list[str]:
    problems = []
    if tally.counts["ok"] != expected:
        problems.append(f"only {tally.counts['ok']}/{expected} holds ended well: {tally}")
    if told_lost:
        problems.append(f"on_lost called {len(told_lost)} times: {told_lost[:3]}")
    if left:
        problems.append(f"left running after close: {left}")
    return problems


async def test_semaphore_permits_renewed_through_a_busy_loop(nodes3: RedisNodes) -> None:
    """9 tasks x 2 holds of 1.3 s on a semaphore of 3 permits (TTL 1 s, renewed): never
    more than 3 held, one holder per slot with rising tokens, all 3 used at once, no
    permit lost, no acquire refused."""
    permits, tasks, rounds, hold = 3, 9, 2, 1.3
    history, tally, told_lost = History(), Tally(), []

    async def on_lost(handle: Any) -> None:
        told_lost.append(str(handle))

    async def worker(dlm: AsyncRedlock, index: int) -> None:
        for _ in range(rounds):
            where = "acquire"
            try:
                permit = dlm.semaphore("family:busy:sem", permits=permits, ttl=TTL,
                                       auto_extend=True, on_lost=on_lost)
                invoked = time.monotonic()
                if not await permit.acquire(timeout=WAIT):
                    raise TimeoutError(f"no permit within {WAIT} s")
                where = "hold"
                start, slot_name, token = time.monotonic(), permit.slot_name, permit.token
                await asyncio.sleep(hold)
                permit.check()  # LockLost if the renewals did not keep it
                end = time.monotonic()
                where = "release"
                await permit.release()
                history.held(Hold(f"t{index}", slot_name, token, start, end, invoked))
                tally.ok()
            except Exception as exc:
                tally.failed(exc, where)

    blocks, left = await _on_a_busy_loop(
        nodes3, lambda dlm: [worker(dlm, i) for i in range(tasks)], 60.0, tally,
        "the semaphore's holds")

    problems = _problems(tally, tasks * rounds, told_lost, left)
    most = history.most_at_once("family:busy:sem:permit:")
    if most > permits:
        problems.append(f"{most} permits held at once, of {permits}")
    if most < permits:
        problems.append(f"never all {permits} permits at once (at most {most})")
    problems += [str(v) for v in history.violations(exclusive=True)]
    assert not problems, "\n".join(problems) + f"\n{blocks} loop blocks; {tally}"


async def test_rwlock_readers_and_writers_renewed_through_a_busy_loop(
        nodes3: RedisNodes) -> None:
    """6 readers (holds of 1.2 s) and 2 writers (1.1 s) for about 6 s, TTL 1 s renewed:
    no writer overlaps anyone, readers share, write tokens rise, each read's token lies
    between its writes, nothing lost."""
    history, tally, told_lost = History(), Tally(), []
    stop = time.monotonic() + 6.0

    async def on_lost(handle: Any) -> None:
        told_lost.append(str(handle))

    async def worker(rw: Any, name: str, mode: str, hold: float, rest: float) -> None:
        while time.monotonic() < stop:
            where = "acquire"
            try:
                handle = (rw.read(auto_extend=True, on_lost=on_lost) if mode == "r"
                          else rw.write(auto_extend=True, on_lost=on_lost))
                invoked = time.monotonic()
                if not await handle.acquire(timeout=WAIT):
                    raise TimeoutError(f"{name}: not granted within {WAIT} s")
                where = "hold"
                start, token = time.monotonic(), handle.token
                await asyncio.sleep(hold)
                handle.check()
                end = time.monotonic()
                where = "release"
                await handle.release()
                history.held(Hold(name, "family:busy:doc", token, start, end, invoked,
                                  mode=mode))
                tally.ok()
            except Exception as exc:
                tally.failed(exc, where)
                return
            await asyncio.sleep(rest)

    def workers(dlm: AsyncRedlock) -> list[Awaitable[None]]:
        rw = dlm.rwlock("family:busy:doc", ttl=TTL)
        return ([worker(rw, f"r{i}", "r", 1.2, 0.05) for i in range(6)]
                + [worker(rw, f"w{i}", "w", 1.1, 0.05) for i in range(2)])

    blocks, left = await _on_a_busy_loop(nodes3, workers, 90.0, tally,
                                         "the read-write lock's holds")

    reads = [h for h in history.holds if h.mode == "r"]
    writes = sorted((h for h in history.holds if h.mode == "w"), key=lambda h: h.start)
    failed = sum(n for name, n in tally.counts.items() if name != "ok")
    problems = _problems(tally, tally.counts["ok"] + failed, told_lost, left)
    if failed or len(history.holds) < 8:
        problems.append(f"{failed} holds failed, {len(history.holds)} ended well: {tally}")
    problems += [str(v) for v in history.rw_violations("family:busy:doc")]
    readers = History()
    for hold in reads:
        readers.held(hold)
    if readers.most_at_once() < 2:
        problems.append("readers never shared the lock")
    for i in range(2):
        if sum(1 for h in writes if h.client == f"w{i}") < 1:
            problems.append(f"writer w{i} never wrote")
    tokens = [h.token for h in writes]
    if tokens != sorted(set(tokens)):
        problems.append(f"write tokens do not rise: {tokens}")
    assert not problems, ("\n".join(problems) + f"\n{len(reads)} reads, {len(writes)} writes;"
                          f" {blocks} loop blocks; {tally}")


async def test_election_leaders_renewed_through_a_busy_loop(nodes3: RedisNodes) -> None:
    """3 candidates, each leads twice for 1.5 s (TTL 1 s, renewed by the campaign): one
    leader at a time, terms rise, ``leader()`` names the one leading, nothing lost."""
    history, tally, told_lost = History(), Tally(), []
    misnamed: list[str] = []

    async def on_lost(handle: Any) -> None:
        told_lost.append(str(handle))

    async def candidate(dlm: AsyncRedlock, name: str) -> None:
        election = dlm.election("family:busy:leader", ttl=TTL, identity=name)
        for _ in range(2):
            where = "campaign"
            try:
                invoked = time.monotonic()
                async with election.campaign(timeout=WAIT, on_lost=on_lost) as leading:
                    where = "lead"
                    start, term = time.monotonic(), leading.token
                    await asyncio.sleep(0.7)
                    seen = await election.leader()
                    if seen is None or seen.identity != name or seen.token != term:
                        misnamed.append(f"{name} leads term {term}, leader() says {seen}")
                    await asyncio.sleep(0.8)
                    leading.check()
                    end = time.monotonic()
                    where = "resign"
                history.held(Hold(name, "family:busy:leader", term, start, end, invoked))
                tally.ok()
            except Exception as exc:
                tally.failed(exc, where)

    blocks, left = await _on_a_busy_loop(
        nodes3, lambda dlm: [candidate(dlm, f"c{i}") for i in range(3)], 60.0, tally,
        "the election's terms")

    problems = _problems(tally, 6, told_lost, left) + misnamed
    problems += [str(v) for v in history.violations(exclusive=True)]
    assert not problems, "\n".join(problems) + f"\n{blocks} loop blocks; {tally}"
