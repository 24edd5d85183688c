"""The stale writer: a paused lock holder wakes up and the resource rejects it.

    python -m examples.stale_writer          # starts its own local redis-server nodes
    python examples/stale_writer.py --ttl 1.0

A holder builds a report under the lock and stores it with the lock's fencing token;
the fenced store refuses a token lower than one it has already accepted. In the demo:

1. Holder A (a separate process) takes the lock with a short TTL and gets a
   fencing token; it is about to write a report.
2. A is frozen with SIGSTOP (think: a long GC pause, a VM migration) for longer
   than its TTL, so its lock expires while A still believes it holds it.
3. Holder B takes the lock, gets a larger token, and writes its report.
4. A is resumed with SIGCONT and, unaware, writes with its old token: the fenced
   store rejects it and keeps B's report. The same stale write to a plain Redis key
   (no fencing) silently overwrites B's work: that is what fencing prevents.

It exits non-zero unless A is rejected and B's value survives in the fenced store.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from fencing import RedisFencedStore, StaleTokenError
from redlock import LockLost, Redlock

if __package__:
    from examples import _common as common
else:  # python examples/stale_writer.py
    import _common as common  # type: ignore[no-redef, import-not-found]

# -- The part to copy -----------------------------------------------------------------------
# One lock manager and one fenced store per process:
#     dlm = Redlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"])
#     store = RedisFencedStore(redis.Redis.from_url("redis://data:6379"))

RESOURCE = "report:daily"


def write_report(dlm: Redlock, store: RedisFencedStore, ttl: float,
                 build: Callable[[int], bytes]) -> dict[str, Any]:
    """Build the report under the lock, then store it with the lock's token."""
    outcome: dict[str, Any] = {}
    try:
        with dlm.lock(RESOURCE, ttl=ttl, timeout=10.0) as lock:
            token = lock.token  # taken once, at the start, as any real worker would
            report = build(token)
            try:
                store.write(RESOURCE, token, report)
                outcome = {"written": True, "token": token}
            except StaleTokenError as exc:  # a newer holder wrote: our lock expired meanwhile
                outcome = {"written": False, "token": token, "highest": exc.highest}
    except LockLost:  # leaving the block: the lock had expired before we were done
        outcome["lock_expired"] = True
    return outcome


# -- The demo around it (the harness is in examples/_common.py) -----------------------------

PLAIN_KEY = "report:daily:unfenced"  # the same report without fencing, for comparison


def holder_a(values: list[str], lock_urls: list[str]) -> None:
    """Helper process A (``STORE_URL TTL``): announces its token, then 'works' (and is
    frozen there by the parent), then writes."""
    store_url, ttl = values
    with common.clients(lock_urls, store_url) as (dlm, store):
        def build(token: int) -> bytes:
            common.emit(event="acquired", token=token, pid=os.getpid())
            time.sleep(0.5)  # building the report... (the parent freezes us in here)
            report = f"report by A (token {token})".encode()
            store.client.set(PLAIN_KEY, report)  # an unfenced copy: nothing checks A
            return report

        common.emit(event="done", **write_report(dlm, store, float(ttl), build))


def process_state(pid: int) -> str:
    """The kernel's run state letter for pid (T: stopped)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def run(args: argparse.Namespace, lock_urls: list[str], store_url: str) -> int:
    ttl, clock = args.ttl, common.Clock()
    with common.fenced_store(store_url) as store:
        store.client.delete(store.key(RESOURCE), PLAIN_KEY)
        helpers = common.Helpers(__file__, lock_urls, [[store_url, str(ttl)]])
        try:
            helpers.go()
            token_a = helpers.next_event()["token"]
            helpers.signal(signal.SIGSTOP)
            print(f"{clock()}  A (pid {helpers.pid()}) took the lock for {ttl:.1f} s with "
                  f"fencing token {token_a}, and starts writing its report")
            time.sleep(0.05)
            print(f"{clock()}  A is frozen with SIGSTOP (process state "
                  f"{process_state(helpers.pid())!r}) in the middle of its work")
            pause = ttl + 0.5
            time.sleep(pause)
            print(f"{clock()}  {pause:.1f} s later A's lock has expired, but A, frozen, "
                  "cannot know")

            def build_b(token: int) -> bytes:
                print(f"{clock()}  B took the lock with fencing token {token}")
                report = f"report by B (token {token})".encode()
                store.client.set(PLAIN_KEY, report)
                return report

            with common.clients(lock_urls, store_url) as (dlm, _):
                b = write_report(dlm, store, 5.0, build_b)
            token_b, value_b = b["token"], f"report by B (token {b['token']})".encode()
            print(f"{clock()}  B wrote {value_b.decode()!r} and released the lock")

            helpers.signal(signal.SIGCONT)
            print(f"{clock()}  A is resumed with SIGCONT and carries on where it stopped")
            a = next(e for e in helpers.results(timeout=30) if e["event"] == "done")
        finally:
            helpers.close()
        final, highest = store.read(RESOURCE), store.highest(RESOURCE)
        plain = store.client.get(PLAIN_KEY)

    if not a["written"]:
        print(f"{clock()}  A tried to write with its old token {token_a}: the store REJECTED "
              f"it (it had already accepted token {a['highest']})")
    else:
        print(f"{clock()}  A's write with token {token_a} was accepted: fencing failed")
    if a.get("lock_expired"):
        print(f"{clock()}  (A's lock handle, asked afterwards, also reports the lock as expired)")
    print(f"fenced store now holds:   {common.text(final)!r} "
          f"(highest accepted token {highest})")
    print(f"unfenced key now holds:   {common.text(plain)!r}"
          + ("   <- A's stale write clobbered B's work" if plain != final else ""))
    ok = (b["written"] and not a["written"] and token_a < token_b
          and a["highest"] == token_b and final == value_b and highest == token_b)
    return common.verdict(ok, "the stale holder A was rejected and B's value was kept")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ttl", type=float, default=1.0, help="A's lock TTL in seconds (default 1)")


if __name__ == "__main__":
    sys.exit(common.main(__doc__, run, options=options, child=holder_a))
