"""The flash sale of examples/flash_sale.py as an HTTP service: the compose stack's app.

Every purchase takes the Redlock on the sale across the lock nodes (through Toxiproxy
in the stack), raises the sale record's fence to its token and reads the stock, and
if a ticket is left writes the new stock and the buyer with the same token (a
``fencing.RedisFencedStore`` on its own Redis node). So even a buyer whose lock
expired mid-purchase cannot sell a ticket twice.

    GET  /health                  200 {"ok": true, "nodes": 5, "quorum": 3}
    POST /sale  {"tickets": 10}   200 a new sale (the record is replaced)
    POST /buy   {"buyer": "ann"}  200 {"bought": true, "token": 41, "stock_after": 9}
                ("timeout": 1.0 optional: this buyer's wait for the lock, in seconds)
                                  200 {"bought": false, "reason": "sold out", ...}
                                  503 {"error": "QuorumUnavailable", "detail": "..."}
                                  409 {"error": "StaleTokenError", "detail": "..."}
    GET  /sale                    200 {"stock": 9, "sold": [{"buyer", "token", ...}]}

Configuration (environment): ``LOCK_URLS`` (space-separated Redis URLs of the lock
nodes), ``STORE_URL`` (the node holding the sale record), ``APP_HOST`` (default
127.0.0.1), ``APP_PORT`` (8080), ``LOCK_TTL`` (5 s), ``LOCK_TIMEOUT`` (how long a
buyer waits for the lock, 2 s), ``LOG_LEVEL`` (WARNING; DEBUG shows every attempt).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis

from fencing import RedisFencedStore, StaleTokenError
from redlock import EventFormatter, LockNotAcquired, Redlock, RedlockError

SALE = "sale:tickets"


class Shop:
    def __init__(self, lock_urls: list[str], store_url: str, ttl: float, timeout: float) -> None:
        self.dlm = Redlock(lock_urls)
        self.client = redis.Redis.from_url(store_url, socket_timeout=5.0,
                                           socket_connect_timeout=5.0)
        self.store = RedisFencedStore(self.client)
        self.ttl = ttl
        self.timeout = timeout

    def new_sale(self, tickets: int) -> dict[str, Any]:
        sale = {"stock": tickets, "tickets": tickets, "sold": []}
        self.client.delete(self.store.key(SALE))
        self.store.write(SALE, 0, json.dumps(sale).encode())
        return sale

    def sale(self) -> dict[str, Any]:
        raw = self.store.read(SALE)
        return json.loads(raw) if raw else {}

    def buy(self, buyer: str, timeout: float | None = None) -> dict[str, Any]:
        started = time.monotonic()
        wait = self.timeout if timeout is None else timeout
        with self.dlm.lock(SALE, ttl=self.ttl, timeout=wait) as held:
            token = held.token
            raw = self.store.fence(SALE, token)  # first raise the fence, then read
            if raw is None:
                return {"bought": False, "reason": "no sale", "token": token}
            sale = json.loads(raw)
            stock = sale["stock"]
            if stock <= 0:
                return {"bought": False, "reason": "sold out", "token": token,
                        "stock_seen": stock}
            sale["stock"] = stock - 1
            sale["sold"].append({"buyer": buyer, "token": token, "stock_after": stock - 1})
            self.store.write(SALE, token, json.dumps(sale).encode())
        return {"bought": True, "token": token, "stock_seen": stock, "stock_after": stock - 1,
                "seconds": round(time.monotonic() - started, 4)}

    def close(self) -> None:
        self.dlm.close()
        self.client.close()


def handler_for(shop: Shop) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: one line per request would drown the stack's logs."""

        def reply(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            data = json.loads(self.rfile.read(length) or b"{}") if length else {}
            return data if isinstance(data, dict) else {}

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(HTTPStatus.OK, {"ok": True, "nodes": len(shop.dlm.nodes),
                                           "quorum": shop.dlm.quorum})
            elif self.path == "/sale":
                self.reply(HTTPStatus.OK, shop.sale())
            else:
                self.reply(HTTPStatus.NOT_FOUND, {"error": "no such path"})

        def do_POST(self) -> None:
            try:
                if self.path == "/sale":
                    self.reply(HTTPStatus.OK, shop.new_sale(int(self.body()["tickets"])))
                elif self.path == "/buy":
                    body = self.body()
                    timeout = float(body["timeout"]) if "timeout" in body else None
                    self.reply(HTTPStatus.OK, shop.buy(str(body["buyer"]), timeout))
                else:
                    self.reply(HTTPStatus.NOT_FOUND, {"error": "no such path"})
            except LockNotAcquired as exc:
                self.reply(HTTPStatus.SERVICE_UNAVAILABLE,
                           {"error": type(exc).__name__, "detail": str(exc)})
            except StaleTokenError as exc:
                self.reply(HTTPStatus.CONFLICT, {"error": type(exc).__name__,
                                                 "detail": str(exc)})
            except (RedlockError, redis.RedisError) as exc:
                self.reply(HTTPStatus.SERVICE_UNAVAILABLE,
                           {"error": type(exc).__name__, "detail": str(exc)})
            except (KeyError, ValueError) as exc:
                self.reply(HTTPStatus.BAD_REQUEST, {"error": "bad request",
                                                    "detail": repr(exc)})

    return Handler


class SaleServer(ThreadingHTTPServer):
    """The app's HTTP server: one thread per request, and a listen queue that holds a
    burst of buyers. socketserver listens with a backlog of 5: the compose test sends 15
    buys at once (right after the heal, while every request also opens new connections
    to the healed nodes), and connections beyond the queue are dropped by the kernel
    until the client retries its SYN, or reset (seen here: a buyer reset after 1 s, and
    buyers of a 15-burst answered 1 s late; in CI a buy unanswered for 60 s, then
    reset), whatever the lock does."""

    daemon_threads = True
    request_queue_size = 128


def make_server(address: tuple[str, int], shop: Any) -> SaleServer:
    return SaleServer(address, handler_for(shop))


def main() -> int:
    # The library's events on stderr: its warnings by default, LOG_LEVEL=DEBUG for every
    # attempt (docs/events.md lists them).
    handler = logging.StreamHandler()
    handler.setFormatter(EventFormatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING").upper(),
                        handlers=[handler])
    lock_urls = os.environ["LOCK_URLS"].split()
    shop = Shop(lock_urls, os.environ["STORE_URL"], float(os.environ.get("LOCK_TTL", "5")),
                float(os.environ.get("LOCK_TIMEOUT", "2")))
    address = (os.environ.get("APP_HOST", "127.0.0.1"), int(os.environ.get("APP_PORT", "8080")))
    server = make_server(address, shop)

    def stop(signum: int, frame: object) -> None:
        # PID 1 in its container: without a handler SIGTERM would be ignored.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"sale service on http://{address[0]}:{address[1]}, lock nodes {lock_urls}",
          flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        shop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
