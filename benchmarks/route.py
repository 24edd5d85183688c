"""Which library modules a warm uncontended acquire+release passes through (issue 41:
at most 15, sync and asyncio), traced with ``sys.setprofile``.

    PYTHONPATH=. .venv/bin/python benchmarks/route.py [--n 1] [--functions]

A manager is warmed first (50 cycles), then one handle made outside the trace is
acquired and released inside it. Prints the modules, sync then asyncio, each with the
number of calls into it (``--functions``: which functions).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

from redlock import AsyncRedlock, Redlock
from redlock.testing import RedisNodes

_ROOTS = ("/redlock/", "/fencing/")


def _tracer(seen: Counter[tuple[str, str]]) -> Callable[[FrameType, str, Any], None]:
    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            for root in _ROOTS:
                if root in path:
                    module = root.strip("/") + "/" + path.split(root, 1)[1]
                    seen[(module, frame.f_code.co_name)] += 1
    return profile


def _report(flavour: str, seen: Counter[tuple[str, str]], functions: bool) -> None:
    modules = sorted({module for module, _ in seen})
    print(f"{flavour}: {len(modules)} modules")
    for module in modules:
        calls = {name: count for (m, name), count in seen.items() if m == module}
        detail = ", ".join(f"{n}x{c}" if c > 1 else n for n, c in calls.items()) \
            if functions else f"{sum(calls.values())} calls"
        print(f"  {module}: {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1, help="nodes (default 1)")
    parser.add_argument("--functions", action="store_true", help="name the functions")
    args = parser.parse_args()
    with RedisNodes(args.n) as nodes:
        with Redlock(nodes.urls) as dlm:
            for _ in range(50):
                with dlm.lock("route", ttl=10.0):
                    pass
            lock = dlm.lock("route", ttl=10.0)
            seen: Counter[tuple[str, str]] = Counter()
            sys.setprofile(_tracer(seen))
            try:
                lock.acquire()
                lock.release()
            finally:
                sys.setprofile(None)
            _report("sync", seen, args.functions)

        async def run() -> None:
            async with AsyncRedlock(nodes.urls) as dlm:
                for _ in range(50):
                    async with dlm.lock("route", ttl=10.0):
                        pass
                lock = dlm.lock("route", ttl=10.0)
                seen: Counter[tuple[str, str]] = Counter()
                sys.setprofile(_tracer(seen))
                try:
                    await lock.acquire()
                    await lock.release()
                finally:
                    sys.setprofile(None)
                _report("asyncio", seen, args.functions)

        asyncio.run(run())


if __name__ == "__main__":
    main()
