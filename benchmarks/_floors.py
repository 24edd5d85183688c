"""The raw floors: what the I/O of one acquire+release costs with no lock logic at all.

A floor sends the same two Lua scripts as our client (ACQUIRE and RELEASE, by EVALSHA)
to every node, on connection pools built with our connection settings, and does nothing
else: no quorum or validity logic, no retries, no bookkeeping, no logging. The gap
between our client and its floor is the client's own cost.

* :class:`SyncFloor`: write the command to every node, then read every reply (what our
  sync client does on one thread);
* :class:`AsyncFloor`: ``asyncio.gather`` of one send+read per node on redis.asyncio
  (what our asyncio client builds on), optionally with the timeout layers our asyncio
  client adds per node call (benchmarks/async_overhead.py measures each layer).

This is the only module of benchmarks/ that imports internals of the library.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from redlock._core.settings import Keys
from redlock._core.tokens import bucket
from redlock._scripts import lock as scripts

MARKER = Keys("redlock").marker


def pool_overrides(socket_timeout: float, retry: Any) -> dict[str, Any]:
    """redis-py connection settings of the floors: our timeouts, no retry, no health
    check (the library's own connections do neither)."""
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        "retry": retry,
        "health_check_interval": 0,
        "decode_responses": False,
    }


_KEYS = Keys("redlock")


def _acquire_command(resource: str, owner: str, ttl_s: float) -> tuple[Any, ...]:
    """A single try (no ticket: it does not join the waiting line)."""
    # The last key and argument: the node's membership record and the client's epoch
    # (0: a cluster that never changed its nodes), as every granting script takes them.
    return ("EVALSHA", scripts.ACQUIRE.sha, 6, _KEYS.lock(resource), _KEYS.counter,
            MARKER, _KEYS.line(resource), _KEYS.line_deadlines(resource), _KEYS.members, owner,
            int(ttl_s * 1000), 0, "", 1000, bucket(resource), 0)


def _release_command(resource: str, owner: str) -> tuple[Any, ...]:
    return ("EVALSHA", scripts.RELEASE.sha, 4, _KEYS.lock(resource), _KEYS.channel(resource),
            _KEYS.line(resource), _KEYS.line_deadlines(resource), owner, "1")


def client_commands(resource: str, owner: str,
                    ttl_s: float) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The ACQUIRE and RELEASE commands exactly as our client sends them to a node of a
    cluster that never changed its nodes (epoch 0): a blocking acquire's first attempt
    (a ticket, attempt 1, the manager's route) and the holder's release, with every key
    and argument (benchmarks/script_cost.py)."""
    from redlock._core.kinds import MUTEX, AcquireArgs, with_epoch
    from redlock._io.wire import render

    args = AcquireArgs(owner, int(ttl_s * 1000), 0, "1", 1000, 1, "0badf00d")
    [acquire] = with_epoch(MUTEX.acquire_calls(_KEYS, range(1), (resource,), args), _KEYS, 0)
    release = MUTEX.release_call(_KEYS, 0, resource, (owner, "1"))
    return render(acquire, evalsha=True), render(release, evalsha=True)


def script_sources() -> tuple[str, str]:
    """Our ACQUIRE and RELEASE scripts' source (to load them on a node)."""
    return scripts.ACQUIRE.source, scripts.RELEASE.source


def initialise(urls: list[str]) -> None:
    """Give the nodes their marker the library's way (the ACQUIRE script refuses on a
    node without one; a marker written by hand is not stamped with the server's run id,
    and the client would then judge the node restarted and bench it)."""
    from redlock import Redlock
    from redlock.admin import Admin

    quiet = logging.getLogger("redlock")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # initialise() warns that it initialised by hand: yes
    try:
        # node_timeout: set-up, not measured; the default 50 ms is below one handshake
        # through a slow network (benchmarks/network.py).
        # force: the N-scaling section grows a cluster over the same servers, and new
        # members of a cluster that has markers count as nodes that lost their data.
        # Nothing here is protected by the locks.
        with Redlock(urls, node_timeout=5.0) as dlm:
            failed = [r for r in Admin(dlm).initialise(force=True) if r.status == "failed"]
    finally:
        quiet.setLevel(level)
    if failed:
        raise RuntimeError(f"could not initialise the nodes: {failed}")


def _check_quorum(replies: list[Any]) -> None:
    if sum(1 for r in replies if int(r[0]) == 1) < len(replies) // 2 + 1:
        raise RuntimeError(f"floor acquire failed: {replies}")


class SyncFloor:
    """Scatter EVALSHA to all nodes, gather the replies; twice per cycle."""

    def __init__(self, urls: list[str], *, node_timeout: float, ttl_s: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        self.pools = [redis.ConnectionPool.from_url(u, **overrides) for u in urls]
        self.ttl_s = ttl_s
        initialise(urls)
        for pool in self.pools:
            with redis.Redis(connection_pool=pool) as client:
                client.script_load(scripts.ACQUIRE.source)
                client.script_load(scripts.RELEASE.source)

    def _scatter(self, *command: Any) -> list[Any]:
        conns = [p.get_connection() for p in self.pools]
        try:
            for conn in conns:
                conn.send_command(*command)
            return [conn.read_response() for conn in conns]
        finally:
            for pool, conn in zip(self.pools, conns, strict=True):
                pool.release(conn)

    def acquire(self, resource: str) -> str:
        owner = secrets.token_hex(16)
        _check_quorum(self._scatter(*_acquire_command(resource, owner, self.ttl_s)))
        return owner

    def release(self, resource: str, owner: str) -> None:
        self._scatter(*_release_command(resource, owner))

    def close(self) -> None:
        for pool in self.pools:
            pool.disconnect()


AsyncCall = Callable[..., Awaitable[Any]]


class AsyncFloor:
    """``asyncio.gather`` of one exchange per node; twice per cycle.

    ``calls(per_call_timeout, read_timeout)`` gives the acquire/release pair with the
    layers our asyncio client puts around each node's exchange:

    * ``per_call_timeout``: None (bare), ``"wait_for"`` (``asyncio.wait_for``: a Task and
      a timer per call) or ``"timeout"`` (``asyncio.timeout``, 3.11+: cancels in place);
    * ``read_timeout``: also pass ``read_response(timeout=...)``.
    """

    def __init__(self, urls: list[str], *, node_timeout: float, ttl_s: float) -> None:
        overrides = pool_overrides(node_timeout, AsyncRetry(NoBackoff(), 0))
        self.pools = [redis.asyncio.ConnectionPool.from_url(u, **overrides) for u in urls]
        self.node_timeout = node_timeout
        self.ttl_s = ttl_s
        self.urls = urls

    async def prepare(self) -> None:
        # Set-up, not measured; in a thread, as the blocking client asks of async code.
        await asyncio.to_thread(initialise, self.urls)
        for pool in self.pools:
            client = redis.asyncio.Redis(connection_pool=pool)
            await client.script_load(scripts.ACQUIRE.source)
            await client.script_load(scripts.RELEASE.source)

    async def _one(self, pool: Any, command: tuple[Any, ...], per_call_timeout: str | None,
                   read_timeout: bool) -> Any:
        conn = await pool.get_connection()
        try:
            async def exchange() -> Any:
                await conn.send_command(*command, check_health=False)
                if read_timeout:
                    return await conn.read_response(timeout=self.node_timeout,
                                                    disconnect_on_error=False)
                return await conn.read_response()

            if per_call_timeout == "wait_for":
                return await asyncio.wait_for(exchange(), self.node_timeout)
            if per_call_timeout == "timeout":
                if sys.version_info < (3, 11):
                    raise RuntimeError("asyncio.timeout needs Python 3.11+")
                async with asyncio.timeout(self.node_timeout):
                    return await exchange()
            return await exchange()
        finally:
            await pool.release(conn)

    def calls(self, per_call_timeout: str | None = None, read_timeout: bool = False
              ) -> tuple[AsyncCall, AsyncCall]:
        async def gather(command: tuple[Any, ...]) -> list[Any]:
            return await asyncio.gather(*(self._one(p, command, per_call_timeout, read_timeout)
                                          for p in self.pools))

        async def acquire(resource: str) -> str:
            owner = secrets.token_hex(16)
            _check_quorum(await gather(_acquire_command(resource, owner, self.ttl_s)))
            return owner

        async def release(resource: str, owner: str) -> None:
            await gather(_release_command(resource, owner))

        return acquire, release

    async def close(self) -> None:
        for pool in self.pools:
            await pool.disconnect()
