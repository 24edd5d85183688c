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

import sys
import threading
import time
from typing import Any

import redis

from fencing import RedisFencedStore
from redlock import LockLost, Redlock
from tests.faults.workers.events import acquire_announced, emit, release_announced, write


def lead(dlm: Redlock, store: RedisFencedStore, name: str, client: str, ttl: float,
         work: float, lead_s: float, stop: threading.Event) -> None:
    election = dlm.election(name, ttl=ttl, identity=client)
    leadership = election.campaign(timeout=1.0)
    held = acquire_announced(leadership, timeout=None, resource=name)
    if held is None:
        return
    term = held["token"]
    until = time.monotonic() + lead_s
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
    release_announced(leadership, term, at, problem)


def hold(dlm: Redlock, store: RedisFencedStore, kind: str, name: str, client: str,
         ttl: float, work: float, permits: int) -> None:
    handle: Any
    if kind == "permit":
        handle = dlm.semaphore(name, permits=permits, ttl=ttl)
    elif kind == "write":
        handle = dlm.rwlock(name, ttl=ttl).write()
    else:
        handle = dlm.rwlock(name, ttl=ttl).read()
    # What the fenced store knows it as: a permit, its slot's name.
    held = acquire_announced(handle, resource=lambda: (
        handle.slot_name if kind == "permit" else name))
    if held is None:
        return
    time.sleep(work)  # the work; a SIGSTOP or SIGKILL lands here or around it
    if kind != "read":
        write(store, client, held["resource"], held["token"])
    release_announced(handle, held["token"])


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
