"""Many distinct resource names: throughput, latency, and what each node keeps.

    PYTHONPATH=. .venv/bin/python benchmarks/many_names.py            # full run (~2.5 min)
    PYTHONPATH=. .venv/bin/python benchmarks/many_names.py --quick    # smoke run (~30 s)
    PYTHONPATH=. .venv/bin/python benchmarks/many_names.py --only memory --mem-names 50000
    PYTHONPATH=. .venv/bin/python benchmarks/many_names.py --json out.json

``PYTHONPATH=.`` (from the checkout's root): the ``redlock`` of this checkout, not the one
an editable install of another checkout points at. The header prints which one was
imported (path and commit); the child processes are given the same.

Starts its own redis-server processes (``RedisNodes(5)``: loopback, no persistence; a
fresh set for each memory variant and for the check) and stops them at the end. It
prints a table per section and asserts nothing. Sections (``--only``):

* ``throughput``: acquire+release cycles on ``--names`` (10,000) distinct names, N=5.
  Variant ``threads``: 8 threads share one sync ``Redlock``; the names are split into 8
  disjoint shares and each thread cycles through its own (uncontended). Variant
  ``processes``: 4 processes x 2 threads, one ``Redlock`` per process; each worker
  cycles through its own share of the names, except that a quarter of its cycles
  (``--shared-fraction``) take a random name of a pool of 20 (``--shared-names``) that
  every worker of every process uses: some contention, from several processes at once.
  Before round 1 every name is locked once (untimed, one thread), so the rounds measure
  names that were locked before. A cycle is ``dlm.lock(name)``, ``acquire()``,
  ``release()``; the rounds last ``--duration`` seconds each, the variants alternate
  (order rotated each round). Also: Lua scripts and Redis commands per cycle, summed
  over the 5 nodes (``INFO commandstats`` deltas: a GET inside a script counts as one).
* ``memory``: ``--mem-names`` (100,000) distinct names, each locked once by one thread
  (``--fill-threads``; more are no faster on 2 cores). Variant ``released``: each is
  released at once. Variant ``lapsed``: none is released; the lock keys (``--lapse-ttl``
  2 s) expire, and the run waits (bounded) until the nodes have reclaimed them. Per
  node, against a baseline taken just before the names (manager connected, scripts
  loaded): ``DBSIZE``, ``used_memory`` delta, and the keys matching ``redlock:*`` by
  kind (lock, fence, line, other). Each variant on fresh nodes.
* ``check``: ``--check-names`` (20,000) distinct names locked once by one thread and
  left to expire; every fourth one is contended by a second thread (its own manager:
  the nodes see a rival, not the local hand-off) that tries to acquire it while held,
  waits in the nodes' line for ``--rival-timeout`` and gives up. Per node: keys and
  memory delta once the lock keys are gone, against the bound of the bounded-state
  issue (at most 64 keys, at most 512 KiB more than before).

BENCHMARKS.md ("Many distinct names and node memory") has the figures and how each is made.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _children
import _measure
from _environment import LoadMonitor, configure_logging, load_text, loadavg_text, machine_lines
from _report import spread, table

HERE = Path(__file__).resolve().parent
SECTIONS = ("throughput", "memory", "check")
NODES = 5
NAMESPACE = "redlock"  # the managers' default
TTL_S = 10.0  # cycles release at once; the TTL only bounds a lost release
ACQUIRE_TIMEOUT_S = 10.0  # a contended acquire gives up after this (counted as failed)
EXPIRY_DEADLINE_S = 60.0  # the most the lapsed variants wait for the nodes to reclaim keys
KEY_BOUND, MEMORY_BOUND_KIB = 64, 512  # the check's bound (the bounded-state issue)
FULL = {"rounds": 3, "duration": 3.0, "names": 10_000, "mem_names": 100_000,
        "check_names": 20_000}
QUICK = {"rounds": 1, "duration": 1.5, "names": 10_000, "mem_names": 10_000,
         "check_names": 4_000}


# -- the workers: T threads over one manager ----------------------------------------------


def throughput_names(count: int) -> list[str]:
    return [f"bench:many:{i}" for i in range(count)]


def plans(names: list[str], workers: int, shared_names: int,
          shared_fraction: float) -> list[dict[str, Any]]:
    """Each worker's own share of the names (disjoint) and the pool shared by all."""
    pool = names[:shared_names] if shared_fraction > 0 else []
    own = names[len(pool):]
    return [{"own": own[w::workers], "pool": pool, "fraction": shared_fraction, "seed": w}
            for w in range(workers)]


def run_workers(dlm: Any, worker_plans: list[dict[str, Any]], *, warmup: int,
                duration: float, ready: Callable[[], None] | None = None) -> dict[str, Any]:
    """One thread per plan: ``warmup`` cycles, then (all at once, after ``ready``)
    cycles for ``duration`` seconds. Returns each worker's cycle times and the wall."""
    results: list[dict[str, Any]] = [{"samples_ns": [], "failed": 0, "errors": []}
                                     for _ in worker_plans]
    warmed = threading.Barrier(len(worker_plans) + 1)
    go = threading.Event()
    stop_at = [0]
    clock = time.perf_counter_ns

    def work(index: int) -> None:
        plan, record = worker_plans[index], results[index]
        own, pool, fraction = plan["own"], plan["pool"], plan["fraction"]
        rng = random.Random(plan["seed"])
        position = 0

        def cycle() -> int:
            nonlocal position
            if pool and rng.random() < fraction:
                name = rng.choice(pool)
            else:
                name = own[position % len(own)]
                position += 1
            t0 = clock()
            handle = dlm.lock(name, ttl=TTL_S, timeout=ACQUIRE_TIMEOUT_S)
            if not handle.acquire():
                record["failed"] += 1
                return -1
            handle.release()
            return clock() - t0

        try:
            for _ in range(warmup):
                cycle()
        except Exception as exc:
            record["errors"].append(f"warm-up: {type(exc).__name__}: {exc}"[:300])
        warmed.wait()
        go.wait()
        samples = record["samples_ns"]
        try:
            while clock() < stop_at[0]:
                elapsed = cycle()
                if elapsed >= 0:
                    samples.append(elapsed)
        except Exception as exc:
            record["errors"].append(f"{type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=work, args=(i,), daemon=True)
               for i in range(len(worker_plans))]
    for thread in threads:
        thread.start()
    warmed.wait()
    if ready is not None:
        ready()
    started = clock()
    stop_at[0] = started + int(duration * 1e9)
    go.set()
    for thread in threads:
        thread.join()
    return {"workers": results, "wall_s": (clock() - started) / 1e9}


def summary(samples_ns: list[int], ops_s: float, failed: int,
            errors: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = _measure.summarize_latencies(samples_ns, 1.0)
    out.update(ops_s=ops_s, failed=failed, errors=errors[:3])
    return out


# -- the child process of the processes variant ------------------------------------------


def child(options: dict[str, Any]) -> None:
    """T threads of one process, one manager: warm up, say ready, run at the go line."""
    from redlock import Redlock

    configure_logging()
    names = throughput_names(options["names"])
    worker_plans = plans(names, options["workers"], options["shared_names"],
                         options["shared_fraction"])
    mine = worker_plans[options["first"]:options["first"] + options["threads"]]

    def ready() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    with Redlock(options["urls"]) as dlm:
        out = run_workers(dlm, mine, warmup=options["warmup"], duration=options["duration"],
                          ready=ready)
    print(json.dumps(out), flush=True)


def run_processes(urls: list[str], args: argparse.Namespace, env: dict[str, str],
                  ready: Callable[[], None]) -> dict[str, Any]:
    """``--procs`` child processes of ``--threads`` threads each, started at once
    (``ready`` is called once every one has warmed up)."""
    workers = args.procs * args.threads
    options = [{"urls": urls, "names": args.names, "workers": workers,
                "shared_names": args.shared_names, "shared_fraction": args.shared_fraction,
                "first": p * args.threads, "threads": args.threads, "warmup": args.warmup,
                "duration": args.duration} for p in range(args.procs)]
    with _children.started(HERE / "many_names.py", options, env) as procs:
        ready()
        _children.go(procs)
        outputs = _children.results(procs, args.duration + 60)
    records = [w for o in outputs for w in o["workers"]]
    # Each process measures its own wall from its go line; the rate is their sum.
    ops = sum(sum(len(w["samples_ns"]) for w in o["workers"]) / o["wall_s"]
              for o in outputs)
    return summary([s for w in records for s in w["samples_ns"]], ops,
                   sum(w["failed"] for w in records), [e for w in records for e in w["errors"]])


def run_threads(dlm: Any, names: list[str], args: argparse.Namespace,
                ready: Callable[[], None]) -> dict[str, Any]:
    out = run_workers(dlm, plans(names, args.workers, 0, 0.0), warmup=args.warmup,
                      duration=args.duration, ready=ready)
    records = out["workers"]
    samples = [s for w in records for s in w["samples_ns"]]
    return summary(samples, len(samples) / out["wall_s"], sum(w["failed"] for w in records),
                   [e for w in records for e in w["errors"]])


# -- what the nodes keep -------------------------------------------------------------------


def key_kind(key: bytes) -> str:
    text = key.decode(errors="replace")
    if text.endswith(":lock"):
        return "lock"
    if text.endswith(":fence"):
        return "fence"
    if text.endswith((":line", ":line-deadlines")):
        return "line"
    return "other"


def node_state(node: Any) -> dict[str, Any]:
    """DBSIZE, INFO memory and keyspace, and the ``redlock:*`` keys by kind (one SCAN)."""
    with node.client(socket_timeout=30) as client:
        kinds: Counter[str] = Counter()
        others: list[str] = []
        for key in client.scan_iter(match=f"{NAMESPACE}:*", count=5000):
            kind = key_kind(key)
            kinds[kind] += 1
            if kind == "other" and len(others) < 4:
                others.append(key.decode(errors="replace"))
        memory = client.info("memory")
        expires = client.info("keyspace").get("db0", {}).get("expires", 0)
        dbsize = client.dbsize()
    return {"dbsize": dbsize, "expires": expires, "used_memory": memory["used_memory"],
            "used_memory_dataset": memory["used_memory_dataset"],
            "kinds": {k: kinds.get(k, 0) for k in ("lock", "fence", "line", "other")},
            "not_redlock": dbsize - sum(kinds.values()), "other_keys": sorted(others)}


def expiring(nodes: Any) -> int:
    """Keys with a TTL on all nodes (``INFO keyspace``: cheap, no SCAN)."""
    total = 0
    for node in nodes:
        with node.client() as client:
            total += client.info("keyspace").get("db0", {}).get("expires", 0)
    return total


def wait_for_expiry(nodes: Any, baseline: int, ttl: float) -> dict[str, Any]:
    """Until the nodes hold no more keys with a TTL than at the baseline (the lock and
    line keys reclaimed, not just expired), at most ``EXPIRY_DEADLINE_S``."""
    time.sleep(ttl)
    started = time.monotonic()
    while True:
        left = expiring(nodes) - baseline
        waited = time.monotonic() - started
        if left <= 0 or waited > EXPIRY_DEADLINE_S:
            return {"waited_s": ttl + waited, "still_expiring": max(left, 0)}
        time.sleep(0.2)


def fill(dlm: Any, names: list[str], threads: int, ttl: float,
         release: bool) -> dict[str, Any]:
    """Lock every name once with ``threads`` threads (each its own share)."""
    failed = [0] * threads
    errors: list[str] = []

    def work(index: int) -> None:
        try:
            for name in names[index::threads]:
                handle = dlm.lock(name, ttl=ttl, timeout=ACQUIRE_TIMEOUT_S)
                if not handle.acquire():
                    failed[index] += 1
                elif release:
                    handle.release()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    return {"names": len(names), "wall_s": wall, "names_s": len(names) / wall,
            "failed": sum(failed), "errors": errors[:3]}


def warm(dlm: Any, threads: int, prefix: str) -> None:
    """Every thread's first cycle (its connections, the scripts): before the baseline."""
    fill(dlm, [f"{prefix}:warm:{i}" for i in range(threads)], threads, TTL_S, True)


def node_table(before: list[dict[str, Any]], after: list[dict[str, Any]],
               names: int) -> str:
    rows = []
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        delta = a["used_memory"] - b["used_memory"]
        kinds = a["kinds"]
        rows.append([
            f"node {i}", f"{b['dbsize']}", f"{a['dbsize']}", f"{a['dbsize'] - b['dbsize']:+d}",
            f"{delta / 1024:+.0f}", f"{delta / names:+.1f}",
            *(str(kinds[k]) for k in ("lock", "fence", "line", "other")),
            str(a["not_redlock"]),
        ])
    others = sorted({k for a in after for k in a["other_keys"]})
    lines = [table(["node", "keys before", "keys after", "keys delta", "used_memory KiB",
                    "B/name", "lock", "fence", "line", "other", "not redlock:*"],
                   rows)]
    lines.append("   (lock/fence/line/other: keys matching redlock:* after, by kind; deltas "
                 "against the baseline; B/name = used_memory delta / names)")
    if others:
        lines.append(f"   'other' keys: {', '.join(others)}")
    return "\n".join(lines)


# -- the sections ------------------------------------------------------------------------


def section_throughput(nodes: Any, args: argparse.Namespace, env: dict[str, str],
                       say: Callable[[str], None]) -> dict[str, Any]:
    from _contention import command_counts

    from redlock import Redlock

    names = throughput_names(args.names)
    runs: dict[str, list[dict[str, Any]]] = {"threads": [], "processes": []}
    with Redlock(nodes.urls) as dlm:
        prime = fill(dlm, names, args.fill_threads, TTL_S, True)
        say(f"   primed: every name locked and released once by {args.fill_threads} thread(s): "
            f"{prime['wall_s']:.1f} s, {prime['names_s']:.0f} names/s"
            f" (failed {prime['failed']})")
        variants = ["threads", "processes"]
        for round_no in range(args.rounds):
            for variant in variants[round_no % 2:] + variants[:round_no % 2]:
                before: Counter[str] = Counter()

                def warmed_up(counts: Counter[str] = before) -> None:
                    counts.update(command_counts(nodes.urls))

                if variant == "threads":
                    result = run_threads(dlm, names, args, warmed_up)
                else:
                    result = run_processes(nodes.urls, args, env, warmed_up)
                delta = command_counts(nodes.urls) - before
                del delta["info"]  # command_counts' own INFO calls
                cycles = result["n"] + result["failed"]
                result["scripts_per_cycle"] = (delta["evalsha"] + delta["eval"]) / cycles
                result["commands_per_cycle"] = sum(delta.values()) / cycles
                result["commands"] = dict(delta.most_common(12))
                runs[variant].append(result)
            say(f"   round {round_no + 1}/{args.rounds} done")
    rows = []
    for variant, label in (("threads", f"1 process x {args.workers} threads, own names"),
                           ("processes", f"{args.procs} processes x {args.threads} threads, "
                                         f"{args.shared_fraction:.0%} on {args.shared_names}"
                                         " shared names")):
        r = runs[variant]
        rows.append([variant, label, spread([x["ops_s"] for x in r]),
                     spread([x["p50_us"] for x in r]), spread([x["p99_us"] for x in r]),
                     f"{sum(x['scripts_per_cycle'] for x in r) / len(r):.2f}",
                     f"{sum(x['commands_per_cycle'] for x in r) / len(r):.1f}",
                     str(sum(x["failed"] for x in r)),
                     "; ".join({e for x in r for e in x["errors"]})[:60] or "-"])
    say(table(["variant", "workers", "acq+rel/s [min-max]", "p50 us [min-max]",
               "p99 us [min-max]", "scripts/cycle", "commands/cycle", "failed", "errors"],
              rows))
    say(f"   ({args.names} names, N={NODES}, {args.rounds} round(s) x {args.duration:g} s"
        " per variant; scripts and commands: summed over the nodes, per measured cycle)")
    return {"prime": prime, **runs}


def section_memory(args: argparse.Namespace, start_nodes: Callable[[], Any],
                   say: Callable[[str], None]) -> dict[str, Any]:
    from redlock import Redlock

    out: dict[str, Any] = {}
    for variant in ("released", "lapsed"):
        names = [f"bench:mem:{variant}:{i}" for i in range(args.mem_names)]
        ttl = TTL_S if variant == "released" else args.lapse_ttl
        nodes = start_nodes()  # fresh ones: the baseline holds nothing of the other variant
        with Redlock(nodes.urls) as dlm:
            warm(dlm, args.fill_threads, f"bench:mem:{variant}")
            before = [node_state(node) for node in nodes]
            filled = fill(dlm, names, args.fill_threads, ttl, release=variant == "released")
            expiry = None
            if variant == "lapsed":
                expiry = wait_for_expiry(nodes, sum(b["expires"] for b in before), ttl)
            after = [node_state(node) for node in nodes]
        out[variant] = {"fill": filled, "expiry": expiry, "before": before, "after": after}
        how = "each released at once"
        if expiry is not None:
            how = (f"none released, TTL {ttl:g} s; waited {expiry['waited_s']:.1f} s for the"
                   f" nodes to reclaim them ({expiry['still_expiring']} still with a TTL)")
        say(f"\n-- {variant}: {args.mem_names} names locked once by {args.fill_threads} thread(s)"
            f" ({filled['wall_s']:.1f} s, {filled['names_s']:.0f} names/s, failed "
            f"{filled['failed']}), {how} --")
        say(node_table(before, after, args.mem_names))
    return out


def section_check(args: argparse.Namespace, start_nodes: Callable[[], Any],
                  say: Callable[[str], None]) -> dict[str, Any]:
    from _contention import command_counts

    from redlock import Redlock

    names = [f"bench:check:{i}" for i in range(args.check_names)]
    ttl = args.lapse_ttl
    nodes = start_nodes()
    with Redlock(nodes.urls) as dlm, Redlock(nodes.urls) as rival_dlm:
        warm(dlm, 1, "bench:check:first")
        warm(rival_dlm, 1, "bench:check:rival")
        before = [node_state(node) for node in nodes]
        counts_before = command_counts(nodes.urls)
        held: queue.Queue[str | None] = queue.Queue()
        outcomes: Counter[str] = Counter()

        def first() -> None:
            try:
                for i, name in enumerate(names):
                    if not dlm.lock(name, ttl=ttl, timeout=ACQUIRE_TIMEOUT_S).acquire():
                        outcomes["first: failed"] += 1
                    elif i % 4 == 0:
                        held.put(name)
            except Exception as exc:
                outcomes[f"first: {type(exc).__name__}: {exc}"[:200]] += 1
            finally:
                held.put(None)

        def rival() -> None:
            while (name := held.get()) is not None:
                try:
                    handle = rival_dlm.lock(name, ttl=ttl, timeout=args.rival_timeout)
                    outcomes["rival: got it (first's key had lapsed)" if handle.acquire()
                             else "rival: refused, gave up"] += 1
                except Exception as exc:
                    outcomes[f"rival: {type(exc).__name__}: {exc}"[:200]] += 1

        started = time.perf_counter()
        threads = [threading.Thread(target=f, daemon=True) for f in (first, rival)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        delta = command_counts(nodes.urls) - counts_before
        expiry = wait_for_expiry(nodes, sum(b["expires"] for b in before), ttl)
        after = [node_state(node) for node in nodes]
    line_ops = {k: delta[k] for k in ("zadd", "zrem", "zrange")}
    say(f"   {args.check_names} names locked once by one thread in {wall:.1f} s, never "
        f"released, TTL {ttl:g} s; every fourth one contended by a second thread (its own "
        f"manager, timeout {args.rival_timeout:g} s): {dict(outcomes)}")
    say(f"   line commands on the nodes during the run: {line_ops}; waited "
        f"{expiry['waited_s']:.1f} s for the keys to be reclaimed "
        f"({expiry['still_expiring']} still with a TTL)")
    say(node_table(before, after, args.check_names))
    rows = []
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        grown = (a["used_memory"] - b["used_memory"]) / 1024
        ok = a["dbsize"] <= KEY_BOUND and grown <= MEMORY_BOUND_KIB
        rows.append([f"node {i}", str(a["dbsize"]), f"{grown:+.0f}",
                     "within" if ok else "EXCEEDED"])
    say(table(["node", "keys", "used_memory KiB more than before",
               f"bound (<= {KEY_BOUND} keys, <= {MEMORY_BOUND_KIB} KiB)"], rows))
    return {"wall_s": wall, "outcomes": dict(outcomes), "line_commands": line_ops,
            "expiry": expiry, "before": before, "after": after}


# -- the run -------------------------------------------------------------------------------


def code_under_test() -> tuple[str, dict[str, str]]:
    """Which ``redlock`` was imported (path, commit, uncommitted changes), and the
    environment that gives the child processes the same one."""
    import redlock

    root = Path(redlock.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "redlock"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", ""
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    text = (f"redlock under test: {root / 'redlock'} (commit {commit}"
            f"{', with uncommitted changes' if dirty else ''})")
    return text, {**os.environ, "PYTHONPATH": path}


def whole_run(overall: dict[str, float], sections: list[dict[str, float]]) -> dict[str, float]:
    """The whole run's load, the redis-servers' share summed from the sections: by the
    end they have gone, reaped by this process (their CPU time is in its children's)."""
    redis = sum(s["redis_cores"] * s["wall_s"] for s in sections) / overall["wall_s"]
    bench = max(0.0, overall["bench_cores"] - redis)
    return {**overall, "redis_cores": redis, "bench_cores": bench,
            "other_cores": max(0.0, overall["machine_cores"] - bench - redis)}


def run(args: argparse.Namespace) -> int:
    configure_logging()
    from redlock.testing import RedisNodes

    code, env = code_under_test()
    print("redlock-fenced: many distinct names" + (" (--quick)" if args.quick else ""))
    machine = [*machine_lines(), code]
    for line in machine:
        print("  " + line)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "quick")}
    print(f"  sections: {' '.join(args.only)}; settings: {json.dumps(settings)}")
    results: dict[str, Any] = {"machine": machine, "args": vars(args)}
    loads: dict[str, dict[str, float]] = {}
    live: list[Any] = []
    monitor = LoadMonitor(lambda: [n.pid for nodes in live for n in nodes if n.pid])
    overall = monitor.snapshot()

    def say(text: str) -> None:
        print(text, flush=True)

    def section(key: str, title: str, body: Callable[[Callable[[], Any]], Any]) -> None:
        """Run a section; the node sets it starts stop once its load has been read
        (the CPU time of a process that has gone is no longer in /proc)."""
        say(f"\n== {title} ==")
        with contextlib.ExitStack() as stack:

            def start_nodes() -> Any:
                nodes = stack.enter_context(RedisNodes(NODES))
                live.append(nodes)
                return nodes

            start = monitor.snapshot()
            results[key] = body(start_nodes)
            loads[key] = monitor.since(start)
            live.clear()
        say(f"   load during this section: {load_text(loads[key])}")

    if "throughput" in args.only:
        section("throughput",
                f"Throughput on {args.names} distinct names, N={NODES}: "
                f"{args.workers} threads / {args.procs} processes x {args.threads} threads",
                lambda start_nodes: section_throughput(start_nodes(), args, env, say))
    if "memory" in args.only:
        section("memory", f"Node memory after {args.mem_names} distinct names, N={NODES}",
                lambda start_nodes: section_memory(args, start_nodes, say))
    if "check" in args.only:
        section("check", f"{args.check_names} distinct names locked once and left to expire,"
                f" a quarter contended, N={NODES}",
                lambda start_nodes: section_check(args, start_nodes, say))
    loads["overall"] = whole_run(monitor.since(overall), list(loads.values()))
    results["loads"] = loads
    print(f"\nwhole run: {load_text(loads['overall'])}")
    print(f"loadavg at end: {loadavg_text()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        print(f"\nraw results written to {args.json}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--names", type=int, help="names of the throughput section (10000)")
    parser.add_argument("--rounds", type=int, help="throughput rounds (3; quick 1)")
    parser.add_argument("--duration", type=float,
                        help="seconds per round and variant (3; quick 1.5)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up cycles per worker")
    parser.add_argument("--workers", type=int, default=8, help="threads of that variant")
    parser.add_argument("--procs", type=int, default=4, help="processes of that variant")
    parser.add_argument("--threads", type=int, default=2, help="threads per process")
    parser.add_argument("--shared-names", type=int, default=20,
                        help="the pool every worker of the processes variant shares")
    parser.add_argument("--shared-fraction", type=float, default=0.25,
                        help="the fraction of its cycles a worker takes from that pool")
    parser.add_argument("--fill-threads", type=int, default=1,
                        help="threads that lock the names of the memory section once "
                             "(more are no faster on 2 cores)")
    parser.add_argument("--mem-names", type=int,
                        help="distinct names of the memory section (100000; quick 10000)")
    parser.add_argument("--check-names", type=int,
                        help="distinct names of the check (20000; quick 4000)")
    parser.add_argument("--lapse-ttl", type=float, default=2.0,
                        help="TTL (s) of the locks left to expire")
    parser.add_argument("--rival-timeout", type=float, default=0.002,
                        help="how long (s) the check's second thread waits for a name")
    parser.add_argument("--json", help="also write raw results to this file")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "child":
    child(json.loads(sys.argv[2]))
elif __name__ == "__main__":
    sys.exit(run(parse_args()))
