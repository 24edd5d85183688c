"""What structlog's configuration costs our sync client per acquire+release (N=3).

    .venv/bin/python benchmarks/logging_cost.py [--rounds 5] [--cycles 2000]

The library logs through structlog (a debug event per acquire and per release) and never
configures it; what that costs depends on the application's structlog setup. Each setup
runs in its own subprocess (structlog's lazy loggers keep the first configuration they
cache), rounds interleaved, against one shared RedisNodes(3):

* warning-cached:   filtering bound logger at WARNING, cache_logger_on_first_use=True
                    (what bench.py uses: _environment.configure_logging)
* warning-uncached: the same without caching (structlog's default for that flag)
* unconfigured:     structlog's defaults, which print every level, debug included;
                    output sent to /dev/null so the terminal is not measured
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETUPS = ("warning-cached", "warning-uncached", "unconfigured")


def child(setup: str, urls: list[str], cycles: int) -> None:
    import structlog

    if setup == "warning-cached":
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                            cache_logger_on_first_use=True)
    elif setup == "warning-uncached":
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                            cache_logger_on_first_use=False)
    else:
        # Only the destination changes: processors, level and wrapper stay the defaults.
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(
            file=open(os.devnull, "w")))  # noqa: SIM115 - lives as long as the process

    import _measure
    from _peers import TTL_S, checked

    from redlock import Redlock

    with Redlock(urls) as dlm:
        result = _measure.uncontended(lambda r: dlm.lock(r, ttl=TTL_S),
                                      checked(lambda h: h.acquire(), "redlock-fenced"),
                                      lambda h, _c: h.release(), f"bench:logcost:{setup}",
                                      cycles=cycles, warmup=200)
    print(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--child", nargs=2, metavar=("SETUP", "URLS_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]), args.cycles)
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
    base = statistics.median(r["p50_us"] for r in results["warning-cached"])
    print(f"ours sync N=3, uncontended acquire+release, {args.cycles} cycles x {args.rounds}"
          f" rounds; loadavg {loadavg_text()}")
    for setup in SETUPS:
        p50 = [r["p50_us"] for r in results[setup]]
        med = statistics.median(p50)
        print(f"  {setup:17s} p50 {med:6.0f} us [{min(p50):.0f}-{max(p50):.0f}]  "
              f"{med - base:+5.0f} us ({(med - base) / base:+.0%}) vs warning-cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
