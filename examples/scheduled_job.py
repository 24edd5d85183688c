"""A scheduled job run by a fleet: one leader runs the schedule, the others stand by.

    python -m examples.scheduled_job          # starts its own local redis-server nodes
    python examples/scheduled_job.py --workers 3 --runs 6

Every worker campaigns in the election ``nightly-scheduler`` (``dlm.election``): one is
elected, the others wait in its line. The leader runs each scheduled run when it is due,
fenced by its term: it raises the run record's fence to the term and reads it first (a
record means the run already happened, under an earlier leader), runs the job, and
writes the record with the term. A leader that dies stops renewing its term; once the
term lapses (its TTL, 1 s here) the next in line is elected with a larger term and
catches up on the runs that fell due, skipping those already recorded.

In the demo the workers are separate processes (as on separate machines), and the
first leader dies abruptly (no resignation) after two runs. The demo exits non-zero
unless every run executed exactly once and the terms only went up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from fencing import RedisFencedStore, StaleTokenError
from redlock import LockNotAcquired

if __package__:
    from examples import _common as common
else:  # python examples/scheduled_job.py
    import _common as common  # type: ignore[no-redef, import-not-found]

TERM_TTL = 1.0  # how long a dead leader's term outlives it

# -- The part to copy -----------------------------------------------------------------------
# One lock manager and one fenced store per worker process:
#     dlm = Redlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"])
#     store = RedisFencedStore(redis.Redis.from_url("redis://data:6379"))
#     with dlm.election("nightly-scheduler", ttl=1.0).campaign() as leadership:
#         ... while leading: run_once(store, run_id, me, leadership.token, job)


def run_once(store: RedisFencedStore, run_id: str, worker: str, term: int,
             job: Callable[[], None]) -> dict[str, Any]:
    """Run ``job`` for the scheduled run ``run_id`` as the leader of ``term``, unless it
    already ran (under this or an earlier term)."""
    try:
        record = store.fence(f"job:{run_id}", term)  # raise the fence, then read
        if record is not None:
            return {"outcome": f"skipped: already done by {json.loads(record)['by']}"}
        job()
        store.write(f"job:{run_id}", term, json.dumps({"by": worker, "term": term}).encode())
        return {"outcome": "ran", "term": term}
    except StaleTokenError as exc:  # our term ended: a newer leader took over
        return {"outcome": f"stale: {exc}"}


# -- The demo around it (the harness is in examples/_common.py) -----------------------------

EXECUTIONS = "job:executions"  # run id -> how many times the job body ran


def run_id(tick: int) -> str:
    return f"nightly-report#{tick + 1}"


def worker(values: list[str], lock_urls: list[str]) -> None:
    """A worker process (``NAME RUNS INTERVAL STORE_URL DIES_AFTER DELAY``): campaign
    (after ``DELAY`` s); while leading, run each due run; die after ``DIES_AFTER`` runs
    (0: never)."""
    name, runs, interval, store_url, dies_after, delay = values
    with common.clients(lock_urls, store_url) as (dlm, store):
        start = time.monotonic()
        time.sleep(float(delay))
        election = dlm.election("nightly-scheduler", ttl=TERM_TTL, identity=name)
        last_due = start + (int(runs) - 1) * float(interval)
        try:
            with election.campaign(timeout=last_due + 10 * TERM_TTL - time.monotonic()) as lead:
                common.emit(worker=name, elected=lead.token, at=round(time.monotonic() - start, 3))
                ran = 0
                for tick in range(int(runs)):
                    time.sleep(max(0.0, start + tick * float(interval) - time.monotonic()))
                    job = run_id(tick)

                    def body(job: str = job) -> None:
                        store.client.hincrby(EXECUTIONS, job, 1)
                        time.sleep(0.05)

                    result = run_once(store, job, name, lead.token, body)
                    common.emit(worker=name, run=job, **result)
                    ran += result["outcome"] == "ran"
                    if int(dies_after) and ran == int(dies_after):
                        common.emit(worker=name, died=round(time.monotonic() - start, 3))
                        os._exit(0)  # dies abruptly: no resignation, its term lapses
        except LockNotAcquired:
            common.emit(worker=name, outcome="never elected")


def run(args: argparse.Namespace, lock_urls: list[str], store_url: str) -> int:
    workers, runs, interval = args.workers, args.runs, args.interval
    names = [f"worker-{i + 1}" for i in range(workers)]
    with common.fenced_store(store_url) as store:
        store.client.delete(EXECUTIONS, *(store.key(f"job:{run_id(t)}") for t in range(runs)))
        print(f"{workers} worker processes campaign to run {runs} scheduled runs, one every"
              f" {interval * 1000:.0f} ms; the first leader dies after 2 runs")
        helpers = common.Helpers(__file__, lock_urls, [
            [name, str(runs), str(interval), store_url, "2" if i == 0 else "0",
             "0" if i == 0 else "0.1"] for i, name in enumerate(names)])
        try:
            helpers.go()
            results = helpers.results()
        finally:
            helpers.close()
        executions = {common.text(key): int(value)
                      for key, value in store.client.hgetall(EXECUTIONS).items()}

    elected = sorted((r["at"], r["elected"], r["worker"]) for r in results if "elected" in r)
    died = [r for r in results if "died" in r]
    terms = [term for _, term, _ in elected]
    ok = terms == sorted(set(terms))
    for at, term, who in elected:
        print(f"  {who} elected at {at:.2f} s, term {term}")
    if died and len(elected) > 1:
        print(f"  {died[0]['worker']} died at {died[0]['died']:.2f} s; the next leader was"
              f" elected {elected[1][0] - died[0]['died']:.2f} s later (term TTL"
              f" {TERM_TTL:.1f} s)")
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        if "run" in result:
            by_run[result["run"]].append(result)
    for tick in range(runs):
        job = run_id(tick)
        ran = [e for e in by_run[job] if e["outcome"] == "ran"]
        count = executions.get(job, 0)
        ok = ok and count == 1 and len(ran) == 1
        runner = ", ".join(f"{e['worker']} (term {e['term']})" for e in ran) or "nobody"
        print(f"  {job}: executed {count} time(s), by {runner}")
    return common.verdict(ok, f"each of the {runs} scheduled runs executed exactly once,"
                              f" under {len(elected)} successive leaders")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--interval", type=float, default=0.25, help="seconds between ticks")


def check(args: argparse.Namespace) -> str | None:
    return "--workers must be at least 2" if args.workers < 2 else None


if __name__ == "__main__":
    sys.exit(common.main(__doc__, run, options=options, check=check, child=worker))
