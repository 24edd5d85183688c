"""Celery tasks guarded by ``@dlm.locked``, for tests/apps/test_celery.py.

    PROC_CELERY_BROKER=redis://.../0 PROC_CELERY_BACKEND=redis://.../1 \\
    PROC_CELERY_COUNTER=redis://.../2 PROC_CELERY_NODES=redis://...,redis://... \\
        celery -A tests.apps.proc_celery_tasks worker --pool prefork -c 2

The manager is built at import time, as task modules do: in the worker's main process,
before the prefork pool forks its children, which inherit it. Celery's defaults are
kept: JSON for task arguments and for results, errors included.

- ``proc.incr``: under ``celery:counter`` (``timeout=30``), read the counter, wait 2 ms,
  write it plus one; returns ``{"value", "token", "pid"}``.
- ``proc.try_busy``: under ``celery:busy`` with ``blocking=False``: raises
  ``LockNotAcquired`` while someone else holds it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery  # type: ignore[import-untyped]

from redlock import Lock, Redlock

app = Celery("proc_celery_tasks", broker=os.environ["PROC_CELERY_BROKER"],
             backend=os.environ["PROC_CELERY_BACKEND"])
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_acks_late=False,
)

dlm = Redlock(os.environ["PROC_CELERY_NODES"].split(","))
counter = redis.Redis.from_url(os.environ["PROC_CELERY_COUNTER"], socket_timeout=10.0)


@app.task(name="proc.incr")  # type: ignore[untyped-decorator]
@dlm.locked("celery:counter", ttl=5.0, timeout=30.0, pass_lock="held")
def incr(*, held: Lock | None = None) -> dict[str, Any]:
    assert held is not None
    value = int(counter.get("celery:count") or 0)
    time.sleep(0.002)
    counter.set("celery:count", value + 1)
    return {"value": value + 1, "token": held.token, "pid": os.getpid()}


@app.task(name="proc.try_busy")  # type: ignore[untyped-decorator]
@dlm.locked("celery:busy", ttl=5.0, blocking=False)
def try_busy() -> str:
    return "ran"
