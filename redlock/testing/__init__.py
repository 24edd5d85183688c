"""Real redis-server processes for tests, demos and benchmarks.

    from redlock.testing import RedisNodes

    with RedisNodes(5) as nodes:            # five redis-server processes on loopback
        dlm = Redlock(nodes.urls)
        nodes[0].pause()                    # SIGSTOP: the node hangs, sockets stay open
        nodes[0].resume()
        nodes[1].restart(keep_data=False)   # comes back empty on the same port: amnesia
        backup = nodes[2].backup()          # SAVE and copy its files aside ...
        nodes[2].restore(backup)            # ... and later restart from them (a rollback)
        nodes[3].replicate(nodes[4])        # REPLICAOF; nodes[3].promote(): REPLICAOF NO ONE

``manager(nodes, clock=..., sleep=..., asynchronous=False, **options)`` builds a ``Redlock`` (or
``AsyncRedlock``) with a test's clock and sleep: the public constructor takes neither.

``RedisClusterNodes(masters=3, replicas=1)`` runs a real Redis Cluster (hash slots migrated,
masters killed and their replicas promoted), and the ``redlock_redis_cluster`` fixture gives one.

``RedisSentinel`` runs a real Sentinel (``redis-server --sentinel``) monitoring some of
those nodes under service names, for nodes given as ``Sentinel.master_for(service)``.

Network faults go through a real Toxiproxy server (``ToxiproxyServer``, one ``Proxy`` in
front of each node: refuse, blackhole, lose replies, latency, reset connections).

Everything started here is stopped on ``close()``, on leaving the ``with`` block and,
as a last resort, at interpreter exit.

The same servers can run in Docker containers instead (testcontainers; the ``docker`` extra):
``start_nodes(5, backend="docker")``, ``start_toxiproxy(backend="docker")``, or
``$REDLOCK_TEST_BACKEND=docker`` (:mod:`redlock.testing.backends`; local processes stay the
default). The pytest plugin (:mod:`redlock.testing.pytest_plugin`) offers clusters, clients and
faults as fixtures. ``capture_events()`` collects the library's log events in a test.

Importing this package imports none of that: each name is loaded from its module on
first use, so that the pytest plugin (a module of this package, loaded into every pytest
session that has the package installed) costs nothing until a fixture is used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redlock.testing.backends import start_nodes, start_toxiproxy
    from redlock.testing.logs import capture_events
    from redlock.testing.managers import manager
    from redlock.testing.node import Node, Nodes
    from redlock.testing.redis_cluster import RedisClusterNodes
    from redlock.testing.redis_nodes import (
        NodeBackup,
        RedisNode,
        RedisNodes,
        find_redis_server,
        free_port,
    )
    from redlock.testing.sentinel import RedisSentinel
    from redlock.testing.toxiproxy import (
        Proxies,
        Proxy,
        ToxiproxyError,
        ToxiproxyServer,
        find_toxiproxy_server,
    )

# Public name -> the module that defines it (loaded on first access, PEP 562).
_LAZY = {"start_nodes": "backends", "start_toxiproxy": "backends", "capture_events": "logs",
         "manager": "managers", "Node": "node", "Nodes": "node", "NodeBackup": "redis_nodes",
         "RedisNode": "redis_nodes", "RedisNodes": "redis_nodes",
         "RedisClusterNodes": "redis_cluster",
         "find_redis_server": "redis_nodes", "free_port": "redis_nodes",
         "RedisSentinel": "sentinel", "Proxies": "toxiproxy", "Proxy": "toxiproxy",
         "ToxiproxyError": "toxiproxy", "ToxiproxyServer": "toxiproxy",
         "find_toxiproxy_server": "toxiproxy"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["Node", "NodeBackup", "Nodes", "Proxies", "Proxy", "RedisClusterNodes", "RedisNode",
           "RedisNodes",
           "RedisSentinel", "ToxiproxyError", "ToxiproxyServer", "capture_events",
           "find_redis_server", "find_toxiproxy_server", "free_port", "manager", "start_nodes",
           "start_toxiproxy"]
