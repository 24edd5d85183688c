"""compose/docker-compose.yml for real: the stack comes up, the sale app keeps its
invariant while one lock node and then a majority are partitioned through Toxiproxy,
and the stack goes down leaving nothing behind.

The compose implementation is Debian's docker-compose (v1, the only one Debian 12 or
PyPI offers; scripts/setup.sh --docker installs it). Every port is a free one, given
through the environment, so the stack never collides with anything on the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from docker_support import ROOT, TIMINGS, missing

from redlock.testing.redis_nodes import free_port
from tests.support.dockerd import EngineAPI

pytestmark = pytest.mark.docker

COMPOSE_FILE = ROOT / "compose" / "docker-compose.yml"
LOCK_NODES = 5


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    redis_ports: list[int]
    store_port: int
    proxy_ports: list[int]
    toxiproxy_port: int
    app_port: int
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker-compose", "-p", self.project, "-f", str(COMPOSE_FILE),
                               *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             port: int | None = None, timeout: float = 60) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port or self.app_port}{path}",
                                         data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        return status, json.loads(payload) if payload.strip() else None

    def toxiproxy(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call(method, path, body, port=self.toxiproxy_port, timeout=10)[1]

    def partition(self, index: int) -> None:
        """Blackhole lock node ``index`` (1-based, as the services are named) for the
        app: nothing gets through either way and no connection is closed."""
        for stream in ("upstream", "downstream"):
            self.toxiproxy("POST", f"/proxies/redis{index}/toxics", {
                "name": f"partition_{stream}", "type": "timeout", "stream": stream,
                "attributes": {"timeout": 0}})

    def heal(self) -> None:
        self.toxiproxy("POST", "/reset")


def _wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError, urllib.error.URLError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{what} not ready after {timeout} s ({last})")


def _project_leftovers(api: EngineAPI, project: str) -> dict[str, list[str]]:
    label = f"com.docker.compose.project={project}"
    return {
        "containers": [c["Id"][:12] for c in api.containers([label])],
        "networks": [n["Name"] for n in api.networks() if n["Name"].startswith(project)],
        "volumes": [v["Name"] for v in api.volumes() if v["Name"].startswith(project)],
    }


@pytest.fixture
def stack(docker_engine: EngineAPI, tmp_path: Path) -> Iterator[Stack]:
    if shutil.which("docker-compose") is None:
        missing("docker-compose not found (bash scripts/setup.sh --docker installs Debian's)")
    ports = _distinct_free_ports(2 * LOCK_NODES + 3)
    redis_ports, proxy_ports = ports[:LOCK_NODES], ports[LOCK_NODES:2 * LOCK_NODES]
    store_port, toxiproxy_port, app_port = ports[2 * LOCK_NODES:]
    config = tmp_path / "toxiproxy.json"
    config.write_text(json.dumps([
        {"name": f"redis{i + 1}", "listen": f"127.0.0.1:{proxy}",
         "upstream": f"127.0.0.1:{node}", "enabled": True}
        for i, (proxy, node) in enumerate(zip(proxy_ports, redis_ports, strict=True))]))
    env = {**os.environ, "REDLOCK_TOXIPROXY_CONFIG": str(config),
           "REDLOCK_TOXIPROXY_PORT": str(toxiproxy_port), "REDLOCK_STORE_PORT": str(store_port),
           "REDLOCK_APP_PORT": str(app_port), "REDLOCK_APP_LOCK_TIMEOUT": "20"}
    for i in range(LOCK_NODES):
        env[f"REDLOCK_REDIS{i + 1}_PORT"] = str(redis_ports[i])
        env[f"REDLOCK_PROXY{i + 1}_PORT"] = str(proxy_ports[i])
    project = f"redlocktest{os.getpid()}"
    stack = Stack(project, env, redis_ports, store_port, proxy_ports, toxiproxy_port, app_port)
    started = time.monotonic()
    up = stack.compose("up", "-d")
    try:
        assert up.returncode == 0, up.stderr
        _wait_until(lambda: stack.call("GET", "/health", timeout=2)[0] == 200, 60, "the app")
        _wait_until(lambda: len(stack.toxiproxy("GET", "/proxies")) == LOCK_NODES, 30,
                    "the proxies")
        stack.timings["up"] = time.monotonic() - started
        yield stack
    finally:
        if os.environ.get("REDLOCK_APP_LOG"):  # debugging: keep the app's log
            Path(os.environ["REDLOCK_APP_LOG"]).write_text(stack.compose("logs", "app").stdout)
        started = time.monotonic()
        down = stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")
        stack.timings["down"] = time.monotonic() - started
        TIMINGS["compose stack"] = (f"up (to app healthy) in {stack.timings.get('up', 0):.1f} s,"
                                    f" down in {stack.timings['down']:.1f} s")
        assert down.returncode == 0, down.stderr
        assert _project_leftovers(docker_engine, project) == {
            "containers": [], "networks": [], "volumes": []}


def _buy_all(stack: Stack, names: list[str], timeout: float | None = None
             ) -> list[tuple[str, int, dict[str, Any]]]:
    def buy(name: str) -> tuple[str, int, dict[str, Any]]:
        body: dict[str, Any] = {"buyer": name}
        if timeout is not None:
            body["timeout"] = timeout
        status, reply = stack.call("POST", "/buy", body)
        return name, status, reply

    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return list(pool.map(buy, names))


def _check_invariant(sale: dict[str, Any], bought: set[str]) -> None:
    """No ticket sold twice or lost, stock never negative, tokens strictly increasing,
    and the record lists exactly the buyers who were told they bought."""
    sold = sale["sold"]
    assert sale["stock"] >= 0
    assert sale["stock"] + len(sold) == sale["tickets"]
    assert [s["stock_after"] for s in sold] == list(
        range(sale["tickets"] - 1, sale["stock"] - 1, -1))
    assert len({s["buyer"] for s in sold}) == len(sold)
    assert {s["buyer"] for s in sold} == bought
    tokens = [s["token"] for s in sold]
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens


def test_sale_keeps_its_invariant_while_one_node_then_a_majority_is_partitioned(
        stack: Stack) -> None:
    # Five durable, independent masters, as the compose file promises.
    for port in [*stack.redis_ports, stack.store_port]:
        with redis.Redis(port=port, socket_timeout=5) as node:
            config = node.config_get("*")
            assert (config["appendonly"], config["appendfsync"],
                    config["maxmemory-policy"]) == ("yes", "always", "noeviction")
            replication = node.info("replication")
            assert (replication["role"], replication["connected_slaves"]) == ("master", 0)

    tickets = 25
    status, sale = stack.call("POST", "/sale", {"tickets": tickets})
    assert status == 200 and sale["stock"] == tickets
    bought: set[str] = set()
    results: dict[str, str] = {}

    def phase(name: str, buyers: int, timeout: float | None = None
              ) -> list[tuple[str, int, dict[str, Any]]]:
        started = time.monotonic()
        replies = _buy_all(stack, [f"{name}-{i}" for i in range(buyers)], timeout)
        seconds = time.monotonic() - started
        won = [buyer for buyer, status, reply in replies if status == 200 and reply["bought"]]
        bought.update(won)
        codes = sorted({status for _, status, _ in replies})
        results[name] = (f"{len(won)}/{buyers} bought, HTTP {codes}, {seconds:.1f} s")
        _check_invariant(stack.call("GET", "/sale")[1], bought)
        return replies

    # Healthy: every buyer gets a ticket.
    replies = phase("healthy", 5)
    assert all(status == 200 and reply["bought"] for _, status, reply in replies), replies

    # One node partitioned: 4 of 5 still make a quorum of 3.
    stack.partition(1)
    replies = phase("one node partitioned", 10)
    assert all(status == 200 and reply["bought"] for _, status, reply in replies), replies

    # A majority partitioned (nodes 1-3): no quorum, nobody buys, nothing changes.
    stack.partition(2)
    stack.partition(3)
    before = stack.call("GET", "/sale")[1]
    replies = phase("majority partitioned", 3, timeout=1.0)
    assert all(status == 503 and reply["error"] == "QuorumUnavailable"
               for _, status, reply in replies), replies
    assert stack.call("GET", "/sale")[1] == before

    # Healed: the rest of the tickets sell, exactly once each, and no more.
    stack.heal()
    replies = phase("healed", 15)
    assert sum(status == 200 and reply["bought"] for _, status, reply in replies) == 10
    assert all(status == 200 for _, status, _ in replies), replies
    final = stack.call("GET", "/sale")[1]
    assert final["stock"] == 0 and len(final["sold"]) == tickets
    _check_invariant(final, bought)
    TIMINGS["partitions"] = "; ".join(f"{name}: {text}" for name, text in results.items())
