"""A throwaway PostgreSQL server on loopback, for tests and examples.

    from tests.support.postgres import PostgresServer

    with PostgresServer() as pg:                 # initdb + postgres on a free port
        conn = psycopg.connect(pg.dsn)

The server gets its own temporary directory (data and unix socket), listens on
127.0.0.1 only, trusts local connections as the ``postgres`` role, and runs with
fsync off (it is thrown away). PostgreSQL refuses to run as root, so when we are
root it runs as the ``postgres`` OS user (Debian's package creates it). The
directory is removed on ``close()``; an atexit hook stops anything left running.

The binaries (``initdb``, ``postgres``) are looked up in ``$PG_BIN``, then
``/usr/lib/postgresql/<newest>/bin`` (Debian), then ``PATH``; ``bash
scripts/setup.sh`` installs them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from redlock.testing._leftovers import track, untrack
from redlock.testing.redis_nodes import free_port


class PostgresNotFound(FileNotFoundError):
    """The PostgreSQL server binaries are not installed here."""


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (0,)


def find_postgres_bin(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding ``initdb`` and ``postgres``."""
    candidates: list[Path] = []
    for given in (explicit, os.environ.get("PG_BIN")):
        if given:
            candidates.append(Path(given))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key,
                         reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in ("initdb", "postgres")):
            return directory
    raise PostgresNotFound(
        "PostgreSQL server binaries (initdb, postgres) not found: install the PostgreSQL"
        " server (Debian/Ubuntu: apt-get install postgresql; macOS: brew install"
        " postgresql) or set PG_BIN to the directory that holds initdb and postgres. In a"
        " clone of redlock-fenced, bash scripts/setup.sh installs it.")


def postgres_available() -> bool:
    try:
        find_postgres_bin()
    except PostgresNotFound:
        return False
    return True


class PostgresServer:
    """One PostgreSQL server process with its own temporary directory and port.

    Args:
        port: TCP port on ``host`` (default: a free one).
        host: the address to listen on (loopback by default).
        bin_dir: directory of ``initdb``/``postgres`` (default: :func:`find_postgres_bin`).
        os_user: the OS user to run the server as. Default: ``postgres`` when we are
            root (PostgreSQL refuses root), else ourselves.
        settings: extra ``-c name=value`` server settings.
        start_timeout: seconds to wait for initdb and for the server to accept connections.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        bin_dir: str | os.PathLike[str] | None = None,
        os_user: str | None = None,
        settings: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.bin_dir = find_postgres_bin(bin_dir)
        self.host = host
        self.port = port or free_port(host)
        if os_user is None and os.geteuid() == 0:
            os_user = "postgres"
        self.os_user = os_user
        self.settings = dict(settings or {})
        self.start_timeout = start_timeout
        self.base_dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    # -- addresses -----------------------------------------------------------

    @property
    def dsn(self) -> str:
        """A libpq connection string for the ``postgres`` database as role ``postgres``."""
        return f"host={self.host} port={self.port} user=postgres dbname=postgres"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- lifecycle -----------------------------------------------------------

    def _as_user(self) -> dict[str, Any]:
        """subprocess options that run the child as ``os_user`` (when set)."""
        if self.os_user is None:
            return {}
        try:
            entry = pwd.getpwnam(self.os_user)
        except KeyError:
            raise RuntimeError(
                f"no OS user {self.os_user!r} to run PostgreSQL as (it refuses to run as"
                f" root): create one (Debian's postgresql package creates 'postgres'), pass"
                f" os_user=, or run the tests as a user other than root") from None
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        assert self.base_dir is not None
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        env.update(HOME=str(self.base_dir), LC_ALL="C", LANG="C")
        return env

    def start(self) -> PostgresServer:
        """initdb (first time only) and start the server; on failure nothing is left."""
        if self.running:
            return self
        try:
            if self.base_dir is None:
                as_user = self._as_user()
                self.base_dir = Path(tempfile.mkdtemp(prefix="redlock-pg-"))
                track(self)
                if as_user:
                    os.chown(self.base_dir, as_user["user"], as_user["group"])
                self._initdb()
            self._start_server()
        except BaseException:
            self.close()
            raise
        return self

    def _initdb(self) -> None:
        assert self.base_dir is not None
        result = subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.base_dir / "data"), "-U", "postgres",
             "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"],
            cwd=self.base_dir, env=self._env(), stdin=subprocess.DEVNULL,
            capture_output=True, timeout=self.start_timeout, check=False, **self._as_user())
        if result.returncode != 0:
            raise RuntimeError(
                f"initdb failed ({result.returncode}): "
                f"{(result.stderr or result.stdout).decode(errors='replace')[-2000:]}")

    def _start_server(self) -> None:
        assert self.base_dir is not None
        settings = {
            "listen_addresses": self.host,
            "unix_socket_directories": str(self.base_dir),
            "fsync": "off",  # a throwaway server: durability is not the point
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            "shared_buffers": "32MB",
            **self.settings,
        }
        command = [str(self.bin_dir / "postgres"), "-D", str(self.base_dir / "data"),
                   "-p", str(self.port)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with open(self.base_dir / "postgres.log", "ab") as log:
            self.process = subprocess.Popen(
                command, cwd=self.base_dir, env=self._env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, **self._as_user())
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg  # the "postgres" extra; only needed by whoever starts a server

        assert self.base_dir is not None
        data_dir = self.base_dir / "data"
        deadline = time.monotonic() + self.start_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.running:
                code = self.process.returncode if self.process else None
                self.stop()
                raise RuntimeError(f"postgres exited with {code}: {self.log_tail()}")
            try:
                with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                    row = conn.execute("SHOW data_directory").fetchone()
                # Someone else's server on that port must not pass for ours.
                if row is not None and Path(row[0]) == data_dir:
                    return
                last_error = RuntimeError(f"port {self.port} is served from {row}")
            except psycopg.OperationalError as error:
                last_error = error
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"postgres on port {self.port} not ready after "
                           f"{self.start_timeout}s ({last_error}): {self.log_tail()}")

    def log_tail(self, lines: int = 8) -> str:
        if self.base_dir is None:
            return "(no log)"
        try:
            text = (self.base_dir / "postgres.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """Fast shutdown (SIGINT); immediate (SIGQUIT), then SIGKILL if it hangs."""
        process = self.process
        if process is None:
            return
        for signum, wait in ((signal.SIGINT, 15.0), (signal.SIGQUIT, 5.0),
                             (signal.SIGKILL, 5.0)):
            if process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=wait)
        self.process = None

    def close(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
        untrack(self)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"PostgresServer({self.host}:{self.port}, {state})"
