"""Duplicate form submission: the same checkout form submitted several times
creates one order; the duplicates are rejected.

    python -m examples.duplicate_submission   # starts its own local redis-server nodes
    python examples/duplicate_submission.py

Every request carries the form's idempotency key. The handler takes the lock
``form:<key>``, raises the fence of the form's order record to its token and reads it:
an existing order means "duplicate"; otherwise it creates the order with a fenced write.

In the demo a customer double-clicks "Place order" (two requests at once, threads
here), the browser retries on a slow network and a second tab replays the form (two
requests from another process). Another customer's form, submitted once, goes through
normally. It exits non-zero unless each form produced exactly one order and every
other submission of it was rejected as a duplicate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from typing import Any

from fencing import RedisFencedStore
from redlock import Redlock

if __package__:
    from examples import _common as common
else:  # python examples/duplicate_submission.py
    import _common as common  # type: ignore[no-redef, import-not-found]

# -- The part to copy -----------------------------------------------------------------------
# One lock manager and one fenced store per process, shared by all request handlers:
#     dlm = Redlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"])
#     store = RedisFencedStore(redis.Redis.from_url("redis://data:6379"))


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


# -- The demo around it (the harness is in examples/_common.py) -----------------------------

FORMS = {"checkout-7f3a": 4, "checkout-91c2": 1}  # form -> how often it is submitted
HERE = [("checkout-7f3a", "double-click #1"), ("checkout-7f3a", "double-click #2"),
        ("checkout-91c2", "another customer")]
THERE = [("checkout-7f3a", "browser retry"), ("checkout-7f3a", "replay from a second tab")]


def submit_all(lock_urls: list[str], store_url: str,
               requests: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Send the requests concurrently, one thread each."""
    with common.clients(lock_urls, store_url) as (dlm, store):
        results = common.in_threads(lambda r: submit(dlm, store, *r), requests)
    return [r if not isinstance(r, Exception) else
            {"form": form, "request": request, "accepted": False, "error": repr(r)}
            for (form, request), r in zip(requests, results, strict=True)]


def child(values: list[str], lock_urls: list[str]) -> None:
    """A helper process: ``STORE_URL FORM REQUEST [FORM REQUEST...]``."""
    store_url, *pairs = values
    requests = list(zip(pairs[::2], pairs[1::2], strict=True))
    for result in submit_all(lock_urls, store_url, requests):
        common.emit(**result)


def run(args: argparse.Namespace, lock_urls: list[str], store_url: str) -> int:
    with common.fenced_store(store_url) as store:
        store.client.delete(*(store.key(f"order:{form}") for form in FORMS))
        print("checkout-7f3a is submitted 4 times at once (a double click here; a browser "
              "retry and a second tab from another process); checkout-91c2 once")
        helpers = common.Helpers(__file__, lock_urls,
                                 [[store_url, *(part for pair in THERE for part in pair)]])
        try:
            helpers.go()
            results = submit_all(lock_urls, store_url, HERE)
            results += helpers.results()
        finally:
            helpers.close()
        orders = {form: store.read(f"order:{form}") for form in FORMS}

    by_form: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        by_form[result["form"]].append(result)
    ok = len(results) == sum(FORMS.values())
    for form, expected in FORMS.items():
        raw = orders[form]
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
    return common.verdict(ok, "each form created exactly one order; duplicates were rejected")


if __name__ == "__main__":
    sys.exit(common.main(__doc__, run, child=child))
