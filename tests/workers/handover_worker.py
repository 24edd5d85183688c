"""The other process of a hand-over (docs/design.md §5.6).

    python handover_worker.py adopt URL [URL ...]      < hand-over JSON on stdin
        adopts it, extends it, releases it; prints one JSON line:
        {"token": ..., "validity": ..., "extended_validity": ..., "released": true}
        or {"error": "<exception class>", "message": ...} if adopting failed.
    python handover_worker.py export RESOURCE TTL URL [URL ...]
        acquires RESOURCE, prints its hand-over JSON and exits without releasing.
"""

from __future__ import annotations

import json
import sys

from redlock import Redlock, RedlockError


def adopt(urls: list[str]) -> dict[str, object]:
    exported = sys.stdin.read()
    with Redlock(urls) as dlm:
        try:
            held = dlm.adopt(exported)
        except RedlockError as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        result: dict[str, object] = {"token": held.token, "validity": held.validity}
        held.extend()
        result["extended_validity"] = held.validity
        held.release()
        result["released"] = not held.locked()
        return result


def export(resource: str, ttl: float, urls: list[str]) -> str:
    dlm = Redlock(urls)
    lock = dlm.lock(resource, ttl=ttl, timeout=10.0)
    if not lock.acquire():
        raise SystemExit(f"could not acquire {resource}")
    return lock.export().to_json()


def main() -> int:
    mode, *rest = sys.argv[1:]
    if mode == "adopt":
        print(json.dumps(adopt(rest)), flush=True)
    elif mode == "export":
        resource, ttl, *urls = rest
        print(export(resource, float(ttl), urls), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
