"""A history checker for fenced writes, shared by the store tests and their worker
processes.

Every write is recorded with its monotonic invoke and completion times
(``time.monotonic`` is CLOCK_MONOTONIC: one clock for every process on the machine)
and its outcome. :func:`check` then proves, per resource:

* accepted writes never go backwards: if write A completed before write B was
  invoked and both were accepted, then A.token <= B.token (otherwise B, carrying a
  lower token, overwrote A: A's update is *lost*);
* every rejection was deserved: the highest token the store reported is larger than
  the offered one and was offered by an accepted write invoked before the rejection
  completed;
* the final state is the highest accepted token and a value written with it.
"""

from __future__ import annotations

import bisect
import json
import random
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fencing import StaleTokenError

ACCEPTED = "accepted"
REJECTED = "rejected"
ERROR = "error"

Write = Callable[[str, int, bytes], None]


@dataclass(frozen=True)
class Record:
    writer: str
    resource: str
    token: int
    value: str
    start: float
    end: float
    outcome: str
    highest: int | None = None  # reported by StaleTokenError
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> Record:
        return cls(**json.loads(line))


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


def write_loop(writer: str, write: Write, resources: Sequence[str], t0: float,
               deadline: float, seed: int, max_writes: int = 100_000) -> list[Record]:
    """One writer: random tokens against random resources until the deadline."""
    tokens = TokenSource(t0, seed)
    pick = random.Random(seed + 1)
    records: list[Record] = []
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
            records.append(Record(writer, resource, token, value, start, end, REJECTED,
                                  exc.highest))
        except Exception as exc:  # recorded, and check() counts it against the store
            end = time.monotonic()
            records.append(Record(writer, resource, token, value, start, end, ERROR,
                                  detail=f"{type(exc).__name__}: {exc}"))
        else:
            end = time.monotonic()
            records.append(Record(writer, resource, token, value, start, end, ACCEPTED))
    return records


def run_threads(make_write: Callable[[], tuple[Write, Callable[[], None]]],
                resources: Sequence[str], threads: int, t0: float, deadline: float,
                seed: int, prefix: str = "thread") -> list[Record]:
    """``threads`` writer threads, each with its own writer (connection) from make_write."""
    results: list[list[Record]] = [[] for _ in range(threads)]
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


@dataclass
class Stats:
    tried: int = 0
    accepted: int = 0
    rejected: int = 0
    errors: int = 0
    lost: int = 0  # accepted writes overwritten by a lower token, or missing at the end
    undeserved_rejections: int = 0
    equal_token_accepts: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self, store: str) -> str:
        return (f"{store}: tried={self.tried} accepted={self.accepted} "
                f"rejected={self.rejected} lost={self.lost} errors={self.errors} "
                f"undeserved_rejections={self.undeserved_rejections} "
                f"equal_token_accepts={self.equal_token_accepts}")

    def assert_clean(self) -> None:
        assert not self.problems, "\n".join(self.problems[:20])
        assert self.lost == 0 and self.errors == 0 and self.undeserved_rejections == 0
        assert self.tried == self.accepted + self.rejected


def check(records: Iterable[Record], finals: Mapping[str, tuple[bytes | None, int]]) -> Stats:
    """Check a history; ``finals`` maps each resource to the store's (value, highest)."""
    stats = Stats()
    by_resource: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_resource[record.resource].append(record)
        stats.tried += 1
        if record.outcome == ACCEPTED:
            stats.accepted += 1
        elif record.outcome == REJECTED:
            stats.rejected += 1
        else:
            stats.errors += 1
            stats.problems.append(f"write failed without a verdict: {record}")
    for resource in set(by_resource) | set(finals):
        history = by_resource.get(resource, [])
        accepted = [r for r in history if r.outcome == ACCEPTED]
        # Accepted writes, by completion time, with the running maximum of their tokens.
        done = sorted(accepted, key=lambda r: r.end)
        ends = [r.end for r in done]
        running_max: list[int] = []
        for r in done:
            running_max.append(max(r.token, running_max[-1] if running_max else -1))
        for r in accepted:
            before = bisect.bisect_left(ends, r.start)  # accepted and completed before r began
            if before and running_max[before - 1] > r.token:
                stats.lost += 1
                stats.problems.append(
                    f"{resource}: token {r.token} ({r.value}) accepted after token "
                    f"{running_max[before - 1]} had been accepted: an update was lost")
            if before and running_max[before - 1] == r.token:
                stats.equal_token_accepts += 1
        # Each rejection must name a higher token that some accepted write had offered,
        # invoked before the rejection completed.
        started = sorted(accepted, key=lambda r: r.start)
        starts = [r.start for r in started]
        best: list[int] = []
        for r in started:
            best.append(max(r.token, best[-1] if best else -1))
        tokens = {r.token for r in accepted}
        for r in history:
            if r.outcome != REJECTED:
                continue
            seen = bisect.bisect_right(starts, r.end)
            if r.highest is None or r.highest <= r.token or r.highest not in tokens \
                    or not seen or best[seen - 1] <= r.token:
                stats.undeserved_rejections += 1
                stats.problems.append(f"{resource}: rejection not explained: {r}")
        value, highest = finals.get(resource, (None, 0))
        if not accepted:
            if value is not None:
                stats.problems.append(f"{resource}: value {value!r} but no accepted write")
            continue
        top = max(r.token for r in accepted)
        top_values = {r.value.encode() for r in accepted if r.token == top}
        if highest != top or value not in top_values:
            stats.lost += 1
            stats.problems.append(
                f"{resource}: final state (value={value!r}, highest={highest}) is not the "
                f"highest accepted write (token {top}, values {sorted(top_values)[:3]})")
    return stats


WORKER = Path(__file__).resolve().parent / "workers" / "fenced_writer.py"


class WriterProcesses:
    """Writer processes (workers/fenced_writer.py) that start together with the threads."""

    def __init__(self, store: str, target: str, count: int, resources: Sequence[str],
                 seed: int) -> None:
        self.processes = [
            subprocess.Popen(
                [sys.executable, str(WORKER), store, target, f"process-{i}", str(seed + 7919 * i),
                 *resources],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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

    def collect(self, timeout: float = 60.0) -> list[Record]:
        records: list[Record] = []
        for process in self.processes:
            out, err = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"writer process exited {process.returncode}: {err[-2000:]}")
            records.extend(Record.from_json(line) for line in out.splitlines() if line.strip())
        return records

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()


def run_mixed(store: str, target: str, make_write: Callable[[], tuple[Write, Callable[[], None]]],
              resources: Sequence[str], *, threads: int, processes: int, seconds: float,
              seed: int) -> list[Record]:
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
