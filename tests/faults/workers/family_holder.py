"""A holder process of the lock family for tests/faults/test_family_faults.py: an
election candidate, a semaphore permit holder, or a read-write lock's reader or writer.

Loops until its stdin closes (the test closes it to stop it):

* ``leader``: campaign (auto-renewed); once elected announce ``holding`` with the term,
  then lead: ``check()``, announce ``checked`` (the test may SIGSTOP the process now,
  past its TTL), work, write the term through the fenced store; until the leadership is
  lost (``lost``: ``check()`` raised LockLost) or ``LEAD`` seconds passed (resign).
* ``permit`` / ``write`` / ``read``: acquire (TTL, not renewed), announce ``holding``
  (the test may freeze or kill -9 the process now), work, write the token through the
  fenced store (a permit under its slot's name, a write under the name; a reader
  writes nothing), release.

Every step is one JSON line on stdout, with time.monotonic() times (CLOCK_MONOTONIC:
one clock for every process on the machine); ``valid_until`` is the holder's validity
deadline as it knew it at that moment (a lower bound of the real one).

    python -m tests.faults.workers.family_holder KIND NAME CLIENT TTL WORK PERMITS LEAD \
        STORE_URL LOCK_URL...
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import redis

from fencing import RedisFencedStore, StaleTokenError
from redlock import LockLost, LockNotAcquired, NotHeld, Redlock, RedlockError


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def write(store: RedisFencedStore, client: str, resource: str, token: int) -> None:
    invoked = time.monotonic()
    try:
        store.write(resource, token, f"{client}:{token}".encode())
        outcome = "accepted"
    except StaleTokenError:
        outcome = "rejected"
    emit(event="write", resource=resource, token=token, invoked=invoked,
         completed=time.monotonic(), outcome=outcome)


def lead(dlm: Redlock, store: RedisFencedStore, name: str, client: str, ttl: float,
         work: float, lead_s: float, stop: threading.Event) -> None:
    election = dlm.election(name, ttl=ttl, identity=client)
    leadership = election.campaign(timeout=1.0)
    invoked = time.monotonic()
    try:
        got = leadership.acquire()
    except LockNotAcquired:
        got = False
    completed = time.monotonic()
    if not got:
        emit(event="failed", invoked=invoked, completed=completed)
        return
    term = leadership.token
    emit(event="holding", resource=name, token=term, invoked=invoked, completed=completed,
         valid_until=completed + leadership.validity)
    until = completed + lead_s
    at, problem = time.monotonic(), None
    try:
        while not stop.is_set() and time.monotonic() < until:
            leadership.check()
            now = time.monotonic()
            emit(event="checked", token=term, at=now, valid_until=now + leadership.validity)
            time.sleep(work)  # the work; a SIGSTOP lands here or around it
            write(store, client, name, term)
            time.sleep(0.05)
    except LockLost as exc:
        at, problem = time.monotonic(), f"LockLost: {exc}"
        emit(event="lost", token=term, at=at)
    else:
        at = time.monotonic()
    try:
        leadership.release()
    except (NotHeld, RedlockError) as exc:
        problem = problem or f"{type(exc).__name__}: {exc}"
    emit(event="released", token=term, at=at, problem=problem)


def hold(dlm: Redlock, store: RedisFencedStore, kind: str, name: str, client: str,
         ttl: float, work: float, permits: int) -> None:
    handle: Any
    if kind == "permit":
        handle = dlm.semaphore(name, permits=permits, ttl=ttl)
    elif kind == "write":
        handle = dlm.rwlock(name, ttl=ttl).write()
    else:
        handle = dlm.rwlock(name, ttl=ttl).read()
    invoked = time.monotonic()
    try:
        got = handle.acquire(timeout=1.0)
    except LockNotAcquired:
        got = False
    completed = time.monotonic()
    if not got:
        emit(event="failed", invoked=invoked, completed=completed)
        return
    token, validity = handle.token, handle.validity
    resource = handle.slot_name if kind == "permit" else name
    emit(event="holding", resource=resource, token=token, invoked=invoked,
         completed=completed, valid_until=completed + validity)
    time.sleep(work)  # the work; a SIGSTOP or SIGKILL lands here or around it
    if kind != "read":
        write(store, client, resource, token)
    released = time.monotonic()
    problem = None
    try:
        handle.release()
    except (NotHeld, RedlockError) as exc:  # e.g. it expired while we were frozen
        problem = f"{type(exc).__name__}: {exc}"
    emit(event="released", token=token, at=released, problem=problem)


def main() -> int:
    kind, name, client, ttl, work, permits, lead_s, store_url, *lock_urls = sys.argv[1:]
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    redis_client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(redis_client)
    with Redlock(lock_urls, node_timeout=0.25, retry_delay_max=0.05) as dlm:
        while not stop.is_set():
            if kind == "leader":
                lead(dlm, store, name, client, float(ttl), float(work), float(lead_s), stop)
            else:
                hold(dlm, store, kind, name, client, float(ttl), float(work), int(permits))
    redis_client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
