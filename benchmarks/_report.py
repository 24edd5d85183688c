"""The report: plain-text tables of one run's results, as ratios against our clients.

Every figure is the median over rounds with its [min-max] spread; every ratio compares
medians measured in the same run (absolute numbers move with the machine, ratios much
less). Nothing here measures anything.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from _peers import Peer

BASELINE = "ours"  # our sync client on N=3: the baseline of every ratio
BASELINE_N1 = "ours_n1"  # our sync client on N=1: the baseline of the single-node locks
FLOORS = (("ours", "floor"), ("ours_async", "floor_async"))  # client -> its raw floor


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(out)


def ratio_text(ours: float, theirs: float, *, higher_is_better: bool) -> str:
    """How the peer compares with ours: 'same (±3%)', or 'N.NNx slower' / 'N.NNx faster'."""
    if not ours or not theirs or ours != ours or theirs != theirs:
        return "n/a"
    slower = ours / theirs if higher_is_better else theirs / ours
    if 0.97 <= slower <= 1.03:
        return "same (±3%)"
    if slower >= 1:
        return f"{slower:.2f}x slower" if slower < 10 else f"{slower:.0f}x slower"
    faster = 1 / slower
    return f"{faster:.2f}x faster" if faster < 10 else f"{faster:.0f}x faster"


def size_ratio_text(ours: float, theirs: float) -> str:
    return (ratio_text(ours, theirs, higher_is_better=False)
            .replace("slower", "larger").replace("faster", "smaller"))


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def _versus(peer: Peer, baseline: str, med: dict[str, dict[str, float]], metric: str) -> str:
    if peer.key == baseline:
        return "(baseline)"
    if baseline not in med:
        return "n/a"
    return ratio_text(med[baseline][metric], med[peer.key][metric], higher_is_better=False)


def uncontended_table(peers: list[Peer], runs: dict[str, list[dict[str, float]]]) -> str:
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("p50_us", "p99_us", "ops_s")}
           for k, v in runs.items() if v}
    rows = []
    for peer in peers:
        r = runs[peer.key]
        rows.append([peer.label, str(peer.nodes),
                     spread([x["p50_us"] for x in r]),
                     spread([x["p99_us"] for x in r]),
                     spread([x["ops_s"] for x in r]),
                     _versus(peer, BASELINE, med, "p50_us"),
                     _versus(peer, BASELINE_N1, med, "p50_us") if peer.nodes == 1 else ""])
    lines = [table(["library", "N", "p50 us [min-max]", "p99 us [min-max]",
                    "ops/s [min-max]", "p50 vs ours sync N=3", "p50 vs ours N=1"], rows)]
    for ours, floor in FLOORS:
        if ours in med and floor in med:
            extra = med[ours]["p50_us"] - med[floor]["p50_us"]
            lines.append(f"   {ours}: p50 {extra:+.0f} us ({extra / med[floor]['p50_us']:+.0%}) "
                         f"against its raw floor ({floor}: same Lua and connection settings)")
    return "\n".join(lines)


def contended_table(peers: list[Peer], runs: dict[str, list[dict[str, Any]]],
                    args: argparse.Namespace) -> str:
    ok = {k: [r for r in v if "error" not in r] for k, v in runs.items()}
    base = (statistics.median(r["acq_s"] for r in ok[BASELINE]) if ok.get(BASELINE)
            else None)
    rows = []
    for peer in peers:
        good = ok[peer.key]
        if not good:
            rows.append([peer.label, str(peer.nodes), "error", "", "", "", "",
                         runs[peer.key][0]["error"][:60]])
            continue
        acq = [r["acq_s"] for r in good]
        notes = []
        if any(r["timed_out"] for r in good):
            notes.append(f"hit the {args.deadline:g}s deadline")
        if not all(r["counter_ok"] for r in good) or any(r["violations"] for r in good):
            notes.append(f"MUTUAL EXCLUSION BROKEN ({sum(r['violations'] for r in good)}"
                         " overlaps)")
        rows.append([
            peer.label + (" [tasks]" if peer.kind == "async" else ""), str(peer.nodes),
            spread([r["total_s"] for r in good], "{:.2f}"),
            spread(acq),
            "/".join(str(r["min_per_worker"]) for r in good),
            "/".join(str(r["max_per_worker"]) for r in good),
            "(baseline)" if peer.key == BASELINE else
            ratio_text(base, statistics.median(acq), higher_is_better=True) if base else "n/a",
            "; ".join(notes) or "ok",
        ])
    return "\n".join([
        table(["library", "N", "total s [min-max]", "acq/s [min-max]", "min/worker per round",
               "max/worker per round", "acq/s vs ours sync", "exclusion"], rows),
        f"   (perfectly fair share: {args.total / args.workers:.0f} per worker)"])


def memory_table(peers: list[Peer], out: dict[str, dict[str, Any]]) -> str:
    base = out.get(BASELINE, {}).get("handles")
    rows = []
    for peer in peers:
        if peer.key not in out:
            continue
        entry = out[peer.key]
        handles, cycles = entry.get("handles"), entry.get("cycles")
        rows.append([
            peer.label, str(peer.nodes),
            f"{handles['bytes_per_handle']:.0f}" if handles else "n/a (no handle)",
            f"{handles['peak_kib']:.0f}" if handles else "",
            f"{handles['create_us']:.2f}" if handles else "",
            ("(baseline)" if peer.key == BASELINE else size_ratio_text(
                base["bytes_per_handle"], handles["bytes_per_handle"]))
            if handles and base else "",
            f"{cycles['peak_kib']:.0f}" if cycles else entry.get("cycles_error", "")[:40],
            f"{cycles['retained_kib']:.0f}" if cycles else "",
            f"{cycles['retained_b_per_cycle']:.0f}" if cycles else "",
        ])
    return table(["library", "N", "B/handle", "peak KiB", "create us/handle",
                  "handle size vs ours", "cycles: peak KiB", "retained KiB",
                  "retained B/cycle"], rows)
