"""The client's instructions per uncontended acquire+release: a repeatable measure of the
client's own work, for judging one change against another on a noisy machine.

    PYTHONPATH=. .venv/bin/python benchmarks/instructions.py [--ns 1 3] [--trees A B]
        [--only ours ours_async redispy]

Wall-clock A/B pairs of one tree against another spread by ±10% on a shared 2-vCPU VM
(BENCHMARKS.md, "Issue 21: where the client's time went, and the node's"); instruction
counts do not. Each case runs in a process of its own under ``valgrind --tool=callgrind``
(which counts the user-space instructions the process executes: no kernel, no waiting
for the nodes), twice: with a few cycles and with more; the difference, divided by the
extra cycles, is the instructions of one acquire+release, start-up and warm-up left out.
The same tree gives the same count to within a few hundred instructions.

It is not a time: a Python instruction count misses cache misses and the node's work
(``script_cost.py`` measures that). Valgrind slows the client about fiftyfold, so a
connection idles longer between requests than in a timed loop and gets the idle check
the timed loop skips (a ``select()``, ``redlock/_io/wire.py`` ``FRESH``): a constant per
request in every tree.

``--trees``: library trees to compare (each put first on ``PYTHONPATH`` of its runs;
default: the library installed in the venv). Needs ``valgrind`` (Debian's package).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _floors

from redlock.testing import RedisNodes

FEW, MORE = 300, 1300  # cycles of the two runs of each case

# One case's loop, run in the measured process: the manager or client made and warmed
# up, then ``cycles`` acquire+release of one name.
_CASE = r'''
import sys
urls, cycles, case = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
if case == "ours":
    from redlock import Redlock
    with Redlock(urls) as dlm:
        lock = dlm.lock("bench:instructions", ttl=10)
        for _ in range(200 + cycles):
            lock.acquire()
            lock.release()
elif case == "ours_async":
    import asyncio
    from redlock import AsyncRedlock
    async def main():
        async with AsyncRedlock(urls) as dlm:
            lock = dlm.lock("bench:instructions", ttl=10)
            for _ in range(200 + cycles):
                await lock.acquire()
                await lock.release()
    asyncio.run(main())
elif case == "redispy":
    import redis
    lock = redis.Redis.from_url(urls[0]).lock("bench:instructions-redispy", timeout=10)
    for _ in range(200 + cycles):
        lock.acquire()
        lock.release()
'''


def instructions(tree: str | None, urls: list[str], case: str, cycles: int) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0")
    if tree is not None:
        env["PYTHONPATH"] = tree
    # (Run from "/": ``python -c`` puts the working directory first on sys.path, where a
    # checkout's own redlock/ would shadow the tree asked for.)
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         "-c", _CASE, ",".join(urls), str(cycles), case],
        env=env, capture_output=True, text=True, check=False, cwd="/")
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"{case} failed under valgrind:\n{run.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", type=int, nargs="*", default=[1])
    parser.add_argument("--trees", nargs="*", default=[None])
    parser.add_argument("--only", nargs="*", default=["ours", "ours_async", "redispy"])
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    trees = [str(Path(t).resolve()) if t else None for t in args.trees]
    print(f"instructions per acquire+release ({MORE} - {FEW} cycles, callgrind)")
    for n in args.ns:
        with RedisNodes(n) as nodes:
            _floors.initialise(nodes.urls)
            for case in args.only:
                if case == "redispy" and n != 1:
                    continue
                for tree in trees if case != "redispy" else [None]:
                    few = instructions(tree, nodes.urls, case, FEW)
                    more = instructions(tree, nodes.urls, case, MORE)
                    where = f" [{tree}]" if tree else ""
                    print(f"  N={n} {case:11s} {(more - few) / (MORE - FEW):>10,.0f}{where}",
                          flush=True)


if __name__ == "__main__":
    main()
