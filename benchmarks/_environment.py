"""The conditions of a run: quiet logging, what machine it ran on, and how busy it was.

Every figure a benchmark prints is only comparable within its run; these lines say what
that run was (CPU, versions, settings) and whether anything else used the CPUs meanwhile.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

PEER_DISTRIBUTIONS = ("redis", "hiredis", "structlog", "tenacity", "pottery",
                      "python-redis-lock", "aioredlock", "aioredis", "matplotlib")


def configure_logging() -> None:
    """The library logs through the standard library and is silent unless configured;
    the runs show warnings only (benchmarks/logging_cost.py: what other setups cost)."""
    logging.basicConfig(level=logging.WARNING)


# -- the machine --------------------------------------------------------------------------


def cpu_model() -> str:
    """'model name' from /proc/cpuinfo, with family/model/MHz (the name can be vague)."""
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    if not info:
        return platform.processor() or "unknown"
    text = (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}, {float(info.get('cpu MHz', 'nan')):.0f} MHz")
    if "hypervisor" in info.get("flags", "").split():
        text += ", virtual machine"
    return text + ")"


def redis_server_version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip()


def version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def pin(placement: str, node_pids: list[int]) -> str:
    """Place this process and the nodes on the CPUs (``sched_setaffinity``), and say how.

    On a machine with fewer cores than processes, where the scheduler puts the client
    and the nodes decides the figures at N >= 3 more than the code does (BENCHMARKS.md,
    "Issue 21", tenth session). "apart": this process alone on the first CPU, the nodes
    on the others (as in production, where the nodes are other machines: the client's
    Python then hides behind the nodes' work); "shared": the nodes spread over every CPU,
    this process on the first with some of them (the client's Python then delays them).
    "none": as the scheduler likes."""
    if placement == "none":
        return "not pinned"
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"--pin {placement} needs 2 CPUs or more; this process has {cpus}")
    os.sched_setaffinity(0, {cpus[0]})
    for index, pid in enumerate(node_pids):
        os.sched_setaffinity(pid, {cpus[1 + index % (len(cpus) - 1)]} if placement == "apart"
                             else {cpus[index % len(cpus)]})
    return (f"pinned {placement}: this process on CPU {cpus[0]}, the nodes on "
            + ("the others" if placement == "apart" else "every CPU in turn"))


def loadavg_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_lines() -> list[str]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    mem = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    packages = ", ".join(f"{d} {version_of(d)}" for d in PEER_DISTRIBUTIONS)
    return [
        f"cpus: nproc={os.cpu_count()} (usable by this process: {affinity}), {cpu_model()}",
        f"memory: {mem}; kernel {platform.release()}",
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"redis-server {redis_server_version()}",
        f"packages: {packages}",
        f"loadavg at start: {loadavg_text()}",
    ]


# -- the load during a run -----------------------------------------------------------------

Snapshot = tuple[float, int, int, int]


class LoadMonitor:
    """Machine CPU use during a section, split into: this benchmark (process + waited-for
    children), our redis-server processes, and everything else on the machine."""

    def __init__(self, redis_pids: Callable[[], list[int]]) -> None:
        self._redis_pids = redis_pids
        self._tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _machine() -> tuple[int, int]:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in fields]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values[:8]) - idle, sum(values[:8])

    @staticmethod
    def _proc(pid: int | str, children: bool) -> int:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0
        fields = text.rsplit(")", 1)[1].split()
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        return utime + stime + ((cutime + cstime) if children else 0)

    def snapshot(self) -> Snapshot:
        busy, _ = self._machine()
        redis = sum(self._proc(pid, False) for pid in self._redis_pids())
        return time.monotonic(), busy, self._proc("self", True), redis

    def since(self, start: Snapshot) -> dict[str, float]:
        end = self.snapshot()
        wall = max(end[0] - start[0], 1e-9)
        busy, ours, redis = ((end[i] - start[i]) / self._tick / wall for i in (1, 2, 3))
        return {"wall_s": wall, "machine_cores": busy, "bench_cores": ours,
                "redis_cores": redis, "other_cores": max(0.0, busy - ours - redis),
                "loadavg1": os.getloadavg()[0]}


def load_text(load: dict[str, float]) -> str:
    return (f"{load['wall_s']:.0f} s wall; CPU busy {load['machine_cores']:.2f} cores = "
            f"bench {load['bench_cores']:.2f} + redis-servers {load['redis_cores']:.2f} + "
            f"other processes {load['other_cores']:.2f}; loadavg(1m) {load['loadavg1']:.2f}")
