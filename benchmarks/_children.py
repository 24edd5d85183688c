"""Child processes started together: the ready / go / one-JSON-line protocol the
multi-process benchmarks share (``_contention.py``, ``many_names.py``).

A child is ``python SCRIPT child OPTIONS_JSON``: it prints ``ready`` once set up, waits
for a ``go`` line on stdin, and ends by printing its result as the last line of stdout.
Standard library only: ``_contention.py`` may import no ``redlock`` before it knows
which library it runs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def started(script: Path, options: Sequence[dict[str, Any]], env: dict[str, str] | None,
            label: str = "child") -> Iterator[list[subprocess.Popen[str]]]:
    """One child per options dict, each past its ``ready`` line; killed on the way out if
    still running."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for option in options:
            procs.append(subprocess.Popen(
                [sys.executable, str(script), "child", json.dumps(option)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, cwd=str(script.parent), env=env))
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{label} did not start: {line.strip()[:200]} "
                                   f"{(proc.stderr.read() if proc.stderr else '')[-400:]}")
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def go(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Every child starts at once."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def results(procs: Sequence[subprocess.Popen[str]], timeout: float,
            label: str = "child") -> list[Any]:
    """Each child's last stdout line, as JSON, once it ended."""
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed: {err.strip()[-400:]}")
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs
