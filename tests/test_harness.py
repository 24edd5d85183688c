"""The harness itself: real processes that start, pause, die and come back."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from redlock.testing import RedisNode, RedisNodes


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


def test_backup_and_restore_bring_back_the_old_data(
    fresh_nodes: Callable[..., RedisNodes],
) -> None:
    snapshot_only = fresh_nodes(1)[0]
    durable = fresh_nodes(1, appendonly=True)[0]
    for node in (snapshot_only, durable):
        with node.client() as client:
            client.set("k", "old")
            run_id = client.info("server")["run_id"]
        backup = node.backup()
        with node.client() as client:
            client.set("k", "new")
        node.restore(backup)
        with node.client() as client:
            assert client.get("k") == b"old"
            assert client.info("server")["run_id"] != run_id  # a new server run
    assert backup.path.exists()
    durable.close()  # the copies go with the node
    assert not backup.path.exists()


def test_appendfsync_is_a_setting_of_the_next_start(
    fresh_nodes: Callable[..., RedisNodes],
) -> None:
    node = fresh_nodes(1, appendonly=True)[0]
    with node.client() as client:
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.set("k", "v")
    node.appendfsync = "everysec"
    node.restart(keep_data=True)
    with node.client() as client:
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.get("k") == b"v"
    with pytest.raises(ValueError, match="appendfsync"):
        fresh_nodes(1, appendonly=True, appendfsync="sometimes")


def test_replica_follows_its_primary_and_promote_detaches_it(
    fresh_nodes: Callable[..., RedisNodes],
) -> None:
    primary, replica = fresh_nodes(2)
    replica.replicate(primary)
    assert replica.replication()["role"] == "slave"
    with primary.client() as client:
        client.set("k", "v")
    replica.caught_up(primary)
    with replica.client() as client:
        assert client.get("k") == b"v"
    replica.promote()
    info = replica.replication()
    assert info["role"] == "master"
    assert info["second_repl_offset"] != "-1"  # what a promoted replica looks like
    with replica.client() as client:
        client.set("k", "mine")  # writable now


def test_a_node_whose_port_was_taken_meanwhile_does_not_use_the_other_server(
        tmp_path: Path) -> None:
    """Another process may start a server on the port free_port() chose before ours
    binds it: ours exits ("address in use"), and the node must say so rather than talk
    to the other server, which answers PING just as well."""
    with RedisNodes(1) as nodes:
        late = RedisNode(data_dir=tmp_path / "late", port=nodes[0].port)
        try:
            with pytest.raises(RuntimeError, match="exited"):
                late.start()
        finally:
            late.kill()
        assert nodes[0].client().ping()


def test_a_node_whose_chosen_port_was_taken_moves_to_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same race with a port the node chose itself: its first start moves to a
    free port, and it is its own server that answers there."""
    from redlock.testing import redis_nodes

    with RedisNodes(1) as nodes:
        taken = iter([nodes[0].port])
        real = redis_nodes.free_port
        monkeypatch.setattr(redis_nodes, "free_port",
                            lambda host="127.0.0.1": next(taken, None) or real(host))
        node = RedisNode(data_dir=tmp_path / "moved")
        try:
            node.start()
            assert node.port != nodes[0].port
            with node.client() as client:
                assert int(client.info("server")["process_id"]) == node.pid
        finally:
            node.kill()
