"""A private Docker engine for the tests, and a small client for the Engine API.

    from tests.support.dockerd import PrivateDockerd

    with PrivateDockerd() as engine:        # dockerd on a socket of its own (needs root)
        api = engine.api()                  # EngineAPI: containers, images, clean-up
        os.environ["DOCKER_HOST"] = engine.host

No Docker engine runs on our machines by default. Debian's ``docker.io`` package
installs ``dockerd`` (``bash scripts/setup.sh --docker`` does), and this module runs it
privately: its own ``--data-root`` (``.tools/docker/data`` of the checkout, so the
locally built images are kept between runs), its own ``--exec-root``, unix socket and
pid file under ``/run/redlock-dockerd-<hash>``, its own empty ``daemon.json``, and it is
stopped by its pid. It runs with ``--bridge none --iptables=false --ip-masq=false
--ip-forward=false``: no docker0 bridge, no NAT rules, no address outside loopback.
Our containers use host networking, so every byte of test traffic stays on 127.0.0.1.

Clean-up: ``stop()`` removes every container, network and volume of the engine, stops
dockerd (which stops its containerd) and removes the run directory. A run that was
killed leaves a stale pid file: the next ``start()`` stops that dockerd first, starts a
new one (which picks up the containerd and containers left behind) and removes every
container, network and volume before handing the engine out.

``python -m tests.support.dockerd up|down|clean|status`` does the same from a shell
(``scripts/test`` uses it).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

ISOLATION_FLAGS = ("--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip-forward=false")


class EngineError(RuntimeError):
    """The Docker engine refused a request (the message carries its answer)."""


class EngineUnavailable(RuntimeError):
    """No Docker engine can be used or started here (the message says why)."""


# -- the Engine API over a unix socket --------------------------------------------------


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class EngineAPI:
    """The few Docker Engine API calls the test tooling needs, with the standard library
    (the docker SDK comes with testcontainers; building images and cleaning up must work
    without it)."""

    def __init__(self, socket_path: str | os.PathLike[str], timeout: float = 60.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout = timeout

    @classmethod
    def from_host(cls, host: str | None = None) -> EngineAPI:
        """The engine at ``host`` (a ``unix://`` address), ``$DOCKER_HOST``, or the
        default socket ``/var/run/docker.sock``."""
        address = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        if not address.startswith("unix://"):
            raise EngineUnavailable(f"only unix:// Docker hosts are supported here, not {address}")
        return cls(address[len("unix://"):])

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, data: bytes | IO[bytes] | None = None,
                headers: Mapping[str, str] | None = None,
                timeout: float | None = None) -> bytes:
        if query:
            pairs: list[tuple[str, str]] = []
            for key, value in query.items():
                values = value if isinstance(value, list) else [value]
                pairs += [(key, v if isinstance(v, str) else json.dumps(v)) for v in values]
            path = f"{path}?{urllib.parse.urlencode(pairs)}"
        sent_headers = dict(headers or {})
        payload: bytes | IO[bytes] | None = data
        if body is not None:
            payload = json.dumps(body).encode()
            sent_headers["Content-Type"] = "application/json"
        connection = _UnixHTTPConnection(self.socket_path, timeout or self.timeout)
        try:
            connection.request(method, path, body=payload, headers=sent_headers)
            response = connection.getresponse()
            content = response.read()
        finally:
            connection.close()
        if response.status >= 400:
            try:
                message = json.loads(content).get("message", "")
            except ValueError:
                message = content.decode(errors="replace")
            raise EngineError(f"{method} {path}: HTTP {response.status} {message}".strip())
        return content

    def json(self, method: str, path: str, **options: Any) -> Any:
        content = self.request(method, path, **options)
        return json.loads(content) if content.strip() else None

    def ping(self, timeout: float = 2.0) -> bool:
        try:
            return self.request("GET", "/_ping", timeout=timeout) == b"OK"
        except (OSError, EngineError, http.client.HTTPException):
            return False

    def version(self) -> dict[str, Any]:
        return dict(self.json("GET", "/version"))

    # -- containers, networks, volumes -------------------------------------------------

    def containers(self, labels: Iterable[str] = ()) -> list[dict[str, Any]]:
        """Every container (running or not), optionally only those with all ``labels``
        (``key`` or ``key=value``)."""
        query: dict[str, Any] = {"all": "1"}
        wanted = list(labels)
        if wanted:
            query["filters"] = json.dumps({"label": wanted})
        return list(self.json("GET", "/containers/json", query=query))

    def remove_container(self, container_id: str) -> None:
        with contextlib.suppress(EngineError):  # already gone
            self.request("DELETE", f"/containers/{container_id}",
                         query={"force": "1", "v": "1"})

    def networks(self) -> list[dict[str, Any]]:
        """Networks other than the engine's built-in ``host`` and ``none``."""
        return [net for net in self.json("GET", "/networks")
                if net["Name"] not in ("host", "none", "bridge")]

    def volumes(self) -> list[dict[str, Any]]:
        return list(self.json("GET", "/volumes").get("Volumes") or [])

    def leftovers(self) -> dict[str, list[str]]:
        """What a test run must not leave behind: containers, networks, volumes."""
        return {
            "containers": [c["Names"][0].lstrip("/") if c.get("Names") else c["Id"][:12]
                           for c in self.containers()],
            "networks": [net["Name"] for net in self.networks()],
            "volumes": [vol["Name"] for vol in self.volumes()],
        }

    def clean(self, labels: Iterable[str] = ()) -> dict[str, list[str]]:
        """Remove containers (all, or those with ``labels``) with their anonymous
        volumes; without labels also every network and volume. Images are kept."""
        wanted = list(labels)
        removed = self.leftovers() if not wanted else {
            "containers": [c["Id"][:12] for c in self.containers(wanted)],
            "networks": [], "volumes": []}
        for container in self.containers(wanted):
            self.remove_container(container["Id"])
        if not wanted:
            for net in self.networks():
                with contextlib.suppress(EngineError):
                    self.request("DELETE", f"/networks/{net['Id']}")
            for vol in self.volumes():
                with contextlib.suppress(EngineError):
                    self.request("DELETE", f"/volumes/{vol['Name']}", query={"force": "1"})
        return removed

    # -- images --------------------------------------------------------------------------

    def image(self, reference: str) -> dict[str, Any] | None:
        try:
            return dict(self.json("GET", f"/images/{reference}/json"))
        except EngineError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def images(self, repository: str) -> list[dict[str, Any]]:
        return list(self.json("GET", "/images/json",
                              query={"filters": json.dumps({"reference": [repository]})}))

    def import_image(self, tar: IO[bytes], size: int, repository: str, tag: str,
                     changes: Iterable[str] = ()) -> None:
        """``docker import``: an image of one layer from a root filesystem tarball."""
        content = self.request(
            "POST", "/images/create",
            query={"fromSrc": "-", "repo": repository, "tag": tag, "changes": list(changes)},
            data=tar, headers={"Content-Type": "application/x-tar",
                               "Content-Length": str(size)}, timeout=600)
        for line in content.splitlines():
            with contextlib.suppress(ValueError):
                if "error" in (event := json.loads(line)):
                    raise EngineError(f"import of {repository}:{tag}: {event['error']}")

    def tag(self, source: str, repository: str, tag: str) -> None:
        self.request("POST", f"/images/{source}/tag", query={"repo": repository, "tag": tag})

    def remove_image(self, reference: str) -> None:
        with contextlib.suppress(EngineError):
            self.request("DELETE", f"/images/{reference}")


# -- the private dockerd -----------------------------------------------------------------


def default_root() -> Path:
    """Where the private engine keeps its data: ``$REDLOCK_DOCKERD_ROOT``, else
    ``.tools/docker`` of this checkout, else ``~/.cache/redlock-fenced/docker``."""
    explicit = os.environ.get("REDLOCK_DOCKERD_ROOT")
    if explicit:
        return Path(explicit)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "redlock").is_dir():
        return checkout / ".tools" / "docker"
    return Path.home() / ".cache" / "redlock-fenced" / "docker"


def find_dockerd(explicit: str | None = None) -> str | None:
    for candidate in (explicit, os.environ.get("DOCKERD"), shutil.which("dockerd"),
                      "/usr/sbin/dockerd", "/usr/bin/dockerd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (a child not waited for yet) counts as gone.
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return status[0] != "Z"
    return True


def _remove_cgroups(container_ids: Iterable[str]) -> None:
    """The cgroups (cgroupfs driver: ``<controller>/docker/<id>``) of containers that
    are gone, if they are still there and empty."""
    for container_id in container_ids:
        for group in Path("/sys/fs/cgroup").glob(f"*/docker/{container_id}"):
            with contextlib.suppress(OSError):
                group.rmdir()  # only an empty cgroup can be removed


class PrivateDockerd:
    """One ``dockerd`` process of our own, on a unix socket of its own."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 dockerd: str | None = None, start_timeout: float = 90.0) -> None:
        self.root = Path(root or default_root()).resolve()
        key = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        run_base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
        self.run_dir = run_base / f"redlock-dockerd-{key}"
        self.data_root = self.root / "data"
        self.exec_root = self.run_dir / "exec"
        self.socket_path = self.run_dir / "docker.sock"
        self.pidfile = self.run_dir / "dockerd.pid"
        self.log_path = self.root / "dockerd.log"
        self.config_path = self.root / "daemon.json"
        self.dockerd = find_dockerd(dockerd)
        self.start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """The ``DOCKER_HOST`` value for this engine."""
        return f"unix://{self.socket_path}"

    def api(self, timeout: float = 60.0) -> EngineAPI:
        return EngineAPI(self.socket_path, timeout)

    def unavailable_reason(self) -> str | None:
        """Why this engine cannot be started here, or None if it can be tried."""
        if self.dockerd is None:
            return ("dockerd not found: bash scripts/setup.sh --docker installs Debian's "
                    "docker.io package")
        if os.geteuid() != 0:
            return "dockerd needs root here (no rootless setup)"
        for tool in ("containerd", "runc"):
            if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
                return f"{tool} not found (Debian's docker.io package brings it)"
        return None

    def running_pid(self) -> int | None:
        """The pid of a dockerd of ours that is running (maybe left by another run)."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        if _alive(pid) and str(self.data_root) in " ".join(_cmdline(pid)):
            return pid
        return None

    def running(self) -> bool:
        return self.running_pid() is not None and self.api().ping()

    # -- start and stop ----------------------------------------------------------------

    def start(self) -> PrivateDockerd:
        """Start dockerd (after stopping and cleaning what an interrupted run left) and
        wait until it answers; every container, network and volume is removed."""
        reason = self.unavailable_reason()
        if reason:
            raise EngineUnavailable(reason)
        assert self.dockerd is not None
        stale = self.running_pid()
        if stale is not None:
            self._terminate(stale)
        # dockerd refuses to start while its pid file names a process that exists (a
        # zombie of a killed one counts): the file of a dead dockerd goes.
        with contextlib.suppress(OSError):
            self.pidfile.unlink()
        # The containerd of a killed dockerd goes down with it, and may stay a zombie
        # for a while: dockerd would take that for a running containerd and wait for
        # its socket in vain.
        self._forget_dead_containerd()
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("{}\n")  # never /etc/docker/daemon.json
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        command = [
            self.dockerd,
            "--data-root", str(self.data_root),
            "--exec-root", str(self.exec_root),
            "--host", self.host,
            "--pidfile", str(self.pidfile),
            "--config-file", str(self.config_path),
            "--log-level", "warn",
            *ISOLATION_FLAGS,
        ]
        with open(self.log_path, "wb") as log:  # this start's log only
            # A session of its own: a Ctrl-C in the terminal reaches the test run, whose
            # clean-up then stops the engine in order (containers first).
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        api = self.api()
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self.log_tail()
                self._process = None
                self._remove_run_dir()
                raise EngineUnavailable(f"dockerd exited at start: {tail}")
            if api.ping(timeout=1.0):
                # Containers a killed run left (restored by dockerd): removed, and the
                # cgroups of those whose processes died without dockerd as well.
                left = [container["Id"] for container in api.containers()]
                api.clean()
                _remove_cgroups(left)
                return self
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise EngineUnavailable(f"dockerd did not answer within {self.start_timeout}s: {tail}")

    def _forget_dead_containerd(self, timeout: float = 10.0) -> None:
        pidfile = self.exec_root / "containerd" / "containerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + timeout
        while (_alive(pid) and str(self.run_dir) in " ".join(_cmdline(pid))
               and time.monotonic() < deadline):
            time.sleep(0.05)  # still shutting down
        if not _alive(pid) or str(self.run_dir) not in " ".join(_cmdline(pid)):
            with contextlib.suppress(OSError):
                pidfile.unlink()

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """Remove every container, network and volume, stop dockerd by its pid (it stops
        its containerd), and remove the run directory. Images stay (the cache).

        If dockerd is already gone but its containerd or shims are not (it was killed),
        they are killed here, the containers' processes first, so that nothing is left
        running without a parent to reap it."""
        pid = self._process.pid if self._process is not None else self.running_pid()
        if pid is not None and _alive(pid):
            with contextlib.suppress(OSError, EngineError, http.client.HTTPException):
                self.api(timeout=30).clean()
            self._terminate(pid)
        elif self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=1)  # reap a dockerd that died on its own
        self._process = None
        self._kill_leftovers()
        self._unmount_leftovers()
        self._remove_run_dir()

    def _terminate(self, pid: int, timeout: float = 30.0) -> None:
        """SIGTERM (dockerd stops its containers and its containerd), SIGKILL after
        ``timeout``."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=0.1)
            if not _alive(pid):
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if self._process is not None and self._process.pid == pid:
            self._process.wait(timeout=10)

    def leftover_processes(self) -> list[int]:
        """Processes (containerd, shims) whose command line names our run directory."""
        mine = str(self.run_dir)
        found = []
        for entry in Path("/proc").iterdir():
            if (entry.name.isdigit() and int(entry.name) != os.getpid()
                    and any(mine in part for part in _cmdline(int(entry.name)))):
                found.append(int(entry.name))
        return found

    def _kill_leftovers(self) -> None:
        leftovers = [pid for pid in self.leftover_processes() if _alive(pid)]
        if not leftovers:
            return
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if entry.name.isdigit():
                    stat_fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    children.setdefault(int(stat_fields[1]), []).append(int(entry.name))

        def tree(pid: int) -> list[int]:  # deepest first
            return [*(p for child in children.get(pid, []) for p in tree(child)), pid]

        container_ids = []
        for pid in leftovers:
            command = _cmdline(pid)
            if "-id" in command[:-1]:
                container_ids.append(command[command.index("-id") + 1])
        for pid in leftovers:
            for victim in tree(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in leftovers) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The killed containers' (empty) cgroups, which only dockerd would have removed.
        _remove_cgroups(container_ids)

    def _unmount_leftovers(self) -> None:
        ours = (str(self.run_dir), str(self.data_root))
        try:
            mounts = Path("/proc/self/mounts").read_text().splitlines()
        except OSError:
            return
        fields = [line.split() for line in mounts]
        targets = [field[1].replace("\\040", " ") for field in fields if len(field) > 1]
        for target in sorted((t for t in targets
                              if any(t == d or t.startswith(d + "/") for d in ours)),
                             reverse=True):
            subprocess.run(["umount", "-l", target], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _remove_run_dir(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> PrivateDockerd:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@contextlib.contextmanager
def docker_host(host: str) -> Iterator[None]:
    """Set ``$DOCKER_HOST`` for the block (testcontainers and docker-compose read it)."""
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = host
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before


def main(argv: list[str] | None = None) -> int:
    """``up``: start the private engine (cleaning a stale one) and print its DOCKER_HOST;
    ``down``: clean and stop it; ``clean``: remove containers, networks, volumes;
    ``status``: say whether it runs and what it holds."""
    args = sys.argv[1:] if argv is None else argv
    action = args[0] if args else "status"
    engine = PrivateDockerd()
    if action == "up":
        try:
            engine.start()
        except EngineUnavailable as exc:
            print(f"docker engine unavailable: {exc}", file=sys.stderr)
            return 3
        print(engine.host)
        return 0
    if action == "down":
        engine.stop()
        return 0
    if action == "clean":
        if engine.running():
            print(json.dumps(engine.api().clean()))
        return 0
    if action == "status":
        if not engine.running():
            print("stopped")
            return 1
        print(json.dumps({"host": engine.host, **engine.api().leftovers()}))
        return 0
    print(f"usage: python -m tests.support.dockerd up|down|clean|status (not {action!r})",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
