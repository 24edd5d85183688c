"""The raw floor of each kind of the lock family (benchmarks/family.py): a kind's acquire
and release scripts, exactly as the library builds them (``Kind.acquire_calls``,
``Kind.release_call``), sent to every node by EVALSHA on one thread (write to all,
then read all), and nothing else: no quorum, token or validity logic. Like
``_floors.py``, it imports internals of the library, on purpose.
"""

from __future__ import annotations

import secrets
from typing import Any

import redis

from benchmarks._floors import initialise
from redlock._core.kinds import AcquireArgs, Kind, with_epoch
from redlock._core.requests import Call
from redlock._core.settings import Keys

_KEYS = Keys("redlock")


class KindFloor:
    """One name of one kind: ``cycle()`` = one acquire + one release, scattered."""

    def __init__(self, urls: list[str], kind: Kind, name: str, ttl_s: float = 10.0) -> None:
        initialise(urls)
        self.clients = [redis.Redis.from_url(u) for u in urls]
        self.kind, self.name, self.ttl_ms = kind, name, int(ttl_s * 1000)
        self.n = len(urls)

    def _scatter(self, calls: tuple[Call, ...]) -> list[Any]:
        conns = [(c, c.connection_pool.get_connection()) for c in self.clients]
        try:
            for (_, conn), call in zip(conns, calls, strict=True):
                assert call.script is not None
                conn.send_command("EVALSHA", call.script.sha, len(call.keys), *call.keys,
                                  *call.args)
            replies = []
            for (client, conn), call in zip(conns, calls, strict=True):
                try:
                    replies.append(conn.read_response())
                except redis.exceptions.NoScriptError:
                    assert call.script is not None
                    replies.append(client.eval(call.script.source, len(call.keys),
                                               *call.keys, *call.args))
            return replies
        finally:
            for client, conn in conns:
                client.connection_pool.release(conn)

    def cycle(self) -> None:
        owner = secrets.token_hex(16)
        kind = self.kind.for_call(owner)
        calls = with_epoch(kind.acquire_calls(_KEYS, range(self.n), (self.name,),
                                              AcquireArgs(owner, self.ttl_ms, 0, "", 1000)),
                           _KEYS, 0)  # epoch 0: a cluster whose membership never changed
        replies = self._scatter(calls)
        if sum(1 for r in replies if int(r[0]) in (1, 2)) < self.n // 2 + 1:
            raise RuntimeError(f"floor acquire failed: {replies}")
        if hasattr(kind, "slot") and isinstance(replies[0], list) and len(replies[0]) == 3:
            from dataclasses import replace
            kind = replace(kind, slot=int(replies[0][2]))  # type: ignore[type-var]
        self._scatter(tuple(kind.release_call(_KEYS, i, self.name, (owner, "1"))
                            for i in range(self.n)))

    def close(self) -> None:
        for client in self.clients:
            client.close()
