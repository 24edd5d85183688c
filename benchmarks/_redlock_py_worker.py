"""Measure the classic ``redlock-py`` package in its own process.

Its module is also called ``redlock``, like ours, so the redlock-py peer
(``_peers.SubprocessPeer``) runs this file with PYTHONPATH pointing at a separate
``pip install --target`` directory and reads one JSON line from stdout. Usage (the peer
does this):

    PYTHONPATH=DIR python _redlock_py_worker.py MODE '{"urls": [...], ...}'

MODE is ``uncontended``, ``contended`` or ``memory``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import _measure

import redlock  # the redlock-py package, NOT redlock-fenced: checked below


def main() -> None:
    mode, options = sys.argv[1], json.loads(sys.argv[2])
    target = os.path.realpath(os.environ["REDLOCK_PY_DIR"])
    if not os.path.realpath(redlock.__file__).startswith(target + os.sep):
        raise SystemExit(f"imported the wrong redlock: {redlock.__file__}")
    logging.basicConfig(level=logging.WARNING)
    dlm = redlock.Redlock(options["urls"])
    ttl_ms = 10_000

    def make(resource: str) -> str:
        return resource

    def acquire(resource: str) -> object:
        # lock() gives up after retry_count (3) attempts 0.2 s apart: keep trying, as a
        # blocking caller would.
        while True:
            held = dlm.lock(resource, ttl_ms)
            if held:
                return held
            time.sleep(0.0)

    def release(_resource: str, held: object) -> None:
        dlm.unlock(held)

    if mode == "uncontended":
        result = _measure.uncontended(make, acquire, release, options["resource"],
                                      cycles=options["cycles"], warmup=options["warmup"])
    elif mode == "contended":
        result = _measure.contended(make, acquire, release, options["resource"],
                                    workers=options["workers"], total=options["total"],
                                    deadline_s=options["deadline_s"])
    elif mode == "memory":
        result = _measure.cycle_memory(make, acquire, release, cycles=options["cycles"],
                                       prefix=options["resource"])
    else:
        raise SystemExit(f"unknown mode {mode}")
    version = getattr(redlock, "__version__", None)
    print(json.dumps({"result": result, "module": redlock.__file__, "version": version}))


if __name__ == "__main__":
    main()
