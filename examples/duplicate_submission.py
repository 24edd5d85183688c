"""Duplicate form submission: the same checkout form submitted several times
creates one order; the duplicates are rejected.

    python -m examples.duplicate_submission   # starts its own local redis-server nodes
    python examples/duplicate_submission.py

A customer double-clicks "Place order" (two requests at once, threads here), the
browser retries on a slow network and a second tab replays the form (two
requests from another process). Every request carries the form's idempotency
key. The handler takes the lock ``form:<key>``, raises the fence of the form's
order record to its token and reads it: an existing order means "duplicate";
otherwise it creates the order with a fenced write. Another customer's form,
submitted once, goes through normally.

Exits non-zero unless each form produced exactly one order and every other
submission of it was rejected as a duplicate.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import redis

if __package__:
    from examples import _common as common
else:  # python examples/duplicate_submission.py
    import _common as common  # type: ignore[no-redef]

from fencing import RedisFencedStore
from redlock import Redlock


def submit(dlm: Redlock, store: RedisFencedStore, form: str, request: str) -> dict[str, Any]:
    """The request handler: one order per form key, whatever arrives."""
    with dlm.lock(f"form:{form}", ttl=5.0, timeout=30.0) as held:
        token = held.token
        existing = store.fence(f"order:{form}", token)  # raise the fence, then read
        if existing is not None:
            order = json.loads(existing)
            return {"form": form, "request": request, "accepted": False,
                    "duplicate_of": order["request"]}
        time.sleep(0.02)  # validate the cart, reserve the items, charge the card
        order = {"form": form, "request": request, "token": token}
        store.write(f"order:{form}", token, json.dumps(order).encode())
        return {"form": form, "request": request, "accepted": True, "token": token}


def submit_all(lock_urls: list[str], store_url: str,
               requests: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Send the requests concurrently, one thread each."""
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    results: list[dict[str, Any]] = []
    with Redlock(lock_urls) as dlm:
        def one(form: str, request: str) -> None:
            try:
                results.append(submit(dlm, store, form, request))
            except Exception as exc:
                results.append({"form": form, "request": request, "accepted": False,
                                "error": repr(exc)})

        threads = [threading.Thread(target=one, args=r) for r in requests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    client.close()
    return results


def run(lock_urls: list[str], store_url: str) -> int:
    client = redis.Redis.from_url(store_url)
    store = RedisFencedStore(client)
    forms = {"checkout-7f3a": 4, "checkout-91c2": 1}
    client.delete(*(store.key(f"order:{form}") for form in forms))
    here = [("checkout-7f3a", "double-click #1"), ("checkout-7f3a", "double-click #2"),
            ("checkout-91c2", "another customer")]
    there = ["checkout-7f3a", "browser retry", "checkout-7f3a", "replay from a second tab"]
    print("checkout-7f3a is submitted 4 times at once (a double click here; a browser retry "
          "and a second tab from another process); checkout-91c2 once")
    helpers = common.Helpers(__file__, [[store_url, *there, "--", *lock_urls]])
    try:
        helpers.go()
        results = submit_all(lock_urls, store_url, here)
        results += helpers.results()
    finally:
        helpers.close()

    by_form: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        by_form[result["form"]].append(result)
    ok = len(results) == sum(forms.values())
    for form, expected in forms.items():
        raw = store.read(f"order:{form}")
        order = json.loads(raw) if raw else None
        accepted = [r for r in by_form[form] if r["accepted"]]
        duplicates = [r for r in by_form[form] if "duplicate_of" in r]
        for r in by_form[form]:
            if r["accepted"]:
                what = f"ACCEPTED: order created (fencing token {r['token']})"
            elif "duplicate_of" in r:
                what = f"rejected as a duplicate of {r['duplicate_of']!r}"
            else:
                what = f"failed: {r.get('error')}"
            print(f"  {form} [{r['request']}]: {what}")
        ok = (ok and len(by_form[form]) == expected and len(accepted) == 1
              and len(duplicates) == expected - 1 and order is not None
              and order["request"] == accepted[0]["request"])
        print(f"  -> {form}: {len(accepted)} order, {len(duplicates)} duplicate(s) rejected")
    client.close()
    return common.verdict(ok, "each form created exactly one order; duplicates were rejected")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        split = argv.index("--")
        store_url, *pairs = argv[1:split]
        common.quiet_logging()
        common.child_handshake()
        requests = list(zip(pairs[::2], pairs[1::2], strict=True))
        for result in submit_all(argv[split + 1:], store_url, requests):
            common.emit(**result)
        return 0
    args = common.parser(__doc__).parse_args(argv)
    common.quiet_logging()
    with common.redis_nodes(args.urls, args.store_url) as (lock_urls, store_url):
        return run(lock_urls, store_url)


if __name__ == "__main__":
    sys.exit(main())
