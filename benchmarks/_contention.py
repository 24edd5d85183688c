"""Cross-process contention: P processes x T threads on one lock (benchmarks/network.py).

Every worker loops: take a ticket (a DECR on a separate control redis-server, so the
total number of acquisitions is fixed across processes and the lock nodes see none of
it), want the lock, hold it for the critical section (``time.sleep``), release it. The
wait of an acquisition runs from wanting the lock to holding it. An ``inside`` slot in
a shared memory map catches two holders at once, across processes.

Reported per library: wait p50/p99/max, the Jain fairness index of the acquisitions per
worker ((sum x)^2 / (n sum x^2): 1.0 when every worker got the same share), throughput,
and Redis commands per completed acquisition (``INFO commandstats`` deltas summed over
the lock nodes, between "every process warmed up" and "every process done"; our own
INFO calls left out; rejected commands from ``INFO errorstats``). commandstats counts
the commands a Lua script runs too (a GET inside a script is a GET), so the EVAL and
EVALSHA calls, one per script run, are also given on their own.

The floor of a contended lock is computed, not run: an ideal hand-off in which the next
waiter holds the lock one round trip after the holder's critical section ends (a
release that reaches the nodes and wakes the waiter in half a round trip each), so an
acquisition costs ``cs + rt``: ``rt`` the p50 of one bare scatter/gather of the ACQUIRE
script measured here just before (``_floors.SyncFloor``), ``cs`` what ``time.sleep(cs)``
really takes here (median). Throughput floor: ``1 / (cs + rt)``; the wait of a fair FIFO
with W always-wanting workers is ``(W - 1) (cs + rt)`` for every acquisition; Jain 1.0.
The row "release, then acquire" is the same with two round trips (``cs + rt_acquire +
rt_release``).

This file is also the child process (``python _contention.py child JSON``); it must then
import no ``redlock`` module before it knows which library it runs (redlock-py and
redlock-ng run from their own ``--target`` directory: benchmarks/_clashing.py).
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _children
import _clashing
from _measure import percentile

HERE = Path(__file__).resolve().parent
TTL_S = 10.0
BUDGET_KEY = "bench:contention:tickets"
WARM_CYCLES = 3  # acquisitions per thread before the measured run


# -- the child: T threads of one library in one process ------------------------------------


def _library_calls(library: str, urls: list[str]) -> tuple[Any, Any, Any, Any]:
    """``(make, acquire, release, close)`` for a library, acquire blocking until held."""
    if library in _clashing.LIBRARIES:
        make, acquire, release, _attempt = _clashing.adapter(library, urls)
        return make, acquire, release, lambda: None
    import _peers
    import redis

    peers = _peers.Peers()
    if library == "ours":
        peer = _peers.ours_sync(peers, urls, "ours", "ours")
    elif library == "pottery":
        peer = _peers.pottery(peers, urls)
    else:
        single = redis.Redis.from_url(urls[0])
        peers.closers.append(single.close)
        peer = (_peers.redis_py_lock(single) if library == "redispy"
                else _peers.python_redis_lock(single))
    return peer.make, peer.acquire, peer.release, peers.close


def child(options: dict[str, Any]) -> None:
    import redis

    make, acquire, release, close = _library_calls(options["library"], options["urls"])
    control = redis.Redis.from_url(options["control"])
    resource, threads, cs_s = options["resource"], options["threads"], options["cs_ms"] / 1000
    base = options["worker_base"]
    with open(options["slot_file"], "r+b") as slot_file:
        slot = mmap.mmap(slot_file.fileno(), 8)
    handles = [make(resource) for _ in range(threads)]
    # Connections opened and scripts loaded, per thread: the threads contend for a lock
    # of this process's own a few times, together (one after another, they all used the
    # one connection per node the first opened: the measured run's first acquisitions
    # then waited for the others' connections, tens of ms on a busy machine).
    warm_name = f"{resource}:warm:{base}"
    together = threading.Barrier(threads)

    def warm_up() -> None:
        warm = make(warm_name)
        together.wait()
        for _ in range(WARM_CYCLES):
            release(warm, acquire(warm))

    warmers = [threading.Thread(target=warm_up, daemon=True) for _ in range(threads)]
    for warmer in warmers:
        warmer.start()
    for warmer in warmers:
        warmer.join()
    go = threading.Event()
    records: list[dict[str, Any]] = [{"waits_ms": [], "cs_ms": [], "violations": 0}
                                     for _ in range(threads)]
    errors: list[str] = []

    def work(index: int) -> None:
        me, record, handle = base + index + 1, records[index], handles[index]
        go.wait()
        stop_at = time.monotonic() + options["deadline_s"]
        try:
            while time.monotonic() < stop_at and control.decr(BUDGET_KEY) >= 0:
                wanted = time.monotonic()
                held = acquire(handle)
                holding = time.monotonic()
                if struct.unpack_from("q", slot, 0)[0] != 0:
                    record["violations"] += 1
                struct.pack_into("q", slot, 0, me)
                time.sleep(cs_s)
                if struct.unpack_from("q", slot, 0)[0] != me:
                    record["violations"] += 1
                struct.pack_into("q", slot, 0, 0)
                left = time.monotonic()
                release(handle, held)
                record["waits_ms"].append((holding - wanted) * 1000)
                record["cs_ms"].append((left - holding) * 1000)
                record["last_release"] = time.monotonic()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    print("ready", flush=True)
    sys.stdin.readline()
    go.set()
    for worker in workers:
        worker.join()
    close()
    print(json.dumps({"records": records, "errors": errors}), flush=True)


# -- the parent ------------------------------------------------------------------------


def command_counts(urls: list[str]) -> Counter[str]:
    """Calls per command (and rejected commands per error prefix) summed over nodes."""
    import redis

    counts: Counter[str] = Counter()
    for url in urls:
        with redis.Redis.from_url(url, socket_timeout=10) as client:
            for name, stats in client.info("commandstats").items():
                counts[name.removeprefix("cmdstat_")] += int(stats["calls"])
            for name, stats in client.info("errorstats").items():
                counts["rejected " + name.removeprefix("errorstat_")] += int(stats["count"])
    return counts


def jain(values: list[int]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else float("nan")


def run_library(library: str, resource: str, urls: list[str], node_urls: list[str],
                control: str, args: Any, env: dict[str, str] | None) -> dict[str, Any]:
    """P processes of ``library`` contend; returns the figures of the run."""
    import redis

    fd, slot_path = tempfile.mkstemp(prefix="bench-slot-")
    os.write(fd, b"\0" * 8)
    os.close(fd)
    options = [{"library": library, "urls": urls, "control": control, "resource": resource,
                "threads": args.threads, "cs_ms": args.cs_ms,
                "deadline_s": args.contention_deadline, "slot_file": slot_path,
                "worker_base": p * args.threads} for p in range(args.procs)]
    try:
        with _children.started(HERE / "_contention.py", options, env,
                               f"{library} child") as procs:
            with redis.Redis.from_url(control) as ctl:
                ctl.set(BUDGET_KEY, args.total)
            before = command_counts(node_urls)
            started = time.monotonic()
            _children.go(procs)
            outputs = _children.results(procs, args.contention_deadline + 60,
                                        f"{library} child")
            after = command_counts(node_urls)
    finally:
        os.unlink(slot_path)
    records = [r for o in outputs for r in o["records"]]
    waits = sorted(w for r in records for w in r["waits_ms"])
    per_worker = [len(r["waits_ms"]) for r in records]
    ended = max((r.get("last_release", started) for r in records), default=started)
    delta = after - before
    del delta["info"]  # command_counts' own INFO calls
    done = len(waits)
    return {
        "done": done, "total": args.total, "wall_s": ended - started,
        "acq_s": done / (ended - started) if ended > started else float("nan"),
        "wait_p50_ms": percentile(waits, 50), "wait_p99_ms": percentile(waits, 99),
        "wait_max_ms": waits[-1] if waits else float("nan"),
        "jain": jain(per_worker), "per_worker": per_worker,
        "waits_ms": [round(w, 3) for w in waits],  # for the CDF plot
        "cs_p50_ms": statistics.median(w for r in records for w in r["cs_ms"]) if done else 0,
        "violations": sum(r["violations"] for r in records),
        "errors": [e for o in outputs for e in o["errors"]][:3],
        "commands": dict(delta.most_common()),
        "commands_per_acq": sum(delta.values()) / done if done else float("nan"),
        "scripts_per_acq": (delta["evalsha"] + delta["eval"]) / done if done else float("nan"),
    }


def floor_round_trips(urls: list[str], cycles: int) -> dict[str, float]:
    """p50 of one bare scatter/gather of ACQUIRE, and of RELEASE, in ms (_floors)."""
    from _floors import SyncFloor

    floor = SyncFloor(urls, node_timeout=1.0, ttl_s=TTL_S)
    acquires, releases = [], []
    try:
        for i in range(cycles + 20):
            t0 = time.perf_counter()
            owner = floor.acquire(f"bench:contention:floor:{i % 7}")
            t1 = time.perf_counter()
            floor.release(f"bench:contention:floor:{i % 7}", owner)
            t2 = time.perf_counter()
            if i >= 20:
                acquires.append((t1 - t0) * 1000)
                releases.append((t2 - t1) * 1000)
    finally:
        floor.close()
    return {"acquire_ms": statistics.median(acquires), "release_ms": statistics.median(releases)}


def critical_section_ms(nominal_ms: float, samples: int = 200) -> float:
    """What ``time.sleep(cs)`` really takes here (median, ms): the floor's critical
    section is the workers' own, oversleeping included."""
    taken = []
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(nominal_ms / 1000)
        taken.append((time.perf_counter() - t0) * 1000)
    return statistics.median(taken)


def ideal_floor(rt: dict[str, float], cs_ms: float, workers: int, total: int,
                round_trips: int) -> dict[str, Any]:
    cycle = cs_ms + rt["acquire_ms"] + (rt["release_ms"] if round_trips == 2 else 0.0)
    wait = (workers - 1) * cycle
    return {"done": total, "total": total, "acq_s": 1000 / cycle, "wait_p50_ms": wait,
            "wait_p99_ms": wait, "wait_max_ms": wait, "jain": 1.0, "cycle_ms": cycle,
            "computed": True}


# (key, library, nodes, label): the N=5 Redlocks, then the single-node locks with ours
# on N=1 as their baseline.
CONTENDERS = [
    ("ours", "ours", 5, "ours sync"),
    ("redlock_ng", "redlock-ng", 5, f"redlock-ng {_clashing.LIBRARIES['redlock-ng'].version}"),
    ("pottery", "pottery", 5, "pottery.Redlock"),
    ("redlock_py", "redlock-py", 5, f"redlock-py {_clashing.LIBRARIES['redlock-py'].version}"),
    ("ours_n1", "ours", 1, "ours sync N=1"),
    ("redispy", "redispy", 1, "redis-py redis.lock.Lock"),
    ("prl", "prl", 1, "python-redis-lock"),
]


def run_section(urls: list[str], node_urls: list[str], control: str, args: Any,
                monitor: Any, loads: Any) -> dict[str, Any]:
    """Every contender in turn (the order of CONTENDERS), then the computed floors."""
    import _netreport
    from _sections import section

    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    where = "through Toxiproxy" if urls != node_urls else "loopback, no proxy"
    title = (f"Cross-process contention: {args.procs} processes x {args.threads} threads, "
             f"one lock, {args.cs_ms:g} ms critical section, {args.total} acquisitions, "
             f"{where} (RTT {args.contention_rtt} ms)")
    with section(title, monitor, loads):
        cs_ms = critical_section_ms(args.cs_ms)
        for n in sorted({n for *_, n, _ in CONTENDERS}):
            rt = floor_round_trips(urls[:n], cycles=200)
            workers = args.procs * args.threads
            results[f"floor_n{n}"] = {**ideal_floor(rt, cs_ms, workers, args.total, 1),
                                      "round_trips": rt, "cs_ms": cs_ms}
            results[f"floor2_n{n}"] = ideal_floor(rt, cs_ms, workers, args.total, 2)
        for key, library, n, _label in CONTENDERS:
            if args.peers and key not in args.peers and not key.startswith("ours"):
                continue
            env = None
            if library in _clashing.LIBRARIES:
                target = Path(getattr(args, f"{library.replace('-', '_')}_dir"))
                try:
                    _clashing.ensure_installed(
                        library, target, getattr(args, f"install_{library.replace('-', '_')}"))
                except LookupError as exc:
                    skipped[key] = str(exc)
                    continue
                env = _clashing.subprocess_env(target)
            try:
                results[key] = run_library(library, f"bench:contention:{key}", urls[:n],
                                           node_urls[:n], control, args, env)
            except Exception as exc:
                results[key] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            print(f"   {key} done", flush=True)
        print(_netreport.contention_table(results, args, CONTENDERS))
    return {"results": results, "skipped": skipped,
            "labels": {key: label for key, _, _, label in CONTENDERS}}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "child":
    child(json.loads(sys.argv[2]))
