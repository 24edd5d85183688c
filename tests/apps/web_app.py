"""A small Starlette service that uses redlock as a web application would: one
``AsyncRedlock`` opened in the app's lifespan and shared by every request.

``create_app(lock_urls, data_url)`` makes it over the lock nodes and a Redis of the
application's own (counter, grants list, fenced store), separate from the lock nodes.
tests/apps/test_web_app.py serves it with a real uvicorn server; by hand:
``APP_LOCK_NODES=redis://...,redis://... APP_DATA_NODE=redis://...
uvicorn --factory tests.apps.web_app:app_from_env``.

Endpoints (each answers 200 on success, else 409 for ``LockNotAcquired`` and its
subclasses, 500 for ``LockLost`` and anything else, with the exception's class and where
it was raised, so the test can count them):

* ``POST /count/{resource}``: under the lock, GET the counter, write it + 1 to the
  fenced store with the lock's token, SET the counter, and append the token to the
  grants list: a lost update shows in the counter, a token out of order in the list;
* ``POST /hold/{resource}?seconds=S``: holds an auto-extended lock (ttl 1 s) for S
  seconds, then ``check()``: the renewal loop must keep it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fencing import AsyncRedisFencedStore
from redlock import AsyncRedlock, LockNotAcquired

# Generous: the line of one resource is served in well under a second when healthy.
ACQUIRE_TIMEOUT = 30.0
COUNT_TTL = 5.0
HOLD_TTL = 1.0  # short, so a 2.5 s hold needs two or three renewals


def counter_key(resource: str) -> str:
    return f"counter:{resource}"


def grants_key(resource: str) -> str:
    return f"grants:{resource}"


def failure(exc: BaseException, where: str) -> JSONResponse:
    # LockNotAcquired (and QuorumUnavailable) is a refusal, LockLost and the rest errors.
    status = 409 if isinstance(exc, LockNotAcquired) else 500
    return JSONResponse({"error": type(exc).__name__, "where": where,
                         "detail": str(exc)[:500]}, status_code=status)


async def count(request: Request) -> JSONResponse:
    dlm: AsyncRedlock = request.app.state.dlm
    data: redis.asyncio.Redis = request.app.state.data
    store: AsyncRedisFencedStore = request.app.state.store
    resource = request.path_params["resource"]
    where = "acquire"
    try:
        async with dlm.lock(resource, ttl=COUNT_TTL, timeout=ACQUIRE_TIMEOUT) as held:
            where = "critical section"
            token = held.token
            # A read-modify-write that only the lock makes safe (no WATCH, no INCR).
            value = int(await data.get(counter_key(resource)) or 0)
            await store.write(resource, token, str(value + 1).encode())
            await data.set(counter_key(resource), value + 1)
            await data.rpush(grants_key(resource), token)
            where = "release"
    except Exception as exc:
        return failure(exc, where)
    return JSONResponse({"token": token})


async def hold(request: Request) -> JSONResponse:
    dlm: AsyncRedlock = request.app.state.dlm
    resource = request.path_params["resource"]
    seconds = float(request.query_params.get("seconds", "2.5"))
    where = "acquire"
    try:
        async with dlm.lock(resource, ttl=HOLD_TTL, auto_extend=True,
                            timeout=ACQUIRE_TIMEOUT) as held:
            where = "hold"
            await asyncio.sleep(seconds)
            where = "check"
            held.check()
            where = "release"
    except Exception as exc:
        return failure(exc, where)
    return JSONResponse({"held": seconds})


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def create_app(lock_urls: list[str], data_url: str) -> Starlette:
    """The app over these lock nodes and this data node. After its lifespan has ended,
    ``app.state.report`` says what was still running once the manager was closed."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The server's own tasks, running before the app opens anything: not ours.
        baseline = asyncio.all_tasks()
        data = redis.asyncio.Redis.from_url(data_url)
        app.state.data = data
        app.state.store = AsyncRedisFencedStore(data)
        try:
            async with AsyncRedlock(lock_urls) as dlm:  # the library's defaults, as an app
                app.state.dlm = dlm
                yield
        finally:
            await data.aclose()
            app.state.report = await _report(baseline)

    return Starlette(routes=[
        Route("/count/{resource}", count, methods=["POST"]),
        Route("/hold/{resource}", hold, methods=["POST"]),
        Route("/health", health),
    ], lifespan=lifespan)


def app_from_env() -> Starlette:
    """For ``uvicorn --factory tests.apps.web_app:app_from_env`` (by hand):
    ``APP_LOCK_NODES`` (comma-separated URLs) and ``APP_DATA_NODE``."""
    return create_app([url for url in os.environ["APP_LOCK_NODES"].split(",") if url],
                      os.environ["APP_DATA_NODE"])


async def _report(baseline: set[asyncio.Task[Any]]) -> dict[str, list[str]]:
    """What is still running once the manager is closed (with a short grace for tasks
    that are finishing): nothing of the library should be."""
    me = asyncio.current_task()
    deadline = time.monotonic() + 3.0

    def left() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks()
                if t is not me and t not in baseline and not t.done()]

    while left() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return {"threads": [t.name for t in threading.enumerate()
                        if t.name.startswith("redlock")],
            "tasks": [f"{t.get_name()}: {t.get_coro()!r}" for t in left()]}
