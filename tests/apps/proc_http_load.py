"""HTTP load for tests/apps/test_busy_renewals.py: ``CLIENTS`` connections requesting
``URL`` back to back for ``SECONDS``, from a process of its own (so that the test's own
checks are not starved by it). Prints ``done <requests> <errors>``.

    python -m tests.apps.proc_http_load URL SECONDS CLIENTS
"""

from __future__ import annotations

import asyncio
import sys
import time

import httpx


async def main(url: str, seconds: float, clients: int) -> None:
    done = errors = 0
    until = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal done, errors
        while time.monotonic() < until:
            try:
                response = await http.get(url)
                done += 1
                errors += response.status_code != 200
            except httpx.HTTPError:
                errors += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as http:
        await asyncio.gather(*[client(http) for _ in range(clients)])
    print(f"done {done} {errors}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
