"""What logging costs our sync client per acquire+release (N=3), by application setup.

    .venv/bin/python benchmarks/logging_cost.py [--rounds 5] [--cycles 2000]

The library logs through the standard library's ``logging`` (two DEBUG events per
uncontended acquire+release: ``redlock.acquired``, ``redlock.released``) and is silent
unless the application configures logging. Each setup runs in its own subprocess,
rounds interleaved, against one shared RedisNodes(3):

* unconfigured:  nothing configured (the library's NullHandler; the default)
* basic-warning: ``logging.basicConfig(level=logging.WARNING)``, what most apps do
* debug-devnull: the redlock logger at DEBUG into a handler with EventFormatter
                 writing to /dev/null: every event formatted and written

Then, per event and without Redis, what one ``redlock.acquired`` call costs with the
event disabled (the two setups above that filter it) and enabled into /dev/null, and,
when structlog is installed, the same event through structlog as the library logged
before it moved to ``logging``: a filtering bound logger at WARNING (the setup the
previous release recommended), and structlog's defaults printing to /dev/null (what an
application that configured nothing paid then).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETUPS = ("unconfigured", "basic-warning", "debug-devnull")


def configure(setup: str) -> None:
    from redlock import EventFormatter

    if setup == "basic-warning":
        logging.basicConfig(level=logging.WARNING)
    elif setup == "debug-devnull":
        handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - process-long
        handler.setFormatter(EventFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("redlock").addHandler(handler)
        logging.getLogger("redlock").setLevel(logging.DEBUG)


def child(setup: str, urls: list[str], cycles: int) -> None:
    configure(setup)
    import _measure
    from _peers import TTL_S, checked

    from redlock import Redlock

    with Redlock(urls) as dlm:
        result = _measure.uncontended(lambda r: dlm.lock(r, ttl=TTL_S),
                                      checked(lambda h: h.acquire(), "redlock-fenced"),
                                      lambda h, _c: h.release(), f"bench:logcost:{setup}",
                                      cycles=cycles, warmup=200)
    print(json.dumps(result))


def per_event_ns(call: Callable[[], None], number: int = 200_000) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e9


def micro_child(setup: str) -> None:
    """One event's cost in ns under one setup (own process: logging setups are global)."""
    if setup.startswith("structlog"):
        import structlog

        if setup == "structlog-warning":
            structlog.configure(
                wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                cache_logger_on_first_use=True)
        else:
            structlog.configure(logger_factory=structlog.PrintLoggerFactory(
                file=open(os.devnull, "w")))  # noqa: SIM115 - process-long
        slog = structlog.get_logger("redlock._core.algorithm")
        print(per_event_ns(lambda: slog.debug("redlock.acquired", resource="bench:x", token=42,
                                              validity_ms=9876.5, granted=3, nodes=3)))
        return
    configure(setup)
    from redlock._observe.log import get_logger

    log = get_logger("redlock._core.algorithm")
    # Keyword arguments spelled out, as in the library (a ** unpacking costs ~200 ns more).
    print(per_event_ns(lambda: log.debug("redlock.acquired", resource="bench:x", token=42,
                                         validity_ms=9876.5, granted=3, nodes=3),
                       number=20_000 if setup == "debug-devnull" else 200_000))


def micro() -> None:
    setups = list(SETUPS)
    try:
        import structlog  # noqa: F401
        setups += ["structlog-warning", "structlog-unconfigured"]
    except ImportError:
        pass
    print("one redlock.acquired DEBUG event, per call (best of 5):")
    for setup in setups:
        done = subprocess.run([sys.executable, __file__, "--micro-child", setup],
                              capture_output=True, text=True, check=True, cwd=str(HERE))
        print(f"  {setup:23s} {float(done.stdout.strip()):8.0f} ns")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--child", nargs=2, metavar=("SETUP", "URLS_JSON"), help=argparse.SUPPRESS)
    parser.add_argument("--micro-child", metavar="SETUP", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]), args.cycles)
        return 0
    if args.micro_child:
        micro_child(args.micro_child)
        return 0

    from _environment import loadavg_text

    from redlock.testing import RedisNodes

    results: dict[str, list[dict[str, float]]] = {s: [] for s in SETUPS}
    with RedisNodes(3) as nodes:
        for round_no in range(args.rounds):
            order = SETUPS[round_no % 3:] + SETUPS[:round_no % 3]
            for setup in order:
                done = subprocess.run(
                    [sys.executable, __file__, "--cycles", str(args.cycles),
                     "--child", setup, json.dumps(nodes.urls)],
                    capture_output=True, text=True, check=True, cwd=str(HERE))
                results[setup].append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = statistics.median(r["p50_us"] for r in results["unconfigured"])
    print(f"ours sync N=3, uncontended acquire+release, {args.cycles} cycles x {args.rounds}"
          f" rounds; loadavg {loadavg_text()}")
    for setup in SETUPS:
        p50 = [r["p50_us"] for r in results[setup]]
        med = statistics.median(p50)
        print(f"  {setup:14s} p50 {med:6.0f} us [{min(p50):.0f}-{max(p50):.0f}]  "
              f"{med - base:+5.0f} us ({(med - base) / base:+.0%}) vs unconfigured")
    micro()
    return 0


if __name__ == "__main__":
    sys.exit(main())
