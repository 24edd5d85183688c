"""What the process-level application tests share (tests/apps/test_fork.py,
test_gunicorn.py, test_celery.py, test_close.py, test_log_lines.py, test_proc_startup.py).

- :data:`REPO_ROOT` and :func:`child_env`: subprocesses import this checkout's
  ``redlock`` (the worktree, or a clean clone installed editable in CI).
- :class:`AppProcess`: an application run as a subprocess in a session of its own, its
  stdout and stderr read by threads (every wait has a deadline), and its whole process
  tree killed by :meth:`AppProcess.close` whatever happened.
- :class:`Monitor`: ``MONITOR`` on one redis-server over a raw socket, to see exactly
  which commands reached the node and when (wall-clock time, as the server logs it);
  commands run by the lock scripts appear too (``lua`` as the client).
- :func:`descendants` / :func:`kill_processes`: the process tree of a child, read from
  ``/proc`` (Linux), to kill what a server forked and to prove nothing is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
APPS_DIR = Path(__file__).resolve().parent
PYTHON = sys.executable


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess: this checkout first on PYTHONPATH, so the
    child imports the same ``redlock`` as the test (from the worktree, or from a clean
    clone installed editable), plus ``extra``."""
    env = dict(os.environ)
    previous = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + previous if previous else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# -- process trees -------------------------------------------------------------------


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    fields = stat[stat.rindex(")") + 2:].split()
    state, ppid = fields[0], int(fields[1])
    return None if state == "Z" else ppid


def descendants(pid: int) -> list[int]:
    """Every live (not zombie) process below ``pid``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _parent_of(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    return _parent_of(pid) is not None


def kill_processes(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids`` (processes this test started, or their children)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def tcp_connections(ports: Iterable[int], pid: int | None = None) -> list[tuple[str, str]]:
    """The open TCP connections of process ``pid`` (default: this one) to any of
    ``ports`` on loopback, as (local, remote) ``host:port`` pairs (Linux: the socket
    inodes of ``/proc/<pid>/fd`` looked up in ``/proc/<pid>/net/tcp``)."""
    pid = os.getpid() if pid is None else pid
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    wanted = set(ports)
    found = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        remote_port = int(remote.split(":")[1], 16)
        if inode in inodes and remote_port in wanted and state != "0A":  # 0A: LISTEN
            found.append((_address(local), _address(remote)))
    return found


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    octets = [str(int(host[i:i + 2], 16)) for i in range(6, -1, -2)]  # little-endian
    return f"{'.'.join(octets)}:{int(port, 16)}"


# -- an application as a subprocess ----------------------------------------------------

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the test process dies (killed from
    outside, so no ``finally`` runs). Its own children are not covered: gunicorn
    workers and Celery's pool notice their parent is gone; the rest end by themselves."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class AppProcess:
    """A subprocess in its own session whose stdout and stderr lines are collected by
    reader threads; :meth:`close` kills it and everything it started."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None, stdin: bool = False) -> None:
        self.args = list(args)
        self.process = subprocess.Popen(
            self.args, env=env if env is not None else child_env(), cwd=cwd,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=_die_with_parent)  # a C call only: safe with threads running
        self.pid = self.process.pid
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._stdout_queue: queue.Queue[str | None] = queue.Queue()
        self._seen_tree: set[int] = set()  # every descendant ever seen, for close()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout_lines,
                                                      self._stdout_queue),
                             name=f"proc-stdout-{self.pid}", daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr_lines,
                                                      None),
                             name=f"proc-stderr-{self.pid}", daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: object, lines: list[str], into: queue.Queue[str | None] | None) -> None:
        assert stream is not None
        for raw in stream:  # type: ignore[attr-defined]
            line = raw.decode(errors="replace").rstrip("\n")
            lines.append(line)
            if into is not None:
                into.put(line)
        if into is not None:
            into.put(None)

    @property
    def stderr(self) -> str:
        return "\n".join(self.stderr_lines)

    @property
    def stdout(self) -> str:
        return "\n".join(self.stdout_lines)

    def tree(self) -> list[int]:
        """The subprocess's live descendants now (remembered for :meth:`close`)."""
        found = descendants(self.pid)
        self._seen_tree.update(found)
        return found

    def expect(self, prefix: str, timeout: float) -> str:
        """The next stdout line starting with ``prefix`` (earlier lines are skipped);
        AssertionError after ``timeout`` seconds or if the process ended first."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"no {prefix!r} line on stdout within {timeout}s; stderr:\n{self.stderr}")
            try:
                line = self._stdout_queue.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self._stdout_queue.put(None)  # stays ended for later calls
                raise AssertionError(f"process ended before a {prefix!r} line "
                                     f"(exit {self.process.poll()}); stderr:\n{self.stderr}")
            if line.startswith(prefix):
                return line

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds; the
        reader threads are joined once it exited (all output collected)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        for reader in self._readers:
            reader.join(5.0)
        return code

    def close(self) -> list[int]:
        """Kill the subprocess and every process it started (its session's group, and
        any descendant seen or found now); returns those still found alive before the
        kill (empty when everything had already ended)."""
        leftovers = [pid for pid in {*self._seen_tree, *descendants(self.pid)} if alive(pid)]
        if self.process.poll() is None:
            leftovers.append(self.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # the session we created for it
        kill_processes(leftovers)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        for reader in self._readers:
            reader.join(5.0)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return leftovers

    def __enter__(self) -> AppProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- MONITOR -----------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One command as MONITOR showed it."""

    at: float  # the server's wall-clock time, seconds since the epoch
    client: str  # "127.0.0.1:54321", or "lua" for a command run by a script
    args: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.args[0].upper() if self.args else ""


_MONITOR_LINE = re.compile(r'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$')
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _unquote(text: str) -> str:
    return re.sub(r'\\x([0-9a-fA-F]{2})|\\(.)',
                  lambda m: chr(int(m.group(1), 16)) if m.group(1) else
                  {"n": "\n", "r": "\r", "t": "\t"}.get(m.group(2), m.group(2)), text)


@dataclass
class Monitor:
    """``MONITOR`` on one node, read by a thread into :attr:`commands` until
    :meth:`stop` (use as a context manager)."""

    host: str
    port: int
    commands: list[Command] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._sock = socket.create_connection((self.host, self.port), timeout=5.0)
        self._sock.sendall(b"MONITOR\r\n")
        reply = b""
        deadline = time.monotonic() + 5.0
        while not reply.endswith(b"\r\n"):
            if time.monotonic() > deadline:
                raise TimeoutError("MONITOR did not answer")
            reply += self._sock.recv(64)
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"MONITOR refused: {reply!r}")
        self._thread = threading.Thread(target=self._run, name=f"proc-monitor-{self.port}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buffer = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.05)
            if not ready:
                continue
            try:
                chunk = self._sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return  # the node went away
            buffer += chunk
            *lines, buffer = buffer.split(b"\r\n")
            for raw in lines:
                match = _MONITOR_LINE.match(raw.decode(errors="replace"))
                if match:
                    args = tuple(_unquote(arg) for arg in _QUOTED.findall(match.group(3)))
                    self.commands.append(Command(float(match.group(1)), match.group(2), args))

    def stop(self) -> None:
        """Stop reading (a short grace first, for commands already on their way)."""
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self._sock.close()

    @property
    def local_address(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{host}:{port}"

    def touching(self, key: str) -> list[Command]:
        """The commands (scripts' own included) that named ``key``."""
        return [command for command in list(self.commands) if key in command.args[1:]]

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
