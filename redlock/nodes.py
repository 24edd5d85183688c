"""Turning the user's node list into connection settings with bounded timeouts.

Nodes are given as URLs (``redis://``, ``rediss://user:pass@host``, ``unix://``)
or as redis-py clients. Either way each shell builds its *own* connection pool
for every node from the node's connection settings, overriding what must be
bounded for Redlock to keep its deadlines: socket and connect timeouts equal to
the node timeout, no hidden redis-py retries (each of which could sleep past
the lock's validity), no health-check pings, raw (undecoded) replies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def pool_overrides(node_timeout: float, retry: Any) -> dict[str, Any]:
    return {
        "socket_timeout": node_timeout,
        "socket_connect_timeout": node_timeout,
        "retry": retry,
        "health_check_interval": 0,
        "decode_responses": False,
    }


def address_of(kwargs: Mapping[str, Any]) -> str:
    """A readable, unique name for a node: host:port[/db] or the unix socket path."""
    if kwargs.get("path"):
        base = f"unix:{kwargs['path']}"
    else:
        base = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    db = int(kwargs.get("db", 0) or 0)
    return f"{base}/{db}" if db else base


def check_node_list(nodes: object, client_type: type, client_name: str) -> list[Any]:
    """Reject a bare string, an empty list or items of the wrong type at the call site."""
    if isinstance(nodes, str | bytes) or not isinstance(nodes, Sequence):
        raise TypeError(
            f"nodes must be a list of URLs or {client_name} clients, not {type(nodes).__name__}")
    items = list(nodes)
    if not items:
        raise ValueError("at least one Redis node is needed")
    for item in items:
        if not isinstance(item, str | client_type):
            raise TypeError(
                f"each node must be a URL string or a {client_name}, not {type(item).__name__}")
    return items
