"""The testcontainers backend of redlock.testing: Redis nodes and Toxiproxy in
containers, with the surface of the local-process harness, and our own clean-up. The
images are the locally built ones (tests/docker/conftest.py sets them), as a user sets
theirs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from redlock import QuorumUnavailable, Redlock
from redlock.testing.backends import backend_name, start_nodes, start_toxiproxy
from redlock.testing.containers import (
    DEFAULT_REDIS_IMAGE,
    DEFAULT_TOXIPROXY_IMAGE,
    OWNER_LABEL,
    REDIS_IMAGE_ENV,
    TESTING_LABEL,
    TOXIPROXY_IMAGE_ENV,
    ContainerRedisNode,
    ContainerRedisNodes,
    ContainerToxiproxy,
    engine_leftovers,
    redis_image,
    remove_orphans,
    toxiproxy_image,
)
from redlock.testing.node import Node
from tests.support.dockerd import EngineAPI
from tests.support.images import REDIS_IMAGE, TOXIPROXY_IMAGE

pytestmark = pytest.mark.docker


def test_backend_is_chosen_by_argument_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_TEST_BACKEND", raising=False)
    assert backend_name() == "local"
    monkeypatch.setenv("REDLOCK_TEST_BACKEND", "docker")
    assert backend_name() == "docker"
    assert backend_name("local") == "local"
    with pytest.raises(ValueError, match="unknown test backend"):
        backend_name("kubernetes")
    nodes = start_nodes(1)
    try:
        assert isinstance(nodes, ContainerRedisNodes)
    finally:
        nodes.close()


def test_images_are_the_public_ones_unless_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REDIS_IMAGE_ENV, raising=False)
    monkeypatch.delenv(TOXIPROXY_IMAGE_ENV, raising=False)
    assert (DEFAULT_REDIS_IMAGE, DEFAULT_TOXIPROXY_IMAGE) == (
        "redis:7", "ghcr.io/shopify/toxiproxy:2.12.0")
    assert ContainerRedisNode().image == redis_image() == DEFAULT_REDIS_IMAGE
    assert ContainerToxiproxy().image == toxiproxy_image() == DEFAULT_TOXIPROXY_IMAGE
    monkeypatch.setenv(REDIS_IMAGE_ENV, "registry.example/redis:7.4")
    monkeypatch.setenv(TOXIPROXY_IMAGE_ENV, "registry.example/toxiproxy:2.12.0")
    assert ContainerRedisNode().image == "registry.example/redis:7.4"
    assert ContainerToxiproxy().image == "registry.example/toxiproxy:2.12.0"
    assert ContainerRedisNode(image="redis:7.2").image == "redis:7.2"  # the argument wins
    assert ContainerToxiproxy(image="mine:1").image == "mine:1"


def test_our_suite_runs_on_the_locally_built_images() -> None:
    assert (redis_image(), toxiproxy_image()) == (REDIS_IMAGE, TOXIPROXY_IMAGE)


def test_nodes_are_testcontainers_redis_containers_on_loopback(docker_engine: EngineAPI
                                                               ) -> None:
    from testcontainers.community.redis import RedisContainer

    with ContainerRedisNodes(2) as nodes:
        assert len({node.port for node in nodes}) == 2
        for node in nodes:
            assert isinstance(node, Node)
            assert isinstance(node._container, RedisContainer)
            assert node.url == f"redis://127.0.0.1:{node.port}"
            with node.client() as client:
                assert client.ping()
            info = docker_engine.json("GET", f"/containers/{node.container_id}/json")
            assert info["HostConfig"]["NetworkMode"] == "host"
            assert info["Config"]["Image"] == REDIS_IMAGE  # chosen through the environment
            assert info["Config"]["Labels"][OWNER_LABEL].endswith(f":{os.getpid()}")
            assert node.pid is not None  # the server, as a process of this machine
        ids = [node.container_id for node in nodes]
    assert not set(ids) & set(engine_leftovers())


def test_faults_through_containers_and_toxiproxy_container(docker_engine: EngineAPI) -> None:
    with start_nodes(5, backend="docker") as nodes, start_toxiproxy(backend="docker"
                                                                   ) as toxiproxy:
        assert isinstance(toxiproxy, ContainerToxiproxy)
        proxies = toxiproxy.front(nodes)
        with Redlock(proxies.urls) as dlm:
            with dlm.lock("orders:1", ttl=5.0):  # a new cluster: every node answers once
                pass
            nodes[0].pause()  # docker pause: hung, connections stay open
            with nodes[0].client(socket_timeout=0.2) as client, pytest.raises(redis.TimeoutError):
                client.ping()
            proxies[1].blackhole()
            with dlm.lock("orders:1", ttl=5.0, timeout=5.0) as held:
                first = held.token
            proxies[2].lose_replies()
            with pytest.raises(QuorumUnavailable):
                dlm.lock("orders:1", ttl=5.0, blocking=False).acquire()
            nodes[0].resume()
            toxiproxy.heal()
            with dlm.lock("orders:1", ttl=5.0, timeout=5.0) as held:
                assert held.token > first


def test_restart_keeps_data_with_aof_and_forgets_without(docker_engine: EngineAPI) -> None:
    durable = ContainerRedisNode(appendonly=True)
    volatile = ContainerRedisNode()
    try:
        for node in (durable, volatile):
            node.start()
            with node.client() as client:
                client.set("k", "v")
        port, container = durable.port, durable.container_id
        durable.restart(keep_data=True)  # kill -9, same container and /data
        assert (durable.port, durable.container_id) == (port, container)
        with durable.client() as client:
            assert client.get("k") == b"v"
        volatile.restart(keep_data=True)
        with volatile.client() as client:
            assert client.get("k") is None  # nothing on disk
        durable.restart(keep_data=False)  # a new, empty container on the same port
        assert durable.port == port and durable.container_id != container
        with durable.client() as client:
            assert client.get("k") is None
    finally:
        durable.close()
        volatile.close()
    assert not engine_leftovers()


def test_orphans_of_a_killed_run_are_removed(docker_engine: EngineAPI) -> None:
    """A container whose creating process is gone (killed before its atexit hook) is
    removed by the next run; a live owner's container is left alone."""
    code = (
        "import os\n"
        "from redlock.testing.containers import ContainerRedisNode\n"
        "node = ContainerRedisNode().start()\n"
        "print(node.container_id[:12], flush=True)\n"
        "os._exit(0)  # no atexit: what a SIGKILL leaves\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    orphan = result.stdout.strip()
    mine = ContainerRedisNode().start()
    try:
        assert orphan in engine_leftovers()
        removed = remove_orphans()
        assert orphan in removed
        assert mine.container_id is not None and mine.container_id[:12] not in removed
        assert engine_leftovers() == [mine.container_id[:12]]
    finally:
        mine.close()
    assert docker_engine.containers([TESTING_LABEL]) == []
