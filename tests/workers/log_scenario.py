"""An application using redlock with a given logging setup, for tests/test_logging.py.

    python log_scenario.py none|warning|debug DEAD_URL URL [URL ...]

none: the application configures no logging at all; warning / debug: it calls
logging.basicConfig at that level. Then it goes through the events a real user meets:
a manager over an even number of nodes, a contended acquire (a waiter retries until the
holder's short TTL runs out), an auto-extended block, a failed non-blocking acquire, an
outage (QuorumUnavailable), and a lock lost behind the holder's back. It prints only
"done" on stdout; anything else on stdout or stderr came from logging.
"""

from __future__ import annotations

import logging
import sys
import time

import redis

from redlock import LockLost, QuorumUnavailable, Redlock


def main() -> int:
    mode, dead_url, *urls = sys.argv[1:]
    if mode != "none":
        logging.basicConfig(level=logging.DEBUG if mode == "debug" else logging.WARNING)
    with Redlock(urls[:2]):
        pass  # redlock.even_node_count
    with Redlock(urls, retry_delay_max=0.02) as dlm, Redlock(urls) as other:
        assert other.lock("log:contended", ttl=0.3).acquire(blocking=False)
        with dlm.lock("log:contended", ttl=5.0, timeout=5.0):  # waits ~0.3 s
            pass
        with dlm.lock("log:extended", ttl=0.3, auto_extend=True) as held:
            time.sleep(0.5)  # the watchdog renews at ttl/3
            held.check()
        blocker = other.lock("log:busy", ttl=5.0)
        assert blocker.acquire(blocking=False)
        assert not dlm.lock("log:busy", ttl=5.0).acquire(blocking=False)
        blocker.release()
        lost = dlm.lock("log:lost", ttl=5.0)
        assert lost.acquire(blocking=False)
        for url in urls:
            with redis.Redis.from_url(url) as client:
                client.delete("redlock:{log:lost}:lock")
        try:
            lost.extend()
        except LockLost:
            pass
        else:
            raise AssertionError("extend() should have failed")
    with Redlock([dead_url], node_timeout=0.1) as down:
        try:
            down.lock("log:down", ttl=5.0).acquire(blocking=False)
        except QuorumUnavailable:
            pass
        else:
            raise AssertionError("acquire() should have raised QuorumUnavailable")
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
