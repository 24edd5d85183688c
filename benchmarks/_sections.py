"""The measuring rounds: each section runs every peer in the same rounds, interleaved.

Rounds go through all peers in turn and the order is rotated each round, so slow drift
in the machine's load hits every peer alike. A section only collects raw results;
benchmarks/_report.py turns them into tables.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
from collections.abc import Iterator
from typing import Any

import _measure
import _report
from _environment import LoadMonitor, load_text
from _peers import Peer

Loads = dict[str, dict[str, float]]


@contextlib.contextmanager
def section(title: str, monitor: LoadMonitor, loads: Loads) -> Iterator[None]:
    """Print the title, and afterwards how busy the machine was during the section."""
    print(f"\n== {title} ==", flush=True)
    start = monitor.snapshot()
    yield
    loads[title] = monitor.since(start)
    print(f"   load during this section: {load_text(loads[title])}", flush=True)


def rotated(peers: list[Peer], shift: int) -> list[Peer]:
    shift %= len(peers)
    return peers[shift:] + peers[:shift]


def uncontended(peers: list[Peer], args: argparse.Namespace, monitor: LoadMonitor,
                loads: Loads) -> dict[str, list[dict[str, float]]]:
    """One caller, one handle per peer: per-cycle latency and throughput."""
    runs: dict[str, list[dict[str, float]]] = {p.key: [] for p in peers}
    title = (f"Uncontended acquire+release, one caller, {args.cycles} cycles x "
             f"{args.rounds} rounds")
    with section(title, monitor, loads):
        for round_no in range(args.rounds):
            for peer in rotated(peers, round_no):
                runs[peer.key].append(peer.uncontended(
                    f"bench:{peer.key}:u{round_no}", cycles=args.cycles, warmup=args.warmup))
            print(f"   round {round_no + 1}/{args.rounds} done", flush=True)
        print(_report.uncontended_table(peers, runs))
    return runs


def contended(peers: list[Peer], args: argparse.Namespace, monitor: LoadMonitor,
              loads: Loads) -> dict[str, list[dict[str, Any]]]:
    """``workers`` threads (asyncio peers: tasks) share ``total`` acquisitions of one
    lock; a peer that fails a round gets an error entry for it, not a crash."""
    runs: dict[str, list[dict[str, Any]]] = {}
    contenders = [p for p in peers if not p.reference]
    title = (f"Contended: {args.workers} threads (asyncio: tasks) x one lock, {args.total} "
             f"acquisitions in total, {args.contended_rounds} round(s)")
    with section(title, monitor, loads):
        for round_no in range(args.contended_rounds):
            for peer in rotated(contenders, round_no):
                try:
                    result = peer.contended(f"bench:{peer.key}:c{round_no}",
                                            workers=args.workers, total=args.total,
                                            deadline_s=args.deadline)
                except Exception as exc:
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                runs.setdefault(peer.key, []).append(result)
            print(f"   round {round_no + 1}/{args.contended_rounds} done", flush=True)
        print(_report.contended_table(contenders, runs, args))
    return runs


def memory(peers: list[Peer], args: argparse.Namespace, monitor: LoadMonitor,
           loads: Loads) -> dict[str, dict[str, Any]]:
    """tracemalloc: handles kept alive, and acquire/release cycles on new resources."""
    out: dict[str, dict[str, Any]] = {}
    title = (f"Memory (tracemalloc): {args.handles} lock handles kept alive; "
             f"{args.mem_cycles} acquire/release cycles on distinct resources")
    with section(title, monitor, loads):
        for peer in peers:
            if peer.reference:
                continue
            entry: dict[str, Any] = {}
            if peer.handle_memory:
                entry["handles"] = _measure.handle_memory(peer.make, args.handles)
            try:
                entry["cycles"] = peer.cycle_memory(f"bench:{peer.key}:m",
                                                    cycles=args.mem_cycles)
            except Exception as exc:
                entry["cycles_error"] = f"{type(exc).__name__}: {exc}"
            out[peer.key] = entry
        print(_report.memory_table(peers, out))
    return out


def profile(peer: Peer, cycles: int) -> None:
    """cProfile one sync peer, uncontended (compare with the raw floor row)."""
    handle = peer.make("bench:profile")
    for _ in range(200):
        peer.release(handle, peer.acquire(handle))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(cycles):
        peer.release(handle, peer.acquire(handle))
    profiler.disable()
    for sort in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(35)
        print(f"\n== cProfile of {peer.label} N={peer.nodes}, {cycles} cycles, by {sort} ==")
        print(text.getvalue())
