"""A separate process that increments a shared Redis counter under the lock.

    python -m tests.workers.counter_worker COUNTER_URL ROUNDS URL [URL ...]

The read-sleep-write is deliberately racy: only the lock keeps the count exact.
Prints one line per critical section: "<token>".
"""

from __future__ import annotations

import sys
import time

import redis

from redlock import Redlock


def main() -> int:
    counter_url, rounds, *urls = sys.argv[1:]
    counter = redis.Redis.from_url(counter_url)
    with Redlock(urls) as dlm:
        for _ in range(int(rounds)):
            with dlm.lock("mx:processes", ttl=5.0, timeout=30.0) as held:
                value = int(counter.get("mx:count") or 0)
                time.sleep(0.005)
                counter.set("mx:count", value + 1)
                print(held.token, flush=True)
    counter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
