"""Every non-public name of the library that the tests use, imported in this one place.

When the library's internals move, only the imports below change. Tests import these
names from here, never from the library's private modules.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from types import SimpleNamespace
from typing import Any

from redlock._client.environment import real as real_environment
from redlock._client.renewer import Renewer
from redlock._client.telemetry import RECHECK_S, Telemetry, observe
from redlock._client.waiting_room import Waiter, WaitingRoom
from redlock._core.algorithm import RedlockCore
from redlock._core.amnesia.episodes import open_episodes
from redlock._core.amnesia.maintenance import maintenance
from redlock._core.amnesia.repair import RepairReport
from redlock._core.amnesia.repair import read_counters as _read_counters
from redlock._core.amnesia.repair import repair_node as _repair_node
from redlock._core.environment import Environment
from redlock._core.handoff import Handoffs, Heard, counted, parse_message
from redlock._core.kinds import (
    MUTEX,
    READ,
    WRITE,
    AcquireArgs,
    Hole,
    Leadership,
    Permit,
    Template,
    _acquire_template,
    with_epoch,
)
from redlock._core.members import Rule
from redlock._core.renewals import Renewals
from redlock._core.requests import (
    LAST_ROUND,
    PENDING,
    Backoff,
    Broadcast,
    Call,
    Invoke,
    Pause,
    PauseUntilWoken,
    Replies,
    Wait,
    drive,
)
from redlock._core.settings import (
    LINE_POLL_MAX,
    Keys,
    Settings,
    validate_node_addresses,
    validate_resource,
    validate_seconds,
    validate_timeout,
)
from redlock._core.state import LockState, Status
from redlock._core.tokens import (
    CALL_DIGITS,
    COUNTER_BUCKETS,
    TOKEN_LIMIT,
    bucket,
    choose_token,
    lock_value,
    quorum,
    validity_left,
    waiter_id,
)
from redlock._io import sync_transport
from redlock._io.failures import as_failure, map_failures
from redlock._io.sync_drainer import SyncDrainer
from redlock._io.sync_transport import SyncTransport
from redlock._io.wakeups import WakeRegistry
from redlock._io.wire import render as render_call
from redlock._observe.events import SENTENCES, render
from redlock._observe.log import RESERVED_FIELDS, EventLogger, event_fields
from redlock._observe.outages import NodeOutages
from redlock._scripts import lock as _lock_scripts
from redlock._scripts import node as node_scripts
from redlock._scripts import tools as _tool_scripts
from redlock._scripts.command import plain_pack
from redlock._scripts.node_config import unsafe_config
from redlock._scripts.replies import ack_outcome, acquire_outcome, marker_format, ours
from redlock._scripts.script import Script
from redlock._scripts.shared import EPOCH_CHECK, STALE_EPOCH
from redlock.cli import render as cli_render

__all__ = [
    "CALL_DIGITS",
    "COUNTER_BUCKETS",
    "KEYS",
    "LAST_ROUND",
    "LINE_POLL_MAX",
    "MUTEX",
    "PENDING",
    "READ",
    "RECHECK_S",
    "RESERVED_FIELDS",
    "SENTENCES",
    "TOKEN_LIMIT",
    "WRITE",
    "AcquireArgs",
    "Backoff",
    "Broadcast",
    "Call",
    "Environment",
    "EventLogger",
    "Handoffs",
    "Heard",
    "Hole",
    "Invoke",
    "Keys",
    "Leadership",
    "LockState",
    "NodeOutages",
    "Pause",
    "PauseUntilWoken",
    "Permit",
    "RedlockCore",
    "Renewals",
    "RepairReport",
    "Replies",
    "Settings",
    "Status",
    "SyncDrainer",
    "SyncTransport",
    "Telemetry",
    "Template",
    "Wait",
    "Waiter",
    "WaitingRoom",
    "WakeRegistry",
    "ack_outcome",
    "acquire_outcome",
    "acquire_templates_kept",
    "as_failure",
    "bucket",
    "choose_token",
    "cli_render",
    "counted",
    "drive",
    "drop_idle_connections",
    "event_fields",
    "idle_connections",
    "idle_count",
    "late_entries",
    "lock_value",
    "maintenance",
    "map_failures",
    "marker_format",
    "membership_rule",
    "node_scripts",
    "observe",
    "open_episodes",
    "ours",
    "parse_message",
    "plain_pack",
    "put_idle",
    "quorum",
    "read_counters",
    "real_environment",
    "render",
    "render_call",
    "repair_node",
    "requests_sent",
    "scripts",
    "sync_transport",
    "turns_idle",
    "unsafe_config",
    "validate_node_addresses",
    "validate_resource",
    "validate_seconds",
    "validate_timeout",
    "validity_left",
    "waiter_id",
    "with_epoch",
]

KEYS = Keys("redlock")  # the key names of the default namespace

# The lock's scripts (redlock/_scripts/lock.py) and the operator tools'
# (redlock/_scripts/tools.py), as one namespace, with what the tests' scripted nodes
# read of the Lua both share (redlock/_scripts/shared.py).
scripts = SimpleNamespace(
    **{name: value for module in (_lock_scripts, _tool_scripts)
       for name, value in vars(module).items() if isinstance(value, Script)
       or (name.isupper() and not name.startswith("_"))},
    Script=Script, EPOCH_CHECK=EPOCH_CHECK, STALE_EPOCH=STALE_EPOCH)


def turns_idle(manager: Any) -> bool:
    """True when no thread or task of ``manager`` waits in, or holds a turn of, local
    turns (Redlock and AsyncRedlock keep them in a private attribute)."""
    return bool(manager._room.turns.idle())


def route_of(manager: Any) -> str:
    """The route hand-offs to ``manager``'s waiters are published on (docs/design.md
    §6.7)."""
    return str(manager._core.route)


def hand_offs_heard(manager: Any) -> list[str]:
    """From now on, the data of every message ``manager``'s listeners hand to its
    wake-up registry (whatever channel brought it); returns the list it grows."""
    registry = manager._room.wakeups
    deliver = registry.deliver
    heard: list[str] = []

    def recorded(channel: str, data: str, *args: Any, **kwargs: Any) -> None:
        heard.append(data)
        deliver(channel, data, *args, **kwargs)
    registry.deliver = recorded
    return heard


async def drop_idle_connections(manager: Any) -> None:
    """Close an AsyncRedlock's idle connections: its next request to each node opens a
    new one (connect and handshake first)."""
    transport = manager._transport
    for idle in transport._idle:
        while idle:
            await transport._discard(idle.pop())


def requests_sent(manager: Any) -> list[Any]:
    """From now on, every request (broadcast) ``manager``'s handles send through its
    transport, in order; returns the list it grows."""
    transport = manager._transport
    broadcast = transport.broadcast
    sent: list[Any] = []

    def recorded(request: Any) -> Any:
        sent.append(request)
        return broadcast(request)
    transport.broadcast = recorded
    return sent


def acquire_templates_kept() -> int:
    """How many ACQUIRE templates the process keeps (bounded: the names used lately)."""
    return int(_acquire_template.cache_info().currsize)


def membership_rule(manager: Any) -> Rule:
    """The membership rule ``manager`` counts by now (docs/design.md §13.2)."""
    rule: Rule = manager._core.membership.rule
    return rule


def idle_connections(manager: Any, node: int = 0) -> int:
    """How many open connections a Redlock keeps for ``node`` between requests."""
    return idle_count(manager._transport, node)


def idle_count(transport: SyncTransport, node: int) -> int:
    """How many open connections a SyncTransport keeps for ``node`` between requests."""
    return len(transport._idle[node])


def put_idle(transport: SyncTransport, node: int, conn: Any) -> None:
    """Give a SyncTransport an open connection to ``node``, as a request gives one back."""
    transport._give_back(node, conn)


def late_entries(drainer: SyncDrainer) -> Any:
    """A SyncDrainer's late connections (their ``entries`` is what its thread reads)."""
    return drainer.late


def repair_node(core: RedlockCore, node: int, *, force: bool = False,
                sources: Sequence[int] | None = None) -> Generator[Any, Any, RepairReport]:
    """The protocol that re-seeds one amnesiac node and gives it its marker back (once
    its episode is one max_ttl old by its clock, or at once: ``force``); ``sources``:
    the nodes to read counters from (default: every healthy node, a quorum of them)."""
    return _repair_node(core.amnesia, node, force=force, sources=sources)


def read_counters(core: RedlockCore,
                  node: int) -> Generator[Any, Any, dict[str, int] | None]:
    """The protocol that reads the fence counters of one node, per bucket (None: it
    could not)."""
    return _read_counters(core.amnesia, (node,))


def renewed_by_a_renewer(manager: Any) -> bool:
    """Whether ``manager``'s auto-extended locks are renewed by a renewer process
    (docs/design.md §5.2), not by a thread or task of this one."""
    return isinstance(manager._registry.renewals, Renewer)
