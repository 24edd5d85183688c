"""A process that waits in a lock's line until it is killed (tests/test_handoff.py): a
worker killed while it waits, as gunicorn kills one past its timeout.

    python -m tests.workers.line_waiter RESOURCE URL [URL ...]

Exits 1 if it ever gets the lock: the test kills it first.
"""

from __future__ import annotations

import sys

from redlock import Redlock


def main() -> None:
    resource, urls = sys.argv[1], sys.argv[2:]
    dlm = Redlock(urls)
    if dlm.lock(resource, ttl=30.0).acquire(timeout=120.0):
        raise SystemExit("acquired: the test should have killed this waiter before")


if __name__ == "__main__":
    main()
