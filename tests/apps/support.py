"""What the application tests share: the checks every case makes (tokens rising, nothing
left running), a loop-blocking CPU worker, and a tally of outcomes by exception class.

Only public API: lock keys are read through plain redis-py clients of the nodes, under
the documented key layout ``{namespace}:{{resource}}:lock`` (README, option table).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from redlock.testing import RedisNode

NAMESPACE = "redlock"  # the library's default namespace (README, option table)


def lock_key(resource: str) -> str:
    """The documented key of ``resource``'s lock on every node."""
    return f"{NAMESPACE}:{{{resource}}}:lock"


def pttls(nodes: Iterable[RedisNode], resource: str) -> list[int]:
    """Each node's PTTL of ``resource``'s lock key, asked directly (not through a proxy):
    -2 where the key is gone, -1 where it has no expiry."""
    found = []
    for node in nodes:
        with node.client() as client:
            found.append(int(client.pttl(lock_key(resource))))
    return found


def library_threads() -> list[str]:
    """Names of the library's live threads (all are named ``redlock...``)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("redlock")]


def library_processes() -> list[int]:
    """This process's renewer processes still alive (docs/design.md §5.2), from
    ``/proc``: children whose command line runs the renewer."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if (int(fields[1]) == os.getpid() and fields[0] != "Z"
                and b"redlock._client.renewer_process" in command):
            found.append(int(entry))
    return found


def wait_no_library_threads(timeout: float = 5.0) -> list[str]:
    """The library's threads still alive after ``timeout`` seconds (daemon threads may
    take a moment to notice a close; a hang is not waited out)."""
    deadline = time.monotonic() + timeout
    while (library_threads() or library_processes()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return library_threads() + [f"renewer process {pid}" for pid in library_processes()]


async def wait_no_other_tasks(baseline: set[asyncio.Task[object]],
                              timeout: float = 5.0) -> list[str]:
    """Tasks of this loop, not in ``baseline`` and not the caller, still running after
    ``timeout`` seconds: what a closed manager left behind."""
    me = asyncio.current_task()
    deadline = time.monotonic() + timeout

    def others() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if t is not me and t not in baseline
                and not t.done()]

    while others() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return [f"{t.get_name()}: {t.get_coro()!r}" for t in others()]


def not_rising(tokens: Sequence[int]) -> list[tuple[int, int, int]]:
    """(index, token, next token) wherever the tokens, in the order of grants, do not
    strictly increase: every grant of one resource must carry a larger token."""
    return [(i, a, b) for i, (a, b) in enumerate(itertools.pairwise(tokens)) if b <= a]


class BusyLoop:
    """A coroutine that does CPU work on the event loop: blocks it ``block`` seconds at a
    time (``time.sleep``, as a synchronous parser or a hash would), yielding between
    blocks. An application loop that also computes looks like this to the library."""

    def __init__(self, block: float = 0.003) -> None:
        self.block = block
        self.blocks = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            time.sleep(self.block)  # deliberately blocking: the point of this worker
            self.blocks += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> BusyLoop:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="busy-loop")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 5.0)


class Tally:
    """Outcomes by name (``ok`` or an exception class), with one example message each."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def ok(self) -> None:
        self.counts["ok"] += 1

    def failed(self, exc: BaseException, where: str = "") -> None:
        name = type(exc).__name__ + (f"@{where}" if where else "")
        self.counts[name] += 1
        self.examples.setdefault(name, str(exc)[:300])

    def count(self, prefix: str) -> int:
        """How many outcomes' names start with ``prefix`` (e.g. ``LockLost``)."""
        return sum(n for name, n in self.counts.items() if name.startswith(prefix))

    def __str__(self) -> str:
        lines = [f"{dict(self.counts)}"]
        lines += [f"  {name}: {message}" for name, message in self.examples.items()]
        return "\n".join(lines)


async def within(seconds: float, work: Awaitable[object], tally: Tally, what: str) -> None:
    """``work`` must end within ``seconds``: a hang fails the test with the figures so far
    (its tasks are cancelled by wait_for, then the manager is closed by the caller)."""
    try:
        await asyncio.wait_for(work, seconds)
    except asyncio.TimeoutError:
        pytest.fail(f"{what} hung: not done within {seconds} s; so far {tally}")


async def nothing_left(baseline: set[asyncio.Task[Any]]) -> list[str]:
    """After the manager was closed: the library's threads and this loop's new tasks."""
    return wait_no_library_threads() + await wait_no_other_tasks(baseline)
