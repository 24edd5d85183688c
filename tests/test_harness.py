"""The harness itself: real processes that start, pause, die and come back."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import redis

from redlock.testing import RedisNodes


def test_nodes_start_on_distinct_loopback_ports_and_answer(nodes3: RedisNodes) -> None:
    ports = {node.port for node in nodes3}
    assert len(ports) == 3
    for node in nodes3:
        assert node.host == "127.0.0.1"
        with node.client() as client:
            assert client.ping()


def test_pause_makes_node_hang_and_resume_brings_it_back(nodes3: RedisNodes) -> None:
    node = nodes3[0]
    node.pause()
    with node.client(socket_timeout=0.2) as client, pytest.raises(redis.TimeoutError):
        client.ping()
    node.resume()
    with node.client() as client:
        assert client.ping()


def test_restart_without_data_forgets_and_with_aof_remembers(
    fresh_nodes: Callable[..., RedisNodes],
) -> None:
    volatile = fresh_nodes(1)[0]
    durable = fresh_nodes(1, appendonly=True)[0]
    for node in (volatile, durable):
        with node.client() as client:
            client.set("k", "v")
        port = node.port
        node.restart(keep_data=True)
        assert node.port == port
    with volatile.client() as client:
        assert client.get("k") is None
    with durable.client() as client:
        assert client.get("k") == b"v"
    durable.restart(keep_data=False)
    with durable.client() as client:
        assert client.get("k") is None


def test_close_stops_processes_and_removes_temp_dirs() -> None:
    nodes = RedisNodes(2)
    pids = [node.pid for node in nodes]
    base = nodes.base_dir
    nodes[1].pause()  # a paused node must still be stopped
    nodes.close()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not base.exists()


def test_password_protected_nodes(fresh_nodes: Callable[..., RedisNodes]) -> None:
    node = fresh_nodes(1, password="s3cret")[0]
    assert node.url.startswith("redis://:s3cret@")
    with node.client() as client:
        assert client.ping()
