"""What the caller gives, checked at the call site (``TypeError`` / ``ValueError``), the
settings a manager's locks share, and the names of the keys on the nodes."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from redlock._observe.warn import check_units, milliseconds_hint
from redlock._scripts import node as node_scripts
from redlock._scripts.hash_slots import hash_slot, tag_of

# The longest TTL a lock may ask for by default, and how long a node that lost data stays
# out where nothing that survived bounds its leases (docs/design.md §4.3.1). Auto-extend
# holds a lock as long as its holder lives with a short TTL.
DEFAULT_MAX_TTL = 60.0
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]+$")


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
    """``None`` waits without a deadline; 0 means a single attempt. A timeout of 1000 s
    or more was probably meant in milliseconds: a :class:`DurationWarning`."""
    if timeout is None:
        return None
    seconds = _as_float("timeout", timeout, "a number of seconds or None")
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"timeout must be a finite number >= 0 or None, got {timeout!r}")
    check_units("timeout", seconds, timeout)
    return seconds


def validate_node_addresses(addresses: Sequence[str]) -> None:
    if not addresses:
        raise ValueError("at least one Redis node is needed")
    seen: set[str] = set()
    for address in addresses:
        if address in seen:
            raise ValueError(f"node {address} is listed twice: each node must be independent")
        seen.add(address)


# The longest a waiter in line that hears releases waits between attempts: it keeps
# its place in line, and a lost wake-up costs it at most this (docs/design.md §6.4).
LINE_POLL_MAX = 0.5


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
    replica_acks: int = 0  # replicas that must have a grant before it counts (§11.3)

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
        if isinstance(self.replica_acks, bool) or not isinstance(self.replica_acks, int):
            raise TypeError("replica_acks must be an int (the replicas that must acknowledge"
                            f" a grant), not {type(self.replica_acks).__name__}")
        if not 0 <= self.replica_acks <= 16:
            raise ValueError(f"replica_acks must be in 0..16, got {self.replica_acks}")

    def drift(self, ttl: float) -> float:
        """Clock drift allowance: ttl * drift_factor + a constant for timer granularity."""
        return ttl * self.drift_factor + self.drift_constant

    def request_ceiling(self, ttl: float | None) -> float:
        """The most an adaptive request may wait: a fifth of the TTL (the rest is the
        holder's), and a second without one (admin views, probes)."""
        return 1.0 if ttl is None else min(2.0, max(ttl / 5, 0.01))

    def patience(self, request_timeout: float) -> float:
        """How long a waiting-line entry stays without a new attempt from its waiter: two of the
        longest waits between attempts (a wait and an attempt), so a live waiter keeps its place
        and a dead one blocks the line briefly (about 1.1 s by default; docs/design.md §6.3)."""
        longest_wait = max(self.retry_delay_max, LINE_POLL_MAX)
        return 2 * (longest_wait + request_timeout) + 0.05

    def single_try(self, ttl: float) -> float:
        """How long a single try (``blocking=False``, ``timeout=0``) may take, all its
        rounds together (the acquire, a new cluster's initialisation, a write-back, the
        release of a failed attempt): one request ceiling, or ``node_timeout`` if the
        user set a longer one (it bounds each request as given)."""
        ceiling = self.request_ceiling(ttl)
        return ceiling if self.node_timeout is None else max(ceiling, self.node_timeout)

    def check_ttl(self, ttl: object, *, given: bool = True) -> float:
        """A lock's TTL in seconds: above ``max_ttl`` a ``ValueError`` that says the
        unit; 1000 s or more (below ``max_ttl``) a :class:`DurationWarning` at the
        caller's line, unless the TTL was not ``given`` by the caller (a hand-over's)."""
        seconds = validate_seconds("ttl", ttl)
        if seconds > self.max_ttl:
            raise ValueError(milliseconds_hint("ttl", ttl, seconds, "max_ttl", self.max_ttl))
        if seconds <= self.drift(seconds):
            raise ValueError(f"ttl={ttl!r} s is not larger than the clock-drift allowance")
        if given:
            check_units("ttl", seconds, ttl, self.max_ttl)
        return seconds


@dataclass(frozen=True)
class Keys:
    """Key names (the table at the top of docs/design.md). A resource's keys share a
    hash tag (``{resource}``): one hash slot. A node keeps a fixed set of keys of its own
    (``ns:node:*``): its marker, its fence counters (one hash), its membership record,
    its lease horizon, its amnesia episode and repair claim; the resources' lock keys and
    lines expire. A cluster node keeps that set once per hash slot (``hash_slot``), named
    ``ns:node:{T}:*`` with the hash slot's tag (docs/design.md §11.4): :meth:`beside`."""

    namespace: str
    hash_slot: int | None = None

    def beside(self, resource: str) -> Keys:
        """The keys a cluster node uses for ``resource``: its node keys of the hash slot
        the resource's keys are stored in (one hash slot per script)."""
        return in_hash_slot(self.namespace, hash_slot(self.lock(resource)))

    @cached_property
    def node(self) -> str:
        """The prefix of the node's own keys: ``ns:node`` (``ns:node:{T}`` on a cluster)."""
        if self.hash_slot is None:
            return f"{self.namespace}:node"
        return f"{self.namespace}:node:{{{tag_of(self.hash_slot)}}}"

    def lock(self, resource: str) -> str:
        return f"{self.namespace}:{{{resource}}}:lock"

    def part(self, resource: str, suffix: str) -> str:
        """A key of ``resource`` for one kind of the lock family (docs/design.md §12.0):
        ``ns:{R}:leader``, ``ns:{R}:permit:0``, ``ns:{R}:write``..."""
        return f"{self.namespace}:{{{resource}}}:{suffix}"

    def channel(self, resource: str) -> str:
        """Where a release publishes; also the key of the resource's local turns."""
        return f"{self.namespace}:{{{resource}}}:released"

    def line(self, resource: str) -> str:
        """The resource's waiting line on a node (docs/design.md §6)."""
        return f"{self.namespace}:{{{resource}}}:line"

    def line_deadlines(self, resource: str) -> str:
        """When each entry of the waiting line lapses, by the node's clock."""
        return f"{self.namespace}:{{{resource}}}:line-deadlines"

    @cached_property  # (read on every call: made once)
    def counter(self) -> str:
        """The node's fence counters: a hash of ``COUNTER_BUCKETS`` fields; a resource's
        tokens come from the one its name hashes to (``tokens.bucket``)."""
        return f"{self.node}:fence"

    @cached_property  # (read on every call: made once)
    def members(self) -> str:
        """The node's membership record (docs/design.md §13.1): a hash, no TTL."""
        return f"{self.node}:members"

    @cached_property  # (read on every call: made once)
    def marker(self) -> str:
        """The node marker: the node's format and the server run that stamped it
        (docs/design.md §4.1)."""
        return f"{self.node}:marker"

    def identify_command(self) -> tuple[str | int, ...]:
        """IDENTIFY, as the transports send it first on every new connection: an EVAL
        with the body (it never meets NOSCRIPT, and it is rare; docs/design.md §4.4)."""
        return ("EVAL", node_scripts.IDENTIFY.source, 1, self.marker)

    @property
    def episode(self) -> str:
        """When (by the node's clock) and in which server run it lost its data, and from
        when it may rejoin."""
        return f"{self.node}:amnesia"

    @cached_property  # (read on every granting, committing or renewing call: made once)
    def horizon(self) -> str:
        """The node's lease horizon (docs/design.md §4.3.1): a key whose expiry is the
        latest of the leases it granted or extended; a declared key of every script
        that raises it, before :attr:`members`."""
        return f"{self.node}:horizon"

    @property
    def repair_guard(self) -> str:
        return f"{self.node}:repair"


@lru_cache(maxsize=1024)
def in_hash_slot(namespace: str, slot: int) -> Keys:
    """The keys of a cluster node's hash slot ``slot`` (asked on every call to a cluster
    node: kept for the hash slots used lately)."""
    return Keys(namespace, slot)
