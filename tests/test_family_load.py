"""The lock family under load, as issue 20's "done means" states it, on real nodes and
checked by the history checker (redlock/testing/history.py):

* a semaphore of 3 permits, 8 threads taking and giving back permits, while a holder
  in another process is killed (-9) holding one: never more than 3 held, at least 2
  at once at some point, no acquire fails (the dead holder's permit comes back when
  its lease runs out);
* a read-write lock, 6 readers and 2 writers for 4 s: no writer overlaps anyone,
  readers overlap, each writer gets at least 5 grants, write tokens strictly increase,
  each read's token lies between the writes before and after it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from redlock import Redlock
from redlock.testing import RedisNodes
from redlock.testing.history import History, Hold

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]

_DYING_HOLDER = """
import sys, time
from redlock import Redlock
with Redlock(sys.argv[1].split(","), node_timeout=0.25) as dlm:
    permit = dlm.semaphore("load:sem", permits=3, ttl=float(sys.argv[2]))
    assert permit.acquire(timeout=10)
    print(permit.slot, permit.token, flush=True)
    time.sleep(60)  # killed here, holding the permit
"""


def test_semaphore_eight_threads_three_permits_one_holder_dies(nodes3: RedisNodes) -> None:
    ttl = 1.0
    history = History()
    failures: list[str] = []
    dying = subprocess.Popen([sys.executable, "-c", _DYING_HOLDER, ",".join(nodes3.urls),
                              str(ttl)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert dying.stdout is not None
        slot, token = map(int, dying.stdout.readline().split())
        killed_at = time.monotonic()
        os.kill(dying.pid, signal.SIGKILL)  # dies holding slot `slot` until its lease ends
        history.held(Hold("dead", f"load:sem:permit:{slot}", token, killed_at,
                          killed_at + ttl))
        stop = time.monotonic() + 4.0

        with Redlock(nodes3.urls, node_timeout=0.25, retry_delay_max=0.05) as dlm:
            def worker(i: int) -> None:
                permit = dlm.semaphore("load:sem", permits=3, ttl=2.0)
                while time.monotonic() < stop:
                    invoked = time.monotonic()
                    if not permit.acquire(timeout=10.0):
                        failures.append(f"worker {i}: no permit within 10 s")
                        return
                    start, slot_name, token = time.monotonic(), permit.slot_name, permit.token
                    time.sleep(0.03)
                    end = min(time.monotonic(), start + permit.validity)
                    permit.release()
                    history.held(Hold(f"w{i}", slot_name, token, start, end, invoked))

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
    finally:
        dying.kill()
        dying.wait()
        if dying.stdout is not None:
            dying.stdout.close()
    assert not failures
    assert history.most_at_once("load:sem:permit:") <= 3
    live = [h for h in history.holds if h.client != "dead"]
    assert _only(live).most_at_once("load:sem:permit:") >= 2
    assert history.violations(exclusive=True) == []  # per slot: one holder, tokens rise
    assert len(live) >= 20


def _only(holds: list[Hold]) -> History:
    history = History()
    for hold in holds:
        history.held(hold)
    return history


def test_rwlock_six_readers_two_writers(nodes3: RedisNodes) -> None:
    history = History()
    stop = time.monotonic() + 4.0
    errors: list[str] = []
    with Redlock(nodes3.urls, node_timeout=0.25, retry_delay_max=0.05) as dlm:
        rw = dlm.rwlock("load:doc", ttl=2.0)

        def worker(name: str, mode: str, hold: float, rest: float) -> None:
            handle = rw.read() if mode == "r" else rw.write()
            while time.monotonic() < stop:
                invoked = time.monotonic()
                if not handle.acquire(timeout=10.0):
                    errors.append(f"{name} waited 10 s")
                    return
                start, token = time.monotonic(), handle.token
                time.sleep(hold)
                end = min(time.monotonic(), start + handle.validity)
                handle.release()
                history.held(Hold(name, "load:doc", token, start, end, invoked, mode=mode))
                time.sleep(rest)

        threads = ([threading.Thread(target=worker, args=(f"r{i}", "r", 0.02, 0.0))
                    for i in range(6)]
                   + [threading.Thread(target=worker, args=(f"w{i}", "w", 0.01, 0.02))
                      for i in range(2)])
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert not errors
    assert history.rw_violations("load:doc") == []
    reads = [h for h in history.holds if h.mode == "r"]
    writes = [h for h in history.holds if h.mode == "w"]
    assert _only(reads).most_at_once() >= 2  # readers overlap
    for i in range(2):
        assert sum(1 for h in writes if h.client == f"w{i}") >= 5
    tokens = [h.token for h in sorted(writes, key=lambda h: h.start)]
    assert tokens == sorted(set(tokens))
    per_writer = [sum(1 for h in writes if h.client == f"w{i}") for i in range(2)]
    print(f"\nrwlock 4 s: {len(reads)} reads (at most {_only(reads).most_at_once()} at once),"
          f" {len(writes)} writes {per_writer}")
