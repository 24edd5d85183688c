"""A node's configuration as its replies show it (INFO, CONFIG GET): what makes a node
unsafe for locks, and why a restarted node may have lost acknowledged writes (docs/
design.md §4.6, §4.7). Advice and judgement read from replies, next to
:mod:`redlock._scripts.replies` (which reads the scripts' own)."""

from __future__ import annotations

from redlock._scripts.replies import CLUSTER_MODE_HINT, text


def unsafe_config(info: object, *, cluster: bool = False) -> list[str]:
    """What in a node's ``INFO`` reply makes it unsafe for locks (docs/design.md §4.7): a
    replica (writes go elsewhere, and a failover can promote a copy that lacks our keys),
    cluster mode on a node not given as a cluster (``cluster``), or a memory limit with an
    eviction policy (lock keys carry a TTL, so even the volatile-* policies can evict them;
    allkeys-* also evicts fence counters).
    Anything unreadable yields no findings: this is advice, not a gate."""
    if isinstance(info, bytes):
        info = info.decode("utf-8", "replace")
    if not isinstance(info, str):
        return []
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    findings = []
    if fields.get("role", "").strip() == "slave":
        findings.append("node is a replica (role:slave): lock writes belong on primaries")
    if fields.get("cluster_enabled", "0").strip() == "1" and not cluster:
        findings.append(f"node runs in cluster mode (cluster_enabled:1): {CLUSTER_MODE_HINT}")
    policy = fields.get("maxmemory_policy", "noeviction").strip()
    if fields.get("maxmemory", "0").strip() not in ("", "0") and policy != "noeviction":
        findings.append(f"maxmemory is set with maxmemory-policy {policy}: Redis may evict"
                        " lock keys or fence counters under memory pressure (use noeviction)")
    return findings


def not_durable(appendonly: object, appendfsync: object, replication: object) -> str | None:
    """Why a restarted node may have lost acknowledged writes (None: it cannot have)."""
    def setting(reply: object) -> str:  # CONFIG GET: a map (RESP3) or a pair (RESP2)
        if isinstance(reply, dict) and len(reply) == 1:
            return text(next(iter(reply.values())))
        if isinstance(reply, list | tuple) and len(reply) == 2:
            return text(reply[1])
        return "unknown"

    if isinstance(replication, BaseException):
        return None  # unreachable: judged again later
    fields = dict(line.split(":", 1) for line in text(replication).splitlines() if ":" in line)
    if fields.get("second_repl_offset", "-1").strip() != "-1":
        return "a promoted replica (its copy may lag behind the old primary)"
    if setting(appendonly) != "yes" or setting(appendfsync) != "always":
        return (f"restarted with appendonly {setting(appendonly)}, appendfsync"
                f" {setting(appendfsync)}: the last writes may be lost")
    return None
