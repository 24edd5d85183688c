"""Demo: workers contend for one lock on N local Redis nodes and show their tokens.

    python -m redlock.demo                # starts 3 local redis-server nodes itself
    python -m redlock.demo --count 5 --workers 4 --rounds 3
    python -m redlock.demo --nodes redis://h1:6379 redis://h2:6379 redis://h3:6379

``--nodes`` takes URLs, as in every ``redlock`` command (``--urls`` is its old name);
``--count`` is how many local nodes to start when none are given.

Each worker repeatedly acquires the lock ``demo:counter``, reads a shared counter, sleeps a
little (a deliberately racy read-modify-write), writes it back, and releases. With the lock the
final count is exact, and every holder's fencing token is larger than the previous holder's."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import NoReturn

import redis

from redlock import EventFormatter, Redlock
from redlock._io.endpoint import from_url


def run(urls: Sequence[str], workers: int, rounds: int, ttl: float) -> int:
    dlm = Redlock(list(urls))
    counter = redis.Redis.from_url(urls[0])
    counter.delete("demo:count")
    holds: list[tuple[float, str, int]] = []
    started = time.monotonic()

    def worker(name: str) -> None:
        for _ in range(rounds):
            with dlm.lock("demo:counter", ttl=ttl, timeout=30.0) as held:
                value = int(counter.get("demo:count") or 0)
                time.sleep(0.02)  # a racy read-modify-write, safe only under the lock
                counter.set("demo:count", value + 1)
                holds.append((time.monotonic() - started, name, held.token))

    threads = [threading.Thread(target=worker, args=(f"worker-{i + 1}",)) for i in range(workers)]
    print(f"{workers} workers x {rounds} rounds contend for 'demo:counter' on "
          f"{len(urls)} nodes (quorum {dlm.quorum}):")
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    previous = 0
    ok = True
    for at, name, token in holds:
        order = "ok" if token > previous else "NOT INCREASING"
        ok = ok and token > previous
        print(f"  {at * 1000:8.1f} ms  {name:<9} holds the lock with fencing token {token:>6}"
              f"  ({order})")
        previous = token
    final = int(counter.get("demo:count") or 0)
    expected = workers * rounds
    print(f"counter = {final} (expected {expected}); tokens strictly increasing: {ok}")
    counter.close()
    dlm.close()
    return 0 if final == expected and ok else 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as the other redlock commands (the usage first is noise for a typo).
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _node_urls(parser: argparse.ArgumentParser, urls: list[str] | None) -> list[str] | None:
    """``--nodes``: URLs, checked; a bare number is the option's meaning before it took
    URLs as everywhere else (now ``--count``)."""
    if not urls:
        return None
    if all(url.isdigit() for url in urls):
        parser.error(f"--nodes takes the nodes' URLs, as in every redlock command (redis://"
                     f"host:port ...); to start {' '.join(urls)} local nodes, pass --count"
                     f" {' '.join(urls)}")
    for url in urls:
        try:
            from_url(url)
        except ValueError as exc:
            shown = re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", url)  # no password
            parser.error(f"bad node URL {shown!r}: {exc}")
    return urls


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = _Parser(prog=prog or "python -m redlock.demo",
                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", "--urls", nargs="+", metavar="URL", dest="nodes",
                        help="run on these nodes (redis://host:port ...) instead of"
                             " starting local ones")
    parser.add_argument("--count", type=int, default=3, metavar="N",
                        help="how many local redis-server nodes to start (default 3)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ttl", type=float, default=5.0)
    parser.add_argument("--verbose", action="store_true", help="show redlock's debug events")
    args = parser.parse_args(argv)
    urls = _node_urls(parser, args.nodes)
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    # The application (this demo), not the library, decides what gets logged: warnings
    # (or with --verbose every event) on stderr, each with its fields.
    handler = logging.StreamHandler()
    handler.setFormatter(EventFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("redlock").addHandler(handler)
    logging.getLogger("redlock").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    if urls:
        return run(urls, args.workers, args.rounds, args.ttl)
    from redlock.testing import RedisNodes

    with RedisNodes(args.count) as nodes:
        print(f"started {args.count} local redis-server nodes: {', '.join(nodes.urls)}")
        return run(nodes.urls, args.workers, args.rounds, args.ttl)


if __name__ == "__main__":
    sys.exit(main())
