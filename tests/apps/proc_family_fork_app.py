"""An application that forks after using the lock family (tests/apps/test_family_fork.py).

Run as ``python proc_family_fork_app.py OUTDIR URL...``. The parent builds one sync
``Redlock`` and, inside ``with`` blocks, holds a semaphore permit, a read lock and the
leadership of an election, each renewed; a blocking wait for a permit that cannot come
starts the wake-up machinery (listener thread, subscriptions) before the fork. Then it
forks CHILDREN children that use the inherited manager:

- a permit of the semaphore (2 permits, one held by the parent): the children take the
  free one in turn (blocking, woken on release), each holding it HOLD seconds;
- a read of the read-write lock (shared with the parent's read), then a write that must
  be refused within WRITE_TRY (the parent still reads);
- ``leader()`` must name the parent and its term; a campaign within CAMPAIGN_TRY must fail.

Each child then leaves the parent's ``with`` blocks, as code after a fork does, and
exits: that must not release the parent's permit, read or leadership. The parent, after
its children, checks with the nodes (views read from a quorum) that it still holds all
three, and releases them. Everyone writes a JSON report in OUTDIR; the parent prints
``REPORT <json>`` on its last line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from redlock import Redlock

CHILDREN = 4
HOLD = 0.2
WRITE_TRY = 0.3
CAMPAIGN_TRY = 0.3
TTL = 1.0  # the parent's holds outlast it (about two TTLs): only its renewals keep them
CHILD_LIMIT = 40.0  # a child not done by then is killed and reported hung


def child_work(dlm: Redlock, index: int) -> dict[str, Any]:
    record: dict[str, Any] = {"index": index, "pid": os.getpid(), "errors": []}
    try:
        permit = dlm.semaphore("fork:sem", permits=2, ttl=5.0)
        invoked = time.monotonic()
        if permit.acquire(timeout=20.0):
            start = time.time()
            record["permit"] = {"slot": permit.slot, "token": permit.token, "start": start,
                                "waited": time.monotonic() - invoked}
            time.sleep(HOLD)
            record["permit"]["end"] = time.time()
            permit.release()
        else:
            record["errors"].append("no permit within 20 s")
        rw = dlm.rwlock("fork:doc", ttl=5.0)
        with rw.read(timeout=5.0) as reading:
            record["read_token"] = reading.token
        record["write_refused"] = not rw.write().acquire(timeout=WRITE_TRY)
        election = dlm.election("fork:leader", ttl=TTL, identity=f"child{index}")
        seen = election.leader()
        record["leader"] = None if seen is None else [seen.identity, seen.token]
        try:
            with election.campaign(timeout=CAMPAIGN_TRY):
                record["campaign_won"] = True
        except Exception as exc:  # LockNotAcquired: the parent leads
            record["campaign_won"] = False
            record["campaign_error"] = type(exc).__name__
    except Exception as exc:
        record["errors"].append(f"{type(exc).__name__}: {exc}")
    return record


def write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.rename(path)


def main() -> int:
    outdir, urls = Path(sys.argv[1]), sys.argv[2:]
    report: dict[str, Any] = {"errors": [], "children": {}}
    with Redlock(urls) as dlm:
        sem = dlm.semaphore("fork:sem", permits=2, ttl=TTL, auto_extend=True)
        rw = dlm.rwlock("fork:doc", ttl=TTL)
        election = dlm.election("fork:leader", ttl=TTL, identity="parent")
        try:
            child = parent_and_children(dlm, sem, rw, election, outdir, report)
        except BaseException as exc:
            if not isinstance(exc, _ChildLeft):
                raise
            # A child whose leaving the parent's with blocks failed: say why, exit 1.
            write_json(outdir / f"exit{os.getpid()}.json", {"error": repr(exc)})
            os._exit(1)
        if child is not None:
            os._exit(0)  # after leaving the parent's with blocks, as a forked worker does
        report["after_release"] = {"permits": sem.status().held,
                                   "readers": len(rw.status().readers),
                                   "leader": election.leader() is not None}
    print("REPORT " + json.dumps(report), flush=True)
    return 0


class _ChildLeft(Exception):
    pass


def parent_and_children(dlm: Redlock, sem: Any, rw: Any, election: Any, outdir: Path,
                        report: dict[str, Any]) -> int | None:
    """The parent's holds, the fork, and each side's part; returns the child's index in
    a child (None in the parent), after the with blocks were left."""
    child: int | None = None
    try:
        with sem as permit, rw.read(auto_extend=True) as reading, \
                election.campaign(timeout=10.0) as leading:
            report["parent"] = {"slot": permit.slot, "read_token": reading.token,
                                "term": leading.token}
            # The other permit taken: a third one waits (listener, wake-ups started), then
            # gives up; then the other permit is given back.
            other = dlm.semaphore("fork:sem", permits=2, ttl=5.0)
            assert other.acquire(timeout=5.0)
            report["third_refused"] = not dlm.semaphore("fork:sem", permits=2).acquire(
                timeout=0.3)
            other.release()
            pids = []
            for index in range(CHILDREN):
                pid = os.fork()
                if pid == 0:
                    child = index
                    break
                pids.append(pid)
            if child is not None:
                record = child_work(dlm, child)
                write_json(outdir / f"child{child}.json", record)
            else:
                until = time.monotonic() + CHILD_LIMIT
                for pid in pids:
                    while time.monotonic() < until:
                        done, status = os.waitpid(pid, os.WNOHANG)
                        if done:
                            report["children"][str(pid)] = os.waitstatus_to_exitcode(status)
                            break
                        time.sleep(0.05)
                    else:
                        os.kill(pid, 9)
                        os.waitpid(pid, 0)
                        report["children"][str(pid)] = "hung"
                # Still ours, on a quorum of the nodes (after the children left the
                # with blocks and exited), and still valid here.
                status = sem.status()
                report["permits_held_after"] = status.held
                report["readers_after"] = len(rw.status().readers)
                leader = election.leader()
                report["leader_after"] = None if leader is None else [leader.identity,
                                                                       leader.token]
                for name, handle in (("permit", permit), ("read", reading),
                                     ("leadership", leading)):
                    try:
                        handle.check()
                    except Exception as exc:
                        report["errors"].append(f"parent's {name}: {type(exc).__name__}:"
                                                f" {exc}")
    except BaseException as exc:
        if child is not None:
            raise _ChildLeft(repr(exc)) from exc
        raise
    return child


if __name__ == "__main__":
    sys.exit(main())
