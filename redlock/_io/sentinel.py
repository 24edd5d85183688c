"""Nodes behind Redis Sentinel, and why a Redis Cluster is not a node.

A client from ``redis.Sentinel(...).master_for(service)`` (or the asyncio twin) is a
node: the master Sentinel currently names for ``service``. Its connection settings
name no host (each new connection asks the sentinels first), so such a node is known
by its service and its sentinels, not by host and port, and is labelled
``sentinel:<service>`` (``sentinel:<service>@<first sentinel>`` when two nodes of one
list share a service name: three independent deployments may all call theirs
``mymaster``).

Each manager builds its own pool for the service, like for any node, with
``connect_timeout`` on every socket, and also its own copy of the sentinel manager, so
that the sentinels are asked within it too and without redis-py retries. What Sentinel
adds, and what it costs, is in docs/design.md §11.3 (a failover promotes a replica,
which may lack the newest keys and counters: clients see it restarted and demote it).

A Redis Cluster client is refused with the reason (see :func:`cluster_refusal`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio.sentinel
import redis.sentinel

_SENTINEL_POOLS = (redis.sentinel.SentinelConnectionPool,
                   redis.asyncio.sentinel.SentinelConnectionPool)


def _cluster_client_types() -> tuple[type, ...]:
    types: list[type] = []
    with contextlib.suppress(ImportError):
        from redis.cluster import RedisCluster
        types.append(RedisCluster)
    with contextlib.suppress(ImportError):
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
        types.append(AsyncRedisCluster)
    return tuple(types)


_CLUSTER_CLIENTS = _cluster_client_types()

CLUSTER_REASON = (
    "a Redis Cluster is not supported as a Redlock node: the lock scripts take the"
    " resource's keys together with the node marker (ns:node:marker), which hash to"
    " different slots (CROSSSLOT), and a cluster's failover promotes replicas that may"
    " lack the newest lock keys and fence counters. Give N independent non-cluster"
    " masters instead (docs/design.md §11.4)"
)


def cluster_refusal(node: object) -> str | None:
    """Why ``node`` cannot be a Redlock node because it is a cluster client, or None."""
    if _CLUSTER_CLIENTS and isinstance(node, _CLUSTER_CLIENTS):
        return f"{type(node).__name__}: {CLUSTER_REASON}"
    return None


def sentinel_pool(node: object) -> Any | None:
    """The node's Sentinel connection pool, or None if it is not Sentinel-managed."""
    pool = getattr(node, "connection_pool", None)
    return pool if isinstance(pool, _SENTINEL_POOLS) else None


def sentinel_addresses(pool: Any) -> list[str]:
    """``host:port`` of each sentinel the pool asks, in the manager's current order."""
    addresses = []
    for sentinel in pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        addresses.append(f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 26379)}")
    return addresses


def check_master(pool: Any, shown: str) -> None:
    if not getattr(pool, "is_master", True):
        raise ValueError(
            f"{shown} is a Sentinel replica client (slave_for): lock writes must go to the"
            " master, use Sentinel.master_for(service)")


def sentinel_identity(pool: Any) -> str:
    """Which master a Sentinel node means: its service as seen by its sentinels."""
    return f"sentinel:{pool.service_name}@{','.join(sorted(sentinel_addresses(pool)))}"


def sentinel_label(pool: Any, *, qualified: bool) -> str:
    label = f"sentinel:{pool.service_name}"
    if qualified:
        label += f"@{sentinel_addresses(pool)[0]}"
    return label


class _OwnedSentinelPool(redis.sentinel.SentinelConnectionPool):
    """A Sentinel pool whose sentinel clients belong to it: closed with it.

    redis-py itself calls ``disconnect(inuse_connections=False)`` when Sentinel names a
    new master (to drop idle connections to the old one); only the full disconnect of
    the transport's ``close()`` also closes the sentinel clients.
    """

    def disconnect(self, inuse_connections: bool = True) -> None:
        super().disconnect(inuse_connections)
        if inuse_connections:
            for sentinel in self.sentinel_manager.sentinels:
                with contextlib.suppress(Exception):
                    sentinel.close()


class _OwnedAsyncSentinelPool(redis.asyncio.sentinel.SentinelConnectionPool):
    """The asyncio twin of :class:`_OwnedSentinelPool`."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:
            for sentinel in self.sentinel_manager.sentinels:
                with contextlib.suppress(Exception):
                    await sentinel.aclose()


def portable(pool: Any) -> tuple[Any, ...]:
    """A Sentinel-managed master as another process rebuilds it (:func:`rebuilt`): the
    sentinels' addresses and settings, the service, and the master connections' settings."""
    manager = pool.sentinel_manager
    hosts = []
    for sentinel in manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        hosts.append((kwargs.get("host", "localhost"), kwargs.get("port", 26379)))
    sentinel_kwargs = {key: value for key, value in manager.sentinel_kwargs.items()
                       if key in _SENTINEL_SETTINGS or key.startswith("ssl_")}
    kwargs = {key: value for key, value in pool.connection_kwargs.items()
              if key in _SENTINEL_SETTINGS or key.startswith("ssl_")}
    return hosts, pool.service_name, sentinel_kwargs, kwargs, manager.min_other_sentinels


def rebuilt(hosts: list[tuple[str, int]], service: str, sentinel_kwargs: dict[str, Any],
            kwargs: dict[str, Any], min_other_sentinels: int) -> redis.Redis:
    """A blocking ``master_for`` client from :func:`portable`'s parts."""
    manager = redis.sentinel.Sentinel(hosts, min_other_sentinels=min_other_sentinels,
                                      sentinel_kwargs=sentinel_kwargs)
    client: redis.Redis = manager.master_for(service, **kwargs)
    return client


# The settings a Sentinel node's connections carry across to the renewer (§5.2).
_SENTINEL_SETTINGS = frozenset({"db", "username", "password", "credential_provider",
                                "client_name", "protocol", "socket_keepalive",
                                "socket_keepalive_options"})


def build_sentinel_pool(source: Any, overrides: Mapping[str, Any]) -> Any:
    """Our own pool for a Sentinel-managed master, and our own sentinel manager: every
    socket (sentinels included) bounded by the pools' timeout (``connect_timeout``), no
    retries."""
    manager = source.sentinel_manager
    sentinel_kwargs = {**manager.sentinel_kwargs,
                       **{key: overrides[key] for key in
                          ("socket_timeout", "socket_connect_timeout", "retry",
                           "health_check_interval")}}
    hosts = []
    for sentinel in manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        hosts.append((kwargs.get("host", "localhost"), kwargs.get("port", 26379)))
    asynchronous = isinstance(source, redis.asyncio.sentinel.SentinelConnectionPool)
    sentinel_class: Any = redis.asyncio.sentinel.Sentinel if asynchronous else redis.Sentinel
    pool_class: Any = _OwnedAsyncSentinelPool if asynchronous else _OwnedSentinelPool
    options: dict[str, Any] = {}
    if getattr(manager, "_force_master_ip", None) is not None:
        options["force_master_ip"] = manager._force_master_ip
    own_manager = sentinel_class(hosts, min_other_sentinels=manager.min_other_sentinels,
                                 sentinel_kwargs=sentinel_kwargs, **options)
    kwargs = {key: value for key, value in source.connection_kwargs.items()
              if key != "connection_pool"}
    return pool_class(source.service_name, own_manager, is_master=True,
                      check_connection=source.check_connection,
                      connection_class=source.connection_class, **{**kwargs, **overrides})
