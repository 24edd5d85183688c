"""The caller's node list: checked, named, and turned into bounded connection pools.

Nodes are given as URLs (``redis://``, ``rediss://user:pass@host``, ``unix://``)
or as redis-py clients. Either way each manager builds its *own* connection pool
for every node from the node's connection settings, overriding what must be
bounded for Redlock to keep its deadlines: socket and connect timeouts equal to
``connect_timeout`` (they bound connecting, the handshake and a send that cannot
proceed; reads carry each request's own deadline, docs/design.md §2.4), no hidden
redis-py retries (each of which could sleep past the lock's validity), no
health-check pings, raw (undecoded) replies. The overrides win over a URL's query
string too (``?socket_timeout=30`` would otherwise unbound a node).

The list may be any collection (a list, a tuple, a set, a generator): the nodes are
taken in its iteration order, which for a set is arbitrary (node names in errors and
logs follow it). Nodes behind Sentinel and the refusal of Redis Cluster clients are in
:mod:`redlock._io.sentinel`.
"""

from __future__ import annotations

import ipaddress
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.connection
from redis.connection import parse_url

from redlock._io import sentinel as _sentinel

PoolT = TypeVar("PoolT")


def pool_overrides(socket_timeout: float, retry: Any) -> dict[str, Any]:
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
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


def server_identity(kwargs: Mapping[str, Any]) -> str:
    """Which Redis *server* a node's settings point at, however the address is spelled.

    The database number, user and password are ignored (two databases of one server are
    one failure domain, not two nodes); host names are compared case-insensitively
    without a trailing dot, IP literals in canonical form, ``localhost`` as 127.0.0.1,
    unix socket paths normalised. No name resolution: other aliases are not detected.
    """
    if kwargs.get("path"):
        return f"unix:{os.path.normpath(str(kwargs['path']))}"
    host = str(kwargs.get("host") or "localhost").strip("[]").rstrip(".").lower()
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        if host == "localhost":
            host = "127.0.0.1"
    return f"{host}:{int(kwargs.get('port') or 6379)}"


def type_name(value: object) -> str:
    """A value's class as a user imports it: ``redis.asyncio.Redis`` (the class names of
    the two redis-py clients are both ``Redis``), ``builtins`` left out."""
    cls = type(value)
    module = cls.__module__.removesuffix(".client")
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _flavour_hint(item: object, client_name: str) -> str:
    """The fix when a client of the other flavour was given."""
    if isinstance(item, redis.asyncio.Redis):
        return ": an asyncio client goes to AsyncRedlock (or give the node's URL)"
    if isinstance(item, redis.Redis) and client_name.startswith("redis.asyncio"):
        return ": a blocking client goes to Redlock (or give the node's URL)"
    return ""


def check_node_list(nodes: object, client_type: type, client_name: str) -> list[Any]:
    """Reject a bare string, a mapping, an empty collection, items of the wrong type
    (and Redis Cluster clients, saying why), unparsable URLs and the same server listed
    twice, at the call site. Any other iterable is taken in its iteration order."""
    if isinstance(nodes, str | bytes | bytearray | Mapping) or not isinstance(nodes, Iterable):
        raise TypeError(
            f"nodes must be a collection (list, tuple, set...) of URLs or {client_name}"
            f" clients, not {type(nodes).__name__}")
    items = list(nodes)
    if not items:
        raise ValueError("at least one Redis node is needed")
    for item in items:
        refusal = _sentinel.cluster_refusal(item)
        if refusal is not None:
            raise TypeError(refusal)
        if not isinstance(item, str | client_type):
            raise TypeError(f"each node must be a URL string or a {client_name}, not"
                            f" {type_name(item)}{_flavour_hint(item, client_name)}")
    seen: dict[str, str] = {}
    for item in items:
        identity, shown = _identity_and_shown(item)
        if identity in seen:
            raise ValueError(
                f"nodes {seen[identity]} and {shown} are the same Redis server ({identity}):"
                " each node must be an independent server")
        seen[identity] = shown
    return items


def _identity_and_shown(item: Any) -> tuple[str, str]:
    pool = _sentinel.sentinel_pool(item)
    if pool is not None:
        shown = f"{type(item).__name__}(service={pool.service_name!r})"
        _sentinel.check_master(pool, shown)
        return _sentinel.sentinel_identity(pool), shown
    kwargs = parse_url(item) if isinstance(item, str) else item.connection_pool.connection_kwargs
    return server_identity(kwargs), _shown(item, kwargs)


def node_labels(items: Iterable[Any]) -> list[str]:
    """The nodes' names, in order: ``host:port[/db]``, the unix socket path, or
    ``sentinel:<service>`` (qualified by its first sentinel when two nodes of the list
    share a service name)."""
    items = list(items)
    services = [pool.service_name for pool in map(_sentinel.sentinel_pool, items)
                if pool is not None]
    labels = []
    for item in items:
        pool = _sentinel.sentinel_pool(item)
        if pool is not None:
            shared = services.count(pool.service_name) > 1
            labels.append(_sentinel.sentinel_label(pool, qualified=shared))
        elif isinstance(item, str):
            labels.append(address_of(parse_url(item)))
        else:
            labels.append(address_of(item.connection_pool.connection_kwargs))
    return labels


def _shown(node: object, kwargs: Mapping[str, Any]) -> str:
    """A node for an error message, without its password."""
    if isinstance(node, str):
        password = kwargs.get("password")
        return repr(node.replace(f":{password}@", ":***@") if password else node)
    return f"{type(node).__name__}({address_of(kwargs)})"


def build_pool(node: Any, pool_class: Callable[..., PoolT],
               parse: Callable[[str], Mapping[str, Any]], overrides: Mapping[str, Any]) -> PoolT:
    """Our own pool for one node (a URL, or a client whose settings we copy)."""
    if isinstance(node, str):
        return pool_class(**{**parse(node), **overrides})
    if _sentinel.sentinel_pool(node) is not None:
        return _sentinel.build_sentinel_pool(node.connection_pool, overrides)  # type: ignore[no-any-return]
    source = node.connection_pool
    return pool_class(connection_class=source.connection_class,
                      **{**source.connection_kwargs, **overrides})


# What a blocking connection takes from an asyncio connection's settings: where the
# server is and how to log in (TLS included). The rest is the client's own machinery
# (parsers, retry objects, notification handlers of the asyncio flavour), which the
# transport sets for itself anyway (pool_overrides above).
_SETTINGS = frozenset({"host", "port", "path", "db", "username", "password",
                       "credential_provider", "client_name", "protocol", "socket_keepalive",
                       "socket_keepalive_options", "socket_type"})


def blocking_twin(node: Any) -> str | redis.Redis | None:
    """The node as the sync transport takes it: a URL as it is; a ``redis.asyncio``
    client as a blocking client of the same server and settings; None when there is no
    such twin (Sentinel-managed nodes, connection classes of the application's own)."""
    if isinstance(node, str):
        return node
    if _sentinel.sentinel_pool(node) is not None:
        return None
    pool = node.connection_pool
    twin_class = getattr(redis.connection, pool.connection_class.__name__, None)
    if twin_class not in (redis.connection.Connection, redis.connection.SSLConnection,
                          redis.connection.UnixDomainSocketConnection):
        return None
    settings = {key: value for key, value in pool.connection_kwargs.items()
                if key in _SETTINGS or key.startswith("ssl_")}
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=twin_class,
                                                            **settings))


def portable(node: Any) -> object | None:
    """The node as another process can rebuild it (:func:`rebuilt`): the renewer
    (docs/design.md §5.2) connects to the same servers with the same settings. A URL as
    it is; a client (either flavour) as its server, credentials and TLS settings; a
    Sentinel-managed one as its sentinels and service. None when that cannot be sent to
    another process (a connection class of the application's own, settings that do not
    pickle: a credential provider or an SSL context object of the application's)."""
    if isinstance(node, str):
        return node
    pool = _sentinel.sentinel_pool(node)
    if pool is not None:
        spec: object = ("sentinel", *_sentinel.portable(pool))
    else:
        source = node.connection_pool
        twin_class = getattr(redis.connection, source.connection_class.__name__, None)
        if twin_class not in (redis.connection.Connection, redis.connection.SSLConnection,
                              redis.connection.UnixDomainSocketConnection):
            return None
        settings = {key: value for key, value in source.connection_kwargs.items()
                    if key in _SETTINGS or key.startswith("ssl_")}
        spec = ("client", twin_class.__name__, settings)
    try:
        pickle.dumps(spec)
    except Exception:  # (whatever the object's pickling raises)
        return None
    return spec


def rebuilt(spec: Any) -> str | redis.Redis:
    """A blocking node from :func:`portable`'s ``spec``."""
    if isinstance(spec, str):
        return spec
    if spec[0] == "sentinel":
        return _sentinel.rebuilt(*spec[1:])
    _, class_name, settings = spec
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=getattr(redis.connection, class_name), **settings))
