"""The rules: pure functions and values with no state and no I/O.

Validation of the caller's arguments (``TypeError`` / ``ValueError`` at the call
site), settings, key naming, the quorum, validity and token rules, and the one place
where the nodes' replies become :class:`~redlock.errors.NodeResult` outcomes.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from redlock._core.requests import PENDING, NotAwaited
from redlock._scripts import lock as scripts
from redlock._scripts import node as node_scripts
from redlock.errors import NodeResult, Outcome

#: Tokens are Lua numbers on the nodes, exact integers only below 2**53: an
#: acquisition whose token would reach it fails instead of issuing an inexact one.
TOKEN_LIMIT = 2**53
DEFAULT_MAX_TTL = 3600.0
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]+$")


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def validate_resource(resource: object) -> str:
    if not isinstance(resource, str):
        raise TypeError(f"resource must be a str, not {type(resource).__name__}")
    if not resource:
        raise ValueError("resource must be a non-empty string")
    return resource


def _as_float(name: str, value: object, what: str) -> float:
    """A number as float; bool is rejected (True is not a duration)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int beyond float range: absurd, not a crash
        raise ValueError(f"{name}={value!r} s is larger than any usable duration") from None


def validate_seconds(name: str, value: object, *, upper: float | None = None) -> float:
    """A finite, positive number of seconds."""
    seconds = _as_float(name, value, "a number of seconds")
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    if upper is not None and seconds > upper:
        raise ValueError(f"{name}={value!r} s is larger than the maximum {upper:g} s")
    return seconds


def validate_resources(resources: object) -> tuple[str, ...]:
    """A set of resources: validated, without duplicates, sorted (the order its keys are
    sent in, so every client asks for a set's keys in the same order)."""
    if isinstance(resources, str | bytes) or not isinstance(resources, Iterable):
        raise TypeError("resources must be a collection of resource names (str), not"
                        f" {type(resources).__name__}")
    names = tuple(sorted({validate_resource(r) for r in resources}))
    if not names:
        raise ValueError("at least one resource is needed")
    return names


def label(resources: Sequence[str]) -> str:
    """What an acquisition is called in messages: its resource, or its set."""
    if len(resources) == 1:
        return resources[0]
    return "[" + ", ".join(repr(r) for r in resources) + "]"


def shown(resources: Sequence[str]) -> str:
    """An acquisition in an error message: ``'orders:42'``, or ``['a', 'b']``."""
    return repr(resources[0]) if len(resources) == 1 else label(resources)


def validate_timeout(timeout: object) -> float | None:
    """``None`` waits without a deadline; 0 means a single attempt."""
    if timeout is None:
        return None
    seconds = _as_float("timeout", timeout, "a number of seconds or None")
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"timeout must be a finite number >= 0 or None, got {timeout!r}")
    return seconds


def validate_node_addresses(addresses: Sequence[str]) -> None:
    if not addresses:
        raise ValueError("at least one Redis node is needed")
    seen: set[str] = set()
    for address in addresses:
        if address in seen:
            raise ValueError(f"node {address} is listed twice: each node must be independent")
        seen.add(address)


# ---------------------------------------------------------------------------
# Settings and key naming
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Tuning shared by every lock of one manager (all durations in seconds)."""

    namespace: str = "redlock"
    node_timeout: float | None = None  # None: adapt to the measured round trips
    connect_timeout: float = 1.0
    drift_factor: float = 0.01
    drift_constant: float = 0.002
    retry_delay_min: float = 0.005
    retry_delay_max: float = 0.25
    max_ttl: float = DEFAULT_MAX_TTL
    repair_interval: float = 5.0
    repair_timeout: float = 2.0
    outage_timeout: float | None = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or not _NAMESPACE_RE.match(self.namespace):
            raise ValueError(
                f"namespace must match {_NAMESPACE_RE.pattern} (no braces or glob characters),"
                f" got {self.namespace!r}"
            )
        if self.node_timeout is not None:
            validate_seconds("node_timeout", self.node_timeout)
        for name in ("connect_timeout", "retry_delay_min", "retry_delay_max", "max_ttl",
                     "repair_interval", "repair_timeout"):
            validate_seconds(name, getattr(self, name))
        if self.outage_timeout is not None:
            validate_seconds("outage_timeout", self.outage_timeout)
        if isinstance(self.drift_factor, bool) or not 0 <= self.drift_factor < 0.5:
            raise ValueError(f"drift_factor must be in [0, 0.5), got {self.drift_factor!r}")
        if self.retry_delay_min > self.retry_delay_max:
            raise ValueError("retry_delay_min must not exceed retry_delay_max")

    def drift(self, ttl: float) -> float:
        """Clock drift allowance: ttl * drift_factor + a constant for timer granularity."""
        return ttl * self.drift_factor + self.drift_constant

    def request_ceiling(self, ttl: float | None) -> float:
        """The most an adaptive request may wait: a fifth of the TTL (the rest is the
        holder's), and a second without one (admin views, probes)."""
        return 1.0 if ttl is None else min(2.0, max(ttl / 5, 0.01))

    def check_ttl(self, ttl: object) -> float:
        seconds = validate_seconds("ttl", ttl, upper=self.max_ttl)
        if seconds <= self.drift(seconds):
            raise ValueError(f"ttl={ttl!r} s is not larger than the clock-drift allowance")
        return seconds


@dataclass(frozen=True)
class Keys:
    """Key names. A resource's keys share a hash tag (``{resource}``): one slot."""

    namespace: str

    def lock(self, resource: str) -> str:
        return f"{self.namespace}:{{{resource}}}:lock"

    def fence(self, resource: str) -> str:
        return f"{self.namespace}:{{{resource}}}:fence"

    def channel(self, resource: str) -> str:
        """Where a release publishes; also the key of the resource's local line."""
        return f"{self.namespace}:{{{resource}}}:released"

    def line(self, resource: str) -> str:
        """The resource's waiting line on a node (docs/design.md §6)."""
        return f"{self.namespace}:{{{resource}}}:line"

    def line_deadlines(self, resource: str) -> str:
        """When each entry of the waiting line lapses, by the node's clock."""
        return f"{self.namespace}:{{{resource}}}:line-deadlines"

    @property
    def marker(self) -> str:
        return f"{self.namespace}:node-marker"

    def identify_command(self) -> tuple[str | int, ...]:
        """IDENTIFY, as the transports send it first on every new connection: an EVAL
        with the body (it never meets NOSCRIPT, and it is rare; docs/design.md §4.4)."""
        return ("EVAL", node_scripts.IDENTIFY.source, 1, self.marker)

    @property
    def episode(self) -> str:
        """When (by the node's clock) and in which server run it lost its data."""
        return f"{self.namespace}:node-amnesia"

    @property
    def repair_guard(self) -> str:
        return f"{self.namespace}:node-repair"

    @property
    def fence_pattern(self) -> str:
        return f"{self.namespace}:{{*}}:fence"


# ---------------------------------------------------------------------------
# Quorum, validity and the token rule (docs/design.md §2, §3)
# ---------------------------------------------------------------------------


def quorum(node_count: int) -> int:
    """Majority of N: N // 2 + 1."""
    return node_count // 2 + 1


def waiter_id(owner: str) -> str:
    """An acquisition's name in the nodes' waiting lines and wake-up messages: SHA1 of
    its owner value (the scripts compute the same), which does not reveal the owner."""
    return hashlib.sha1(owner.encode()).hexdigest()


def validity_left(settings: Settings, ttl: float, started: float, now: float) -> float:
    """ttl - elapsed - drift, measured from the attempt's start on a monotonic clock."""
    return ttl - (now - started) - settings.drift(ttl)


@dataclass(frozen=True)
class TokenChoice:
    token: int
    committed: tuple[int, ...]  # nodes known to hold counter >= token under our key
    write_back: tuple[int, ...]  # granting nodes whose counter is lower: need the write-back


def choose_token(counters: dict[int, int]) -> TokenChoice:
    """Token = max over the granting nodes; nodes that returned it are already committed."""
    token = max(counters.values())
    committed = tuple(i for i, c in counters.items() if c == token)
    lower = tuple(i for i, c in counters.items() if c < token)
    return TokenChoice(token, committed, lower)


# ---------------------------------------------------------------------------
# Replies: the one place reply codes become outcomes
# ---------------------------------------------------------------------------


#: Why a node in cluster mode answers CROSSSLOT: the lock scripts take the resource's
#: keys and the node marker together, in different slots (docs/design.md §11.4).
CLUSTER_MODE_HINT = ("a Redis Cluster node cannot be a Redlock node: the lock scripts"
                     " need the node marker beside the resource's keys (another slot);"
                     " use independent non-cluster masters, docs/design.md §11.4")


# redis-py turns a cluster-mode node's CROSSSLOT/MOVED/ASK/CLUSTERDOWN replies into
# these (without the code in the message): the node is in cluster mode, not a lock node.
_CLUSTER_ERRORS = {"ClusterCrossSlotError", "MovedError", "AskError", "ClusterDownError"}


def _is_cluster_error(exc: BaseException) -> bool:
    return (type(exc).__name__ in _CLUSTER_ERRORS
            or str(exc).startswith(("CROSSSLOT", "MOVED", "ASK ", "CLUSTERDOWN")))


def error_detail(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if _is_cluster_error(exc):
        text += f" ({CLUSTER_MODE_HINT})"
    return f"{type(exc).__name__}: {text}"


def is_permanent_error(exc: BaseException) -> bool:
    """Errors that retrying will not fix: credentials, permissions, wrong node type."""
    name = type(exc).__name__
    if name in {"AuthenticationError", "AuthenticationWrongNumberOfArgsError", "NoPermissionError"}:
        return True
    text = str(exc)
    return (text.startswith(("NOPERM", "WRONGPASS", "NOAUTH", "READONLY", "MOVED", "CROSSSLOT"))
            or _is_cluster_error(exc))


def not_awaited(node: str, why: NotAwaited | None = None) -> NodeResult:
    return NodeResult(node, Outcome.NOT_AWAITED, str(why) if why is not None else
                      "the request was decided without this reply (read in the background)")


def unread(node: str) -> NodeResult:
    """A reply that nobody read: an error, never a refusal (it says nothing about our key)."""
    return NodeResult(node, Outcome.ERROR, "no reply was read from this node")


def classify_acquire_reply(node: str, reply: object, resources: int = 1) -> NodeResult:
    """ACQUIRE's reply (one resource) or ACQUIRE_MANY's (a set of ``resources``); a
    granting node's counters are ``reply[1:]``, one per resource (``counter``: the max)."""
    if isinstance(reply, NotAwaited):
        return not_awaited(node)
    if reply is PENDING:
        return unread(node)
    if isinstance(reply, BaseException):
        return NodeResult(node, Outcome.ERROR, error_detail(reply))
    if not isinstance(reply, list | tuple) or len(reply) < 2:
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    try:
        code, values = int(reply[0]), [int(v) for v in reply[1:]]
    except (TypeError, ValueError):  # a proxy or a foreign script answering: not ours
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    if code in (scripts.ACQUIRE_GRANTED, scripts.ACQUIRE_ALREADY_OURS):
        if len(values) != resources:
            return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
        return NodeResult(node, Outcome.GRANTED, counter=max(values))
    if len(values) != 1:
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    if code == scripts.ACQUIRE_REFUSED:
        held = "held by another owner" if resources == 1 else "a key is held by another owner"
        return NodeResult(node, Outcome.REFUSED, f"{held}, {values[0]} ms left",
                          pttl_ms=values[0])
    if code == scripts.ACQUIRE_NOT_YOUR_TURN:
        waiters = "1 waiter is" if values[0] == 1 else f"{values[0]} waiters are"
        return NodeResult(node, Outcome.REFUSED, f"free, but {waiters} first in line")
    if code == scripts.ACQUIRE_AMNESIAC:
        return NodeResult(node, Outcome.AMNESIAC, "no node marker: new, or lost its data")
    return NodeResult(node, Outcome.ERROR, f"unexpected reply code {code}")


def classify_ack_reply(node: str, reply: object, *, refused: str) -> NodeResult:
    """Replies of the owner-checked scripts (extend, write-back, release): 1 = done, 0 =
    our key is not there. Only a 0 the node sent is a refusal: anything else (no reply
    read, an error, a reply of another shape) is an error and says nothing about our key."""
    if isinstance(reply, NotAwaited):
        return not_awaited(node, reply)
    if reply is PENDING:
        return unread(node)
    if isinstance(reply, BaseException):
        return NodeResult(node, Outcome.ERROR, error_detail(reply))
    if reply == 1:
        return NodeResult(node, Outcome.GRANTED)
    if reply == 0:
        return NodeResult(node, Outcome.REFUSED, refused)
    return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")


def unsafe_config(info: object) -> list[str]:
    """What in a node's ``INFO`` reply makes it unsafe for locks (docs/design.md §4): a
    replica (writes go elsewhere, and a failover can promote a copy that lacks our keys),
    or a memory limit with an eviction policy (lock keys carry a TTL, so even the
    volatile-* policies can evict them; allkeys-* also evicts fence counters). Anything
    unreadable yields no findings: this is advice, not a gate."""
    if isinstance(info, bytes):
        info = info.decode("utf-8", "replace")
    if not isinstance(info, str):
        return []
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    findings = []
    if fields.get("role", "").strip() == "slave":
        findings.append("node is a replica (role:slave): lock writes belong on primaries")
    if fields.get("cluster_enabled", "0").strip() == "1":
        findings.append(f"node runs in cluster mode (cluster_enabled:1): {CLUSTER_MODE_HINT}")
    policy = fields.get("maxmemory_policy", "noeviction").strip()
    if fields.get("maxmemory", "0").strip() not in ("", "0") and policy != "noeviction":
        findings.append(f"maxmemory is set with maxmemory-policy {policy}: Redis may evict"
                        " lock keys or fence counters under memory pressure (use noeviction)")
    return findings
