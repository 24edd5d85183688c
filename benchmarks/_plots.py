"""PNG plots of a benchmarks/network.py run (matplotlib, the ``bench`` extra).

Each figure shows one run; BENCHMARKS.md embeds the PNGs of the run it reports.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from _netreport import median_of

STYLE = {  # key -> (label, colour, line style)
    "ours": ("ours sync", "tab:blue", "-"),
    "ours_async": ("ours asyncio", "tab:cyan", "-"),
    "floor": ("floor (sync scatter/gather)", "black", "--"),
    "floor_async": ("floor (asyncio gather)", "grey", "--"),
    "pottery": ("pottery", "tab:orange", "-"),
    "aioredlock": ("aioredlock", "tab:purple", "-"),
    "redlock_py": ("redlock-py", "tab:red", "-"),
    "redlock_ng": ("redlock-ng", "tab:green", "-"),
    "redlock_ng_async": ("redlock-ng asyncio", "olive", "-"),
    "ours_n1": ("ours sync N=1", "tab:blue", ":"),
    "redispy": ("redis-py Lock (N=1)", "tab:brown", ":"),
    "prl": ("python-redis-lock (N=1)", "tab:pink", ":"),
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_vs_rtt(data: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    res = data["results"]
    rtts = [int(r) for r in res]
    fig, ax = plt.subplots(figsize=(10.5, 5.5))
    for key, (label, colour, style) in STYLE.items():
        xs, ys, fx, fy = [], [], [], []
        for rtt in rtts:
            rounds = res[str(rtt)].get(key)
            if not rounds:
                continue
            p50 = median_of(rounds, "p50_us")
            if not math.isnan(p50):
                xs.append(rtt)
                ys.append(p50 / 1000)
            failed = [r["failed_p50_ms"] for r in rounds if r.get("failed")]
            if failed and not any(r.get("ok") for r in rounds):
                fx.append(rtt)
                fy.append(max(failed))
        if xs:
            ax.plot(xs, ys, style, marker="o", color=colour, label=label)
        if fx:
            ax.scatter(fx, fy, marker="x", s=90, color=colour, zorder=5,
                       label=f"{label}: every cycle failed (time to fail)")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_yscale("log")
    ax.set_xticks(rtts, [str(r) for r in rtts])
    ax.set_xlabel("round-trip time added by Toxiproxy (ms)")
    ax.set_ylabel("acquire+release p50 (ms)")
    ax.set_title("Uncontended acquire+release, N=5 through Toxiproxy, default settings")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def n_scaling(data: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    res = data["results"]
    ns = [int(n) for n in res]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for key, (label, colour, style) in STYLE.items():
        p50 = [median_of(res[str(n)].get(key), "p50_us") for n in ns]
        if all(math.isnan(p) for p in p50):
            continue
        left.plot(ns, p50, style, marker="o", color=colour, label=label)
        if not key.startswith("floor"):
            floor = "floor_async" if key.endswith("async") or key == "aioredlock" else "floor"
            base = [median_of(res[str(n)].get(floor), "p50_us") for n in ns]
            right.plot(ns, [p / b for p, b in zip(p50, base, strict=True)], style,
                       marker="o", color=colour, label=label)
    left.set_ylabel("acquire+release p50 (us)")
    left.set_yscale("log")
    right.set_ylabel("p50 / floor at the same N")
    right.axhline(1.0, color="black", lw=0.8)
    for ax in (left, right):
        ax.set_xlabel("N (nodes)")
        ax.set_xticks(ns)
        ax.grid(True, alpha=0.3)
    handles, names = left.get_legend_handles_labels()
    right.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("N-scaling on loopback, uncontended")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def contention(data: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    res = data["results"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    names, p99s, colours = [], [], []
    for key, (label, colour, style) in STYLE.items():
        r = res.get(key)
        if not r or "error" in r or not r.get("waits_ms"):
            continue
        waits = r["waits_ms"]
        left.plot(waits, [(i + 1) / len(waits) for i in range(len(waits))], style,
                  color=colour, label=label)
        names.append(label)
        p99s.append(r["wait_p99_ms"])
        colours.append(colour)
    floor = res.get("floor_n5")
    if floor:
        left.axvline(floor["wait_p99_ms"], color="black", ls="--",
                     label="ideal FIFO hand-off, N=5 (every wait)")
        names.append("floor: ideal hand-off N=5")
        p99s.append(floor["wait_p99_ms"])
        colours.append("black")
    left.set_xscale("log")
    left.set_xlabel("wait from wanting the lock to holding it (ms)")
    left.set_ylabel("fraction of acquisitions")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7)
    right.barh(names, p99s, color=colours)
    right.set_xscale("log")
    right.set_xlabel("wait p99 (ms)")
    right.invert_yaxis()
    right.grid(True, axis="x", which="both", alpha=0.3)
    fig.suptitle("Cross-process contention: 4 processes x 2 threads, one lock, 1 ms critical"
                 " section")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def blackhole(data: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    res = data["results"]
    conditions = list(res)
    keys = [k for k in STYLE if any(k in res[c] for c in conditions[1:])]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(conditions))
    for i, condition in enumerate(conditions):
        values = [median_of(res[condition].get(k), "p50_us") / 1000 for k in keys]
        ax.bar([x + i * width for x in range(len(keys))],
               [0 if math.isnan(v) else v for v in values], width, label=condition)
        for x, v in enumerate(values):
            if math.isnan(v):  # x in data, y in axes coordinates: at the bottom
                ax.text(x + i * width, 0.02, "failed/hung", rotation=90, fontsize=7,
                        ha="center", va="bottom", transform=ax.get_xaxis_transform())
    ax.set_xticks([x + width for x in range(len(keys))], [STYLE[k][0] for k in keys],
                  rotation=20, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("acquire+release p50 (ms)")
    ax.set_title(f"Nodes blackholed out of 5 (RTT {data.get('rtt_ms', 0)} ms), default settings")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(title="blackholed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_all(data: dict[str, Any], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    drawn = []
    for key, draw in (("rtt", latency_vs_rtt), ("nscale", n_scaling),
                      ("contention", contention), ("blackhole", blackhole)):
        if key in data:
            path = directory / f"{key}.png"
            draw(data[key], path)
            drawn.append(path)
    return drawn
