"""What ``redlock nodes`` reports about each node: reachability, round trip, marker,
identity, role, persistence, memory policy, and the warnings that follow from them. A Redis
Cluster node (``?cluster=yes``) is reported per shard: each master, its replicas and their
lag, and how many of its hash slots carry a marker of its own run (docs/design.md §11.4).

An operator's view, read with plain redis-py clients (bounded timeouts, no retries),
never on the lock path. The warnings are those the library logs on a manager's first
acquire (:func:`redlock._scripts.node_config.unsafe_config`: a replica, an evicting memory policy),
plus what docs/design.md §4 and §9 say about persistence and markers, which the library
cannot check on the lock path."""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redlock._core.settings import Keys, in_hash_slot
from redlock._io.endpoint import from_url
from redlock._io.failures import as_failure
from redlock._io.routing import slot_map_command, slot_owners
from redlock._scripts.node import FORMAT
from redlock._scripts.node_config import unsafe_config
from redlock._scripts.replies import marker_format, other_format, stamped_run


@dataclass
class NodeReport:
    """One node, as ``redlock nodes --json`` shows it (docs/operations.md)."""

    node: str
    reachable: bool = False
    rtt_ms: float | None = None
    marker: bool | None = None
    marker_value: str | None = None
    format: int | None = None  # the node format its marker names (this release's: 1, §4.1)
    fence_counter: int | None = None  # the highest of the node's fence counters
    repairing: bool | None = None
    run_id: str | None = None
    version: str | None = None
    role: str | None = None
    replicas: int | None = None  # online replicas (what replica_acks can count on, §11.3)
    replica_lag_s: int | None = None  # the most any of them lags (INFO replication), s
    appendonly: bool | None = None
    appendfsync: str | None = None  # None when CONFIG GET is not allowed
    save: str | None = None
    maxmemory: int | None = None
    maxmemory_policy: str | None = None
    warnings: list[str] = field(default_factory=list)  # unsafe for locks: fix the node
    notes: list[str] = field(default_factory=list)  # safe, with an availability cost
    error: str | None = None
    # A shard of a Redis Cluster node: the node as given, the hash slots its master
    # serves, and how many of them have a marker stamped by its run (None: standalone).
    shard_of: str | None = None
    hash_slots: int | None = None
    slots_marked: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _info_fields(raw: str) -> dict[str, str]:
    return {key: value.strip() for key, _, value in
            (line.partition(":") for line in raw.splitlines() if ":" in line)}


def _config(client: redis.Redis, name: str) -> str | None:
    """A CONFIG GET value, or None when the command is renamed or not permitted."""
    try:
        reply = client.config_get(name)
    except redis.ResponseError:
        return None
    values = {_text(key): _text(value) for key, value in dict(reply).items()}
    return values.get(name)


def _persistence_findings(report: NodeReport) -> tuple[list[str], list[str]]:
    """(warnings, notes) about a node's persistence (docs/design.md §4.9, §9)."""
    if report.appendonly:
        if report.appendfsync not in (None, "always"):
            return [f"appendfsync {report.appendfsync}: a crash can lose the last writes and"
                    " come back with older keys and fence counters; a restart is therefore"
                    " taken as data loss (the node is out of quorums until its leases have"
                    " expired, then repaired), and missed if the lock user may not run INFO (use"
                    " appendfsync always)"], []
        return [], []
    if report.save:
        return [f"appendonly no with save '{report.save}': a restart reloads an older"
                " snapshot; it is therefore taken as data loss (the node is out of quorums"
                " until its leases have expired, then repaired), and missed if the lock user"
                " may not run INFO (use appendonly yes with appendfsync always)"], []
    if report.save == "":
        return [], ["no persistence: a restart comes back empty, is detected as amnesia and"
                " kept out of quorums until its leases have expired, about the longest TTL"
                " in use (appendonly yes + appendfsync always avoids it)"]
    return [], []


def _client(url: str, timeout: float) -> redis.Redis:
    """A plain client of the server at ``url`` (bounded waits, no retries; a cluster
    URL's own ``cluster`` option left out)."""
    plain = re.sub(r"([?&])cluster=[^&]*&?", r"\1", url).rstrip("?&")
    return redis.Redis.from_url(plain, socket_timeout=timeout, socket_connect_timeout=timeout,
                                retry=Retry(NoBackoff(), 0), health_check_interval=0)


def _at(url: str, host: str, port: int) -> str:
    """``url`` with another server's address (the same credentials and options)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{host}:{port}" if credentials else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def read_cluster(url: str, address: str, keys: Keys, timeout: float) -> list[NodeReport]:
    """A Redis Cluster node, one report per shard: its hash slot map read from the
    address given (``CLUSTER SLOTS``), then each master as :func:`read_node` reads a
    node, with its hash slots' markers and fence counters in place of the node's."""
    seed = _client(url, timeout)
    try:
        owners = slot_owners(seed.execute_command(*slot_map_command()), from_url(url).host)
    except (redis.RedisError, OSError, ValueError) as exc:
        return [NodeReport(address, error=as_failure(exc).detail)]
    finally:
        seed.close()
    served: dict[tuple[str, int], list[int]] = {}
    for first, last, host, port in owners:
        served.setdefault((host, port), []).extend(range(first, last + 1))
    reports = []
    for (host, port), slots in sorted(served.items()):
        report = read_node(_at(url, host, port), f"{host}:{port}", keys, timeout, slots)
        report.shard_of = address
        reports.append(report)
    return reports


def _slots(client: redis.Redis, report: NodeReport, keys: Keys, slots: Sequence[int]) -> None:
    """A shard's hash slots: how many have a marker of its master's run, the highest
    counter, and a warning for the others."""
    pipe = client.pipeline(transaction=False)
    for slot in slots:
        slot_keys = in_hash_slot(keys.namespace, slot)
        pipe.get(slot_keys.marker)
        pipe.hget(slot_keys.counter, "0")
    found = pipe.execute()
    markers, counters = found[0::2], found[1::2]
    report.hash_slots = len(slots)
    report.slots_marked = sum(1 for m in markers if m is not None
                              and stamped_run(m) == report.run_id)
    report.marker = report.slots_marked == len(slots)
    report.fence_counter = max((int(c) for c in counters if c is not None), default=0)
    left = len(slots) - report.slots_marked
    if left:
        report.warnings.append(
            f"{left} of its {len(slots)} hash slots have no marker of this master's run (a"
            " failover, a migration or a loss; or a new cluster, which the first acquire"
            " marks): clients keep them out until judged and repaired")


def read_node(url: str, address: str, keys: Keys, timeout: float,
              slots: Sequence[int] | None = None) -> NodeReport:
    """Everything ``nodes`` shows about one node (``slots``: a cluster shard's master and
    the hash slots it serves); errors end up in ``error``."""
    report = NodeReport(address)
    client = _client(url, timeout)
    client.set_response_callback("INFO", lambda reply, **_: reply)  # the raw text
    try:
        client.ping()  # connects (and authenticates): not part of the round trip
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            client.ping()
            samples.append((time.perf_counter() - started) * 1000)
        report.rtt_ms = round(statistics.median(samples), 3)
        report.reachable = True
        raw = _text(client.execute_command("INFO"))
        info = _info_fields(raw)
        report.run_id = info.get("run_id")
        report.version = info.get("redis_version")
        report.role = info.get("role")
        online = [dict(part.split("=", 1) for part in value.split(",") if "=" in part)
                  for key, value in info.items()
                  if key.startswith("slave") and key[5:].isdigit()]
        online = [replica for replica in online if replica.get("state") == "online"]
        report.replicas = len(online)
        lags = [int(r["lag"]) for r in online if r.get("lag", "").isdigit()]
        report.replica_lag_s = max(lags) if lags else None
        report.appendonly = info.get("aof_enabled") == "1" if "aof_enabled" in info else None
        report.maxmemory = int(info["maxmemory"]) if info.get("maxmemory", "").isdigit() else None
        report.maxmemory_policy = info.get("maxmemory_policy")
        report.appendfsync = _config(client, "appendfsync")
        report.save = _config(client, "save")
        warnings, report.notes = _persistence_findings(report)
        report.warnings = unsafe_config(raw, cluster=slots is not None) + warnings
        if slots is not None:
            _slots(client, report, keys, slots)
            return report
        marker = client.get(keys.marker)
        counters = client.hvals(keys.counter)
        report.marker = marker is not None
        report.format = None if marker is None else marker_format(marker)
        report.marker_value = None if marker is None else _text(marker)
        report.fence_counter = max((int(c) for c in counters), default=0)
        report.repairing = bool(client.exists(keys.repair_guard))
    except (redis.RedisError, OSError) as exc:
        report.error = as_failure(exc).detail
    finally:
        client.close()
    return report


def read_nodes(urls: Sequence[str], addresses: Sequence[str], keys: Keys,
               timeout: float) -> list[NodeReport]:
    """All nodes in parallel (one thread each; a cluster node gives one report per
    shard), then the warnings across nodes."""
    def read(url: str, address: str) -> list[NodeReport]:
        if from_url(url).cluster:
            return read_cluster(url, address, keys, timeout)
        return [read_node(url, address, keys, timeout)]

    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        reports = [r for found in pool.map(read, urls, addresses) for r in found]
    run_ids = Counter(r.run_id for r in reports if r.run_id)
    marked = sum(1 for r in reports if r.marker)
    for report in reports:
        if report.run_id and run_ids[report.run_id] > 1:
            others = [r.node for r in reports if r.run_id == report.run_id and r is not report]
            report.warnings.append(f"same run_id as {', '.join(others)}: one Redis server"
                                   " listed twice (a failure domain counted as two nodes)")
        if report.marker and report.format != FORMAT and report.shard_of is None:
            report.warnings.append(f"{other_format(report.format)}: clients of this release"
                                   " do not use it (docs/operations.md, \"Upgrading: the"
                                   " node format\")")
        if report.reachable and not report.marker and marked and report.shard_of is None:
            report.warnings.append(f"no node marker while {marked} other node(s) have one:"
                                   " it lost its data, or was added empty; clients keep it"
                                   " out until repaired (redlock repair)")
    return reports


def namespaces_on(urls: Sequence[str], timeout: float, pages: int = 20) -> list[str]:
    """The namespaces whose node markers a node holds (``NS:node:marker``), from the first
    node that answers; a bounded look (at most ``pages`` SCAN pages per node), for a
    hint, not an inventory."""
    suffix = ":node:marker"
    for url in urls:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                      retry=Retry(NoBackoff(), 0), health_check_interval=0)
        found: set[str] = set()
        try:
            cursor = 0
            for _ in range(pages):
                cursor, keys = client.scan(cursor, match="*" + suffix, count=1000)
                found.update(_text(key)[:-len(suffix)] for key in keys)
                if cursor == 0:
                    break
        except (redis.RedisError, OSError):
            continue
        finally:
            client.close()
        return sorted(found)
    return []
