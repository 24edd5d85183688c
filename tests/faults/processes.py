"""A worker process of a fault test (tests/faults/workers/) and the JSON events it
prints, one per line, read by a thread as they come: the test waits for an event
(``wait_for``), marks where it stands (``mark``), freezes or kills the worker
(``signal``) and always stops it (``finish``), whatever happened."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

Event = dict[str, Any]


class EventProcess:
    """``python -m module args...`` run from the repository root (this checkout's
    ``redlock`` first on its path), its stdout read as JSON events."""

    def __init__(self, module: str, args: Sequence[str], *, stdin: bool = False) -> None:
        self.events: list[Event] = []
        self.changed = threading.Condition()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=ROOT, env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = json.loads(line)
            with self.changed:
                self.events.append(event)
                self.changed.notify_all()
        with self.changed:  # ended: waiters look once more, then see it has
            self.changed.notify_all()

    def mark(self) -> int:
        """Where the events stand now (for ``find``/``wait_for`` of later ones)."""
        with self.changed:
            return len(self.events)

    def find(self, after: int, test: Callable[[Event], bool]) -> Event | None:
        """The first event at index >= ``after`` that passes ``test``, if any yet."""
        with self.changed:
            return next((e for e in self.events[after:] if test(e)), None)

    def wait_for(self, after: int, test: Callable[[Event], bool], timeout: float) -> Event | None:
        """As ``find``, waiting up to ``timeout`` (None once the process has ended)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = next((e for e in self.events[after:] if test(e)), None)
                left = deadline - time.monotonic()
                if found is not None or left <= 0 or self.process.poll() is not None:
                    return found
                self.changed.wait(left)

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def finish(self, timeout: float = 20.0) -> str:
        """Stop the worker: resumed if frozen, its stdin closed (a worker that reads it
        ends its current step), killed if it has not ended within ``timeout``. Its
        stderr."""
        self.signal(signal.SIGCONT)
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.reader.join(10)
        stderr = self.process.stderr.read() if self.process.stderr else ""
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return stderr
