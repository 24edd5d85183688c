"""A process that holds auto-extended locks while it is busy the ordinary way (run by
tests/apps/test_busy_renewals.py, which watches the keys on the nodes meanwhile).

    python -m tests.apps.proc_busy_holder MODE SECONDS LOCKS URL [URL ...]

MODE:

- ``asyncio`` / ``uvloop``: one coroutine computes in chunks with ``await asyncio.sleep(0)``
  between them, on the default loop or on uvloop (what ``uvicorn[standard]`` installs);
- ``sync``: four threads hold the locks; one of them computes in chunks with a
  zero-timeout ``select()`` between them (any loop that polls a socket), the others wait;
- ``web``: a Starlette app under uvicorn holds them (acquired in its lifespan) while the
  test loads it over HTTP to saturation (each request computes in chunks and yields);
  it stops when a line ``stop`` comes on stdin.

The chunks cycle through 0.1, 1, 3 and 10 ms, a quarter of the time each. Prints
``held <port or ->`` once every lock is held, then one JSON line ``result {...}``: how
many locks were reported lost (``check()``, ``on_lost``, ``redlock.lost``), and how late
the renewals went out (``redlock.renewed``: p50, p99, max in ms).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import socket
import sys
import threading
import time
from typing import Any

from redlock import AsyncRedlock, Redlock

CHUNKS = (0.0001, 0.001, 0.003, 0.01)
TTL = 1.0
HOLDERS = 4  # sync: threads holding the locks, the first one busy


class Renewals(logging.Handler):
    """The renewal lateness and the losses the library logs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.late: list[float] = []
        self.bridged: list[float] = []  # renewals by the holder's own bridge (§5.2)
        self.lost = 0
        self.said: dict[str, str] = {}  # the first message of each warning event

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", "")
        if event == "redlock.renewed":  # (the renewer's records keep its process id)
            into = self.bridged if record.process == os.getpid() else self.late
            into.append(float(record.late_ms))  # type: ignore[attr-defined]
        elif event == "redlock.lost":
            self.lost += 1
        if record.levelno >= logging.WARNING:
            self.said.setdefault(str(event), record.getMessage()[:400])

    def figures(self) -> dict[str, Any]:
        late = sorted(self.late)
        if not late:
            return {"renewals": 0, "said": self.said}

        def at(q: float) -> float:
            return round(late[min(len(late) - 1, int(q * len(late)))], 1)
        return {"renewals": len(late), "late_p50_ms": at(0.5), "late_p99_ms": at(0.99),
                "late_max_ms": round(late[-1], 1), "bridged": len(self.bridged),
                "bridged_late_max_ms": round(max(self.bridged, default=0.0), 1),
                "said": self.said}


def chunk_at(started: float, seconds: float) -> float:
    """The work chunk for now: each of CHUNKS for a quarter of the run."""
    part = int((time.monotonic() - started) / seconds * len(CHUNKS))
    return CHUNKS[min(part, len(CHUNKS) - 1)]


def compute(chunk: float) -> None:
    until = time.perf_counter() + chunk
    while time.perf_counter() < until:
        pass


def report(renewals: Renewals, lost_checks: int, on_lost: int) -> None:
    print("result " + json.dumps({"lost_checks": lost_checks, "on_lost": on_lost,
                                  "lost_events": renewals.lost, **renewals.figures()}),
          flush=True)


async def run_async(seconds: float, count: int, urls: list[str], renewals: Renewals) -> None:
    lost: list[object] = []
    async with AsyncRedlock(urls) as dlm:
        locks = [dlm.lock(f"busy:{i}", ttl=TTL, auto_extend=True, on_lost=lost.append)
                 for i in range(count)]
        for lock in locks:
            assert await lock.acquire(timeout=10)
        print("held -", flush=True)
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            compute(chunk_at(started, seconds))
            await asyncio.sleep(0)
        lost_checks = 0
        for lock in locks:
            if not lock.locked():
                lost_checks += 1
        for lock in locks:
            if lock.locked():
                await lock.release()
        report(renewals, lost_checks, len(lost))


def run_sync(seconds: float, count: int, urls: list[str], renewals: Renewals) -> None:
    lost: list[object] = []
    lost_checks = [0]
    with Redlock(urls) as dlm:
        held = threading.Barrier(HOLDERS + 1)
        done = threading.Event()

        def holder(index: int) -> None:
            locks = [dlm.lock(f"busy:{i}", ttl=TTL, auto_extend=True, on_lost=lost.append)
                     for i in range(index, count, HOLDERS)]
            for lock in locks:
                assert lock.acquire(timeout=10)
            held.wait()
            if index == 0:  # the busy one: computes, polling a socket in between
                ours, _theirs = socket.socketpair()
                started = time.monotonic()
                while time.monotonic() - started < seconds:
                    compute(chunk_at(started, seconds))
                    select.select([ours], [], [], 0)
                done.set()
            else:
                done.wait()
            for lock in locks:
                if lock.locked():
                    lock.release()
                else:
                    lost_checks[0] += 1

        threads = [threading.Thread(target=holder, args=(i,)) for i in range(HOLDERS)]
        for thread in threads:
            thread.start()
        held.wait()
        print("held -", flush=True)
        for thread in threads:
            thread.join()
    report(renewals, lost_checks[0], len(lost))


def run_web(seconds: float, count: int, urls: list[str], renewals: Renewals) -> None:
    import contextlib
    from collections.abc import AsyncIterator

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from redlock.testing import free_port

    state: dict[str, Any] = {"lost": [], "locks": []}
    started = time.monotonic()

    async def work(_request: Request) -> PlainTextResponse:
        chunk = chunk_at(started, seconds)
        for _ in range(max(3, int(0.01 / chunk))):  # 10 ms of work or more, in chunks,
            compute(chunk)                           # yielding between them
            await asyncio.sleep(0)
        return PlainTextResponse("ok")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with AsyncRedlock(urls) as dlm:
            locks = state["locks"] = [
                dlm.lock(f"busy:{i}", ttl=TTL, auto_extend=True, on_lost=state["lost"].append)
                for i in range(count)]
            for lock in locks:
                assert await lock.acquire(timeout=10)
            yield
            state["lost_checks"] = sum(1 for lock in locks if not lock.locked())
            for lock in locks:
                if lock.locked():
                    await lock.release()

    app = Starlette(routes=[Route("/work", work)], lifespan=lifespan)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on",
                                           log_level="warning", access_log=False,
                                           timeout_keep_alive=300))
    thread = threading.Thread(target=server.run, name="uvicorn")
    thread.start()
    while not server.started:
        time.sleep(0.01)
    print(f"held {port}", flush=True)
    sys.stdin.readline()  # "stop"
    server.should_exit = True
    thread.join(30)
    report(renewals, state.get("lost_checks", count), len(state["lost"]))


def main() -> None:
    mode, seconds, count, *urls = sys.argv[1:]
    renewals = Renewals()
    library = logging.getLogger("redlock.locks")
    library.setLevel(logging.DEBUG)
    library.addHandler(renewals)
    library.propagate = False
    if mode == "sync":
        run_sync(float(seconds), int(count), urls, renewals)
    elif mode == "web":
        run_web(float(seconds), int(count), urls, renewals)
    elif mode == "uvloop":
        import uvloop
        uvloop.run(run_async(float(seconds), int(count), urls, renewals))
    else:
        asyncio.run(run_async(float(seconds), int(count), urls, renewals))


if __name__ == "__main__":
    main()
