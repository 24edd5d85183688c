"""An application that configures logging with ``logging.basicConfig()`` (level WARNING,
to stderr: exactly what its operator reads) and meets node problems while it locks,
for tests/apps/test_log_lines.py.

    python proc_log_app.py SCENARIO URL [URL ...]

- ``unreachable``: a few locks, ``ready`` on stdout, then waits for ``go`` on stdin
  (the test kills a node meanwhile) and takes 20 auto-extended locks; ``done``.
- ``acl``: the URLs name an ACL user who may not run INFO; takes 5 locks; ``done``.
- ``outage``: 32 threads lock and release (ttl 2 s) as fast as they can; ``ready`` after
  a second; on ``mark`` it prints ``mark <operations so far>``; on ``stop`` it stops
  them and prints ``done <json>`` (operations, errors by type and the first few in
  full).

Nothing else is printed on stdout; stderr carries only what logging printed.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter

from redlock import Redlock, RedlockError

THREADS = 32


def lock_briefly(dlm: Redlock, resource: str, times: int = 1) -> None:
    """Take and release ``resource`` (ttl 2 s, timeout 5 s) ``times`` times in a row."""
    for _ in range(times):
        with dlm.lock(resource, ttl=2.0, timeout=5.0):
            pass


def unreachable(urls: list[str]) -> None:
    with Redlock(urls) as dlm:
        lock_briefly(dlm, "logs:unreachable", 5)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("expected go")
        for _ in range(20):
            with dlm.lock("logs:unreachable", ttl=2.0, timeout=5.0, auto_extend=True):
                time.sleep(0.02)
    print("done", flush=True)


def acl(urls: list[str]) -> None:
    with Redlock(urls) as dlm:
        lock_briefly(dlm, "logs:acl", 5)
    print("done", flush=True)


def outage(urls: list[str]) -> None:
    stop = threading.Event()
    ops = [0] * THREADS
    errors: Counter[str] = Counter()
    examples: list[str] = []  # the first few errors, in full
    with Redlock(urls) as dlm:
        # One lock first: the new cluster is initialised before the threads start (32
        # threads initialising it at once can bench nodes: a bug of its own, tested in
        # tests/apps/test_proc_startup.py, not what this scenario is about).
        lock_briefly(dlm, "logs:warmup")

        def work(index: int) -> None:
            while not stop.is_set():
                try:
                    with dlm.lock(f"logs:outage:{index}", ttl=2.0, timeout=5.0):
                        pass
                    ops[index] += 1
                except RedlockError as error:
                    errors[type(error).__name__] += 1
                    if len(examples) < 3:
                        examples.append(f"{type(error).__name__}: {error}")

        threads = [threading.Thread(target=work, args=(i,), name=f"app-{i}", daemon=True)
                   for i in range(THREADS)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() == "mark":
                print(f"mark {sum(ops)}", flush=True)
            elif line.strip() == "stop":
                break
        stop.set()
        for thread in threads:
            thread.join(20.0)
        hung = [t.name for t in threads if t.is_alive()]
    print("done " + json.dumps({"ops": sum(ops), "errors": dict(errors), "examples": examples,
                                "hung": hung}), flush=True)


def main() -> int:
    scenario, *urls = sys.argv[1:]
    logging.basicConfig()
    {"unreachable": unreachable, "acl": acl, "outage": outage}[scenario](urls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
