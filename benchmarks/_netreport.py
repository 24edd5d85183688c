"""The tables of benchmarks/network.py, and issue 11's summary table, from one run.

Latencies are the median over rounds of each round's percentile; every ratio compares
figures of the same run. Nothing here measures anything.
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from _report import ratio_text, table

ASYNC_KEYS = {"ours_async", "aioredlock", "redlock_ng_async", "floor_async"}
Rounds = list[dict[str, Any]]


def floor_of(key: str) -> str:
    """The floor a peer is compared with: the asyncio floor for asyncio clients."""
    return "floor_async" if key in ASYNC_KEYS else "floor"


def median_of(rounds: Rounds | None, metric: str) -> float:
    values = [r[metric] for r in rounds or [] if "error" not in r and r.get("ok", 1)
              and not math.isnan(r.get(metric, math.nan))]
    return statistics.median(values) if values else math.nan


def ms(us: float) -> str:
    if math.isnan(us):
        return "-"
    return f"{us / 1000:.2f}" if us < 10_000 else f"{us / 1000:.1f}"


def times(a: float, b: float) -> str:
    """a / b as '1.23x' ('-' when either is missing)."""
    return "-" if math.isnan(a) or math.isnan(b) or not b else f"{a / b:.2f}x"


def _tried(rounds: Rounds) -> tuple[int, int, int]:
    ok = sum(r.get("ok", 0) for r in rounds)
    failed = sum(r.get("failed", 0) for r in rounds)
    return ok, ok + failed, sum(r.get("warmup_failed", 0) for r in rounds)


def _note(rounds: Rounds) -> str:
    stops = sorted({r.get("stopped", "") for r in rounds} - {"cycles", "budget", ""})
    errors = [e for r in rounds for e, _count in r.get("errors", [])]
    text = f"stopped: {'/'.join(stops)}; " if stops else ""
    return (text + (errors[0] if errors else ""))[:90]


def _attempt_row(label: str, condition: str, rounds: Rounds, floor_p50: float,
                 ours_p50: float, extra: list[str]) -> list[str]:
    ok, tried, warm = _tried(rounds)
    p50 = median_of(rounds, "p50_us")
    return [label, condition, f"{ok}/{tried}" + (" (w)" if warm else ""), ms(p50),
            ms(median_of(rounds, "p95_us")), times(p50, floor_p50),
            ratio_text(ours_p50, p50, higher_is_better=False), *extra, _note(rounds)]


def rtt_table(peers: list[tuple[str, str]], out: dict[str, dict[str, Rounds]],
              links: dict[str, dict[str, float]], rtts: list[int]) -> str:
    """``peers``: (key, label) in the order of the report."""
    lines = []
    for rtt in rtts:
        link = links.get(str(rtt), {})
        lines.append(f"   RTT {rtt} ms: PING p50 {link.get('ping_ms', math.nan):.2f} ms, a new "
                     f"redis-py connection (connect + handshake) {link.get('connect_ms', 0):.1f}"
                     " ms, through proxy 1")
    rows = []
    for rtt in rtts:
        runs = out.get(str(rtt), {})
        ours = median_of(runs.get("ours"), "p50_us")
        for key, label in peers:
            if key in runs:
                floor = median_of(runs.get(floor_of(key)), "p50_us")
                rows.append(_attempt_row(label, f"{rtt}", runs[key], floor, ours, []))
    lines.append(table(["library", "RTT ms", "ok/tried", "p50 ms", "p95 ms", "p50/floor",
                        "p50 vs ours sync", "failures"], rows))
    lines.append("   ok/tried: successful cycles / measured cycles; (w): the warm-up cycle "
                 "failed too. p50/floor: against the sync floor (asyncio clients: the "
                 "asyncio floor) at the same RTT.")
    return "\n".join(lines)


def blackhole_table(peers: list[Any], out: dict[str, dict[str, Rounds]],
                    conditions: list[str]) -> str:
    healthy = out.get("healthy", {})
    rows = []
    for condition in conditions:
        runs = out.get(condition, {})
        ours = median_of(healthy.get("ours"), "p50_us")
        for peer in peers:
            if peer.key in runs:
                p50 = median_of(runs[peer.key], "p50_us")
                own = median_of(healthy.get(peer.key), "p50_us")
                floor = median_of(healthy.get(floor_of(peer.key)), "p50_us")
                rows.append(_attempt_row(peer.label, condition, runs[peer.key], floor, ours,
                                         [times(p50, own)]))
    return "\n".join([
        table(["library", "blackholed", "ok/tried", "p50 ms", "p95 ms", "p50/healthy floor",
               "p50 vs ours healthy", "p50/own healthy", "failures"], rows),
        "   every ratio is against the *healthy* row of this section (same run)."])


def nscale_table(labels: dict[str, str], out: dict[str, dict[str, Rounds]],
                 ns: list[int]) -> str:
    keys = [k for k in labels if any(k in out.get(str(n), {}) for n in ns)]
    rows, ratios = [], []
    for key in keys:
        p50s = [median_of(out.get(str(n), {}).get(key), "p50_us") for n in ns]
        rows.append([labels[key], *[f"{p:.0f}" if not math.isnan(p) else "-" for p in p50s]])
        if not key.startswith("floor"):
            floors = [median_of(out.get(str(n), {}).get(floor_of(key)), "p50_us") for n in ns]
            ratios.append([labels[key], *[times(p, f) for p, f in zip(p50s, floors, strict=True)]])
    return "\n".join([
        "   p50 us of one acquire+release:",
        table(["library", *[f"N={n}" for n in ns]], rows),
        "   p50 / floor at the same N (asyncio clients: the asyncio floor):",
        table(["library", *[f"N={n}" for n in ns]], ratios)])


def contention_table(results: dict[str, Any], args: argparse.Namespace,
                     contenders: list[tuple[str, str, int, str]]) -> str:
    """``contenders``: (key, library, nodes, label), in the order of the table's rows
    (``_contention.CONTENDERS``)."""
    order = [(k, label, n) for k, _lib, n, label in contenders]
    for n in (5, 1):
        order += [(f"floor_n{n}", f"(ref) ideal hand-off: cs + 1 round trip, N={n}", n),
                  (f"floor2_n{n}", f"(ref) release, then acquire: cs + 2 rt, N={n}", n)]
    rows = []
    for key, label, n in order:
        r = results.get(key)
        if r is None:
            continue
        if "error" in r:
            rows.append([label, str(n), "error", "", "", "", "", "", "", "", "", r["error"][:60]])
            continue
        floor = results.get(f"floor_n{n}", {}).get("acq_s", math.nan)
        top = ", ".join(f"{c} {v / r['done']:.1f}" for c, v in list(
            r.get("commands", {}).items())[:3]) if r.get("done") else ""
        per = r.get("per_worker")
        rows.append([
            label, str(n), f"{r['done']}/{r['total']}", f"{r['acq_s']:.0f}",
            f"{r['wait_p50_ms']:.1f}", f"{r['wait_p99_ms']:.1f}", f"{r['wait_max_ms']:.0f}",
            f"{r['jain']:.3f}", f"{min(per)}-{max(per)}" if per else "",
            times(r["acq_s"], floor),
            f"{r['commands_per_acq']:.1f} / {r['scripts_per_acq']:.1f} ({top})"
            if "commands_per_acq" in r else "",
            ("ok" if not r.get("violations") else f"BROKEN ({r['violations']})")
            + ("; " + r["errors"][0][:50] if r.get("errors") else ""),
        ])
    fair = args.total / (args.procs * args.threads)
    return "\n".join([
        table(["library", "N", "done", "acq/s", "wait p50 ms", "p99 ms", "max ms", "Jain",
               "min-max/worker", "acq/s vs floor", "commands / scripts per acq (top 3)",
               "exclusion"], rows),
        f"   fair share {fair:.0f} per worker; floors computed from one bare scatter/gather"
        " measured here (see BENCHMARKS.md); commands: every command the nodes ran (those"
        " inside Lua scripts included), scripts: EVAL + EVALSHA calls."])


def held_table(results: dict[str, Any], labels: dict[str, str],
               args: argparse.Namespace) -> str:
    rows = []
    for key, label in labels.items():
        r = results.get(key)
        if r is None:
            continue
        if "error" in r:
            rows.append([label, "error", r["error"][:80]] + [""] * 7)
            continue
        base, held, end = r["base"], r["held"], r["end"]
        rows.append([
            label, f"{r['keys_alive']}/{args.held}", str(r["lost"]),
            f"{base['threads']} -> {held['threads']} -> {end['threads']}",
            f"{base['os_threads']} -> {r['most_os_threads']}",
            f"{base['tasks']} -> {end['tasks']}",
            f"{(held['rss_kib'] - base['rss_kib']) / 1024:.1f}",
            f"{(held['traced_kib'] - base['traced_kib']) * 1024 / args.held:.0f}",
            f"{r['node_commands_per_lock_s']:.2f}", str(r["node_clients"]),
        ])
    notes = [f"   {labels[k]}: threads that died: {n} x {text}"
             for k, r in results.items() if "error" not in r
             for text, n in r.get("thread_failures", [])]
    return "\n".join([
        *notes,
        table(["library", "alive at end", "lost", "threads base->held->end",
               "OS threads base->max", "tasks", "RSS +MiB", "traced B/lock",
               "node1 cmds/lock/s", "node1 clients"], rows),
        "   alive at end: lock keys still on node 1 after the hold (longer than the TTL)."])


# -- issue 11's table, filled in from one run ------------------------------------------

TARGETS = [
    ("default settings, RTT 10 ms and 100 ms (TTL 10 s)",
     "100 % success; acquire+release p50 <= 1.2x a bare scatter/gather floor at the same RTT"),
    ("RTT 2 ms, uncontended acquire+release",
     "<= 1.1x the floor; keep >= 3x / >= 1.3x"),
    ("one of 5 nodes blackholed (accepts, never answers)",
     "<= 2x the healthy p50; also with 2 of 5"),
    ("4 processes x 2 threads on one lock, 1 ms critical section",
     "wait p99 <= 30 ms, max <= 150 ms, Jain >= 0.98, throughput >= 0.9x the floor"),
    ("loopback, uncontended, N=5", "<= 1.5x"),
    ("1000 locks held with auto_extend=True",
     "one renewal loop per manager, renewals pipelined per node; thread count flat"),
]


def _success(runs: dict[str, Rounds], key: str) -> str:
    if key not in runs:
        return "-"
    ok, tried, _warm = _tried(runs[key])
    return f"{ok}/{tried}"


def _p50(runs: dict[str, Rounds], key: str) -> float:
    return median_of(runs.get(key), "p50_us")


def _rtt_cells(data: dict[str, Any]) -> tuple[str, str]:
    res = data.get("rtt", {}).get("results", {})
    cells = []
    for rtt in ("10", "100"):
        runs = res.get(rtt, {})
        if not runs:
            continue
        peers = ", ".join(f"{k} {_success(runs, k)}" for k in
                          ("pottery", "aioredlock", "redlock_py", "redlock_ng",
                           "redlock_ng_async") if k in runs)
        errors = [e for r in runs.get("ours", []) for e, _ in r.get("errors", [])]
        cells.append(
            f"RTT {rtt}: ours sync {_success(runs, 'ours')}, asyncio "
            f"{_success(runs, 'ours_async')} cycles succeeded (p50/floor "
            f"{times(_p50(runs, 'ours'), _p50(runs, 'floor'))}; floor p50 "
            f"{ms(_p50(runs, 'floor'))} ms); peers: {peers}"
            + (f"; ours fails with {errors[0][:70]}..." if errors else ""))
    two = res.get("2", {})
    ours2 = _p50(two, "ours")
    second = (f"{times(ours2, _p50(two, 'floor'))} the floor (asyncio "
              f"{times(_p50(two, 'ours_async'), _p50(two, 'floor_async'))} its floor); "
              + ", ".join(f"{k}: {ratio_text(ours2, _p50(two, k), higher_is_better=False)}"
                          " than ours" for k in ("redlock_ng", "redlock_py", "pottery")
                          if k in two)) if two else "-"
    return "<br>".join(cells) or "-", second


def _blackhole_cell(data: dict[str, Any]) -> str:
    res = data.get("blackhole", {}).get("results", {})
    healthy = res.get("healthy", {})
    cells = []
    for condition in ("1 of 5", "2 of 5"):
        runs = res.get(condition, {})
        for key, name in (("ours", "sync"), ("ours_async", "asyncio")):
            if key in runs:
                p50, base = _p50(runs, key), _p50(healthy, key)
                cells.append(f"{condition}, ours {name}: p50 {ms(p50)} ms = "
                             f"{times(p50, base)} the healthy p50 ({ms(base)} ms), "
                             f"{_success(runs, key)} ok")
    return "<br>".join(cells) or "-"


def _contention_cell(data: dict[str, Any]) -> str:
    res = data.get("contention", {}).get("results", {})
    r, floor = res.get("ours"), res.get("floor_n5", {})
    if not r or "error" in r:
        return (r or {}).get("error", "-")
    return (f"wait p50 {r['wait_p50_ms']:.1f} ms, p99 {r['wait_p99_ms']:.0f} ms, max "
            f"{r['wait_max_ms']:.0f} ms, Jain {r['jain']:.3f}, throughput "
            f"{times(r['acq_s'], floor.get('acq_s', math.nan))} the floor "
            f"({r['acq_s']:.0f} vs {floor.get('acq_s', math.nan):.0f} acq/s), "
            f"{r['commands_per_acq']:.1f} Redis commands ({r['scripts_per_acq']:.1f} script"
            " calls) per acquisition")


def _loopback_cell(data: dict[str, Any]) -> str:
    runs = data.get("nscale", {}).get("results", {}).get("5", {})
    if not runs:
        return "-"
    return (f"{times(_p50(runs, 'ours'), _p50(runs, 'floor'))} the floor (p50 "
            f"{_p50(runs, 'ours'):.0f} vs {_p50(runs, 'floor'):.0f} us); asyncio "
            f"{times(_p50(runs, 'ours_async'), _p50(runs, 'floor_async'))} its floor")


def _held_cell(data: dict[str, Any]) -> str:
    res = data.get("held", {}).get("results", {})
    cells = []
    for key, name in (("ours", "ours sync"), ("ours_async", "ours asyncio"),
                      ("prl", "python-redis-lock"),
                      ("prl_pool", "python-redis-lock, bigger pool"),
                      ("aioredlock", "aioredlock")):
        r = res.get(key)
        if r and "error" not in r:
            cells.append(f"{name}: threads {r['base']['threads']} -> {r['held']['threads']}, "
                         f"tasks {r['base']['tasks']} -> {r['end']['tasks']}, "
                         f"RSS +{(r['held']['rss_kib'] - r['base']['rss_kib']) / 1024:.1f} MiB, "
                         f"{r['keys_alive']} of {len_held(data)} alive after the hold")
    return "<br>".join(cells) or "-"


def len_held(data: dict[str, Any]) -> int:
    return int(data.get("settings", {}).get("held", 0))


def issue_table(data: dict[str, Any]) -> str:
    first, second = _rtt_cells(data)
    today = [first, second, _blackhole_cell(data), _contention_cell(data),
             _loopback_cell(data), _held_cell(data)]
    lines = ["| case | this run | target |", "|---|---|---|"]
    lines += [f"| {case} | {cell} | {target} |"
              for (case, target), cell in zip(TARGETS, today, strict=True)]
    return "\n".join(lines)
