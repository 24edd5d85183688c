"""The lock family (docs/design.md §12): what each primitive costs, against floors, and
how fast an election fails over.

    PYTHONPATH=. .venv/bin/python benchmarks/family.py            # full run (~2 min)
    PYTHONPATH=. .venv/bin/python benchmarks/family.py --quick    # smoke run (~30 s)
    PYTHONPATH=. .venv/bin/python benchmarks/family.py --only failover --trials 10

Starts its own redis-server processes (``RedisNodes``: loopback, no persistence) and
stops them at the end; prints a table per section and asserts nothing.

* ``uncontended``: one thread, acquire+release cycles of one name, N = 1, 3, 5: our
  mutex, election (campaign + resign), semaphore (3 permits), read, write; each against
  its **floor**: the same Lua scripts sent to every node by EVALSHA and nothing else
  (``benchmarks/_family_floors.py``), and against our mutex. Rounds interleave the
  cases (order rotated), p50 and p90 per case over all rounds.
* ``contended``: N = 3, 8 threads for ``--duration`` s each, 1 ms held: the mutex (all
  on one name), the semaphore of 3 permits, and its floor, 3 mutexes with thread i on
  mutex i mod 3 (a semaphore cannot do better than K independent locks); the read-write
  lock with 6 readers and 2 writers, against the mutex with the same 8 threads.
* ``failover``: N = 5, 3 candidate processes campaign; the leader is frozen (SIGSTOP)
  and the time until another candidate is elected is measured (one CLOCK_MONOTONIC for
  all processes), per TTL, as a multiple of the TTL.

No Python peer offers these primitives over Redis to compare with: redis-py,
python-redis-lock, pottery and aioredlock offer a mutex only (pottery also a Redlock,
no semaphore, read-write lock or election).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- uncontended --------------------------------------------------------------------------


def uncontended(args: argparse.Namespace) -> None:
    from benchmarks._family_floors import KindFloor
    from redlock import Redlock
    from redlock._core.kinds import MUTEX, READ, WRITE, Leadership, Permit
    from redlock.testing import RedisNodes

    print("\n## Uncontended acquire+release, one thread (µs per cycle)\n")
    print("| N | case | p50 | p90 | x its floor | x our mutex |")
    print("|---|---|---|---|---|---|")
    for n in (1, 3, 5):
        with RedisNodes(n) as nodes, Redlock(nodes.urls) as dlm:
            election = dlm.election("u:e", ttl=10.0, identity="me")
            cases: dict[str, Callable[[], None]] = {}

            def cycle(handle: Any) -> Callable[[], None]:
                def run() -> None:
                    handle.acquire()
                    handle.release()
                return run

            cases["lock"] = cycle(dlm.lock("u:l", ttl=10.0))
            cases["election"] = cycle(election.campaign())
            cases["semaphore"] = cycle(dlm.semaphore("u:s", permits=3, ttl=10.0))
            rw = dlm.rwlock("u:rw", ttl=10.0)
            cases["read"] = cycle(rw.read())
            cases["write"] = cycle(rw.write())
            floors = {"lock": MUTEX, "election": Leadership(identity="me"),
                      "semaphore": Permit(permits=3), "read": READ, "write": WRITE}
            floor_objects = {name: KindFloor(nodes.urls, kind, f"u:floor:{name}")
                             for name, kind in floors.items()}
            for name, floor in floor_objects.items():
                cases[f"floor {name}"] = floor.cycle
            samples: dict[str, list[float]] = {name: [] for name in cases}
            names = list(cases)
            for name in names:  # warm up: connections, scripts, the nodes' markers
                for _ in range(20):
                    cases[name]()
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    case = cases[name]
                    for _ in range(args.cycles):
                        t0 = time.perf_counter()
                        case()
                        samples[name].append(time.perf_counter() - t0)
            for floor in floor_objects.values():
                floor.close()
            lock_p50 = _p(samples["lock"], 0.5)
            for name in ("lock", "election", "semaphore", "read", "write"):
                p50, p90 = _p(samples[name], 0.5), _p(samples[name], 0.9)
                floor_p50 = _p(samples[f"floor {name}"], 0.5)
                print(f"| {n} | {name} | {p50 * 1e6:.0f} | {p90 * 1e6:.0f} |"
                      f" {p50 / floor_p50:.2f} ({floor_p50 * 1e6:.0f}) |"
                      f" {p50 / lock_p50:.2f} |")


# -- contended ----------------------------------------------------------------------------


def _threads(count: int, duration: float, body: Callable[[int, Callable[[], bool]], int]
             ) -> list[int]:
    stop = time.monotonic() + duration
    done = [0] * count

    def run(i: int) -> None:
        done[i] = body(i, lambda: time.monotonic() < stop)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 60)
    return done


def contended(args: argparse.Namespace) -> None:
    from redlock import Redlock
    from redlock.testing import RedisNodes

    print(f"\n## Contended, N=3, 8 threads, 1 ms held, {args.duration:g} s per case\n")
    print("| case | grants/s | per thread (min-max) | note |")
    print("|---|---|---|---|")
    with RedisNodes(3) as nodes, Redlock(nodes.urls, retry_delay_max=0.05) as dlm:
        def holder(make: Callable[[int], Any]) -> Callable[[int, Callable[[], bool]], int]:
            def body(i: int, going: Callable[[], bool]) -> int:
                handle, count = make(i), 0
                while going():
                    if handle.acquire(timeout=10.0):
                        time.sleep(0.001)
                        handle.release()
                        count += 1
                return count
            return body

        cases = {
            "mutex, one name": (holder(lambda i: dlm.lock("c:one", ttl=5.0)), ""),
            "semaphore, 3 permits": (holder(lambda i: dlm.semaphore("c:sem", permits=3,
                                                                    ttl=5.0)), ""),
            "floor: 3 mutexes, thread i on i mod 3": (
                holder(lambda i: dlm.lock(f"c:three:{i % 3}", ttl=5.0)), ""),
        }
        rw = dlm.rwlock("c:rw", ttl=5.0)
        cases["rwlock, 6 readers + 2 writers"] = (
            holder(lambda i: rw.read() if i < 6 else rw.write()), "readers 0-5, writers 6-7")
        cases["mutex, same 8 threads"] = (holder(lambda i: dlm.lock("c:rwref", ttl=5.0)), "")
        for name, (body, note) in cases.items():
            done = _threads(8, args.duration, body)
            extra = note
            if name.startswith("rwlock"):
                extra = (f"reads {sum(done[:6]) / args.duration:.0f}/s,"
                         f" writes {sum(done[6:]) / args.duration:.0f}/s")
            print(f"| {name} | {sum(done) / args.duration:.0f} | {min(done)}-{max(done)} |"
                  f" {extra} |")


# -- failover -------------------------------------------------------------------------------


def child(options: dict[str, Any]) -> None:
    """A candidate: campaign for ever; announce each election (pid, term, when)."""
    from redlock import LockLost, Redlock

    print("ready", flush=True)
    with Redlock(options["urls"], node_timeout=0.25) as dlm:
        election = dlm.election("failover", ttl=options["ttl"], identity=str(os.getpid()))
        while True:
            try:
                with election.campaign() as lead:
                    print(json.dumps({"pid": os.getpid(), "term": lead.token,
                                      "at": time.monotonic()}), flush=True)
                    while True:
                        time.sleep(0.02)
                        lead.check()
            except LockLost:
                continue


def failover(args: argparse.Namespace) -> None:
    from redlock.testing import RedisNodes

    print(f"\n## Leader failover, N=5, 3 candidate processes, the leader frozen (SIGSTOP),"
          f" {args.trials} trials per TTL\n")
    print("| TTL | median s | max s | median x TTL | max x TTL | terms |")
    print("|---|---|---|---|---|---|")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with RedisNodes(5) as nodes:
        for ttl in (0.5, 1.0, 2.0):
            times, terms = _failover_trials(nodes.urls, ttl, args.trials, env)
            rising = all(a < b for a, b in itertools.pairwise(terms))
            print(f"| {ttl:g} s | {statistics.median(times):.2f} | {max(times):.2f} |"
                  f" {statistics.median(times) / ttl:.2f} | {max(times) / ttl:.2f} |"
                  f" {'strictly increasing' if rising else 'NOT increasing: ' + str(terms)} |")


def _failover_trials(urls: list[str], ttl: float, trials: int, env: dict[str, str]
                     ) -> tuple[list[float], list[int]]:
    """Seconds from freezing the leader to the next election, per trial; the terms."""
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    procs: list[subprocess.Popen[str]] = []

    def read(stdout: Any) -> None:
        for line in stdout:
            events.put(json.loads(line))

    def spawn() -> None:
        proc = subprocess.Popen([sys.executable, __file__, "child",
                                 json.dumps({"urls": urls, "ttl": ttl})],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        procs.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("candidate did not start")
        threading.Thread(target=read, args=(proc.stdout,), daemon=True).start()

    times, terms = [], []
    try:
        for _ in range(3):
            spawn()
        leader = events.get(timeout=30)
        terms.append(leader["term"])
        for _ in range(trials):
            frozen = leader["pid"]
            time.sleep(0.2)  # the term has been renewed at least once
            froze_at = time.monotonic()
            os.kill(frozen, signal.SIGSTOP)
            leader = events.get(timeout=30 + 10 * ttl)
            times.append(leader["at"] - froze_at)
            terms.append(leader["term"])
            os.kill(frozen, signal.SIGKILL)  # a third candidate takes its place
            spawn()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return times, terms


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=("uncontended", "contended", "failover"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.cycles, args.duration, args.trials = 2, 100, 1.0, 2
    import logging
    logging.getLogger("redlock").setLevel(logging.ERROR)
    import redlock
    print(f"redlock from {Path(redlock.__file__).parent}, python {sys.version.split()[0]},"
          f" {os.cpu_count()} CPUs")
    for section in args.only or ("uncontended", "contended", "failover"):
        {"uncontended": uncontended, "contended": contended, "failover": failover}[section](args)


if __name__ == "__main__":
    main()
