"""A WSGI application that builds its lock manager at import time, as web apps do, for
``gunicorn --preload`` (tests/apps/test_gunicorn.py).

    PROC_WSGI_NODES=redis://...,redis://... PROC_WSGI_COUNTER=redis://... \\
        gunicorn --preload tests.apps.proc_wsgi_app:app

With ``--preload`` the master imports this module (so the manager is created, and used
once, in the master) and then forks its workers, which all inherit it.

- ``GET /incr``: under ``wsgi:counter`` (ttl 5 s, ``timeout=30``), read the counter from
  a separate Redis, wait 2 ms (a real read-modify-write window), write it back plus
  one; answers ``{"value", "token", "pid"}``. Only the lock keeps the count exact.
- ``GET /hold?n=<i>``: hold ``wsgi:hold:<i>`` auto-extended (ttl 1 s) for 2.5 s,
  checking it every 250 ms; answers ``{"token", "checks", "pid"}``, or 409 with
  ``LockLost: ...`` when the lock was lost.
- ``GET /pid``: the worker's pid (readiness).

A lock error answers 503 with the exception's type and message; anything else 500
with the traceback, so the test can say what went wrong in which worker.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

import redis

from redlock import LockLost, Redlock, RedlockError

NODES = os.environ["PROC_WSGI_NODES"].split(",")
COUNTER_URL = os.environ["PROC_WSGI_COUNTER"]
HOLD = 2.5

dlm = Redlock(NODES)
with dlm.lock("wsgi:startup", ttl=2.0, timeout=10.0):  # used once, before workers fork
    pass
counter = redis.Redis.from_url(COUNTER_URL, socket_timeout=10.0)  # connects lazily

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def incr() -> dict[str, Any]:
    with dlm.lock("wsgi:counter", ttl=5.0, timeout=30.0) as held:
        value = int(counter.get("wsgi:count") or 0)
        time.sleep(0.002)
        counter.set("wsgi:count", value + 1)
        return {"value": value + 1, "token": held.token, "pid": os.getpid()}


def hold(n: str) -> dict[str, Any]:
    checks = 0
    with dlm.lock(f"wsgi:hold:{n}", ttl=1.0, auto_extend=True, timeout=30.0) as held:
        token = held.token
        until = time.monotonic() + HOLD
        while time.monotonic() < until:
            time.sleep(0.25)
            held.check()
            checks += 1
    return {"token": token, "checks": checks, "pid": os.getpid()}


def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    query = parse_qs(environ.get("QUERY_STRING", ""))
    try:
        if path == "/incr":
            status, body = "200 OK", json.dumps(incr())
        elif path == "/hold":
            status, body = "200 OK", json.dumps(hold(query.get("n", ["0"])[0]))
        elif path == "/pid":
            status, body = "200 OK", json.dumps({"pid": os.getpid()})
        else:
            status, body = "404 Not Found", path
    except LockLost as error:
        status, body = "409 Conflict", f"LockLost: {error}"
    except RedlockError as error:
        status, body = "503 Service Unavailable", f"{type(error).__name__}: {error}"
    except Exception:
        status, body = "500 Internal Server Error", traceback.format_exc()
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain"),
                            ("Content-Length", str(len(data)))])
    return [data]
