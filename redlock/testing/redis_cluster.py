"""A real Redis Cluster on loopback: ``redis-server --cluster-enabled yes`` processes made
into one cluster with the cluster's own commands (ADDSLOTSRANGE, MEET, REPLICATE), for the
tests of a cluster as a lock node (docs/proposals/cluster.md) and for users' own suites.

    from redlock.testing import RedisClusterNodes

    with RedisClusterNodes(masters=3, replicas=1) as cluster:
        client = cluster.client()              # redis.cluster.RedisCluster
        cluster.migrate(slot, cluster.masters()[1])   # a hash slot and its keys moved
        cluster.kill_master(slot)              # its replica is promoted (about 3-4 s)

Needs Redis 7.0 or later (``CLUSTER ADDSLOTSRANGE``, ``--cluster-port``). Nodes time out
after ``node_timeout`` ms (2000 by default: a failover in seconds, as in
production with a shorter timeout). ``full_coverage`` is ``cluster-require-full-coverage``
(docs/proposals/cluster.md, P2: a lock cluster runs better without it)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import redis
import redis.cluster

from redlock.testing.redis_nodes import RedisNode, free_port

_HASH_SLOTS = 16384


class Seen(NamedTuple):
    """A node as one line of ``CLUSTER NODES`` shows it."""

    id: str
    address: str  # host:port
    flags: tuple[str, ...]
    role: str  # master, replica
    master: str | None  # a replica's master's id


class RedisClusterNodes:
    """``masters`` shards of a Redis Cluster, each a master with ``replicas`` replicas,
    one redis-server process per node on its own port and temp dir; stopped by ``close()``."""

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout: int = 2000,
                 full_coverage: bool = False, redis_server: str | None = None,
                 host: str = "127.0.0.1", start_timeout: float = 20.0) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        if replicas < 0:
            raise ValueError("replicas must be 0 or more")
        self.host = host
        self.start_timeout = start_timeout
        self.base_dir = Path(tempfile.mkdtemp(prefix="redlock-cluster-"))
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout),
                "--cluster-require-full-coverage", "yes" if full_coverage else "no",
                # A replica with a stale link may still be promoted: the harness kills
                # masters on purpose, and a failover must follow (the default factor
                # would refuse one after a long test step without writes).
                "--cluster-replica-validity-factor", "0"]
        # The cluster bus port is given: by default it is the port + 10000, and a free
        # port above 55535 has none.
        self._bus = [free_port(host) for _ in range(masters * (1 + replicas))]
        self.nodes = [RedisNode(data_dir=self.base_dir / f"node{i}", host=host,
                                redis_server=redis_server,
                                extra_args=[*args, "--cluster-port", str(bus)])
                      for i, bus in enumerate(self._bus)]
        self._masters, self._replicas = masters, replicas
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.close()
            raise

    # -- forming the cluster ---------------------------------------------------------------

    def _form(self) -> None:
        first = self.nodes[: self._masters]
        for i, (node, (low, high)) in enumerate(zip(first, slot_ranges(self._masters),
                                                    strict=True)):
            with node.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        with self.nodes[0].client() as client:
            for node, bus in zip(self.nodes[1:], self._bus[1:], strict=True):
                client.execute_command("CLUSTER", "MEET", node.host, node.port, bus)
        self._until(lambda: all(len(self._view(node)) == len(self.nodes) for node in self.nodes),
                    "every node to know every other")
        for r, node in enumerate(self.nodes[self._masters:]):
            with node.client() as client:
                client.execute_command("CLUSTER", "REPLICATE",
                                       self.node_id(first[r % self._masters]))
        self._until(self._settled, "the cluster to be ok on every node, replicas in sync")

    def _until(self, done: Callable[[], bool], what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last: redis.RedisError | None = None
        while True:
            try:
                if done():
                    return
            except redis.RedisError as exc:
                last = exc  # a node still starting or failing over: asked again
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout or self.start_timeout} s for {what}:"
                                   f" {self.describe()}" + (f" (last error: {last})"
                                                            if last else ""))
            time.sleep(0.05)

    def _settled(self) -> bool:
        running = [node for node in self.nodes if node.running]
        for node in running:
            with node.client() as client:
                if cluster_info(client).get("cluster_state") != "ok":
                    return False
                info = client.info("replication")
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
        views = {tuple(sorted((n.id, n.role) for n in self._view(node).values()
                              if "fail" not in n.flags)) for node in running}
        return len(views) == 1  # every running node sees the same masters and replicas

    @staticmethod
    def _view(node: RedisNode) -> dict[str, Seen]:
        """CLUSTER NODES as this node sees it, by node id."""
        with node.client() as client:
            text = _text(client.execute_command("CLUSTER", "NODES"))
        view: dict[str, Seen] = {}
        for line in text.splitlines():
            fields = line.split()
            flags = tuple(fields[2].split(","))
            view[fields[0]] = Seen(fields[0], fields[1].split("@")[0], flags,
                                   "master" if "master" in flags else "replica",
                                   None if fields[3] == "-" else fields[3])
        return view

    # -- addresses --------------------------------------------------------------------------

    @staticmethod
    def node_id(node: RedisNode) -> str:
        with node.client() as client:
            return _text(client.execute_command("CLUSTER", "MYID"))

    def _address(self, master: Sequence[object]) -> str:
        """``host:port`` of a CLUSTER SLOTS entry's master (a one-node cluster does not know
        its own address: an empty host, ours)."""
        return f"{_text(master[0]) or self.host}:{master[1]}"

    def _by_address(self, address: str) -> RedisNode:
        for node in self.nodes:
            if f"{node.host}:{node.port}" == address:
                return node
        raise LookupError(f"no node of this cluster at {address}")

    def masters(self) -> list[RedisNode]:
        """The running masters that serve hash slots, in the order of their first slot."""
        owners = sorted(self._shards().items())
        return [node for _, node in owners]

    def _shards(self) -> dict[int, RedisNode]:
        """First hash slot of each master -> that master, read from a running node."""
        node = next(n for n in self.nodes if n.running and not n.paused)
        with node.client() as client:
            slots = client.execute_command("CLUSTER", "SLOTS")
        return {int(entry[0]): self._by_address(self._address(entry[2]))
                for entry in slots}

    def master_of(self, slot: int) -> RedisNode:
        """The master serving hash slot ``slot`` now (as a running node sees it)."""
        node = next(n for n in self.nodes if n.running and not n.paused)
        owner = self._owner_seen_by(node, slot)
        if owner is None:
            raise LookupError(f"no master serves hash slot {slot}")
        return owner

    def replicas_of(self, master: RedisNode) -> list[RedisNode]:
        wanted = self.node_id(master)
        return [self._by_address(n.address) for n in self._view(master).values()
                if n.master == wanted and "fail" not in n.flags]

    @property
    def seeds(self) -> list[tuple[str, int]]:
        return [(node.host, node.port) for node in self.nodes if node.running]

    @property
    def url(self) -> str:
        """The first running node's URL (a cluster client discovers the rest from it)."""
        node = next(n for n in self.nodes if n.running)
        return node.url

    @property
    def node_url(self) -> str:
        """The cluster as one lock node (``?cluster=yes``), reached first at its first
        master (a test that kills that master knows which it is)."""
        seed = self.masters()[0]
        return f"redis://{seed.host}:{seed.port}?cluster=yes"

    def client(self, **kwargs: object) -> redis.cluster.RedisCluster:
        """A redis-py cluster client (the caller closes it)."""
        options: dict[str, object] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        options.update(kwargs)
        startup = [redis.cluster.ClusterNode(host, port) for host, port in self.seeds]
        return redis.cluster.RedisCluster(startup_nodes=startup, **options)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[RedisNode]:
        return iter(self.nodes)

    def describe(self) -> str:
        states = []
        for node in self.nodes:
            states.append(f"{node.host}:{node.port} {'up' if node.running else 'down'}")
        return ", ".join(states)

    # -- faults and operations ----------------------------------------------------------------

    def migrate(self, slot: int, target: RedisNode, *, batch: int = 100) -> int:
        """Move hash slot ``slot`` and its keys to master ``target`` as ``redis-cli --cluster
        reshard`` does (SETSLOT IMPORTING / MIGRATING, MIGRATE in batches, SETSLOT NODE on
        every master); returns how many keys moved."""
        source = self.master_of(slot)
        if source is target:
            return 0
        source_id, target_id = self.node_id(source), self.node_id(target)
        moved = 0
        with source.client() as src, target.client() as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000,
                                    "KEYS", *keys)
                moved += len(keys)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for master in self.masters():
            if master not in (source, target):
                with master.client() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        # Replicas learn it by gossip: done once every node names the new owner (a client
        # that starts from a replica's stale map would be sent back and forth meanwhile).
        self._until(lambda: all(self._owner_seen_by(node, slot) == target
                                for node in self.nodes if node.running),
                    f"every node to see hash slot {slot} on its new master")
        return moved

    def _owner_seen_by(self, node: RedisNode, slot: int) -> RedisNode | None:
        with node.client() as client:
            for entry in client.execute_command("CLUSTER", "SLOTS"):
                if int(entry[0]) <= slot <= int(entry[1]):
                    return self._by_address(self._address(entry[2]))
        return None

    def kill_master(self, slot: int, *, timeout: float = 20.0) -> tuple[RedisNode, RedisNode]:
        """kill -9 the master of hash slot ``slot`` and wait until one of its replicas
        serves the slot; returns (the killed master, the promoted replica)."""
        master = self.master_of(slot)
        if not self.replicas_of(master):
            raise RuntimeError(f"the master of hash slot {slot} has no replica to promote")
        master.kill()

        def promoted() -> bool:
            return self.master_of(slot) is not master
        self._until(promoted, f"a replica to take hash slot {slot} over", timeout)
        return master, self.master_of(slot)

    def kill_shard(self, slot: int) -> list[int]:
        """kill -9 the master of hash slot ``slot`` and every replica of it: the shard and
        its data are gone. Returns the hash slots it served (no master serves them now)."""
        master = self.master_of(slot)
        served = [s for first, owner in self._shards().items() if owner is master
                  for s in self._range_of(first)]
        for node in (master, *self.replicas_of(master)):
            node.kill()
        return served

    def _range_of(self, first: int) -> range:
        node = next(n for n in self.nodes if n.running and not n.paused)
        with node.client() as client:
            for entry in client.execute_command("CLUSTER", "SLOTS"):
                if int(entry[0]) == first:
                    return range(first, int(entry[1]) + 1)
        raise LookupError(f"no hash slot range starts at {first}")

    def take_over(self, slots: Sequence[int], target: RedisNode, *,
                  timeout: float = 20.0) -> None:
        """An operator's repair after a shard was lost: every running node forgets the
        dead ones, and master ``target`` serves ``slots`` from now on (empty), its epoch
        bumped to the cluster's greatest (docs/operations.md, "Redis Cluster")."""
        dead = [self._dead_id(node) for node in self.nodes if not node.running]
        for node in self.nodes:
            if node.running:
                with node.client() as client:
                    for node_id in dead:
                        with contextlib.suppress(redis.ResponseError):  # (forgotten)
                            client.execute_command("CLUSTER", "FORGET", node_id)
        with target.client() as client:
            for low, high in _ranges(slots):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
            client.execute_command("CLUSTER", "BUMPEPOCH")
        self._until(lambda: all(self._owner_seen_by(node, slots[0]) == target
                                for node in self.nodes if node.running),
                    f"every node to see hash slot {slots[0]} on {target.host}:{target.port}",
                    timeout)

    def _dead_id(self, node: RedisNode) -> str:
        """The cluster id of a node that is not running, as a running node knows it."""
        alive = next(n for n in self.nodes if n.running)
        for node_id, seen in self._view(alive).items():
            if seen.address == f"{node.host}:{node.port}":
                return node_id
        raise LookupError(f"no running node knows {node.host}:{node.port}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> RedisClusterNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisClusterNodes({self.describe()})"


def cluster_info(client: redis.Redis) -> dict[str, str]:
    """``CLUSTER INFO`` as text fields (redis-py parses it on some versions only)."""
    reply = client.execute_command("CLUSTER", "INFO")
    if isinstance(reply, dict):
        return {str(k): _text(v) for k, v in reply.items()}
    return dict(line.split(":", 1) for line in _text(reply).splitlines() if ":" in line)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ranges(slots: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive hash slots as (first, last) ranges."""
    found: list[tuple[int, int]] = []
    for slot in sorted(slots):
        if found and found[-1][1] == slot - 1:
            found[-1] = (found[-1][0], slot)
        else:
            found.append((slot, slot))
    return found


def slot_ranges(count: int) -> Sequence[tuple[int, int]]:
    """The hash slots a cluster of ``count`` masters formed here gives each master."""
    bounds = [round(i * _HASH_SLOTS / count) for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]
