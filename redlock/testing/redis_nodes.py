"""Start, pause, kill and restart real ``redis-server`` processes on loopback; back a
node's files up and restore them; make one node a replica of another and promote it."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import redis

from redlock.testing._leftovers import track, untrack
from redlock.testing.node import NodeSet

T = TypeVar("T")


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


# Ports handed out lately by this process: nodes built together take their ports before any
# of them listens, and the kernel may give the same free port twice.
_ISSUED: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
_ISSUED_LOCK = threading.Lock()


class PortTaken(RuntimeError):
    """The server could not bind its port: another process holds it."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick), and not one this
    process handed out lately (the last 4096)."""
    with _ISSUED_LOCK:
        for _ in range(100):  # bounded: the kernel hands out ports in turn
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if (host, port) not in _ISSUED:
                break
        _ISSUED[(host, port)] = None
        while len(_ISSUED) > 4096:
            _ISSUED.popitem(last=False)
        return port


@dataclass(frozen=True)
class NodeBackup:
    """A copy of one node's persisted files (``dump.rdb``, the AOF directory) taken by
    :meth:`RedisNode.backup`, for :meth:`RedisNode.restore`."""

    path: Path
    taken_at: float  # time.time() when the copy was made


class RedisNode:
    """One redis-server process with its own port and data directory.

    ``appendonly`` turns the AOF on, with ``appendfsync`` (``always`` by default: every
    write is on disk before the reply, so a kill -9 loses nothing; ``everysec`` may lose
    the last second). Both attributes may be changed between a stop and the next start."""

    def __init__(self, *, data_dir: Path, port: int | None = None, host: str = "127.0.0.1",
                 appendonly: bool = False, appendfsync: str = "always",
                 password: str | None = None, redis_server: str | None = None,
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 start_timeout: float = 10.0) -> None:
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
        self.host = host
        self.port = port or free_port(host)
        # A port we chose may be taken by another process before our server binds it:
        # then the first start moves to another one (a port the caller gave is kept).
        self._may_move = port is None
        self.data_dir = Path(data_dir)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.password = password
        self.redis_server = find_redis_server(redis_server)
        self.extra_args = list(extra_args)
        self.env = dict(env) if env is not None else None
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self._backups: Path | None = None  # made by the first backup(), removed by close()
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
        args = [self.redis_server, "--port", str(self.port), "--bind", self.host, "--dir",
                str(self.data_dir), "--daemonize", "no", "--save", "", "--appendonly",
                "yes" if self.appendonly else "no", "--logfile", str(self.data_dir / "redis.log"),
                "--protected-mode", "no",
                # A replica's first sync starts at once (the default waits 5 s for more
                # replicas to share one transfer).
                "--repl-diskless-sync-delay", "0"]
        if self.appendonly:
            # always: every write is on disk before the reply, a kill -9 loses nothing.
            args += ["--appendfsync", self.appendfsync]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self) -> RedisNode:
        if self.running:
            return self
        env = None if self.env is None else {**os.environ, **self.env}
        for attempt in range(3):
            self.process = subprocess.Popen(self._command(), stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            env=env)
            self.paused = False
            track(self)
            try:
                self._wait_ready()
                break
            except PortTaken:
                if not self._may_move or attempt == 2:
                    raise
                self.port = free_port(self.host)
        self._may_move = False
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                tail = self.log_tail()
                raise (PortTaken if "in use" in tail else RuntimeError)(
                    f"redis-server on port {self.port} exited with {self.process.returncode}: "
                    f"{tail}"
                )
            try:
                with self.client(socket_timeout=0.5, socket_connect_timeout=0.5) as probe:
                    if probe.ping():
                        # Ours, not a server another process started on the same port
                        # between free_port() and our bind (ours then exits, raised above).
                        if self.process is None or int(probe.info("server")[
                                "process_id"]) == self.process.pid:
                            return
                        last_error = RuntimeError(f"port {self.port} answers for another"
                                                  " redis-server")
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
        the node amnesia of docs/design.md §4."""
        self.kill()
        if not keep_data:
            self.wipe()
        return self.start()

    # -- backups -------------------------------------------------------------------------

    def _persisted(self, directory: Path) -> list[Path]:
        return [child for child in directory.iterdir() if child.name != "redis.log"]

    def backup(self) -> NodeBackup:
        """``SAVE`` (the dataset to ``dump.rdb``), then copy every persisted file (the
        snapshot, the AOF directory) aside, as a backup tool would. Take it while
        nothing writes to the node; :meth:`restore` puts it back. The copies live in a
        temp dir of their own, removed by :meth:`close`."""
        with self.client() as client:
            client.save()
        if self._backups is None:
            self._backups = Path(tempfile.mkdtemp(prefix=f"redlock-backups-{self.port}-"))
        target = Path(tempfile.mkdtemp(dir=self._backups))
        for child in self._persisted(self.data_dir):
            if child.is_dir():
                shutil.copytree(child, target / child.name)
            else:
                shutil.copy2(child, target / child.name)
        return NodeBackup(target, time.time())

    def restore(self, backup: NodeBackup) -> RedisNode:
        """kill -9, replace the node's files with ``backup``'s, start again on the same port: the
        node comes back with the data it had when the backup was taken (and a new run id)."""
        self.kill()
        self.wipe()
        for child in self._persisted(backup.path):
            if child.is_dir():
                shutil.copytree(child, self.data_dir / child.name)
            else:
                shutil.copy2(child, self.data_dir / child.name)
        return self.start()

    # -- replication ------------------------------------------------------------------

    def replication(self) -> dict[str, str]:
        """``INFO replication`` as text fields (role, master_link_status, offsets...)."""
        with self.client() as client:
            info = client.info("replication")
        return {str(key): str(value) for key, value in info.items()}

    def replicate(self, primary: RedisNode, timeout: float = 10.0) -> None:
        """``REPLICAOF primary``, then wait until the first full sync is done and the
        link is up, and until ``WAIT`` on the primary counts this replica (after a full
        sync that can take until the replica's next periodic acknowledgement, up to a
        second, during which ``WAIT`` answers 0); with AOF, also until the AOF rewrite
        that follows a full sync has finished (until then the synced data is in no AOF
        file that a restart would load). The setting is not persisted: a restart makes
        this a primary again."""
        rewrites = self._persistence()["aof_rewrites"] if self.appendonly else 0
        with self.client() as client:
            client.replicaof(primary.host, primary.port)
        self._until(self.replication, lambda info: info.get("master_link_status") == "up"
                    and info.get("master_sync_in_progress") == "0",
                    timeout, f"replica of {primary.host}:{primary.port} did not sync")
        self._until(lambda: primary._acknowledges(self), bool, timeout,
                    f"WAIT on {primary.host}:{primary.port} did not count its replica on"
                    f" port {self.port}")
        if self.appendonly:
            self._until(self._persistence, lambda state: state["aof_rewrites"] > rewrites
                        and not state["aof_rewrite_in_progress"]
                        and not state["aof_rewrite_scheduled"],
                        timeout, "the AOF rewrite after the sync did not finish")

    def _acknowledges(self, replica: RedisNode) -> bool:
        """Whether ``WAIT`` on this primary counts ``replica`` (listed among its replicas)
        and every other replica it lists: one message published (a write every replica is
        sent, which stores nothing), then ``WAIT`` for all of them, 100 ms at most."""
        with self.client() as client:
            info = client.info("replication")
            listed = [entry for key, entry in info.items()
                      if str(key).startswith("slave") and isinstance(entry, dict)]
            if not any(int(entry.get("port", -1)) == replica.port for entry in listed):
                return False
            client.publish("redlock:testing:replicate", "")
            return int(client.execute_command("WAIT", len(listed), 100)) >= len(listed)

    def _persistence(self) -> dict[str, int]:
        with self.client() as client:
            info = client.info("persistence")
        return {key: value for key, value in info.items() if isinstance(value, int)}

    def caught_up(self, primary: RedisNode, timeout: float = 10.0) -> None:
        """Wait until this replica has applied everything ``primary`` has written so far
        (its replication offset reached the primary's)."""
        target = int(primary.replication()["master_repl_offset"])
        self._until(self.replication,
                    lambda info: int(info.get("slave_repl_offset", "-1")) >= target,
                    timeout, f"replica did not reach offset {target} of its primary")

    def promote(self) -> None:
        """``REPLICAOF NO ONE``: this replica becomes a primary with the data it has (what
        a failover does; anything the old primary had not sent yet is lost)."""
        with self.client() as client:
            client.replicaof("NO", "ONE")

    @staticmethod
    def _until(look: Callable[[], T], ready: Callable[[T], bool], timeout: float,
               failure: str) -> None:
        """Look every 20 ms until ``ready`` of what was seen; TimeoutError after
        ``timeout`` s, with the last thing seen."""
        deadline = time.monotonic() + timeout
        while True:
            seen = look()
            if ready(seen):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{failure} within {timeout}s: {seen}")
            time.sleep(0.02)

    def close(self) -> None:
        self.kill()
        untrack(self)
        if self._backups is not None:
            shutil.rmtree(self._backups, ignore_errors=True)
            self._backups = None

    def __repr__(self) -> str:
        state = "paused" if self.paused else ("running" if self.running else "stopped")
        return f"RedisNode({self.host}:{self.port}, {state})"


class RedisNodes(NodeSet[RedisNode]):
    """N independent redis-server processes, each on its own loopback port and temp dir."""

    def __init__(self, count: int = 3, *, appendonly: bool = False, appendfsync: str = "always",
                 password: str | None = None, redis_server: str | None = None,
                 extra_args: Sequence[str] = (), host: str = "127.0.0.1",
                 base_dir: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="redlock-nodes-"))
        super().__init__(lambda index: RedisNode(
            data_dir=self.base_dir / f"node{index}", host=host, appendonly=appendonly,
            appendfsync=appendfsync, password=password, redis_server=redis_server,
            extra_args=extra_args, env=env),
            count)

    def close(self) -> None:
        super().close()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
