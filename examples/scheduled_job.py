"""A scheduled job run by several workers: each scheduled run executes exactly once.

    python -m examples.scheduled_job          # starts its own local redis-server nodes
    python examples/scheduled_job.py --workers 4 --runs 6

Every worker (a separate process, as on separate machines) has the same schedule
and fires at every tick. For each run id it tries the lock ``job:<run id>``
without waiting: a worker that does not get it skips the run (someone else is
running it). The worker that gets it raises the run record's fence to its token
and reads it: a record means the run already happened (a late worker arriving
after the first one finished and released the lock), so it skips; otherwise it
runs the job and writes the record with its token.

One worker's clock is deliberately late, so it always arrives after the run is
done: the lock alone (already released) would let it run the job a second time;
the record stops it. Exits non-zero unless every run executed exactly once.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from typing import Any

import redis

if __package__:
    from examples import _common as common
else:  # python examples/scheduled_job.py
    import _common as common  # type: ignore[no-redef]

from fencing import RedisFencedStore, StaleTokenError
from redlock import Redlock

EXECUTIONS = "job:executions"  # run id -> how many times the job body ran


def run_id(tick: int) -> str:
    return f"nightly-report#{tick + 1}"


def worker(name: str, late: float, runs: int, interval: float, store_url: str,
           lock_urls: list[str]) -> None:
    """A worker process: at each tick, try to run that tick's job."""
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    with Redlock(lock_urls) as dlm:
        start = time.monotonic()
        for tick in range(runs):
            time.sleep(max(0.0, start + tick * interval + late - time.monotonic()))
            job = run_id(tick)
            lock = dlm.lock(f"job:{job}", ttl=5.0, blocking=False)
            if not lock.acquire():
                common.emit(worker=name, run=job, outcome="skipped: lock busy")
                continue
            try:
                token = lock.token
                record = store.fence(f"job:{job}", token)  # raise the fence, then read
                if record is not None:
                    by = json.loads(record)["by"]
                    common.emit(worker=name, run=job, outcome=f"skipped: already done by {by}")
                    continue
                client.hincrby(EXECUTIONS, job, 1)  # the job itself
                time.sleep(0.05)
                store.write(f"job:{job}", token, json.dumps({"by": name, "token": token}).encode())
                common.emit(worker=name, run=job, outcome="ran", token=token)
            except StaleTokenError as exc:
                common.emit(worker=name, run=job, outcome=f"stale: {exc}")
            finally:
                lock.release()
    client.close()


def run(lock_urls: list[str], store_url: str, workers: int, runs: int,
        interval: float) -> int:
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    client.delete(EXECUTIONS, *(store.key(f"job:{run_id(t)}") for t in range(runs)))
    late = interval / 2
    names = [f"worker-{i + 1}" for i in range(workers)]
    print(f"{workers} worker processes, {runs} scheduled runs, one tick every "
          f"{interval * 1000:.0f} ms; {names[-1]}'s clock is {late * 1000:.0f} ms late")
    helpers = common.Helpers(__file__, [
        [name, str(late if i == workers - 1 else 0.0), str(runs), str(interval), store_url,
         "--", *lock_urls] for i, name in enumerate(names)])
    try:
        helpers.go()
        results = helpers.results()
    finally:
        helpers.close()
    executions = {key.decode(): int(value) for key, value in client.hgetall(EXECUTIONS).items()}
    client.close()

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        split = argv.index("--")
        name, late, runs, interval, store_url = argv[1:split]
        common.quiet_logging()
        common.child_handshake()
        worker(name, float(late), int(runs), float(interval), store_url, argv[split + 1:])
        return 0
    p = common.parser(__doc__)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--interval", type=float, default=0.25, help="seconds between ticks")
    args = p.parse_args(argv)
    if args.workers < 2:
        p.error("--workers must be at least 2")
    common.quiet_logging()
    with common.redis_nodes(args.urls, args.store_url) as (lock_urls, store_url):
        return run(lock_urls, store_url, args.workers, args.runs, args.interval)


if __name__ == "__main__":
    sys.exit(main())
