"""A scheduled job run by several workers: each scheduled run executes exactly once.

    python -m examples.scheduled_job          # starts its own local redis-server nodes
    python examples/scheduled_job.py --workers 4 --runs 6

Every worker has the same schedule and fires at every tick. For each run id it tries
the lock ``job:<run id>`` without waiting: a worker that does not get it skips the run
(someone else is running it). The worker that gets it raises the run record's fence to
its token and reads it: a record means the run already happened (a late worker arriving
after the first one finished and released the lock), so it skips; otherwise it runs
the job and writes the record with its token.

In the demo the workers are separate processes (as on separate machines), and one
worker's clock is deliberately late, so it always arrives after the run is done: the
lock alone (already released) would let it run the job a second time; the record stops
it. It exits non-zero unless every run executed exactly once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from fencing import RedisFencedStore, StaleTokenError
from redlock import Redlock

if __package__:
    from examples import _common as common
else:  # python examples/scheduled_job.py
    import _common as common  # type: ignore[no-redef, import-not-found]

# -- The part to copy -----------------------------------------------------------------------
# One lock manager and one fenced store per worker process:
#     dlm = Redlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"])
#     store = RedisFencedStore(redis.Redis.from_url("redis://data:6379"))


def run_once(dlm: Redlock, store: RedisFencedStore, run_id: str, worker: str,
             job: Callable[[], None]) -> dict[str, Any]:
    """Run ``job`` for the scheduled run ``run_id`` unless another worker is running it
    or already ran it."""
    lock = dlm.lock(f"job:{run_id}", ttl=5.0, blocking=False)
    if not lock.acquire():
        return {"outcome": "skipped: lock busy"}
    try:
        token = lock.token
        record = store.fence(f"job:{run_id}", token)  # raise the fence, then read
        if record is not None:
            return {"outcome": f"skipped: already done by {json.loads(record)['by']}"}
        job()
        store.write(f"job:{run_id}", token, json.dumps({"by": worker, "token": token}).encode())
        return {"outcome": "ran", "token": token}
    except StaleTokenError as exc:  # our lock expired and a newer holder took the run
        return {"outcome": f"stale: {exc}"}
    finally:
        lock.release()


# -- The demo around it (the harness is in examples/_common.py) -----------------------------

EXECUTIONS = "job:executions"  # run id -> how many times the job body ran


def run_id(tick: int) -> str:
    return f"nightly-report#{tick + 1}"


def worker(values: list[str], lock_urls: list[str]) -> None:
    """A worker process (``NAME LATE RUNS INTERVAL STORE_URL``): at each tick, try to run
    that tick's job; the job itself counts its executions and takes a while."""
    name, late, runs, interval, store_url = values
    with common.clients(lock_urls, store_url) as (dlm, store):
        start = time.monotonic()
        for tick in range(int(runs)):
            time.sleep(max(0.0, start + tick * float(interval) + float(late) - time.monotonic()))
            job = run_id(tick)

            def body(job: str = job) -> None:
                store.client.hincrby(EXECUTIONS, job, 1)
                time.sleep(0.05)

            common.emit(worker=name, run=job, **run_once(dlm, store, job, name, body))


def run(args: argparse.Namespace, lock_urls: list[str], store_url: str) -> int:
    workers, runs, interval = args.workers, args.runs, args.interval
    late = interval / 2
    names = [f"worker-{i + 1}" for i in range(workers)]
    with common.fenced_store(store_url) as store:
        store.client.delete(EXECUTIONS, *(store.key(f"job:{run_id(t)}") for t in range(runs)))
        print(f"{workers} worker processes, {runs} scheduled runs, one tick every "
              f"{interval * 1000:.0f} ms; {names[-1]}'s clock is {late * 1000:.0f} ms late")
        helpers = common.Helpers(__file__, lock_urls, [
            [name, str(late if i == workers - 1 else 0.0), str(runs), str(interval), store_url]
            for i, name in enumerate(names)])
        try:
            helpers.go()
            results = helpers.results()
        finally:
            helpers.close()
        executions = {common.text(key): int(value)
                      for key, value in store.client.hgetall(EXECUTIONS).items()}

    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        by_run[result["run"]].append(result)
    ok = len(results) == workers * runs
    for tick in range(runs):
        job = run_id(tick)
        entries = by_run[job]
        ran = [e for e in entries if e["outcome"] == "ran"]
        skipped = Counter(e["outcome"].split(" by ")[0] for e in entries if e["outcome"] != "ran")
        count = executions.get(job, 0)
        ok = ok and count == 1 and len(ran) == 1
        runner = f"{ran[0]['worker']} (token {ran[0]['token']})" if len(ran) == 1 else \
            ", ".join(e["worker"] for e in ran) or "nobody"
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        print(f"  {job}: executed {count} time(s), by {runner}; others {reasons}")
    late_worker = [r["outcome"] for r in results if r["worker"] == names[-1]]
    print(f"the late worker {names[-1]}: " + "; ".join(sorted(set(late_worker))))
    return common.verdict(ok, f"each of the {runs} scheduled runs executed exactly once "
                              f"across {workers} workers")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--interval", type=float, default=0.25, help="seconds between ticks")


def check(args: argparse.Namespace) -> str | None:
    return "--workers must be at least 2" if args.workers < 2 else None


if __name__ == "__main__":
    sys.exit(common.main(__doc__, run, options=options, check=check, child=worker))
