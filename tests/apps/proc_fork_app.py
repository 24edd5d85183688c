"""An application that uses its lock manager, then forks workers that use it too.

    python proc_fork_app.py MODE OUTDIR URL [URL ...]

MODE is ``os-fork`` (``os.fork()`` inside the parent's ``with`` block: each child
leaves that block, as forked code does), ``mp-fork`` (``multiprocessing`` with the
fork start method) or ``asyncio`` (an ``AsyncRedlock`` used under the parent's
``asyncio.run``, children forked by ``multiprocessing`` from inside it, each running its
own ``asyncio.run``).

The parent makes one manager over the nodes and uses it: an acquire/release, then
three threads (tasks) that keep taking a contended resource (so its renewal loop,
release listener and pools are all busy), and an auto-extended lock of its own
(``app:parent``) held through the whole run. While all that runs it forks
:data:`CHILDREN` children, :data:`ROUNDS` rounds apart. Each child, with the inherited
manager, acquires an auto-extended lock (ttl 2 s, ``timeout=30``), holds it 2.5 s while
checking it, and releases it; the first two children of each round contend on
``app:shared:a`` / ``app:shared:b`` (so they need release wake-ups), the others take a
resource of their own.

Each child writes ``OUTDIR/child-<i>.json`` (what it saw, times on CLOCK_MONOTONIC,
which all processes share) and ``OUTDIR/child-<i>.exit.json`` once it left the parent's
block (os-fork only). Before the contended hold each child also takes
``app:handoff`` briefly twice (all 24 contend: hand-offs on release). A child that stays
in one phase longer than that phase's own bound (``timeout=30`` for an acquire) plus
:data:`STUCK_GRACE` is hung: its stacks are dumped, it is killed and reported. The
parent prints one JSON report on stdout (``report {...}``).
"""

from __future__ import annotations

import asyncio
import faulthandler
import inspect
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from redlock import AsyncLock, AsyncRedlock, Lock, LockLost, Redlock, RedlockError

ROUNDS = 4
PER_ROUND = 6
CHILDREN = ROUNDS * PER_ROUND
ROUND_GAP = 0.3  # s between rounds of forks
CHILD_TTL = 2.0  # a child's first auto-extended lock waits for its renewer to start (§5.2)
CHILD_HOLD = 2.5
CHILD_TIMEOUT = 30.0
STUCK_GRACE = 10.0  # s past a call's own bound (timeout=30, or none): the child is hung
HANDOFF_RESOURCE = "app:handoff"  # every child takes it HANDOFF_ROUNDS times, briefly
HANDOFF_ROUNDS = 2
HANDOFF_HOLD = 0.05
PARENT_RESOURCE = "app:parent"
PARENT_TTL = 3.0  # renewed about once a second
BUSY_THREADS = 3


def child_resource(index: int) -> str:
    slot = index % PER_ROUND
    if slot == 0:
        return "app:shared:a"
    if slot == 1:
        return "app:shared:b"
    return f"app:own:{index}"


def write_json(path: Path, value: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value))
    os.replace(temporary, path)


def dump_stacks_on_sigusr1(index: int, outdir: Path) -> None:
    """A hung child's threads are dumped to ``child-<i>.stack`` before it is killed."""
    stream = open(outdir / f"child-{index}.stack", "w")  # noqa: SIM115 (open until exit)
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)


def new_record(index: int) -> dict[str, Any]:
    now = time.monotonic()
    return {"index": index, "pid": os.getpid(), "resource": child_resource(index),
            "forked_at": now, "phase": "forked", "stuck_after": now + STUCK_GRACE,
            "handoffs": [], "acquired": None,
            "acquired_at": None, "token": None, "checks": 0, "lost": None, "on_lost": 0,
            "release_start": None, "release_end": None, "release_error": None,
            "error": None}


def enter_phase(record: dict[str, Any], path: Path, phase: str, bound: float = 0.0) -> None:
    """Note what the child does now; it counts as hung once ``bound`` (the call's own
    timeout) plus STUCK_GRACE has passed without another phase."""
    record["phase"] = phase
    record["stuck_after"] = time.monotonic() + bound + STUCK_GRACE
    write_json(path, record)


# -- the child: one body for both managers ----------------------------------------------


async def settle(value: Any) -> Any:
    """What a call of the manager gave: a sync manager's result as it is, an asyncio
    manager's coroutine awaited."""
    return await value if inspect.isawaitable(value) else value


async def blocking_sleep(seconds: float) -> None:
    """The sync child's sleep: it blocks, as the sync child's calls do."""
    time.sleep(seconds)


async def child_main(dlm: Redlock | AsyncRedlock, sleep: Callable[[float], Awaitable[None]],
                     index: int, outdir: Path) -> None:
    """Runs in a forked child with the parent's manager; writes its record. With a sync
    manager and ``blocking_sleep`` nothing in it suspends (``run_without_a_loop``)."""
    record = new_record(index)
    path = outdir / f"child-{index}.json"
    write_json(path, record)
    lost_calls: list[str] = []
    lock = dlm.lock(record["resource"], ttl=CHILD_TTL, timeout=CHILD_TIMEOUT,
                    auto_extend=True, on_lost=lambda _handle: lost_calls.append("lost"))
    try:
        for round_ in range(HANDOFF_ROUNDS):
            entry: dict[str, Any] = {"acquire_start": time.monotonic()}
            record["handoffs"].append(entry)
            enter_phase(record, path, f"handoff {round_}: acquiring", CHILD_TIMEOUT)
            brief = dlm.lock(HANDOFF_RESOURCE, ttl=5.0, timeout=CHILD_TIMEOUT)
            try:
                entry["acquired"] = await settle(brief.acquire())
                entry["acquired_at"] = time.monotonic()
                if entry["acquired"]:
                    entry["token"] = brief.token
                    await sleep(HANDOFF_HOLD)
                    enter_phase(record, path, f"handoff {round_}: releasing")
                    entry["release_start"] = time.monotonic()
                    await settle(brief.release())
                    entry["release_end"] = time.monotonic()
            except RedlockError as error:
                entry["error"] = f"{type(error).__name__}: {error}"
        enter_phase(record, path, "acquiring", CHILD_TIMEOUT)
        record["acquire_start"] = time.monotonic()
        record["acquired"] = await settle(lock.acquire())
        record["acquired_at"] = time.monotonic()
        if record["acquired"]:
            record["token"] = lock.token
            enter_phase(record, path, "holding", CHILD_HOLD)
            hold_until = time.monotonic() + CHILD_HOLD
            try:
                while time.monotonic() < hold_until:
                    await sleep(0.25)
                    lock.check()
                    record["checks"] += 1
            except LockLost as error:
                record["lost"] = f"check: {error}"
            enter_phase(record, path, "releasing")
            record["release_start"] = time.monotonic()
            try:
                await settle(lock.release())
            except LockLost as error:
                record["lost"] = record["lost"] or f"release: {error}"
            except RedlockError as error:
                record["release_error"] = f"{type(error).__name__}: {error}"
            record["release_end"] = time.monotonic()
    except Exception as error:  # reported to the test, never hidden
        record["error"] = f"{type(error).__name__}: {error}"
    record["on_lost"] = len(lost_calls)
    enter_phase(record, path, "done")


def run_without_a_loop(coroutine: Coroutine[Any, Any, None]) -> None:
    """Runs a coroutine that never suspends to its end in this thread, with no event
    loop: the sync child stays a plain sync program."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("the sync child's body suspended")


def sync_child(dlm: Redlock, index: int, outdir: Path) -> None:
    dump_stacks_on_sigusr1(index, outdir)
    run_without_a_loop(child_main(dlm, blocking_sleep, index, outdir))


def async_child(dlm: AsyncRedlock, index: int, outdir: Path) -> None:
    dump_stacks_on_sigusr1(index, outdir)
    asyncio.run(child_main(dlm, asyncio.sleep, index, outdir))


# -- waiting for children (bounded), killing hung ones ----------------------------------


class Child:
    """A forked child: its pid, when it was forked, and how to ask whether it ended."""

    def __init__(self, index: int, pid: int, forked_at: float,
                 process: multiprocessing.process.BaseProcess | None = None) -> None:
        self.index = index
        self.pid = pid
        self.forked_at = forked_at
        self.process = process
        self.exit_code: int | None = None
        self.hung = False

    def poll(self) -> bool:
        """True once it has exited (reaped)."""
        if self.exit_code is not None:
            return True
        if self.process is not None:
            if self.process.is_alive():
                return False
            self.process.join()
            self.exit_code = self.process.exitcode
            return True
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return False
        self.exit_code = os.waitstatus_to_exitcode(status)
        return True

    def kill(self) -> None:
        """A hung child: dump its threads' stacks (SIGUSR1, faulthandler), then kill it."""
        self.hung = True
        try:
            os.kill(self.pid, signal.SIGUSR1)
            time.sleep(0.3)
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.process is not None:
            self.process.join(10)
            self.exit_code = self.process.exitcode
        else:
            _, status = os.waitpid(self.pid, 0)
            self.exit_code = os.waitstatus_to_exitcode(status)


def reap_step(children: list[Child], outdir: Path) -> bool:
    """Reap the children that exited, kill those stuck in one phase past its bound
    (their record's ``stuck_after``); True once none is left running."""
    now = time.monotonic()
    waiting = [c for c in children if not c.poll()]
    for child in waiting:
        path = outdir / f"child-{child.index}.json"
        try:
            stuck_after = float(json.loads(path.read_text())["stuck_after"])
        except (OSError, ValueError, KeyError):  # not written yet
            stuck_after = child.forked_at + STUCK_GRACE
        if now > stuck_after:
            child.kill()
    return not [c for c in waiting if not c.hung]


def reap(children: list[Child], outdir: Path) -> None:
    while not reap_step(children, outdir):
        time.sleep(0.2)


def collect(children: list[Child], outdir: Path) -> list[dict[str, Any]]:
    records = []
    for child in children:
        path = outdir / f"child-{child.index}.json"
        record: dict[str, Any] = (json.loads(path.read_text()) if path.exists()
                                  else {"index": child.index, "phase": "never wrote"})
        record["pid"] = child.pid
        record["exit_code"] = child.exit_code
        record["hung"] = child.hung
        record["fork_time"] = child.forked_at
        stack_path = outdir / f"child-{child.index}.stack"
        if child.hung and stack_path.exists():
            record["stack"] = stack_path.read_text()[-6000:]
        exit_path = outdir / f"child-{child.index}.exit.json"
        if exit_path.exists():
            record["left_parent_block"] = json.loads(exit_path.read_text())
        records.append(record)
    return records


def note_parent_after_children(report: dict[str, Any], parent: Lock | AsyncLock) -> None:
    """Once every child is done: when, and what the parent's own lock says now."""
    report["children_done_wall"] = time.time()
    try:
        parent.check()
        report["parent_check"] = "ok"
    except LockLost as error:
        report["parent_check"] = f"LockLost: {error}"
    report["parent_locked"] = parent.locked()


# -- the sync parent ---------------------------------------------------------------------


def busy_loop(dlm: Redlock, stop: threading.Event, tally: dict[str, Any]) -> None:
    """A parent thread that keeps taking a contended resource."""
    while not stop.is_set():
        try:
            with dlm.lock("app:busy", ttl=2.0, timeout=5.0):
                tally["ok"] += 1
                time.sleep(0.005)
        except RedlockError as error:
            note_error(tally, error)


def new_tally() -> dict[str, Any]:
    return {"ok": 0, "errors": 0, "examples": []}


def note_error(tally: dict[str, Any], error: BaseException) -> None:
    tally["errors"] += 1
    if len(tally["examples"]) < 2:
        tally["examples"].append(f"{type(error).__name__}: {error}"[:600])


def sync_parent(mode: str, outdir: Path, urls: list[str]) -> dict[str, Any]:
    dlm = Redlock(urls)
    report: dict[str, Any] = {"mode": mode}
    with dlm.lock("app:warmup", ttl=2.0):  # used once, as an application's startup does
        pass
    stop = threading.Event()
    tallies = [new_tally() for _ in range(BUSY_THREADS)]
    busy = [threading.Thread(target=busy_loop, args=(dlm, stop, tallies[i]),
                             name=f"app-busy-{i}", daemon=True) for i in range(BUSY_THREADS)]
    for thread in busy:
        thread.start()
    time.sleep(0.3)  # the busy threads contend: listener, waiting lines, pools in use
    parent_lost: list[str] = []
    children: list[Child] = []
    me = os.getpid()
    child_index: int | None = None
    try:
        with dlm.lock(PARENT_RESOURCE, ttl=PARENT_TTL, auto_extend=True,
                      on_lost=lambda _handle: parent_lost.append("lost")) as parent:
            report["parent_token"] = parent.token
            time.sleep(1.2)  # the parent's lock is renewed at least once before the forks
            report["forks_started_wall"] = time.time()
            ctx = multiprocessing.get_context("fork")
            for round_ in range(ROUNDS):
                for slot in range(PER_ROUND):
                    index = round_ * PER_ROUND + slot
                    forked_at = time.monotonic()
                    if mode == "os-fork":
                        pid = os.fork()
                        if pid == 0:
                            child_index = index
                            break
                        children.append(Child(index, pid, forked_at))
                    else:
                        process = ctx.Process(target=sync_child, args=(dlm, index, outdir),
                                              name=f"app-child-{index}")
                        process.start()
                        assert process.pid is not None
                        children.append(Child(index, process.pid, forked_at, process))
                if child_index is not None:
                    break
                time.sleep(ROUND_GAP)
            if child_index is not None:
                # An os.fork() child: it works with the inherited manager, then leaves
                # the parent's `with` block, as code after a fork does.
                sync_child(dlm, child_index, outdir)
            else:
                reap(children, outdir)
                note_parent_after_children(report, parent)
    except BaseException as error:
        if child_index is not None and os.getpid() != me:
            write_json(outdir / f"child-{child_index}.exit.json",
                       {"error": f"{type(error).__name__}: {error}"})
            os._exit(3)
        report["parent_release"] = f"{type(error).__name__}: {error}"
    else:
        if child_index is not None and os.getpid() != me:
            write_json(outdir / f"child-{child_index}.exit.json", {"error": None})
            os._exit(0)
        report["parent_release"] = "ok"
    stop.set()
    for thread in busy:
        thread.join(10)
    report["busy"] = tallies
    report["busy_hung"] = [t.name for t in busy if t.is_alive()]
    report["parent_on_lost"] = len(parent_lost)
    report["children"] = collect(children, outdir)
    dlm.close()
    return report


# -- the asyncio parent ------------------------------------------------------------------


async def async_parent(outdir: Path, urls: list[str]) -> dict[str, Any]:
    dlm = AsyncRedlock(urls)
    report: dict[str, Any] = {"mode": "asyncio"}
    async with dlm.lock("app:warmup", ttl=2.0):
        pass
    stop = asyncio.Event()
    tallies = [new_tally() for _ in range(BUSY_THREADS)]

    async def busy(tally: dict[str, Any]) -> None:
        while not stop.is_set():
            try:
                async with dlm.lock("app:busy", ttl=2.0, timeout=5.0):
                    tally["ok"] += 1
                    await asyncio.sleep(0.005)
            except RedlockError as error:
                note_error(tally, error)

    tasks = [asyncio.create_task(busy(t), name=f"app-busy-{i}") for i, t in enumerate(tallies)]
    await asyncio.sleep(0.3)
    parent_lost: list[str] = []
    children: list[Child] = []
    ctx = multiprocessing.get_context("fork")

    def on_lost(_handle: AsyncLock) -> None:
        parent_lost.append("lost")

    try:
        async with dlm.lock(PARENT_RESOURCE, ttl=PARENT_TTL, auto_extend=True,
                            on_lost=on_lost) as parent:
            report["parent_token"] = parent.token
            await asyncio.sleep(1.2)
            report["forks_started_wall"] = time.time()
            for round_ in range(ROUNDS):
                for slot in range(PER_ROUND):
                    index = round_ * PER_ROUND + slot
                    forked_at = time.monotonic()
                    process = ctx.Process(target=async_child, args=(dlm, index, outdir),
                                          name=f"app-child-{index}")
                    process.start()
                    assert process.pid is not None
                    children.append(Child(index, process.pid, forked_at, process))
                await asyncio.sleep(ROUND_GAP)
            while not reap_step(children, outdir):  # the loop keeps running meanwhile
                await asyncio.sleep(0.2)
            note_parent_after_children(report, parent)
    except RedlockError as error:
        report["parent_release"] = f"{type(error).__name__}: {error}"
    else:
        report["parent_release"] = "ok"
    stop.set()
    _, pending = await asyncio.wait(tasks, timeout=10)
    for task in pending:
        task.cancel()
    report["busy"] = tallies
    report["busy_hung"] = sorted(t.get_name() for t in pending)
    report["parent_on_lost"] = len(parent_lost)
    report["children"] = collect(children, outdir)
    await dlm.close()
    return report


def main() -> int:
    mode, outdir, *urls = sys.argv[1:]
    if mode not in ("os-fork", "mp-fork", "asyncio"):
        raise SystemExit(f"unknown mode {mode!r}")
    if mode == "asyncio":
        report = asyncio.run(async_parent(Path(outdir), urls))
    else:
        report = sync_parent(mode, Path(outdir), urls)
    print("report " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

