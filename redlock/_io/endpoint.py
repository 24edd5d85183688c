"""Where a node is and how to log in to it (docs/design.md §2.4): an :class:`Endpoint`, parsed
from a URL or read from a redis-py client through its public settings (``connection_kwargs``,
``connection_class``, a credential provider, Sentinel's ``discover_master()``). An endpoint crosses
to the renewer process as it is (§5.2). A Redis Cluster (a ``RedisCluster`` client, or a URL with
``?cluster=yes``) is one node whose calls go to the master of each one's hash slot (§11.4)."""

from __future__ import annotations

import ipaddress
import os
import pickle
import re
import ssl
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_PORT = 6379
SENTINEL_PORT = 26379

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Tls:
    """A TLS connection's settings (redis-py's ``ssl_*`` names, without the prefix)."""

    certfile: str | None = None
    keyfile: str | None = None
    password: str | None = None
    ca_certs: str | None = None
    ca_path: str | None = None
    ca_data: str | None = None
    cert_reqs: str | int = "required"
    check_hostname: bool = True
    min_version: Any = None
    ciphers: str | None = None

    def context(self) -> ssl.SSLContext:
        """The client context these settings describe."""
        context = ssl.create_default_context(cafile=self.ca_certs, capath=self.ca_path,
                                             cadata=self.ca_data)
        reqs = self.cert_reqs
        verify = _CERT_REQS.get(reqs.lower(), ssl.CERT_REQUIRED) if isinstance(reqs, str) \
            else ssl.VerifyMode(reqs)
        context.check_hostname = bool(self.check_hostname) and verify != ssl.CERT_NONE
        context.verify_mode = verify
        if self.certfile:
            context.load_cert_chain(self.certfile, self.keyfile, self.password)
        if self.min_version is not None:
            context.minimum_version = self.min_version
        if self.ciphers:
            context.set_ciphers(self.ciphers)
        return context


@dataclass(frozen=True)
class Sentinels:
    """A master Sentinel names: its sentinels, the service, how to log in to the
    sentinels (``username``, ``password``, ``tls``)."""

    hosts: tuple[tuple[str, int], ...]
    service: str
    username: str | None = None
    password: str | None = None
    tls: Tls | None = None


@dataclass(frozen=True)
class Endpoint:
    """A node: a TCP address (``host``, ``port``) or a Unix socket (``path``), or the
    master that ``sentinels`` name; the database, how to log in, TLS, the client name."""

    host: str = "localhost"
    port: int = DEFAULT_PORT
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    credential_provider: Any = field(default=None, repr=False)
    tls: Tls | None = None
    client_name: str | None = None
    keepalive: bool = True  # TCP keepalive (a dead peer is noticed even while idle)
    sentinels: Sentinels | None = None
    #: How many of its replicas must have a grant, commit or renewal before it counts
    #: (WAIT, docs/design.md §11.3); 0: none.
    replica_acks: int = 0
    #: A Redis Cluster, reached first at this address: each call goes to the master
    #: serving its hash slot (redlock._io.routing).
    cluster: bool = False

    @property
    def address(self) -> str:
        """``host:port[/db]``, the Unix socket's path, or ``sentinel:<service>``."""
        if self.sentinels is not None:
            return f"sentinel:{self.sentinels.service}"
        base = f"unix:{self.path}" if self.path else f"{self.host}:{self.port}"
        return f"{base}/{self.db}" if self.db else base

    @property
    def server(self) -> str:
        """Which *server* it is, however spelled: the database, user and password ignored (two
        databases of one server are one failure domain); host names compared case-insensitively, IP
        literals in canonical form, ``localhost`` as 127.0.0.1, Unix paths normalised; a Sentinel
        master by its service and sentinels. No name resolution."""
        if self.sentinels is not None:
            hosts = ",".join(sorted(f"{h}:{p}" for h, p in self.sentinels.hosts))
            return f"sentinel:{self.sentinels.service}@{hosts}"
        if self.path:
            return f"unix:{os.path.normpath(self.path)}"
        host = self.host.strip("[]").rstrip(".").lower()
        try:
            host = ipaddress.ip_address(host).compressed
        except ValueError:
            if host == "localhost":
                host = "127.0.0.1"
        return f"{host}:{self.port}"

    def credentials(self) -> tuple[str, ...]:
        """AUTH's arguments now: (user, password), (password,) or () for none (an empty
        password is none)."""
        if self.credential_provider is not None:
            found = tuple(self.credential_provider.get_credentials())
            return found if found and found[-1] else ()
        if not self.password:
            return ()
        return (self.username, self.password) if self.username else (self.password,)


# -- from what the caller gives -----------------------------------------------------------


def from_url(url: str) -> Endpoint:
    """``redis://[[user]:password@]host[:port][/db][?option=value...]``, ``rediss://``
    (TLS), ``unix://[[user]:password@]/path[?db=n]``; the options are redis-py's
    (``db``, ``client_name``, ``ssl_cert_reqs``, ``ssl_ca_certs``, ...), and ours:
    ``cluster=yes``, a Redis Cluster reached first at that address (docs/design.md
    §11.4); timeouts in a URL are ignored (the manager's own bound every wait, §2.4)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError("a Redis URL starts with redis://, rediss:// or unix://")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    options: dict[str, Any] = {
        "username": query.get("username", username), "password": query.get("password",
                                                                              password),
        "client_name": query.get("client_name"),
        "keepalive": query.get("socket_keepalive", "true").lower() in _TRUE}
    db = query.get("db")
    if scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL names the socket's path: unix:///path/to/redis.sock")
        return Endpoint(path=unquote(parts.path), db=int(db or 0), **options)
    path_db = parts.path.lstrip("/")
    if db is None and path_db:
        db = path_db
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    tls = None
    if scheme == "rediss":
        tls = _tls({key: value for key, value in query.items() if key.startswith("ssl_")})
    try:
        number = int(db or 0)
    except ValueError:
        raise ValueError(f"the database must be a number, not {db!r}") from None
    cluster = query.get("cluster", "no").lower() in _TRUE
    if cluster and number:
        raise ValueError(f"a Redis Cluster has database 0 only, not {number}")
    return Endpoint(host=unquote(parts.hostname or "localhost"), port=port, db=number,
                    tls=tls, cluster=cluster, **options)


def from_client(client: Any) -> Endpoint:
    """A redis-py client's node (either flavour): its server, credentials and TLS,
    read from its public settings; a ``Sentinel.master_for()`` client's master; a
    ``RedisCluster`` client's cluster, reached first at its default node."""
    if isinstance(client, _client_types(*_CLUSTER)):
        return _from_cluster(client)
    pool = client.connection_pool
    kwargs: Mapping[str, Any] = pool.connection_kwargs
    common: dict[str, Any] = {"db": int(kwargs.get("db") or 0), "username": kwargs.get("username"),
              "password": kwargs.get("password"),
              "credential_provider": kwargs.get("credential_provider"),
              "client_name": kwargs.get("client_name"),
              "keepalive": kwargs.get("socket_keepalive") is not False}
    service = getattr(pool, "service_name", None)
    if service is not None and hasattr(pool, "sentinel_manager"):
        if not getattr(pool, "is_master", True):
            raise ValueError(f"{type(client).__name__}(service={service!r}) is a Sentinel"
                             " replica client (slave_for): lock writes must go to the master,"
                             " use Sentinel.master_for(service)")
        manager = pool.sentinel_manager
        hosts = []
        for sentinel in manager.sentinels:
            found = sentinel.connection_pool.connection_kwargs
            hosts.append((str(found.get("host", "localhost")),
                          int(found.get("port", SENTINEL_PORT))))
        own = manager.sentinel_kwargs or {}
        sentinels = Sentinels(tuple(hosts), service, own.get("username"), own.get("password"),
                              _tls(own) if own.get("ssl") else None)
        return Endpoint(sentinels=sentinels, tls=_tls(kwargs) if _is_tls(pool) else None, **common)
    name = pool.connection_class.__name__
    if "Unix" in name:
        return Endpoint(path=str(kwargs.get("path")), **common)
    return Endpoint(host=str(kwargs.get("host") or "localhost"),
                    port=int(kwargs.get("port") or DEFAULT_PORT),
                    tls=_tls(kwargs) if _is_tls(pool) else None, **common)


def _from_cluster(client: Any) -> Endpoint:
    """A ``RedisCluster`` client's cluster (either flavour), from its public settings:
    ``get_connection_kwargs()`` (credentials, TLS) and ``get_default_node()`` (where to
    read its hash slot map first; the map names the other masters)."""
    kwargs: Mapping[str, Any] = client.get_connection_kwargs()
    seed = client.get_default_node()
    if seed is None:  # (an asyncio client learns its nodes in initialize())
        raise ValueError(f"{type_name(client)} has not met its cluster yet: await"
                         " client.initialize() before giving it, or give the cluster as a"
                         " URL with ?cluster=yes")
    connection_class = kwargs.get("connection_class")
    tls = bool(kwargs.get("ssl")) or (connection_class is not None
                                      and "SSL" in connection_class.__name__)
    return Endpoint(host=str(seed.host), port=int(seed.port),
                    username=kwargs.get("username"), password=kwargs.get("password"),
                    credential_provider=kwargs.get("credential_provider"),
                    client_name=kwargs.get("client_name"),
                    keepalive=kwargs.get("socket_keepalive") is not False,
                    tls=_tls(kwargs) if tls else None, cluster=True)


def _is_tls(pool: Any) -> bool:
    return "SSL" in pool.connection_class.__name__ or bool(pool.connection_kwargs.get("ssl"))


def _tls(kwargs: Mapping[str, Any]) -> Tls:
    """Tls from redis-py's ``ssl_*`` settings (or a URL's query)."""
    def get(name: str, default: Any = None) -> Any:
        value = kwargs.get(f"ssl_{name}", default)
        return default if value is None else value

    check = get("check_hostname", True)
    if isinstance(check, str):
        check = check.lower() in _TRUE
    return Tls(certfile=get("certfile"), keyfile=get("keyfile"), password=get("password"),
               ca_certs=get("ca_certs"), ca_path=get("ca_path"), ca_data=get("ca_data"),
               cert_reqs=get("cert_reqs", "required"), check_hostname=bool(check),
               min_version=get("min_version"), ciphers=get("ciphers"))


def _client_types(*names: tuple[str, str]) -> tuple[type, ...]:
    """redis-py's client classes ``(module, class)`` of the modules already imported: an
    instance of one means its module is, so the library does not import redis-py itself
    (most of a renewer process's start, docs/design.md §5.2)."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in names)
    return tuple(cls for cls in found if isinstance(cls, type))


_PLAIN = (("redis", "Redis"), ("redis.asyncio", "Redis"))
_CLUSTER = (("redis.cluster", "RedisCluster"), ("redis.asyncio.cluster", "RedisCluster"))


def type_name(value: object) -> str:
    """A value's class as a user imports it: ``redis.asyncio.Redis`` (the class names of
    the two redis-py clients are both ``Redis``), ``builtins`` left out."""
    cls = type(value)
    module = cls.__module__.removesuffix(".client")
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


# -- the node list -----------------------------------------------------------------------


def clusters(found: Sequence[Endpoint]) -> tuple[int, ...]:
    """Which of the nodes are Redis Clusters (their calls use each resource's hash slot's
    node keys, docs/design.md §11.4)."""
    return tuple(i for i, endpoint in enumerate(found) if endpoint.cluster)


def endpoints(nodes: object) -> list[Endpoint]:
    """The caller's node list, checked at the call site: a collection of URLs or redis-py
    clients, none twice. A bare string, a mapping, an empty list, an item of another type,
    an unparsable URL and the same server listed twice raise ``TypeError``/``ValueError``."""
    if isinstance(nodes, str | bytes | bytearray | Mapping) or not isinstance(nodes, Iterable):
        raise TypeError(
            "nodes must be a collection (list, tuple, set...) of URLs or redis-py clients,"
            f" not {type(nodes).__name__}")
    items = list(nodes)
    if not items:
        raise ValueError("at least one Redis node is needed")
    found: list[Endpoint] = []
    clients = _client_types(*_PLAIN, *_CLUSTER)
    for item in items:
        if isinstance(item, str):
            try:
                found.append(from_url(item))
            except ValueError as exc:
                raise ValueError(f"bad node URL {_masked(item)!r}: {exc}") from None
        elif isinstance(item, clients):
            found.append(from_client(item))
        else:
            raise TypeError("each node must be a URL string or a redis-py client,"
                            f" not {type_name(item)}")
    seen: dict[str, str] = {}
    for item, endpoint in zip(items, found, strict=True):
        shown = _shown(item, endpoint)
        if endpoint.server in seen:
            raise ValueError(
                f"nodes {seen[endpoint.server]} and {shown} are the same Redis server"
                f" ({endpoint.server}): each node must be an independent server")
        seen[endpoint.server] = shown
    return found


def labels(found: list[Endpoint]) -> list[str]:
    """The nodes' names, in order: ``host:port[/db]``, the Unix socket's path, or
    ``sentinel:<service>`` (qualified by its first sentinel when two nodes share a
    service name)."""
    services = [e.sentinels.service for e in found if e.sentinels is not None]
    names = []
    for endpoint in found:
        sentinels = endpoint.sentinels
        if sentinels is not None and services.count(sentinels.service) > 1:
            host, port = sentinels.hosts[0]
            names.append(f"sentinel:{sentinels.service}@{host}:{port}")
        else:
            names.append(endpoint.address)
    return names


def portable(found: list[Endpoint]) -> bool:
    """Whether the endpoints can be sent to another process (the renewer, docs/design.md
    §5.2): a credential provider of the application's own may not pickle."""
    try:
        pickle.dumps(found)
    except Exception:  # (whatever the object's pickling raises)
        return False
    return True


def _masked(url: str) -> str:
    """A URL without its password."""
    return re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", url)


def _shown(item: object, endpoint: Endpoint) -> str:
    """A node for an error message, without its password."""
    if isinstance(item, str):
        return repr(_masked(item))
    if endpoint.sentinels is not None:
        return f"{type(item).__name__}(service={endpoint.sentinels.service!r})"
    return f"{type(item).__name__}({endpoint.address})"
