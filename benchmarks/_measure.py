"""The measuring loops on one peer: uncontended, contended and memory, sync and asyncio.

Shared by bench.py and network.py (through ``_peers``), async_overhead.py,
logging_cost.py and the subprocess worker of redlock-py and redlock-ng.

Nothing here imports the ``redlock`` package under test: the subprocess worker runs in a
process whose ``redlock`` module is another library of that name.

A peer is described by three callables:

* ``make(resource)`` -> a handle (whatever the library needs per worker; may be None),
* ``acquire(handle)`` -> a context value, blocking until the lock is held,
* ``release(handle, ctx)``.

The asyncio variants are coroutine functions with the same shape.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

Make = Callable[[str], Any]
Acquire = Callable[[Any], Any]
Release = Callable[[Any, Any], Any]
AsyncAcquire = Callable[[Any], Awaitable[Any]]
AsyncRelease = Callable[[Any, Any], Awaitable[Any]]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(q / 100.0 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def summarize_latencies(samples_ns: list[int], wall_s: float) -> dict[str, float]:
    values = sorted(s / 1000.0 for s in samples_ns)  # microseconds
    return {
        "p50_us": percentile(values, 50),
        "p99_us": percentile(values, 99),
        "mean_us": statistics.fmean(values),
        "ops_s": len(values) / wall_s if wall_s > 0 else float("nan"),
        "n": len(values),
    }


# -- uncontended ---------------------------------------------------------------------


def uncontended(make: Make, acquire: Acquire, release: Release, resource: str, *,
                cycles: int, warmup: int) -> dict[str, float]:
    """acquire+release on one handle, one at a time; per-cycle latency and throughput."""
    handle = make(resource)
    for _ in range(warmup):
        release(handle, acquire(handle))
    samples: list[int] = [0] * cycles
    clock = time.perf_counter_ns
    gc.collect()
    started = clock()
    for i in range(cycles):
        t0 = clock()
        release(handle, acquire(handle))
        samples[i] = clock() - t0
    wall = (clock() - started) / 1e9
    return summarize_latencies(samples, wall)


async def uncontended_async(make: Make, acquire: AsyncAcquire, release: AsyncRelease,
                            resource: str, *, cycles: int, warmup: int) -> dict[str, float]:
    handle = make(resource)
    for _ in range(warmup):
        await release(handle, await acquire(handle))
    samples: list[int] = [0] * cycles
    clock = time.perf_counter_ns
    gc.collect()
    started = clock()
    for i in range(cycles):
        t0 = clock()
        await release(handle, await acquire(handle))
        samples[i] = clock() - t0
    wall = (clock() - started) / 1e9
    return summarize_latencies(samples, wall)


# -- attempts: success rate under faults ---------------------------------------------


class Tally:
    """What an :func:`attempts` loop has seen so far (readable while it runs, so that a
    caller that gives up on a hung sync call still has the cycles before it)."""

    def __init__(self) -> None:
        self.ok_ns: list[int] = []
        self.failed_ns: list[int] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.warmup_failed = 0
        self.stopped = "cycles"
        self.cycle_started = time.monotonic()  # of the cycle running now
        self.started = time.perf_counter_ns()
        self.ended: int | None = None
        self.in_a_row = 0  # failures since the last success (a failed warm-up counts)

    def fail(self, text: str, elapsed_ns: int | None) -> None:
        self.errors[text[:400]] += 1
        if elapsed_ns is None:
            self.warmup_failed += 1
            self.in_a_row += 1
        else:
            self.failed_ns.append(elapsed_ns)

    def ok(self, elapsed_ns: int) -> None:
        self.ok_ns.append(elapsed_ns)
        self.in_a_row = 0

    def failed(self, text: str, elapsed_ns: int, max_failures: int) -> bool:
        """A measured cycle failed; True when that makes ``max_failures`` in a row."""
        self.fail(text, elapsed_ns)
        self.in_a_row += 1
        if self.in_a_row >= max_failures:
            self.stopped = "failures"
            return True
        return False

    def result(self) -> dict[str, Any]:
        ok = sorted(v / 1000.0 for v in self.ok_ns)  # microseconds
        failed = sorted(v / 1e6 for v in self.failed_ns)  # milliseconds
        tried = len(ok) + len(failed)
        wall_ns = (self.ended or time.perf_counter_ns()) - self.started
        return {
            "ok": len(ok), "failed": len(failed), "success": len(ok) / tried if tried else 0.0,
            "p50_us": percentile(ok, 50), "p95_us": percentile(ok, 95),
            "p99_us": percentile(ok, 99), "max_us": ok[-1] if ok else float("nan"),
            "failed_p50_ms": percentile(failed, 50), "warmup_failed": self.warmup_failed,
            "errors": self.errors.most_common(3), "stopped": self.stopped,
            "wall_s": wall_ns / 1e9,
        }


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def attempts(make: Make, attempt: Acquire, release: Release, resource: str, *, cycles: int,
             warmup: int, budget_s: float, max_failures: int, hang_s: float = 0.0,
             tally: Tally | None = None) -> dict[str, Any]:
    """acquire+release cycles where ``attempt`` is *one* call of the library's acquire
    with its own defaults (raising when it fails): the success rate, the latency of the
    successful cycles (p50/p95/p99 us) and how long a failed one took (ms).

    Warm-up cycles (connections, scripts) end at the first failure, which counts towards
    ``max_failures``. The measured loop stops after ``cycles``, once ``budget_s``
    seconds have passed, or after ``max_failures`` failures in a row. A sync call cannot
    be interrupted, so ``hang_s`` is the caller's business: it runs this in a thread and
    reads ``tally``.
    """
    tally = tally or Tally()
    handle = make(resource)
    clock = time.perf_counter_ns
    for _ in range(warmup):
        tally.cycle_started = time.monotonic()
        try:
            release(handle, attempt(handle))
        except Exception as exc:
            tally.fail(_error_text(exc), None)
            break
    tally.started = clock()
    stop_at = tally.started + int(budget_s * 1e9)
    for _ in range(cycles):
        if clock() >= stop_at:
            tally.stopped = "budget"
            break
        tally.cycle_started = time.monotonic()
        t0 = clock()
        try:
            release(handle, attempt(handle))
        except Exception as exc:
            if tally.failed(_error_text(exc), clock() - t0, max_failures):
                break
            continue
        tally.ok(clock() - t0)
    tally.ended = clock()
    return tally.result()


async def attempts_async(make: Make, attempt: AsyncAcquire, release: AsyncRelease,
                         resource: str, *, cycles: int, warmup: int, budget_s: float,
                         max_failures: int, hang_s: float = 30.0) -> dict[str, Any]:
    """:func:`attempts` on an event loop; a cycle that takes longer than ``hang_s`` is
    cancelled, counted as failed ("hung") and ends the loop."""
    tally = Tally()
    handle = make(resource)
    clock = time.perf_counter_ns
    hung = f"hung: no answer in {hang_s:g} s (cancelled)"

    async def bare() -> None:
        await release(handle, await attempt(handle))

    async def cycle() -> None:
        # asyncio.timeout (3.11+) cancels in place; wait_for would add a Task per cycle.
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(hang_s):
                await bare()
        else:
            await asyncio.wait_for(bare(), hang_s)

    def timed_out(t0: int) -> bool:  # our bound, not a TimeoutError of the library
        return clock() - t0 >= hang_s * 0.95e9

    for _ in range(warmup):
        t0 = clock()
        try:
            await cycle()
        except Exception as exc:
            if isinstance(exc, asyncio.TimeoutError) and timed_out(t0):
                tally.fail(hung, None)
                tally.stopped = "hung"
                return tally.result()
            tally.fail(_error_text(exc), None)
            break
    tally.started = clock()
    stop_at = tally.started + int(budget_s * 1e9)
    for _ in range(cycles):
        if clock() >= stop_at:
            tally.stopped = "budget"
            break
        t0 = clock()
        try:
            await cycle()
        except Exception as exc:
            if isinstance(exc, asyncio.TimeoutError) and timed_out(t0):
                tally.fail(hung, clock() - t0)
                tally.stopped = "hung"
                break
            if tally.failed(_error_text(exc), clock() - t0, max_failures):
                break
            continue
        tally.ok(clock() - t0)
    tally.ended = clock()
    return tally.result()


# -- contended -----------------------------------------------------------------------


class _Shared:
    """The protected state: a counter bumped with a deliberate read-yield-write race,
    and an 'inside' flag that catches two holders at once."""

    def __init__(self, total: int, workers: int) -> None:
        self.remaining = total
        self.counter = 0
        self.inside = 0
        self.violations = 0
        self.per_worker = [0] * workers
        self.tickets = threading.Lock()

    def take_ticket(self) -> bool:
        with self.tickets:
            if self.remaining <= 0:
                return False
            self.remaining -= 1
            return True

    def result(self, wall: float, total: int, timed_out: bool) -> dict[str, Any]:
        done = sum(self.per_worker)
        return {
            "total_s": wall,
            "acq_s": done / wall if wall > 0 else float("nan"),
            "done": done,
            "total": total,
            "min_per_worker": min(self.per_worker),
            "max_per_worker": max(self.per_worker),
            "counter_ok": self.counter == done,
            "violations": self.violations,
            "timed_out": timed_out,
        }


def contended(make: Make, acquire: Acquire, release: Release, resource: str, *,
              workers: int, total: int, deadline_s: float) -> dict[str, Any]:
    """``workers`` threads share ``total`` acquisitions of one lock (each its own handle)."""
    shared = _Shared(total, workers)
    stop_at = time.monotonic() + deadline_s
    handles = [make(resource) for _ in range(workers)]
    start = threading.Barrier(workers + 1)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        handle = handles[index]
        start.wait()
        try:
            while time.monotonic() < stop_at and shared.take_ticket():
                ctx = acquire(handle)
                try:
                    shared.inside += 1
                    if shared.inside > 1:
                        shared.violations += 1
                    value = shared.counter
                    time.sleep(0)  # yield the GIL inside the critical section
                    shared.counter = value + 1
                    shared.per_worker[index] += 1
                    shared.inside -= 1
                finally:
                    release(handle, ctx)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    if errors:
        raise errors[0]
    return shared.result(wall, total, timed_out=shared.remaining > 0)


async def contended_async(make: Make, acquire: AsyncAcquire, release: AsyncRelease,
                          resource: str, *, workers: int, total: int,
                          deadline_s: float) -> dict[str, Any]:
    """``workers`` asyncio tasks share ``total`` acquisitions of one lock."""
    shared = _Shared(total, workers)
    stop_at = time.monotonic() + deadline_s
    handles = [make(resource) for _ in range(workers)]

    async def work(index: int) -> None:
        handle = handles[index]
        while time.monotonic() < stop_at and shared.take_ticket():
            ctx = await acquire(handle)
            try:
                shared.inside += 1
                if shared.inside > 1:
                    shared.violations += 1
                value = shared.counter
                await asyncio.sleep(0)
                shared.counter = value + 1
                shared.per_worker[index] += 1
                shared.inside -= 1
            finally:
                await release(handle, ctx)

    began = time.perf_counter()
    await asyncio.gather(*(work(i) for i in range(workers)))
    wall = time.perf_counter() - began
    return shared.result(wall, total, timed_out=shared.remaining > 0)


# -- memory --------------------------------------------------------------------------


def handle_memory(make: Make, count: int) -> dict[str, float]:
    """tracemalloc: bytes per handle kept alive, and the peak while creating ``count``."""
    names = [f"bench:mem:{i}" for i in range(count)]
    make(names[0])  # first-use imports and caches happen outside the measurement
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    handles = [make(name) for name in names]
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = len(handles)
    del handles
    # Timing without tracemalloc (it slows allocation several-fold).
    gc.collect()
    t0 = time.perf_counter()
    handles = [make(name) for name in names]
    elapsed = time.perf_counter() - t0
    del handles
    return {
        "bytes_per_handle": (current - base) / kept,
        "peak_kib": (peak - base) / 1024.0,
        "create_us": elapsed / count * 1e6,
    }


def cycle_memory(make: Make, acquire: Acquire, release: Release, *, cycles: int,
                 prefix: str) -> dict[str, float]:
    """tracemalloc over ``cycles`` acquire/release cycles, each on a new resource.

    peak: the most memory the cycles had allocated at once (transient working set);
    retained: what is still allocated afterwards (per-resource state the client keeps).
    """
    for i in range(20):  # connections, scripts loaded, caches warm
        handle = make(f"{prefix}:warm:{i}")
        release(handle, acquire(handle))
    names = [f"{prefix}:{i}" for i in range(cycles)]
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    for name in names:
        handle = make(name)
        release(handle, acquire(handle))
    del handle
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"peak_kib": (peak - base) / 1024.0, "retained_kib": (current - base) / 1024.0,
            "retained_b_per_cycle": (current - base) / cycles}


async def cycle_memory_async(make: Make, acquire: AsyncAcquire, release: AsyncRelease, *,
                             cycles: int, prefix: str) -> dict[str, float]:
    for i in range(20):
        handle = make(f"{prefix}:warm:{i}")
        await release(handle, await acquire(handle))
    names = [f"{prefix}:{i}" for i in range(cycles)]
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    for name in names:
        handle = make(name)
        await release(handle, await acquire(handle))
    del handle
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"peak_kib": (peak - base) / 1024.0, "retained_kib": (current - base) / 1024.0,
            "retained_b_per_cycle": (current - base) / cycles}
