"""Celery prefork workers running tasks under ``@dlm.locked``
(``tests/apps/proc_celery_tasks.py``), on a real Redis broker and result backend.

A real ``celery worker --pool prefork -c 2`` subprocess (the task module, and so the
manager, imported in the worker's main process before the pool forks), Celery's default
JSON serializers, three real redis-server nodes for the locks and one more for the
broker, the results and the counter. The test process is the Celery client
(``send_task`` by name, ``AsyncResult.get()``).

What must hold:

- 40 increments sent at once, run by two pool processes: the counter ends at exactly
  40, every task saw a distinct value and the tokens increase with the values;
- a task whose lock is held elsewhere (``blocking=False``) fails with
  ``LockNotAcquired``, and the error the client gets back through the result backend
  still says what happened: ``.resource`` is the resource and ``.outcomes`` has one
  ``NodeResult`` per node (a quorum refused, the rest refused or not awaited), as the
  same error raised in-process does. Celery rebuilds exceptions from JSON as
  ``type(*args)``: an error whose details live only in attributes comes back empty;
- the worker shuts down cleanly on SIGTERM: exit code 0, no process left behind.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import celery.exceptions  # type: ignore[import-untyped]
from celery import Celery
from celery.result import AsyncResult  # type: ignore[import-untyped]

from redlock import LockNotAcquired, NodeResult, Outcome, Redlock
from redlock.testing import RedisNodes
from tests.apps.proc_support import PYTHON, REPO_ROOT, AppProcess, alive, child_env, wait_until

TASKS = 40
RESULTS_WITHIN = 60.0  # s for all the increments (a healthy run needs about one)


def describe_error(error: BaseException) -> str:
    return (f"{type(error).__module__}.{type(error).__name__}({error}) "
            f"resource={getattr(error, 'resource', '(none)')!r} "
            f"outcomes={getattr(error, 'outcomes', '(none)')!r}")


def outcome_problems(error: LockNotAcquired, urls: list[str], where: str) -> list[str]:
    """``error`` must name the resource and carry one sensible outcome per node."""
    problems: list[str] = []
    if error.resource != "celery:busy":
        problems.append(f"{where}: .resource is {error.resource!r}, not 'celery:busy'")
    outcomes = list(error.outcomes)
    nodes = sorted(url.removeprefix("redis://") for url in urls)
    if len(outcomes) != len(urls):
        problems.append(f"{where}: {len(outcomes)} outcomes for {len(urls)} nodes: {outcomes!r}")
    elif not all(isinstance(o, NodeResult) for o in outcomes):
        problems.append(f"{where}: outcomes are not NodeResult values: {outcomes!r}")
    else:
        if sorted(o.node for o in outcomes) != nodes:
            problems.append(f"{where}: outcomes name {sorted(o.node for o in outcomes)}, "
                            f"the nodes are {nodes}")
        refused = sum(1 for o in outcomes if o.outcome is Outcome.REFUSED)
        odd = [o for o in outcomes if o.outcome not in (Outcome.REFUSED, Outcome.NOT_AWAITED)]
        if refused < len(urls) // 2 + 1 or odd:
            problems.append(f"{where}: the lock is held on every node, yet the outcomes are "
                            f"{[str(o) for o in outcomes]}")
    return problems


def test_celery_prefork_tasks_under_dlm_locked() -> None:
    """Exact counter from 40 ``@dlm.locked`` increments on a prefork pool of 2, and a
    ``LockNotAcquired`` that survives Celery's JSON result backend with its resource
    and per-node outcomes; clean worker shutdown."""
    problems: list[str] = []
    with RedisNodes(3) as nodes, RedisNodes(1) as service:
        base = service[0].url
        broker, backend, counter_url = f"{base}/0", f"{base}/1", f"{base}/2"
        env = child_env(PROC_CELERY_BROKER=broker, PROC_CELERY_BACKEND=backend,
                        PROC_CELERY_COUNTER=counter_url,
                        PROC_CELERY_NODES=",".join(nodes.urls))
        command = [PYTHON, "-m", "celery", "-A", "tests.apps.proc_celery_tasks", "worker",
                   "--pool", "prefork", "--concurrency", "2", "--loglevel", "INFO",
                   "--without-gossip", "--without-mingle", "--without-heartbeat",
                   "--hostname", f"proc-{service[0].port}@localhost"]
        client = Celery("proc-client", broker=broker, backend=backend)
        holder = Redlock(nodes.urls)
        with holder.lock("celery:warmup", ttl=2.0, timeout=5.0):  # the new cluster is set
            pass  # up before two pool processes race (see tests/apps/test_proc_startup.py)
        with AppProcess(command, env=env, cwd=REPO_ROOT) as worker:
            try:
                ready = wait_until(lambda: " ready." in worker.stderr, 30.0, 0.1)
                assert ready, f"the Celery worker did not start:\n{worker.stderr}"
                pool = worker.tree()
                # -- the counter --------------------------------------------------
                started = time.monotonic()
                sent = [client.send_task("proc.incr") for _ in range(TASKS)]
                results: list[dict[str, Any]] = []
                failures: list[str] = []
                for result in sent:
                    left = max(0.1, started + RESULTS_WITHIN - time.monotonic())
                    try:
                        results.append(result.get(timeout=left))
                    except celery.exceptions.TimeoutError:
                        failures.append("no result in time (hung)")
                    except Exception as error:  # the task failed: say how
                        failures.append(describe_error(error))
                took = time.monotonic() - started
                with service[0].client(db=2) as counter:
                    count = int(counter.get("celery:count") or 0)
                # -- LockNotAcquired through the result backend ----------------------
                blocker = holder.lock("celery:busy", ttl=30.0)
                assert blocker.acquire(blocking=False)

                @holder.locked("celery:busy", ttl=5.0, blocking=False)
                def in_process() -> None:
                    raise AssertionError("the lock is held: this must not run")

                local: LockNotAcquired | None = None
                try:
                    in_process()
                except LockNotAcquired as error:
                    local = error
                remote: BaseException | None = None
                busy: AsyncResult[Any] = client.send_task("proc.try_busy")
                try:
                    busy.get(timeout=30.0)
                except celery.exceptions.TimeoutError as error:
                    remote = error
                except Exception as error:
                    remote = error
                blocker.release()
            finally:
                worker.signal(signal.SIGTERM)  # warm shutdown
                code = worker.wait(20.0)
                leftovers = [pid for pid in worker.tree() + pool if alive(pid)]
                client.close()
                holder.close()
            log = worker.stderr

    if failures:
        problems.append(f"{len(failures)} of {TASKS} increments failed: {failures[:3]}")
    values = sorted(r["value"] for r in results)
    if count != len(results) or (not failures and count != TASKS):
        problems.append(f"counter is {count} after {len(results)} successful increments of "
                        f"{TASKS} sent")
    if values != list(range(1, len(results) + 1)):
        problems.append(f"increments did not see distinct consecutive values: {values}")
    tokens = [r["token"] for r in sorted(results, key=lambda r: r["value"])]
    if tokens != sorted(set(tokens)):
        problems.append(f"tokens do not increase with the counter's values: {tokens}")
    # The in-process error is the yardstick: what the library itself reports.
    assert local is not None, "the in-process call was not refused"
    yardstick = outcome_problems(local, nodes.urls, "in-process")
    assert not yardstick, "\n".join(yardstick)
    if not isinstance(remote, LockNotAcquired):
        problems.append("the task refused its lock, but the client got "
                        + (describe_error(remote) if remote else "no error at all"))
    else:
        problems += outcome_problems(remote, nodes.urls, "through Celery's result backend")
    if code != 0:
        problems.append(f"the worker exited with {code} after SIGTERM")
    if leftovers:
        problems.append(f"processes left after the worker exited: {leftovers}")
    if "Traceback" in log and "LockNotAcquired" not in log:
        problems.append("the worker's log shows a traceback")
    pids = sorted({r["pid"] for r in results})
    assert not problems, (f"{len(results)} increments in {took:.1f} s by pool processes "
                          f"{pids}; in-process error: {describe_error(local)}\n"
                          + "\n".join(problems) + "\nworker log (tail):\n" + log[-3000:])
