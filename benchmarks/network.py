"""Issue 11's benchmarks: the network, contention and renewal figures, in one run.

    .venv/bin/python benchmarks/network.py                 # every section (~9 min)
    .venv/bin/python benchmarks/network.py --quick         # smaller budgets (~5 min)
    .venv/bin/python benchmarks/network.py --only rtt blackhole

Starts 9 redis-server processes (loopback, no persistence), a control redis-server
(the contention section's tickets) and a real Toxiproxy server with one proxy in front of
each of the first 5 nodes, and stops them at the end. Sections:

* ``rtt``: uncontended acquire+release through Toxiproxy at each RTT (``--rtts``), every
  library at its defaults, success rate and p50/p95 (benchmarks/_network.py);
* ``blackhole``: the same with 1, then 2, of the 5 proxies blackholed;
* ``nscale``: loopback, N = 1, 3, 5, 7, 9 (``--ns``);
* ``contention``: P processes x T threads on one lock (benchmarks/_contention.py);
* ``held``: 1000 auto-renewed locks held at once: threads and memory (_held.py).

Prints a table per section, then issue 11's table filled in from this run (markdown);
``--json`` keeps the raw results, ``--plots DIR`` gets PNGs (none by default: a
measurement run leaves the tree as it was; the plots BENCHMARKS.md shows were made with
``--plots benchmarks/plots``).
Every ratio compares figures of this run; BENCHMARKS.md says how each is defined.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import _clashing
import _contention
import _held
import _netreport
import _network
import _plots
from _environment import LoadMonitor, configure_logging, load_text, loadavg_text, machine_lines
from _peers import clashing_options

SECTIONS = ("rtt", "blackhole", "nscale", "contention", "held")
FULL = {"cycles": 200, "warmup": 20, "budget": 4.0, "max_failures": 2, "hang": 10.0,
        "rounds": 1, "nscale_cycles": 400, "nscale_rounds": 3, "total": 400, "held": 1000,
        "held_ttl": 5.0, "hold_s": 6.0}
QUICK = {"cycles": 100, "warmup": 10, "budget": 2.0, "max_failures": 1, "hang": 7.0,
         "rounds": 1, "nscale_cycles": 150, "nscale_rounds": 2, "total": 200, "held": 1000,
         "held_ttl": 3.0, "hold_s": 3.5}


def quiet_fault_logging() -> None:
    """Under faults the libraries log every failed cycle (ours: release_incomplete;
    pottery: tracebacks; aioredis/asyncio: connections and tasks dropped at cancel); the
    tables count those outcomes, so only the benchmark's own output is printed."""
    for name, level in (("redlock", logging.ERROR), ("pottery", logging.CRITICAL),
                        ("aioredlock", logging.CRITICAL), ("aioredis", logging.CRITICAL),
                        ("asyncio", logging.CRITICAL)):
        logging.getLogger(name).setLevel(level)


def run(args: argparse.Namespace) -> int:
    configure_logging()
    quiet_fault_logging()
    from redlock.testing import RedisNodes, ToxiproxyServer

    print("redlock-fenced network benchmark (issue 11)" + (" (--quick)" if args.quick else ""))
    clashing = "; ".join(
        _clashing.describe(name, Path(getattr(args, f"{name.replace('-', '_')}_dir")))
        for name in _clashing.LIBRARIES)
    machine = [*machine_lines(), f"clashing peers: {clashing}"]
    for line in machine:
        print("  " + line)
    print(f"  sections: {' '.join(args.only)}; settings: {json.dumps(settings(args))}")
    print("  (in the load lines, 'redis-servers' counts the redis-servers and Toxiproxy)")
    data: dict[str, Any] = {"machine": machine, "settings": settings(args)}
    loads: dict[str, dict[str, float]] = {}
    with RedisNodes(max(9, *args.ns)) as nodes, RedisNodes(1) as control, \
            ToxiproxyServer() as toxiproxy:
        five = [nodes[i] for i in range(5)]
        proxies = toxiproxy.front(five)
        # ToxiproxyServer has no public pid: its CPU time goes with the servers' if found.
        process = getattr(toxiproxy, "_process", None)
        monitor = LoadMonitor(lambda: [p for p in [*(n.pid for n in nodes), control[0].pid,
                                                   process.pid if process else None] if p])
        overall = monitor.snapshot()
        if "rtt" in args.only:
            data["rtt"] = _network.rtt_sweep(proxies, args, monitor, loads)
        if "blackhole" in args.only:
            data["blackhole"] = _network.blackhole(proxies, args, monitor, loads)
        if "nscale" in args.only:
            data["nscale"] = _network.n_scaling(nodes.urls, args, monitor, loads)
        if "contention" in args.only:
            _network.set_rtt(proxies, args.contention_rtt)
            urls = [n.url for n in five] if args.contention_direct else proxies.urls
            try:
                data["contention"] = _contention.run_section(
                    urls, [n.url for n in five], control[0].url, args, monitor, loads)
            finally:
                proxies.heal()
        if "held" in args.only:
            data["held"] = _held.run_section([n.url for n in five], args, monitor, loads)
        loads["overall"] = monitor.since(overall)
    data["loads"] = loads
    print(f"\nwhole run: {load_text(loads['overall'])}")
    print(f"loadavg at end: {loadavg_text()}")
    skipped = {k: v for s in data.values() if isinstance(s, dict)
               for k, v in s.get("skipped", {}).items()}
    if skipped:
        print("\nnot measured:")
        for name, why in skipped.items():
            print(f"  {name}: {why}")
    print("\n== Issue 11's table, this run ==")
    print(_netreport.issue_table(data))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))
        print(f"\nraw results written to {args.json}")
    if args.plots:
        for path in _plots.draw_all(data, Path(args.plots)):
            print(f"plot written to {path}")
    return 0


def settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("rtts", "reuse_clients", "cycles", "warmup", "budget", "max_failures", "hang", "rounds",
            "blackhole_rtt", "ns", "nscale_cycles", "nscale_rounds", "procs", "threads",
            "cs_ms", "total", "contention_rtt", "contention_direct", "held", "held_ttl",
            "hold_s")
    return {k: getattr(args, k) for k in keys}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller budgets")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--peers", nargs="*", help="peer keys to run (ours always runs)")
    group = parser.add_argument_group("rtt and blackhole")
    group.add_argument("--rtts", type=int, nargs="*", default=[0, 2, 10, 40, 100])
    group.add_argument("--cycles", type=int, help="most cycles per peer and RTT (200)")
    group.add_argument("--warmup", type=int, help="warm-up cycles at RTT <= 2 ms (20); 2 above")
    group.add_argument("--budget", type=float, help="seconds per peer and RTT (4; quick 2)")
    group.add_argument("--max-failures", type=int,
                       help="stop a peer after this many failed cycles in a row (2; quick 1)")
    group.add_argument("--hang", type=float,
                       help="a cycle longer than this (s) is hung, and given up on (10; quick 7:"
                            " more than ours' outage_timeout, 5 s)")
    group.add_argument("--rounds", type=int, help="rounds, peers rotated (1)")
    group.add_argument("--blackhole-rtt", type=int, default=0)
    group.add_argument("--reuse-clients", action="store_true",
                       help="one set of clients for the whole sweep, connected at the first"
                            " RTT (default: new clients at every RTT)")
    group = parser.add_argument_group("nscale")
    group.add_argument("--ns", type=int, nargs="*", default=[1, 3, 5, 7, 9])
    group.add_argument("--nscale-cycles", type=int, help="(400; quick 150)")
    group.add_argument("--nscale-rounds", type=int, help="(3; quick 2)")
    group = parser.add_argument_group("contention")
    group.add_argument("--procs", type=int, default=4)
    group.add_argument("--threads", type=int, default=2)
    group.add_argument("--cs-ms", type=float, default=1.0, help="critical section (ms)")
    group.add_argument("--total", type=int, help="acquisitions in total (400; quick 200)")
    group.add_argument("--contention-rtt", type=int, default=0,
                       help="RTT through the proxies during this section")
    group.add_argument("--contention-direct", action="store_true",
                       help="loopback without the proxies")
    group.add_argument("--contention-deadline", type=float, default=60.0)
    group = parser.add_argument_group("held")
    group.add_argument("--held", type=int, help="locks held at once (1000)")
    group.add_argument("--held-ttl", type=float, help="their TTL in s (5; quick 3)")
    group.add_argument("--hold-s", type=float, help="how long they are held (6; quick 3.5)")
    clashing_options(parser)
    parser.add_argument("--json", help="also write raw results to this file")
    parser.add_argument("--plots", default="",
                        help="directory of the PNG plots (default: none; BENCHMARKS.md's"
                             " are in benchmarks/plots)")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.peers:
        args.peers = sorted({"ours", "ours_async", "floor", "floor_async", *args.peers})
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
