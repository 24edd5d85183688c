"""docs/design.md §4.7: warn when a node is a replica, or its memory policy can evict lock keys
or fence counters. Real nodes configured that way; both clients."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from redlock import AsyncRedlock, Redlock
from redlock.testing import RedisNodes, capture_events
from tests.internals import unsafe_config


def test_unsafe_config_reads_role_and_eviction_policy() -> None:
    primary = b"# Replication\r\nrole:master\r\n# Memory\r\nmaxmemory:0\r\n" \
              b"maxmemory_policy:allkeys-lru\r\n"
    assert unsafe_config(primary) == []  # no memory limit: the policy never applies
    assert len(unsafe_config(b"role:slave\r\nmaxmemory:0\r\n")) == 1
    evicting = unsafe_config(b"role:master\r\nmaxmemory:1048576\r\n"
                             b"maxmemory_policy:volatile-ttl\r\n")
    assert len(evicting) == 1 and "volatile-ttl" in evicting[0]
    assert unsafe_config(b"maxmemory:1048576\r\nmaxmemory_policy:noeviction\r\n") == []
    assert unsafe_config(ConnectionError("down")) == []
    assert unsafe_config(None) == []


@pytest.fixture
def unsafe_nodes(fresh_nodes: Callable[..., RedisNodes]) -> list[str]:
    """Three nodes: a sound one, one evicting under a memory limit, one replica."""
    sound = fresh_nodes(1)
    evicting = fresh_nodes(1, extra_args=["--maxmemory", "64mb",
                                          "--maxmemory-policy", "volatile-lru"])
    replica = fresh_nodes(1, extra_args=["--replicaof", sound[0].host, str(sound[0].port),
                                         "--replica-read-only", "no"])
    return [sound.urls[0], evicting.urls[0], replica.urls[0]]


def _warnings(events: list[dict[str, object]]) -> dict[object, object]:
    return {e["node"]: e["problem"] for e in events
            if e["event"] == "redlock.node_unsafe_config"}


def test_sync_client_warns_once_per_unsafe_node(unsafe_nodes: list[str]) -> None:
    with capture_events() as events, Redlock(unsafe_nodes, node_timeout=0.5) as dlm:
        for _ in range(3):
            with dlm.lock("cfg:x", timeout=5.0):
                pass
    warned = _warnings(events)
    addresses = [url.removeprefix("redis://") for url in unsafe_nodes]
    assert set(warned) == {addresses[1], addresses[2]}
    assert "volatile-lru" in str(warned[addresses[1]])
    assert "replica" in str(warned[addresses[2]])
    assert sum(e["event"] == "redlock.node_unsafe_config" for e in events) == 2


async def test_async_client_warns_too(unsafe_nodes: list[str]) -> None:
    with capture_events() as events:
        async with AsyncRedlock(unsafe_nodes, node_timeout=0.5) as dlm, \
                dlm.lock("cfg:y", timeout=5.0):
            pass
    assert len(_warnings(events)) == 2


def test_sound_nodes_give_no_warning(fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3)
    with capture_events() as events, Redlock(nodes.urls) as dlm, dlm.lock("cfg:z", timeout=5.0):
        pass
    assert _warnings(events) == {}
