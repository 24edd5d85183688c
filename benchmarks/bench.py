"""Benchmark redlock-fenced against other Python Redis lock libraries, in one run.

    .venv/bin/python benchmarks/bench.py            # full run (a few minutes)
    .venv/bin/python benchmarks/bench.py --quick    # smoke run (well under a minute)

Starts its own redis-server processes (RedisNodes(3) and RedisNodes(1) on loopback),
measures every library in the same process and the same rounds (interleaved, rotated
order), and prints medians over rounds with their spread, plus ratios against our
synchronous client measured in this very run. See BENCHMARKS.md for methodology.

``redlock-py`` and ``redlock-ng`` (module name ``redlock``, which clashes with ours) are
measured in a subprocess from their own ``pip install --target`` directories, only if
those exist (``--install-redlock-py`` / ``--install-redlock-ng`` create them; PyPI).

Where things are:

* ``_peers.py``: one adapter per library (and ``_floors.py``: the raw I/O floors);
* ``_measure.py``: the measuring loops on one peer (uncontended, contended, memory;
  sync and asyncio), shared with ``_subprocess_worker.py``;
* ``_sections.py``: the rounds of each section over all peers;
* ``_report.py``: the tables and ratios;
* ``_environment.py``: the machine, the load during the run, quiet logging.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import _sections
from _environment import LoadMonitor, configure_logging, load_text, loadavg_text, machine_lines
from _peers import TTL_S, Peers, add_all, clashing_options

FULL = {"rounds": 5, "cycles": 2000, "warmup": 200, "total": 1000, "contended_rounds": 3,
        "handles": 10_000, "mem_cycles": 1000}
QUICK = {"rounds": 3, "cycles": 300, "warmup": 30, "total": 200, "contended_rounds": 1,
         "handles": 2000, "mem_cycles": 200}


def run(args: argparse.Namespace) -> int:
    configure_logging()
    from redlock.testing import RedisNodes

    print("redlock-fenced benchmark" + (" (--quick)" if args.quick else ""))
    for line in machine_lines():
        print("  " + line)
    print(f"  settings: rounds={args.rounds} cycles/round={args.cycles} warmup={args.warmup}"
          f" | contended: workers={args.workers} total={args.total}"
          f" rounds={args.contended_rounds} | memory: handles={args.handles}"
          f" cycles={args.mem_cycles} | ttl={TTL_S:g}s")

    results: dict[str, Any] = {"machine": machine_lines(), "args": vars(args)}
    loads: dict[str, dict[str, float]] = {}
    with RedisNodes(3) as nodes3, RedisNodes(1) as nodes1:
        monitor = LoadMonitor(lambda: [n.pid for n in [*nodes3, *nodes1] if n.pid])
        overall = monitor.snapshot()
        peers = Peers()
        try:
            add_all(peers, nodes3.urls, nodes1.urls, args)
            chosen = [p for p in peers.all if not args.only or p.key in args.only]
            if args.profile:
                _sections.profile(next(p for p in peers.all if p.key == "ours"), args.cycles)
                return 0
            results["uncontended"] = _sections.uncontended(chosen, args, monitor, loads)
            results["contended"] = _sections.contended(chosen, args, monitor, loads)
            results["memory"] = _sections.memory(chosen, args, monitor, loads)
        finally:
            peers.close()
        loads["overall"] = monitor.since(overall)
    print(f"\nwhole run: {load_text(loads['overall'])}")
    print(f"loadavg at end: {loadavg_text()}")
    if peers.skipped:
        print("\nnot measured:")
        for name, why in peers.skipped.items():
            print(f"  {name}: {why}")
    results["loads"] = loads
    results["skipped"] = peers.skipped
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
        print(f"\nraw results written to {args.json}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rounds", type=int, help="uncontended rounds (default 5; quick 3)")
    parser.add_argument("--cycles", type=int, help="cycles per round (2000; quick 300)")
    parser.add_argument("--warmup", type=int, help="warm-up cycles (200; quick 30)")
    parser.add_argument("--workers", type=int, default=8, help="contending threads/tasks")
    parser.add_argument("--total", type=int, help="contended acquisitions (1000; quick 200)")
    parser.add_argument("--contended-rounds", type=int, help="(3; quick 1)")
    parser.add_argument("--deadline", type=float, default=90.0,
                        help="give up a contended run after this many seconds")
    parser.add_argument("--handles", type=int, help="handles for memory (10000; quick 2000)")
    parser.add_argument("--mem-cycles", type=int, help="cycles for memory (1000; quick 200)")
    parser.add_argument("--only", nargs="*", help="peer keys to run (ours is the baseline)")
    parser.add_argument("--profile", action="store_true",
                        help="only cProfile our sync client and print the hot spots")
    clashing_options(parser)
    parser.add_argument("--json", help="also write raw results to this file")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.only:
        args.only = sorted({"ours", "ours_n1", *args.only})
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
