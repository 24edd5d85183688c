"""A lock holder process for the pause scenario (tests/faults/test_paused_holder.py).

Loops until its time is up: acquire, announce "holding" (the test may SIGSTOP this
process now, for longer than the TTL), work a little, write the token to a plain Redis
list (no fencing: what an unprotected resource would see) and through the fenced
store, release. Every step is one JSON line on stdout, with time.monotonic() times
(CLOCK_MONOTONIC: one clock for every process on the machine).

    python -m tests.faults.workers.paused_holder NAME SECONDS TTL STORE_URL LOCK_URL...
"""

from __future__ import annotations

import sys
import time

import redis

from fencing import RedisFencedStore
from redlock import Redlock
from tests.faults.workers.events import acquire_announced, release_announced, write

RESOURCE = "paused:r"
PLAIN_KEY = "paused:plain"


def main() -> int:
    name, seconds, ttl, store_url, *lock_urls = sys.argv[1:]
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    end = time.monotonic() + float(seconds)
    with Redlock(lock_urls, node_timeout=0.2, retry_delay_max=0.05) as dlm:
        while time.monotonic() < end:
            lock = dlm.lock(RESOURCE, ttl=float(ttl))
            held = acquire_announced(lock)
            if held is None:
                continue
            token = held["token"]
            time.sleep(0.15)  # the work; a SIGSTOP lands here or around it
            client.rpush(PLAIN_KEY, token)
            write(store, name, RESOURCE, token)
            release_announced(lock, token)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
