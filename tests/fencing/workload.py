"""The fenced-store workload: writer threads, tasks and processes that offer random
tokens to a store, recording every write for :func:`redlock.testing.history.check`."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fencing import StaleTokenError
from redlock.testing.history import ACCEPTED, ERROR, REJECTED, Write

WriteFunction = Callable[[str, int, bytes], None]  # (resource, token, value)

ROOT = Path(__file__).resolve().parents[2]  # the repository: workers run from there


class TokenSource:
    """Tokens that trend upward with time plus random jitter, so that writers present
    a mix of fresh, equal and stale tokens (as lock holders of different ages do)."""

    def __init__(self, t0: float, seed: int, rate: float = 2000.0) -> None:
        self.t0 = t0
        self.rate = rate
        self.random = random.Random(seed)
        self.last: int | None = None

    def next(self) -> int:
        if self.last is not None and self.random.random() < 0.15:
            return self.last  # the same holder writing again: equal token
        base = int((time.monotonic() - self.t0) * self.rate)
        self.last = max(0, base + self.random.randint(-40, 3))
        return self.last


def write_loop(writer: str, write: WriteFunction, resources: Sequence[str], t0: float,
               deadline: float, seed: int, max_writes: int = 100_000) -> list[Write]:
    """One writer: random tokens against random resources until the deadline."""
    tokens = TokenSource(t0, seed)
    pick = random.Random(seed + 1)
    records: list[Write] = []
    seq = 0
    while time.monotonic() < deadline and seq < max_writes:
        resource = pick.choice(resources)
        token = tokens.next()
        value = f"{writer}:{seq}:{token}"
        seq += 1
        start = time.monotonic()
        try:
            write(resource, token, value.encode())
        except StaleTokenError as exc:
            end = time.monotonic()
            assert exc.resource.endswith(resource) or resource in exc.resource, exc
            assert exc.offered == token
            records.append(Write(writer, resource, token, start, end, REJECTED, value,
                                 highest=exc.highest))
        except Exception as exc:  # recorded, and check() counts it against the store
            end = time.monotonic()
            records.append(Write(writer, resource, token, start, end, ERROR, value,
                                 detail=f"{type(exc).__name__}: {exc}"))
        else:
            end = time.monotonic()
            records.append(Write(writer, resource, token, start, end, ACCEPTED, value))
    return records


def run_threads(make_write: Callable[[], tuple[WriteFunction, Callable[[], None]]],
                resources: Sequence[str], threads: int, t0: float, deadline: float,
                seed: int, prefix: str = "thread") -> list[Write]:
    """``threads`` writer threads, each with its own writer (connection) from make_write."""
    results: list[list[Write]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            write, close = make_write()
            try:
                results[index] = write_loop(f"{prefix}-{index}", write, resources, t0,
                                            deadline, seed + 1000 * index)
            finally:
                close()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return [record for result in results for record in result]


class WriterProcesses:
    """Writer processes (tests/fencing/workers/fenced_writer.py, run as a module from the
    repository root) that start together with the threads."""

    def __init__(self, store: str, target: str, count: int, resources: Sequence[str],
                 seed: int) -> None:
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.fencing.workers.fenced_writer", store, target,
                 f"process-{i}", str(seed + 7919 * i), *resources],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            for i in range(count)
        ]
        try:
            for process in self.processes:
                assert process.stdout is not None
                line = process.stdout.readline()
                if line.strip() != "ready":
                    raise RuntimeError(f"writer process failed to start: {line!r} "
                                       f"{process.communicate(timeout=10)[1][-2000:]}")
        except BaseException:
            self.close()
            raise

    def go(self, t0: float, deadline: float) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(f"{t0!r} {deadline!r}\n")
            process.stdin.flush()

    def collect(self, timeout: float = 60.0) -> list[Write]:
        records: list[Write] = []
        for process in self.processes:
            out, err = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"writer process exited {process.returncode}: {err[-2000:]}")
            records.extend(Write.from_json(line) for line in out.splitlines() if line.strip())
        return records

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()


def run_mixed(store: str, target: str,
              make_write: Callable[[], tuple[WriteFunction, Callable[[], None]]],
              resources: Sequence[str], *, threads: int, processes: int, seconds: float,
              seed: int) -> list[Write]:
    """Writer threads here plus writer processes, all starting at the same instant."""
    workers = WriterProcesses(store, target, processes, resources, seed)
    try:
        t0 = time.monotonic()
        deadline = t0 + seconds
        workers.go(t0, deadline)
        records = run_threads(make_write, resources, threads, t0, deadline, seed)
        records += workers.collect()
    finally:
        workers.close()
    return records


@dataclass
class Backend:
    """One SQL database: how to connect to it and where it is (file path or DSN)."""

    name: str  # "sqlite" or "postgres"
    target: str
    connect: Callable[..., Any]
    blob: str  # the binary column type

    def execute(self, *statements: str) -> None:
        conn = self.connect()
        try:
            for statement in statements:
                conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
