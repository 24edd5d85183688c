"""The stale writer: a paused lock holder wakes up and the resource rejects it.

    python -m examples.stale_writer          # starts its own local redis-server nodes
    python examples/stale_writer.py --ttl 1.0

1. Holder A (a separate process) takes the lock with a short TTL and gets a
   fencing token; it is about to write a report.
2. A is frozen with SIGSTOP (think: a long GC pause, a VM migration) for longer
   than its TTL, so its lock expires while A still believes it holds it.
3. Holder B takes the lock, gets a larger token, and writes its report.
4. A is resumed with SIGCONT and, unaware, writes with its old token: the fenced
   store rejects it and keeps B's report. The same stale write to a plain Redis key
   (no fencing) silently overwrites B's work: that is what fencing prevents.

Exits non-zero unless A is rejected and B's value survives in the fenced store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import redis

if __package__:
    from examples import _common as common
else:  # python examples/stale_writer.py
    import _common as common  # type: ignore[no-redef]

from fencing import RedisFencedStore, StaleTokenError
from redlock import LockLost, Redlock

RESOURCE = "report:daily"
PLAIN_KEY = "report:daily:unfenced"


def holder_a(store_url: str, ttl: float, lock_urls: list[str]) -> int:
    """Child process: take the lock, announce the token, 'work', then write."""
    common.quiet_logging()
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    with Redlock(lock_urls) as dlm:
        lock = dlm.lock(RESOURCE, ttl=ttl, timeout=10.0)
        with lock:
            token = lock.token  # A keeps its token, as any real worker would
            common.emit(event="acquired", token=token, pid=os.getpid())
            time.sleep(0.5)  # building the report... (the parent freezes us in here)
            value = f"report by A (token {token})".encode()
            client.set(PLAIN_KEY, value)  # an unfenced copy: nothing checks A
            try:
                store.write(RESOURCE, token, value)
                common.emit(event="written", token=token)
            except StaleTokenError as exc:
                common.emit(event="rejected", token=token, highest=exc.highest,
                            message=str(exc))
            try:
                _ = lock.token
                common.emit(event="handle", lost=False)
            except LockLost:
                common.emit(event="handle", lost=True)
    client.close()
    return 0


def process_state(pid: int) -> str:
    """The kernel's run state letter for pid (T: stopped)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def run(lock_urls: list[str], store_url: str, ttl: float) -> int:
    clock = common.Clock()
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    client.delete(store.key(RESOURCE), PLAIN_KEY)

    a = subprocess.Popen([sys.executable, __file__, "--child", store_url, str(ttl), *lock_urls],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert a.stdout is not None
        acquired = json.loads(a.stdout.readline())
        a.send_signal(signal.SIGSTOP)
        token_a = acquired["token"]
        print(f"{clock()}  A (pid {a.pid}) took the lock for {ttl:.1f} s with fencing token "
              f"{token_a}, and starts writing its report")
        time.sleep(0.05)
        state = process_state(a.pid)
        print(f"{clock()}  A is frozen with SIGSTOP (process state {state!r}) in the middle "
              f"of its work")
        pause = ttl + 0.5
        time.sleep(pause)
        print(f"{clock()}  {pause:.1f} s later A's lock has expired, but A, frozen, cannot know")

        with Redlock(lock_urls) as dlm, dlm.lock(RESOURCE, ttl=5.0, timeout=10.0) as held:
            token_b = held.token
            print(f"{clock()}  B took the lock with fencing token {token_b}")
            value_b = f"report by B (token {token_b})".encode()
            store.write(RESOURCE, token_b, value_b)
            client.set(PLAIN_KEY, value_b)
            print(f"{clock()}  B wrote {value_b.decode()!r}")
        print(f"{clock()}  B released the lock")

        a.send_signal(signal.SIGCONT)
        print(f"{clock()}  A is resumed with SIGCONT and carries on where it stopped")
        out, _ = a.communicate(timeout=30)
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
            a.communicate()
    events = {e["event"]: e for e in (json.loads(line) for line in out.splitlines() if line)}
    rejected = events.get("rejected")
    if rejected:
        print(f"{clock()}  A tried to write with its old token {token_a}: the store REJECTED it "
              f"(it had already accepted token {rejected['highest']})")
    else:
        print(f"{clock()}  A's write with token {token_a} was accepted: fencing failed")
    if events.get("handle", {}).get("lost"):
        print(f"{clock()}  (A's lock handle, asked afterwards, also reports the lock as lost)")
    final = store.read(RESOURCE)
    highest = store.highest(RESOURCE)
    plain = client.get(PLAIN_KEY)
    client.close()
    print(f"fenced store now holds:   {final.decode() if final else None!r} "
          f"(highest accepted token {highest})")
    print(f"unfenced key now holds:   {plain.decode() if plain else None!r}"
          + ("   <- A's stale write clobbered B's work" if plain != final else ""))
    ok = (a.returncode == 0 and rejected is not None and token_a < token_b
          and rejected["highest"] == token_b and final == value_b and highest == token_b)
    return common.verdict(ok, "the stale holder A was rejected and B's value was kept")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        store_url, ttl, *lock_urls = argv[1:]
        return holder_a(store_url, float(ttl), lock_urls)
    p = common.parser(__doc__)
    p.add_argument("--ttl", type=float, default=1.0, help="A's lock TTL in seconds (default 1)")
    args = p.parse_args(argv)
    common.quiet_logging()
    with common.redis_nodes(args.urls, args.store_url) as (lock_urls, store_url):
        return run(lock_urls, store_url, args.ttl)


if __name__ == "__main__":
    sys.exit(main())
