"""Fenced writes to Redis: the highest accepted token and the value live together.

Each resource is one hash, ``{namespace}:{{resource}}`` (a hash-tagged key, so it is
a single slot on Redis Cluster too), with two fields: ``fence`` (the highest token
accepted, a decimal string) and ``value``. One Lua script compares the offered token
with the stored fence and writes both fields, atomically on the server.

The high-water mark is part of the data it protects, like a version column: one per
resource, for as long as the resource's data exists. A store made with ``ttl=`` gives
that key a time to live on every accepted write, so data that expires takes its mark
with it (and a write after that is a first write again: see :class:`RedisFencedStore`)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from fencing._validate import validate_resource, validate_token, validate_ttl, validate_value
from fencing.errors import StaleTokenError

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]+$")

# Reply codes of FENCED_WRITE (first element of the reply array).
REJECTED = 0
ACCEPTED = 1

MODE_WRITE = "w"  # raise the fence and store the value
MODE_FENCE = "f"  # raise the fence only, and return the stored value (read-modify-write)

FENCED_WRITE = """
-- KEYS[1] the resource's hash, fields 'fence' (highest accepted token) and 'value'
-- ARGV[1] the offered token: a canonical decimal string (no sign, no leading zeros)
-- ARGV[2] mode: 'w' store ARGV[3] as the value; 'f' only raise the fence
-- ARGV[3] the value (mode 'w'; '' in mode 'f')
-- ARGV[4] (optional) time to live in ms, set by PEXPIRE on every accepted call, so the
--         value and its fence expire together; absent or '': the key's expiry is left
--         as it is (HSET keeps an existing one; a new key never expires)
-- returns {0, highest}          rejected: token < highest; nothing changed
--         {1, token}            mode 'w': fence = token, value = ARGV[3]
--         {1, token, value}     mode 'f': fence = token; the stored value (nil if none)
-- A rejected call changes nothing, its expiry included.
-- Tokens are compared as decimal strings (length, then digit by digit), so they are
-- exact up to 2**63 - 1: Lua numbers are doubles and would round above 2**53.
local offered = ARGV[1]
local stored = redis.call('HGET', KEYS[1], 'fence')
if stored then
    local lower = #offered < #stored
    if #offered == #stored then
        for i = 1, #offered do
            local a, b = string.byte(offered, i), string.byte(stored, i)
            if a ~= b then
                lower = a < b
                break
            end
        end
    end
    if lower then
        return {0, stored}
    end
end
if ARGV[2] == 'w' then
    redis.call('HSET', KEYS[1], 'fence', offered, 'value', ARGV[3])
else
    redis.call('HSET', KEYS[1], 'fence', offered)
end
if ARGV[4] and ARGV[4] ~= '' then
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
if ARGV[2] == 'w' then
    return {1, offered}
end
return {1, offered, redis.call('HGET', KEYS[1], 'value')}
"""


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, not {type(namespace).__name__}")
    if not _NAMESPACE_RE.match(namespace):
        raise ValueError(f"namespace must match {_NAMESPACE_RE.pattern}, got {namespace!r}")
    return namespace


def _check_client(client: object, expected: type, name: str) -> None:
    if not isinstance(client, expected):
        # Both redis-py clients are classes named Redis: say which one it is, and the fix.
        given = f"{type(client).__module__.removesuffix('.client')}.{type(client).__qualname__}"
        hint = ""
        if isinstance(client, redis.asyncio.Redis):
            hint = ": an asyncio client goes to AsyncRedisFencedStore"
        elif isinstance(client, redis.Redis):
            hint = ": a blocking client goes to RedisFencedStore"
        raise TypeError(f"client must be a {name}, not {given}{hint}")
    kwargs = client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    if kwargs.get("decode_responses"):
        raise ValueError(
            "the client decodes responses (decode_responses=True), but values are bytes: "
            "give the fenced store a client created with decode_responses=False"
        )


def _interpret(resource: str, token: int, reply: Any) -> Sequence[Any]:
    """Translate the script's reply codes in one place: raise on a stale token."""
    if not isinstance(reply, list | tuple) or len(reply) < 2:
        raise RuntimeError(f"unexpected reply from the fenced-write script: {reply!r}")
    if int(reply[0]) == REJECTED:
        raise StaleTokenError(resource, token, int(reply[1]))
    return reply


def _as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    raise RuntimeError(f"expected bytes from Redis, got {type(value).__name__}")


class _Base:
    def __init__(self, namespace: str, ttl: float | None) -> None:
        self.namespace = _check_namespace(namespace)
        self.ttl = validate_ttl(ttl)
        # Milliseconds for PEXPIRE, rounded up: a key never expires before ``ttl``.
        self._ttl_ms = "" if self.ttl is None else str(math.ceil(self.ttl * 1000))

    def key(self, resource: str) -> str:
        """The Redis key holding ``resource``'s fence and value."""
        return f"{self.namespace}:{{{validate_resource(resource)}}}"

    def _args(self, token: int, mode: str, value: bytes = b"") -> list[str | bytes]:
        return [str(validate_token(token)), mode, value, self._ttl_ms]


class RedisFencedStore(_Base):
    """Values in Redis that only writers with a current fencing token may change.

    ``write(resource, token, value)`` succeeds when ``token`` is at least the highest
    token accepted so far for ``resource`` (equal: the same holder writing again) and
    raises :class:`~fencing.StaleTokenError` otherwise, changing nothing.

    The highest accepted token (the *mark*) lives in the resource's own hash, next to
    its value: one key per resource, which goes when the data goes.

    **Expiring data** (``ttl=``): every accepted :meth:`write` or :meth:`fence` sets the
    key's time to live to ``ttl`` seconds, so value and mark expire together ``ttl``
    after the last accepted call (a rejected call changes nothing, its expiry included).
    Once they have expired the store no longer remembers the mark: the next write is a
    first write and is accepted *whatever its token*, a stale holder's too. So expire
    only data whose staleness no longer matters: ``ttl`` must be longer than any lock's
    validity plus the longest pause you want to fence (a write that arrives more than
    ``ttl`` after the resource's last accepted write or fence is accepted, whatever its
    token). The key's expiry
    is Redis's, by the server's clock; with a ``maxmemory`` policy other than
    ``noeviction`` Redis may also evict it sooner, mark and all.

    Args:
        client: a ``redis.Redis`` client with ``decode_responses=False``; the store
            does not close it.
        namespace: key prefix; a resource lives at ``{namespace}:{{resource}}``.
        ttl: seconds (0.001 to 10 years) the resource's value and mark live after each
            accepted write or fence; None (the default): the store never sets an expiry
            (keys never expire, and one set by other means is left as it is). Give
            every store writing the same keys the same ``ttl``."""

    def __init__(self, client: redis.Redis, namespace: str = "fence", *,
                 ttl: float | None = None) -> None:
        _check_client(client, redis.Redis, "redis.Redis")
        super().__init__(namespace, ttl)
        self.client = client
        self._script = client.register_script(FENCED_WRITE)

    def write(self, resource: str, token: int, value: bytes) -> None:
        """Store ``value`` for ``resource`` if ``token`` >= the highest accepted token."""
        key = self.key(resource)
        args = self._args(token, MODE_WRITE, validate_value(value))
        _interpret(resource, token, self._script(keys=[key], args=args))

    def fence(self, resource: str, token: int) -> bytes | None:
        """Raise the stored fence to ``token`` (rejecting a stale one), then return the
        current value: the first step of a read-modify-write, so that no holder with a
        lower token can write between this read and your :meth:`write`."""
        key = self.key(resource)
        reply = _interpret(resource, token,
                           self._script(keys=[key], args=self._args(token, MODE_FENCE)))
        return _as_bytes(reply[2]) if len(reply) > 2 else None

    def read(self, resource: str) -> bytes | None:
        """The value last written with an accepted token, or None."""
        return _as_bytes(self.client.hget(self.key(resource), "value"))

    def highest(self, resource: str) -> int:
        """The highest token accepted for ``resource`` (0 when none was)."""
        stored = self.client.hget(self.key(resource), "fence")
        return int(stored) if stored is not None else 0


class AsyncRedisFencedStore(_Base):
    """The asyncio twin of :class:`RedisFencedStore`, over ``redis.asyncio.Redis``: the
    same keys, script and arguments (``ttl=`` included; read its caveat there)."""

    def __init__(self, client: redis.asyncio.Redis, namespace: str = "fence", *,
                 ttl: float | None = None) -> None:
        _check_client(client, redis.asyncio.Redis, "redis.asyncio.Redis")
        super().__init__(namespace, ttl)
        self.client = client
        self._script = client.register_script(FENCED_WRITE)

    async def write(self, resource: str, token: int, value: bytes) -> None:
        """Store ``value`` for ``resource`` if ``token`` >= the highest accepted token."""
        key = self.key(resource)
        args = self._args(token, MODE_WRITE, validate_value(value))
        _interpret(resource, token, await self._script(keys=[key], args=args))

    async def fence(self, resource: str, token: int) -> bytes | None:
        """Raise the stored fence to ``token``, then return the current value."""
        key = self.key(resource)
        reply = _interpret(resource, token,
                           await self._script(keys=[key], args=self._args(token, MODE_FENCE)))
        return _as_bytes(reply[2]) if len(reply) > 2 else None

    async def read(self, resource: str) -> bytes | None:
        """The value last written with an accepted token, or None."""
        return _as_bytes(await self.client.hget(self.key(resource), "value"))

    async def highest(self, resource: str) -> int:
        """The highest token accepted for ``resource`` (0 when none was)."""
        stored = await self.client.hget(self.key(resource), "fence")
        return int(stored) if stored is not None else 0
