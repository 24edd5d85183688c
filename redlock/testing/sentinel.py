"""Real Redis Sentinel processes (``redis-server --sentinel``) for tests and demos.

    with RedisNodes(3) as masters, RedisSentinel({"s0": masters[0], "s1": masters[1],
                                                  "s2": masters[2]}) as sentinel:
        sentinels = redis.Sentinel([sentinel.address], socket_timeout=1.0)
        dlm = Redlock([sentinels.master_for(name) for name in ("s0", "s1", "s2")])

The sentinel runs from a config file in its own temp dir (Sentinel rewrites it), on a
free loopback port, and is stopped (and the dir removed) by ``close()``."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import redis

from redlock.testing._leftovers import track, untrack
from redlock.testing.redis_nodes import RedisNode, find_redis_server, free_port


class RedisSentinel:
    """One Sentinel process monitoring the given masters, each under its service name.

    ``down_after`` is Sentinel's ``down-after-milliseconds`` in seconds: long by default,
    so that a test that pauses a master is not surprised by a failover attempt."""

    def __init__(self, masters: Mapping[str, RedisNode], *, host: str = "127.0.0.1",
                 port: int | None = None, redis_server: str | None = None,
                 down_after: float = 60.0, start_timeout: float = 10.0) -> None:
        if not masters:
            raise ValueError("a sentinel needs at least one master to monitor")
        self.masters = dict(masters)
        self.host = host
        self.port = port or free_port(host)
        self.redis_server = find_redis_server(redis_server)
        self.down_after = down_after
        self.start_timeout = start_timeout
        self.data_dir = Path(tempfile.mkdtemp(prefix="redlock-sentinel-"))
        self.process: subprocess.Popen[bytes] | None = None
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``, as ``redis.Sentinel([...])`` takes it."""
        return self.host, self.port

    def _write_config(self) -> Path:
        lines = [f"port {self.port}", f"bind {self.host}", f"dir {self.data_dir}",
                 f"logfile {self.data_dir / 'sentinel.log'}", "protected-mode no"]
        for name, master in self.masters.items():
            lines += [f"sentinel monitor {name} {master.host} {master.port} 1",
                      f"sentinel down-after-milliseconds {name} {int(self.down_after * 1000)}"]
            if master.password:
                lines.append(f"sentinel auth-pass {name} {master.password}")
        config = self.data_dir / "sentinel.conf"
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self) -> RedisSentinel:
        if self.process is not None and self.process.poll() is None:
            return self
        config = self._write_config()
        self.process = subprocess.Popen(
            [self.redis_server, str(config), "--sentinel", "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        track(self)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        """Up, and naming a master for every service."""
        deadline = time.monotonic() + self.start_timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"redis-server --sentinel on port {self.port} exited with"
                                   f" {self.process.returncode}: {self.log_tail()}")
            try:
                with redis.Redis(self.host, self.port, socket_timeout=0.5,
                                 socket_connect_timeout=0.5) as probe:
                    known = probe.sentinel_masters()
                if set(self.masters) <= set(known):
                    return
                last = f"knows {sorted(known)}"
            except (redis.ConnectionError, redis.TimeoutError) as error:
                last = error
            time.sleep(0.02)
        self.close()
        raise TimeoutError(f"sentinel on port {self.port} not ready after"
                           f" {self.start_timeout}s ({last}): {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = (self.data_dir / "sentinel.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def client(self) -> redis.Redis:
        """A plain client of the sentinel itself (``SENTINEL ...`` commands; caller closes)."""
        return redis.Redis(self.host, self.port, socket_timeout=5.0, socket_connect_timeout=5.0)

    def pause(self) -> None:
        """SIGSTOP: the sentinel stops answering but keeps its sockets (a hung sentinel:
        clients that ask it for a master wait for their socket timeout)."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"sentinel on port {self.port} is not running")
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            self.process = None
        untrack(self)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisSentinel:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisSentinel({self.host}:{self.port}, services={sorted(self.masters)})"
