"""Flash sale: 50 concurrent buyers compete for 10 tickets; exactly 10 are sold.

    python -m examples.flash_sale            # starts its own local redis-server nodes
    python examples/flash_sale.py --buyers 50 --tickets 10 --processes 5
    python -m examples.flash_sale --urls redis://h1:6379 redis://h2:6379 redis://h3:6379

Each buyer takes the Redlock on the sale, raises the sale record's fence to its token
and reads the stock, and if a ticket is left writes the new stock and its name with the
same token. The stock and the list of buyers are one fenced value, so a buyer whose
lock expired mid-purchase could not sell a ticket twice.

The demo runs half the buyers as threads of this process and the other half as threads
of helper processes (separate Python interpreters), all released at the same instant.
It exits non-zero unless exactly the number of tickets is sold, no buyer ever sees a
negative stock, and the sold tickets carry strictly increasing fencing tokens.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Any

from fencing import RedisFencedStore, StaleTokenError
from redlock import Redlock

if __package__:
    from examples import _common as common
else:  # python examples/flash_sale.py
    import _common as common  # type: ignore[no-redef, import-not-found]

# -- The part to copy -----------------------------------------------------------------------
# One lock manager and one fenced store per process, shared by all its threads:
#     dlm = Redlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"])
#     store = RedisFencedStore(redis.Redis.from_url("redis://data:6379"))

SALE = "sale:tickets"


def buy(dlm: Redlock, store: RedisFencedStore, buyer: str) -> dict[str, Any]:
    """One buyer: lock, raise the fence and read, then sell one ticket if any is left."""
    with dlm.lock(SALE, ttl=5.0, timeout=60.0) as held:
        token = held.token
        try:
            raw = store.fence(SALE, token)  # first raise the fence, then read
            assert raw is not None, "the sale was not set up"
            sale = json.loads(raw)
            stock = sale["stock"]
            if stock <= 0:
                return {"buyer": buyer, "bought": False, "token": token, "stock_seen": stock}
            time.sleep(0.002)  # charge the card
            sale["stock"] = stock - 1
            sale["sold"].append({"buyer": buyer, "token": token, "stock_after": stock - 1})
            store.write(SALE, token, json.dumps(sale).encode())
        except StaleTokenError as exc:  # our lock expired and a newer buyer took over
            return {"buyer": buyer, "bought": False, "token": token, "stale": str(exc)}
        return {"buyer": buyer, "bought": True, "token": token, "stock_seen": stock}


# -- The demo around it (the harness is in examples/_common.py) -----------------------------


def buyers(lock_urls: list[str], store_url: str, names: list[str]) -> list[dict[str, Any]]:
    """One thread per buyer name in this process."""
    with common.clients(lock_urls, store_url) as (dlm, store):
        results = common.in_threads(lambda name: buy(dlm, store, name), names)
    return [r if not isinstance(r, Exception) else
            {"buyer": name, "bought": False, "error": repr(r)}
            for name, r in zip(names, results, strict=True)]


def child(values: list[str], lock_urls: list[str]) -> None:
    """A helper process: ``STORE_URL NAME...``."""
    store_url, *names = values
    for result in buyers(lock_urls, store_url, names):
        common.emit(**result)


def run(args: argparse.Namespace, lock_urls: list[str], store_url: str) -> int:
    n_buyers, tickets, processes = args.buyers, args.tickets, args.processes
    with common.fenced_store(store_url) as store:
        store.client.delete(store.key(SALE))
        store.write(SALE, 0, json.dumps({"stock": tickets, "sold": []}).encode())
        in_processes = n_buyers // 2 if processes else 0
        local = [f"thread-buyer-{i + 1}" for i in range(n_buyers - in_processes)]
        remote = [[f"process{p + 1}-buyer-{i + 1}" for i in range(p, in_processes, processes)]
                  for p in range(processes)]
        print(f"{n_buyers} buyers compete for {tickets} tickets: {len(local)} threads here "
              f"and {in_processes} threads in {processes} helper processes")
        helpers = common.Helpers(__file__, lock_urls,
                                 [[store_url, *names] for names in remote if names])
        try:
            started = time.monotonic()
            helpers.go()  # every buyer starts at the same moment
            results = buyers(lock_urls, store_url, local)
            results += helpers.results()
            elapsed = time.monotonic() - started
        finally:
            helpers.close()
        raw = store.read(SALE)
    assert raw is not None
    sale = json.loads(raw)

    for number, sold in enumerate(sale["sold"], 1):
        print(f"  ticket {number:2} sold to {sold['buyer']:<22} fencing token {sold['token']:>6}"
              f"  stock now {sold['stock_after']}")
    bought = sorted(r["buyer"] for r in results if r["bought"])
    sold_out = [r for r in results if not r["bought"] and "stock_seen" in r]
    failed = [r for r in results if "error" in r or "stale" in r]
    seen = [r["stock_seen"] for r in results if "stock_seen" in r]
    tokens = [s["token"] for s in sale["sold"]]
    print(f"{len(results)} buyers finished in {elapsed:.2f} s: {len(bought)} bought a ticket, "
          f"{len(sold_out)} found it sold out, {len(failed)} failed; "
          f"{sale['stock']} tickets left; lowest stock any buyer saw: {min(seen, default=0)}")
    by_process = sum(1 for name in bought if name.startswith("process"))
    print(f"tickets went to {len(bought) - by_process} thread buyers and {by_process} "
          f"process buyers")
    for r in failed:
        print(f"  {r['buyer']}: {r.get('error') or r.get('stale')}")
    ok = (len(results) == n_buyers and len(bought) == tickets == len(sale["sold"])
          and sale["stock"] == 0 and not failed and min(seen, default=0) >= 0
          and bought == sorted(s["buyer"] for s in sale["sold"])
          and [s["stock_after"] for s in sale["sold"]] == list(range(tickets - 1, -1, -1))
          and all(a < b for a, b in itertools.pairwise(tokens)))
    return common.verdict(ok, f"exactly {tickets} tickets sold to {n_buyers} concurrent buyers, "
                              "no oversell, stock never negative, tokens increasing")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--buyers", type=int, default=50)
    p.add_argument("--tickets", type=int, default=10)
    p.add_argument("--processes", type=int, default=5, help="helper processes (default 5)")


if __name__ == "__main__":
    sys.exit(common.main(__doc__, run, options=options, child=child))
