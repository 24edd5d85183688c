"""The Docker backend of the test harness: Redis nodes and a Toxiproxy server in
containers, started with testcontainers.

    from redlock.testing.containers import ContainerRedisNodes, ContainerToxiproxy

    with ContainerRedisNodes(3) as nodes, ContainerToxiproxy() as toxiproxy:
        proxies = toxiproxy.front(nodes)      # same API as RedisNodes / ToxiproxyServer
        nodes[0].pause()                      # docker pause: hung, sockets stay open
        nodes[1].restart(keep_data=False)     # a new, empty container on the same port

Each node is testcontainers' ``RedisContainer`` on the image ``redis:7``, the Toxiproxy server a
``DockerContainer`` on Shopify's ``ghcr.io/shopify/toxiproxy:2.12.0``; the engine pulls them when
missing, as for any testcontainers container. Other images are chosen with ``image=``, or for every
container of a run with ``$REDLOCK_REDIS_IMAGE`` / ``$REDLOCK_TOXIPROXY_IMAGE`` (what
``start_nodes(..., backend="docker")`` and the pytest plugin's ``--redlock-backend=docker`` use):
any image whose ``redis-server`` is on PATH, any whose entry point is the Toxiproxy server (this
project's own CI, where no registry is reachable, points them at images it builds from the
machine's binaries). Every container uses host networking and listens on 127.0.0.1, on a free port,
so clients reach it exactly as a local process and no traffic leaves loopback (no port mapping);
the engine must therefore run on this machine (Linux).

Clean-up: ``close()`` removes a container with its volumes, an atexit hook removes
what a test left, and the first start of a process removes the containers whose
creating process (the ``org.redlock-fenced.owner`` label) is gone, i.e. what a killed
run left behind. testcontainers' own reaper (Ryuk) is left as its configuration says
(``TESTCONTAINERS_RYUK_DISABLED``); this clean-up does not need it.

Needs the ``docker`` extra (``pip install 'redlock-fenced[docker]'``: testcontainers,
with the docker SDK) and a Docker engine on this machine (``$DOCKER_HOST``, the
current docker context, or the default socket, as testcontainers finds it).
testcontainers is imported on the first start, not with this module."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from redlock.testing._leftovers import track, untrack
from redlock.testing.docker_engine import (  # the engine's side, re-exported here
    DEFAULT_REDIS_IMAGE,
    DEFAULT_TOXIPROXY_IMAGE,
    OWNER_LABEL,
    REDIS_IMAGE_ENV,
    TESTING_LABEL,
    TOXIPROXY_IMAGE_ENV,
    DockerUnavailable,
    engine_leftovers,
    labels,
    prepare,
    redis_image,
    remove_orphans,
    toxiproxy_image,
)
from redlock.testing.node import NodeSet
from redlock.testing.redis_nodes import free_port
from redlock.testing.toxiproxy import ToxiproxyServer

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

def _redis_container(image: str, port: int, host: str, password: str | None,
                     command: list[str], start_timeout: float) -> DockerContainer:
    from testcontainers.community.redis import PingWaitStrategy, RedisContainer

    class HostNetworkRedis(RedisContainer):
        """testcontainers' Redis container on the host's network: the server listens
        on ``host:port`` itself, nothing is mapped."""

        def get_container_host_ip(self) -> str:
            return host

        def get_exposed_port(self, port: int) -> int:
            return port

    container = HostNetworkRedis(image, port=port, password=password)
    container.ports = {}  # host networking: no port to publish
    container.with_command(command)
    container.with_kwargs(network_mode="host", labels=labels())
    container.waiting_for(PingWaitStrategy().with_poll_interval(0.05)
                          .with_startup_timeout(round(start_timeout)))
    return container


class ContainerRedisNode:
    """One Redis server in a container on the host's network (same surface as
    :class:`~redlock.testing.RedisNode`)."""

    def __init__(self, *, port: int | None = None, host: str = "127.0.0.1",
                 appendonly: bool = False, password: str | None = None, image: str | None = None,
                 extra_args: Sequence[str] = (), start_timeout: float = 30.0) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.appendonly = appendonly
        self.password = password
        self.image = redis_image(image)
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.paused = False
        self._container: DockerContainer | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}"

    def _state(self) -> dict[str, Any]:
        if self._container is None:
            return {}
        wrapped = self._container.get_wrapped_container()
        try:
            wrapped.reload()
        except Exception:  # removed behind our back
            return {}
        return dict(wrapped.attrs.get("State") or {})

    @property
    def running(self) -> bool:
        return bool(self._state().get("Running"))

    @property
    def pid(self) -> int | None:
        """The server's pid on this machine (the container's first process)."""
        pid = self._state().get("Pid")
        return int(pid) if pid else None

    @property
    def container_id(self) -> str | None:
        return self._container.get_container_id() if self._container else None

    def client(self, **kwargs: object) -> redis.Redis:
        options: dict[str, object] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        options.update(kwargs)
        return redis.Redis.from_url(self.url, **options)

    def _command(self) -> list[str]:
        args = ["redis-server", "--port", str(self.port), "--bind", self.host,
                "--protected-mode", "no", "--dir", "/data", "--save", "",
                "--appendonly", "yes" if self.appendonly else "no"]
        if self.appendonly:
            args += ["--appendfsync", "always"]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self) -> ContainerRedisNode:
        if self.running:
            return self
        prepare()
        if self._container is not None:
            # Killed with its files kept: the same container (and /data) again.
            self._container.get_wrapped_container().start()
            self._wait_ready()
        else:
            container = _redis_container(self.image, self.port, self.host, self.password,
                                         self._command(), self.start_timeout)
            try:
                container.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    container.stop()
                raise
            self._container = container
        self.paused = False
        track(self)
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with self.client(socket_timeout=0.5, socket_connect_timeout=0.5) as probe:
                    if probe.ping():
                        return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                last = exc
            time.sleep(0.05)
        raise TimeoutError(f"redis container on port {self.port} not ready ({last}): "
                           f"{self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        if self._container is None:
            return "(no container)"
        with contextlib.suppress(Exception):
            out = self._container.get_wrapped_container().logs(tail=lines)
            return " | ".join(out.decode(errors="replace").strip().splitlines())
        return "(no log)"

    def pause(self) -> None:
        """``docker pause`` (the cgroup freezer): the server stops answering, its
        sockets stay open (a hung node)."""
        if not self.running or self._container is None:
            raise RuntimeError(f"redis container on port {self.port} is not running")
        self._container.get_wrapped_container().pause()
        self.paused = True

    def resume(self) -> None:
        if self.paused and self._container is not None:
            with contextlib.suppress(Exception):
                self._container.get_wrapped_container().unpause()
        self.paused = False

    def kill(self) -> None:
        """SIGKILL to the server; the container (and its /data) stays for a restart."""
        if self._container is None:
            return
        self.resume()
        if self.running:
            wrapped = self._container.get_wrapped_container()
            with contextlib.suppress(Exception):
                wrapped.kill()
            with contextlib.suppress(Exception):
                wrapped.wait(timeout=10)

    def stop(self) -> None:
        self.kill()

    def wipe(self) -> None:
        """Forget the node's data: the container goes, the next start makes a new one."""
        if self.running:
            raise RuntimeError("wipe() needs a stopped node")
        self._remove()

    def restart(self, *, keep_data: bool = True) -> ContainerRedisNode:
        self.kill()
        if not keep_data:
            self.wipe()
        return self.start()

    def _remove(self) -> None:
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.stop()  # removes it, with its anonymous volumes
            self._container = None

    def close(self) -> None:
        self.resume()
        self._remove()
        untrack(self)

    def __repr__(self) -> str:
        state = "paused" if self.paused else ("running" if self.running else "stopped")
        return f"ContainerRedisNode({self.host}:{self.port}, {state})"


class ContainerRedisNodes(NodeSet[ContainerRedisNode]):
    """N Redis containers (same surface as :class:`~redlock.testing.RedisNodes`)."""

    def __init__(self, count: int = 3, *, appendonly: bool = False,
                 password: str | None = None, image: str | None = None,
                 extra_args: Sequence[str] = (), host: str = "127.0.0.1") -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        super().__init__(lambda _: ContainerRedisNode(
            host=host, appendonly=appendonly, password=password, image=image,
            extra_args=extra_args), count)


class ContainerToxiproxy(ToxiproxyServer):
    """The Toxiproxy server in a container on the host's network (same API as
    :class:`~redlock.testing.ToxiproxyServer`: proxies listen on 127.0.0.1)."""

    def __init__(self, image: str | None = None, host: str = "127.0.0.1",
                 request_timeout: float = 5.0, start_timeout: float = 30.0) -> None:
        # No toxiproxy-server binary is needed on this machine: it runs in the image.
        self.binary = ""
        self.host = host
        self.port = 0
        self.request_timeout = request_timeout
        self.start_timeout = start_timeout
        self.image = toxiproxy_image(image)
        self._process = None
        self._log = None
        self._log_fd = None
        self._count = 0
        self._container: DockerContainer | None = None

    def start(self) -> ContainerToxiproxy:
        super().start()
        return self

    def _what(self) -> str:
        return "toxiproxy container"

    def _running(self) -> bool:
        return self._container is not None

    def _before_start(self) -> None:
        prepare()

    def _after_start(self) -> None:
        pass

    def _launch(self) -> None:
        from testcontainers.core.container import DockerContainer

        container = (DockerContainer(self.image)
                     .with_command([f"-host={self.host}", f"-port={self.port}"])
                     .with_env("LOG_LEVEL", os.environ.get("LOG_LEVEL", "warn"))
                     .with_kwargs(network_mode="host", labels=labels()))
        container.start()
        self._container = container

    def _exited(self) -> bool:
        if self._container is None:
            return True
        wrapped = self._container.get_wrapped_container()
        with contextlib.suppress(Exception):
            wrapped.reload()
        return bool(wrapped.status in ("exited", "dead"))

    def log_tail(self, lines: int = 5) -> str:
        if self._container is None:
            return ""
        with contextlib.suppress(Exception):
            out = self._container.get_wrapped_container().logs(tail=lines)
            return " | ".join(out.decode(errors="replace").strip().splitlines())
        return ""

    def _kill(self) -> None:
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.stop()
            self._container = None

    def close(self) -> None:
        self._kill()
        untrack(self)

    def __enter__(self) -> ContainerToxiproxy:
        return self.start()


__all__ = ["DEFAULT_REDIS_IMAGE", "DEFAULT_TOXIPROXY_IMAGE", "OWNER_LABEL", "REDIS_IMAGE_ENV",
           "TESTING_LABEL", "TOXIPROXY_IMAGE_ENV", "ContainerRedisNode", "ContainerRedisNodes",
           "ContainerToxiproxy", "DockerUnavailable", "engine_leftovers", "labels", "prepare",
           "redis_image", "remove_orphans", "toxiproxy_image"]
