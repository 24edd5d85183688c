"""A lock holder process for the pause scenario (tests/faults/test_paused_holder.py).

Loops until its time is up: acquire, announce "holding" (the test may SIGSTOP this
process now, for longer than the TTL), work a little, write the token to a plain Redis
list (no fencing: what an unprotected resource would see) and through the fenced
store, release. Every step is one JSON line on stdout, with time.monotonic() times
(CLOCK_MONOTONIC: one clock for every process on the machine).

    python -m tests.faults.workers.paused_holder NAME SECONDS TTL STORE_URL LOCK_URL...
"""

from __future__ import annotations

import json
import sys
import time

import redis

from fencing import RedisFencedStore, StaleTokenError
from redlock import LockNotAcquired, NotHeld, Redlock, RedlockError

RESOURCE = "paused:r"
PLAIN_KEY = "paused:plain"


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    name, seconds, ttl, store_url, *lock_urls = sys.argv[1:]
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    end = time.monotonic() + float(seconds)
    with Redlock(lock_urls, node_timeout=0.2, retry_delay_max=0.05) as dlm:
        while time.monotonic() < end:
            lock = dlm.lock(RESOURCE, ttl=float(ttl))
            invoked = time.monotonic()
            try:
                got = lock.acquire(timeout=1.0)
            except LockNotAcquired:
                got = False
            completed = time.monotonic()
            if not got:
                emit(event="failed", invoked=invoked, completed=completed)
                continue
            token, validity = lock.token, lock.validity
            emit(event="holding", token=token, invoked=invoked, completed=completed,
                 valid_until=completed + validity)
            time.sleep(0.15)  # the work; a SIGSTOP lands here or around it
            client.rpush(PLAIN_KEY, token)
            write_invoked = time.monotonic()
            try:
                store.write(RESOURCE, token, f"{name}:{token}".encode())
                outcome = "accepted"
            except StaleTokenError:
                outcome = "rejected"
            emit(event="write", token=token, invoked=write_invoked,
                 completed=time.monotonic(), outcome=outcome)
            released = time.monotonic()
            problem = None
            try:
                lock.release()
            except (NotHeld, RedlockError) as exc:  # e.g. it expired while we were frozen
                problem = f"{type(exc).__name__}: {exc}"
            emit(event="released", token=token, at=released, problem=problem)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
