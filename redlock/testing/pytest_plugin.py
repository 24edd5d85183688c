"""pytest plugin: real Redis clusters, ready clients, a fenced store and fault helpers
for your own test suite.

Installed with the package (entry point ``pytest11``: ``redlock``); it costs nothing
until a test asks for one of its fixtures: loading it imports pytest and the library
(``redlock``, its parent package) and nothing else; servers, testcontainers and docker
come with the first fixture that needs them.

    import pytest
    from redlock import QuorumUnavailable

    def test_one_writer_at_a_time(redlock_client, redlock_fenced_store):
        with redlock_client.lock("orders:42", ttl=5.0) as held:
            redlock_fenced_store.write("orders:42", held.token, b"paid")

    @pytest.mark.redlock_cluster(nodes=5)
    def test_survives_a_minority(redlock_cluster, redlock_client, redlock_faults):
        with redlock_client.lock("jobs:nightly", ttl=5.0):
            pass                             # empty nodes: every node answers once
        redlock_faults.blackhole(0)          # node 0 swallows requests, replies nothing
        redlock_faults.pause(1)              # node 1 hangs (SIGSTOP / docker pause)
        with redlock_client.lock("jobs:nightly", ttl=5.0):
            ...
        redlock_faults.blackhole(2)          # now a majority is gone
        with pytest.raises(QuorumUnavailable):
            redlock_client.lock("jobs:nightly", ttl=5.0, blocking=False).acquire()

Fixtures (each test gets its servers running, resumed, healed and empty; empty
nodes are a new cluster to the client, whose first acquire needs every node to
answer, so inject faults after one acquisition, as above):

- ``redlock_cluster``: N independent Redis nodes (``.nodes``), each behind a Toxiproxy
  proxy when a Toxiproxy server is available (``.proxies``); ``.urls`` are the
  addresses to give your code. N is 3, or ``--redlock-nodes`` / ini ``redlock_nodes``,
  or per test ``@pytest.mark.redlock_cluster(nodes=5, appendonly=True)``. Clusters are
  started once per session (per size) and reset before and after every test.
- ``redlock_client``: a :class:`~redlock.Redlock` on the cluster, closed afterwards.
- ``redlock_async_client``: an :class:`~redlock.AsyncRedlock` (needs pytest-asyncio).
- ``redlock_fenced_store``: a :class:`~fencing.RedisFencedStore` on a Redis node of its
  own (the protected resource is not one of the lock nodes), emptied before each test.
- ``redlock_history``: a fresh :class:`redlock.testing.history.History` to record
  holds (``Hold``: who, which name, token, from, to; ``mode`` "r"/"w" for a read-write
  lock) and fenced writes from your threads or processes, then check them: no shared or
  backwards token, no overlap (``violations(exclusive=True)``), at most K permits at
  once (``most_at_once(prefix)``), the read-write rules (``rw_violations(name)``).
- ``redlock_faults``: ``pause(i)`` / ``resume(i)`` (the server hangs, sockets open),
  ``blackhole(i)`` (requests vanish), ``lose_replies(i)`` (the node runs the command,
  the reply is dropped), ``refuse(i)`` (connections refused), ``latency(i, seconds)``,
  ``restart(i)`` (kill -9 and back with its data), ``restart_empty(i)`` (back with
  none: amnesia), ``heal()``. The network faults need Toxiproxy.
- ``redlock_redis_cluster``: a real Redis Cluster (:class:`redlock.testing.RedisClusterNodes`:
  3 masters with a replica each, local processes only), one per test module, emptied before
  each test; ``client()``, ``master_of(hash_slot)``, ``migrate(hash_slot, master)``,
  ``kill_master(hash_slot)`` (its replica promoted). A cluster is not yet accepted as a
  lock node (docs/proposals/cluster.md).

Backends (``--redlock-backend``, ini ``redlock_backend``, or ``$REDLOCK_TEST_BACKEND``): ``local``
(default) runs ``redis-server`` and ``toxiproxy-server`` processes from PATH (``$REDIS_SERVER`` /
``$TOXIPROXY_SERVER``); without a Toxiproxy binary the cluster is direct and the network faults
raise. ``docker`` runs them in containers with testcontainers (``pip install
'redlock-fenced[docker]'`` and a Docker engine on this machine), on the images ``redis:7`` and
``ghcr.io/shopify/toxiproxy:2.12.0`` unless ``$REDLOCK_REDIS_IMAGE`` / ``$REDLOCK_TOXIPROXY_IMAGE``
name others, see :mod:`redlock.testing.containers`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fencing import RedisFencedStore
    from redlock import Redlock
    from redlock.testing.backends import AnyNodes
    from redlock.testing.history import History
    from redlock.testing.node import Node
    from redlock.testing.redis_cluster import RedisClusterNodes
    from redlock.testing.toxiproxy import Proxies, Proxy, ToxiproxyServer

DEFAULT_NODES = 3


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("redlock", "redlock-fenced test clusters")
    group.addoption("--redlock-backend", choices=("local", "docker"), default=None,
                    help="where the Redis and Toxiproxy servers of the redlock_* fixtures "
                         "run (default: ini redlock_backend, $REDLOCK_TEST_BACKEND, local)")
    group.addoption("--redlock-nodes", type=int, default=None,
                    help=f"nodes of redlock_cluster (default: ini redlock_nodes, "
                         f"{DEFAULT_NODES})")
    parser.addini("redlock_backend", "default backend of the redlock_* fixtures", default="")
    parser.addini("redlock_nodes", "default number of nodes of redlock_cluster",
                  default=str(DEFAULT_NODES))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "redlock_cluster(nodes=3, appendonly=False): the redlock_cluster this "
                   "test gets (redlock-fenced plugin)")
    if config.pluginmanager.hasplugin("asyncio"):
        from redlock.testing import _pytest_async

        config.pluginmanager.register(_pytest_async, "redlock-async-fixtures")


class Faults:
    """Fault helpers on the nodes of one cluster, by index."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def _proxy(self, index: int) -> Proxy:
        if self.cluster.proxies is None:
            from redlock.testing.toxiproxy import ToxiproxyError

            raise ToxiproxyError(
                f"network faults need a Toxiproxy server: {self.cluster.no_proxy_reason}")
        return self.cluster.proxies[index]

    def pause(self, index: int) -> None:
        """The server hangs (SIGSTOP, or docker pause); its sockets stay open."""
        self.cluster.nodes[index].pause()

    def resume(self, index: int) -> None:
        self.cluster.nodes[index].resume()

    def kill(self, index: int) -> None:
        """kill -9; connections are refused until ``restart`` (or the next test)."""
        self.cluster.nodes[index].kill()

    def restart(self, index: int) -> None:
        """kill -9 and start again on the same port with the node's files."""
        self.cluster.nodes[index].restart(keep_data=True)

    def restart_empty(self, index: int) -> None:
        """kill -9 and start again on the same port with no data (node amnesia)."""
        self.cluster.nodes[index].restart(keep_data=False)

    def blackhole(self, index: int) -> None:
        """Requests vanish in both directions; nothing is answered or closed."""
        self._proxy(index).blackhole()

    def lose_replies(self, index: int) -> None:
        """Requests reach the node and run; every reply is dropped."""
        self._proxy(index).lose_replies()

    def refuse(self, index: int) -> None:
        """Connections refused (open ones cut)."""
        self._proxy(index).refuse()

    def latency(self, index: int, seconds: float, jitter: float = 0.0) -> None:
        self._proxy(index).latency(seconds, jitter)

    def heal(self) -> None:
        """Every node resumed and running, every proxy enabled with no toxic."""
        for node in self.cluster.nodes:
            node.resume()
            if not node.running:
                node.start()
        if self.cluster.proxies is not None:
            self.cluster.proxies.heal()


class Cluster:
    """N nodes, each behind a proxy when Toxiproxy is available."""

    def __init__(self, nodes: AnyNodes, proxies: Proxies | None, no_proxy_reason: str = ""
                 ) -> None:
        self.nodes = nodes
        self.proxies = proxies
        self.no_proxy_reason = no_proxy_reason
        self.faults = Faults(self)

    @property
    def urls(self) -> list[str]:
        """What clients should use: the proxies' addresses, else the nodes'."""
        return self.proxies.urls if self.proxies is not None else self.nodes.urls

    @property
    def direct_urls(self) -> list[str]:
        return self.nodes.urls

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def reset(self) -> None:
        if self.proxies is not None:
            self.proxies.heal()
        self.nodes.reset()

    def close(self) -> None:
        self.nodes.close()


class ClusterPool:
    """The session's clusters (one per size and durability), its Toxiproxy server and
    the fenced store's node; all started on first use."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.clusters: dict[tuple[int, bool], Cluster] = {}
        self._toxiproxy: ToxiproxyServer | None = None
        self._no_proxy_reason = ""
        self._toxiproxy_tried = False
        self._store: AnyNodes | None = None

    def toxiproxy(self) -> ToxiproxyServer | None:
        if not self._toxiproxy_tried:
            self._toxiproxy_tried = True
            from redlock.testing.backends import start_toxiproxy

            try:
                self._toxiproxy = start_toxiproxy(backend=self.backend)
            except FileNotFoundError as exc:  # local backend without the binary
                self._no_proxy_reason = str(exc)
        return self._toxiproxy

    def cluster(self, count: int, appendonly: bool = False) -> Cluster:
        key = (count, appendonly)
        if key not in self.clusters:
            from redlock.testing.backends import start_nodes

            nodes = start_nodes(count, backend=self.backend, appendonly=appendonly)
            try:
                toxiproxy = self.toxiproxy()
                proxies = toxiproxy.front(nodes) if toxiproxy is not None else None
            except BaseException:
                nodes.close()
                raise
            self.clusters[key] = Cluster(nodes, proxies, self._no_proxy_reason)
        return self.clusters[key]

    def store_node(self) -> Node:
        if self._store is None:
            from redlock.testing.backends import start_nodes

            self._store = start_nodes(1, backend=self.backend)
        return self._store[0]

    def close(self) -> None:
        for cluster in self.clusters.values():
            with contextlib.suppress(Exception):
                cluster.close()
        self.clusters.clear()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None
        if self._toxiproxy is not None:
            with contextlib.suppress(Exception):
                self._toxiproxy.close()
            self._toxiproxy = None


@pytest.fixture(scope="session")
def redlock_backend(pytestconfig: pytest.Config) -> str:
    """``local`` or ``docker``: where this session's redlock_* servers run."""
    from redlock.testing.backends import backend_name

    chosen = (pytestconfig.getoption("redlock_backend")
              or str(pytestconfig.getini("redlock_backend") or "") or None)
    return backend_name(chosen)


@pytest.fixture(scope="session")
def redlock_pool(redlock_backend: str) -> Iterator[ClusterPool]:
    """The session's clusters, Toxiproxy server and store node, stopped at its end."""
    pool = ClusterPool(redlock_backend)
    try:
        yield pool
    finally:
        pool.close()


def _cluster_options(request: pytest.FixtureRequest) -> tuple[int, bool]:
    marker = request.node.get_closest_marker("redlock_cluster")
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker else {}
    if marker and marker.args:
        kwargs.setdefault("nodes", marker.args[0])
    default = (request.config.getoption("redlock_nodes")
               or int(str(request.config.getini("redlock_nodes") or DEFAULT_NODES)))
    count = int(kwargs.get("nodes", default))
    if count < 1:
        raise pytest.UsageError(f"redlock_cluster needs at least one node, not {count}")
    return count, bool(kwargs.get("appendonly", False))


@pytest.fixture
def redlock_cluster(request: pytest.FixtureRequest, redlock_pool: ClusterPool
                    ) -> Iterator[Cluster]:
    """N real Redis nodes (running, resumed, healed, empty) for this test."""
    count, appendonly = _cluster_options(request)
    cluster = redlock_pool.cluster(count, appendonly)
    cluster.reset()
    yield cluster
    cluster.reset()


@pytest.fixture
def redlock_faults(redlock_cluster: Cluster) -> Faults:
    """Pause, blackhole, lose replies, refuse, restart (empty) the cluster's nodes."""
    return redlock_cluster.faults


@pytest.fixture
def redlock_history() -> History:
    """A history of holds and fenced writes to check (one per test)."""
    from redlock.testing.history import History

    return History()


@pytest.fixture
def redlock_client(redlock_cluster: Cluster) -> Iterator[Redlock]:
    """A ``Redlock`` on ``redlock_cluster.urls``, closed after the test."""
    from redlock import Redlock

    with Redlock(redlock_cluster.urls) as dlm:
        yield dlm


@pytest.fixture(scope="module")
def redlock_redis_cluster_of_module() -> Iterator[RedisClusterNodes]:
    """The Redis Cluster of ``redlock_redis_cluster``, one per test module, as the last
    test left it (not emptied)."""
    from redlock.testing.redis_cluster import RedisClusterNodes

    with RedisClusterNodes(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def redlock_redis_cluster(redlock_redis_cluster_of_module: RedisClusterNodes
                          ) -> Iterator[RedisClusterNodes]:
    """A real Redis Cluster (3 masters, each with a replica) on loopback, shared by a
    module's tests and emptied before each (FLUSHALL on every master). A test that kills a
    master or migrates hash slots leaves the cluster so for the module's next tests."""
    cluster = redlock_redis_cluster_of_module
    for master in cluster.masters():
        with master.client() as client:
            client.flushall()
    yield cluster


@pytest.fixture
def redlock_fenced_store(redlock_pool: ClusterPool) -> Iterator[RedisFencedStore]:
    """A ``RedisFencedStore`` on a Redis node of its own, empty at the start."""
    from fencing import RedisFencedStore

    node = redlock_pool.store_node()
    node.resume()
    if not node.running:
        node.start()
    client = node.client()
    client.flushall()
    try:
        yield RedisFencedStore(client)
    finally:
        client.close()
