"""Measure redlock-py or redlock-ng in their own process (their module is ``redlock``).

The subprocess peers (``_peers.SubprocessPeer``) run this file with PYTHONPATH pointing
at the library's own ``pip install --target`` directory and read one JSON line from
stdout. Usage (the peer does this):

    PYTHONPATH=DIR CLASHING_DIR=DIR python _subprocess_worker.py MODE '{"library": ...}'

MODE is ``uncontended``, ``contended``, ``memory`` or ``attempts`` (benchmarks/_measure.py
has the loops); ``"async": true`` runs the library's asyncio client (redlock-ng).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import sys
from typing import Any

import _clashing
import _measure


def run_sync(mode: str, options: dict[str, Any]) -> dict[str, Any]:
    make, acquire, release, attempt = _clashing.adapter(options["library"], options["urls"])
    resource = options["resource"]
    if mode == "uncontended":
        return _measure.uncontended(make, acquire, release, resource,
                                    cycles=options["cycles"], warmup=options["warmup"])
    if mode == "contended":
        return _measure.contended(make, acquire, release, resource,
                                  workers=options["workers"], total=options["total"],
                                  deadline_s=options["deadline_s"])
    if mode == "memory":
        return _measure.cycle_memory(make, acquire, release, cycles=options["cycles"],
                                     prefix=resource)
    if mode == "attempts":
        return _measure.attempts(make, attempt, release, resource, **options["limits"])
    raise SystemExit(f"unknown mode {mode}")


async def run_async(mode: str, options: dict[str, Any]) -> dict[str, Any]:
    make, acquire, release, attempt = _clashing.adapter(
        options["library"], options["urls"], asynchronous=True)
    resource = options["resource"]
    if mode == "uncontended":
        return await _measure.uncontended_async(make, acquire, release, resource,
                                                cycles=options["cycles"],
                                                warmup=options["warmup"])
    if mode == "contended":
        return await _measure.contended_async(make, acquire, release, resource,
                                              workers=options["workers"],
                                              total=options["total"],
                                              deadline_s=options["deadline_s"])
    if mode == "memory":
        return await _measure.cycle_memory_async(make, acquire, release,
                                                 cycles=options["cycles"], prefix=resource)
    if mode == "attempts":
        return await _measure.attempts_async(make, attempt, release, resource,
                                             **options["limits"])
    raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    mode, options = sys.argv[1], json.loads(sys.argv[2])
    logging.basicConfig(level=logging.WARNING)
    if options.get("async"):
        result = asyncio.run(run_async(mode, options))
    else:
        result = run_sync(mode, options)
    name = options["library"]
    print(json.dumps({"result": result, "library": name,
                      "version": importlib.metadata.version(name),
                      "redis": _clashing.redis_version()}))


if __name__ == "__main__":
    main()
