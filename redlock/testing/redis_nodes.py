"""Start, pause, kill and restart real ``redis-server`` processes on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import redis

from redlock.testing._leftovers import track, untrack
from redlock.testing.node import NodeSet


def find_redis_server(explicit: str | None = None) -> str:
    """Path of the redis-server binary: explicit, $REDIS_SERVER, or on PATH."""
    candidate = explicit or os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not candidate or not os.access(candidate, os.X_OK):
        raise FileNotFoundError(
            "redis-server not found: install Redis (Debian/Ubuntu: apt-get install"
            " redis-server; macOS: brew install redis; or a build from redis.io) and put"
            " redis-server on PATH, or set REDIS_SERVER to its path. In a clone of"
            " redlock-fenced, bash scripts/setup.sh installs it."
        )
    return candidate


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisNode:
    """One redis-server process with its own port and data directory."""

    def __init__(
        self,
        *,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendonly: bool = False,
        password: str | None = None,
        redis_server: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.data_dir = Path(data_dir)
        self.appendonly = appendonly
        self.password = password
        self.redis_server = find_redis_server(redis_server)
        self.extra_args = list(extra_args)
        self.env = dict(env) if env is not None else None
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.data_dir.mkdir(parents=True, exist_ok=True)

    # -- addresses -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, **kwargs: object) -> redis.Redis:
        """A plain redis-py client for this node (caller closes it)."""
        options: dict[str, object] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        options.update(kwargs)
        return redis.Redis.from_url(self.url, **options)

    # -- lifecycle -----------------------------------------------------------------------

    def _command(self) -> list[str]:
        args = [
            self.redis_server,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--logfile", str(self.data_dir / "redis.log"),
            "--protected-mode", "no",
        ]
        if self.appendonly:
            # Every write is on disk before the reply: a kill -9 loses nothing.
            args += ["--appendfsync", "always"]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self) -> RedisNode:
        if self.running:
            return self
        env = None if self.env is None else {**os.environ, **self.env}
        self.process = subprocess.Popen(
            self._command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.paused = False
        track(self)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"redis-server on port {self.port} exited with {self.process.returncode}: "
                    f"{self.log_tail()}"
                )
            try:
                with self.client(socket_timeout=0.5, socket_connect_timeout=0.5) as probe:
                    if probe.ping():
                        return
            except redis.exceptions.BusyLoadingError as error:
                last_error = error  # still replaying its AOF
            except (redis.ConnectionError, redis.TimeoutError) as error:
                last_error = error
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(
            f"redis-server on port {self.port} not ready after {self.start_timeout}s "
            f"({last_error}): {self.log_tail()}"
        )

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = (self.data_dir / "redis.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def _signal(self, signum: int) -> None:
        if not self.running:
            raise RuntimeError(f"redis-server on port {self.port} is not running")
        assert self.process is not None
        os.kill(self.process.pid, signum)

    def pause(self) -> None:
        """SIGSTOP: the node stops answering but keeps its sockets (a hung node)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after pause()."""
        if self.paused and self.running:
            self._signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """kill -9: no shutdown, no final save. Data survives only through AOF fsync."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.process = None
        self.paused = False

    def stop(self) -> None:
        """Stop the process (kill -9; the nodes here never rely on a final save)."""
        self.kill()

    def wipe(self) -> None:
        """Delete the node's persisted data (the node must be stopped)."""
        if self.running:
            raise RuntimeError("wipe() needs a stopped node")
        for child in self.data_dir.iterdir():
            if child.name == "redis.log":
                continue
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)

    def restart(self, *, keep_data: bool = True) -> RedisNode:
        """kill -9 and start again on the same port, with or without its files.

        Without AOF there is nothing on disk, so the node comes back empty either way:
        the node amnesia of docs/design.md §4.
        """
        self.kill()
        if not keep_data:
            self.wipe()
        return self.start()

    def close(self) -> None:
        self.kill()
        untrack(self)

    def __repr__(self) -> str:
        state = "paused" if self.paused else ("running" if self.running else "stopped")
        return f"RedisNode({self.host}:{self.port}, {state})"


class RedisNodes(NodeSet[RedisNode]):
    """N independent redis-server processes, each on its own loopback port and temp dir."""

    def __init__(
        self,
        count: int = 3,
        *,
        appendonly: bool = False,
        password: str | None = None,
        redis_server: str | None = None,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        base_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="redlock-nodes-"))
        super().__init__(lambda index: RedisNode(
            data_dir=self.base_dir / f"node{index}", host=host, appendonly=appendonly,
            password=password, redis_server=redis_server, extra_args=extra_args, env=env),
            count)

    def close(self) -> None:
        super().close()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
