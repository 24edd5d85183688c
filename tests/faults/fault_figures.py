"""Per-scenario figures of the crash, clock and randomised fault tests.

Each scenario prints one line of figures and, when ``$REDLOCK_FAULT_REPORT`` names a
file, appends one JSON object per scenario to it::

    {"scenario": ..., "attempted": ..., "succeeded": ..., "failed_cleanly": ...,
     "violations": ..., "recovery_s": ..., ...extra figures}

attempted / succeeded / failed_cleanly count lock acquisitions (failed cleanly: a
typed failure the caller can act on: ``acquire()`` returned False, or raised
``LockNotAcquired`` / ``QuorumUnavailable`` / ``ClusterAmnesiaError``); violations
are the safety violations the checks found; recovery_s is the time the scenario
took to recover (None when it needs an operator).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

REPORT_ENV = "REDLOCK_FAULT_REPORT"


@dataclass
class Figures:
    scenario: str
    attempted: int = 0
    succeeded: int = 0
    failed_cleanly: int = 0
    violations: int = 0
    recovery_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        recovery = None if self.recovery_s is None else round(self.recovery_s, 3)
        return {"scenario": self.scenario, "attempted": self.attempted,
                "succeeded": self.succeeded, "failed_cleanly": self.failed_cleanly,
                "violations": self.violations, "recovery_s": recovery, **self.extra}

    def emit(self) -> None:
        """Print the figures; append them as one JSON line to $REDLOCK_FAULT_REPORT."""
        row = self.as_dict()
        print(f"\n[figures] {json.dumps(row)}")
        path = os.environ.get(REPORT_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")


@contextmanager
def scenario(name: str) -> Iterator[Figures]:
    """Figures for one scenario, emitted when the block ends (also when it fails, so a
    failing run still reports what it saw)."""
    figures = Figures(name)
    started = time.monotonic()
    try:
        yield figures
    finally:
        figures.extra.setdefault("duration_s", round(time.monotonic() - started, 3))
        figures.emit()


def render(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of report rows (the last row per scenario wins)."""
    latest = {row["scenario"]: row for row in rows}
    core = ("scenario", "attempted", "succeeded", "failed_cleanly", "violations",
            "recovery_s")
    lines = ["| " + " | ".join(core) + " | other figures |",
             "|" + "---|" * (len(core) + 1)]
    for row in latest.values():
        others = ", ".join(f"{k}={v}" for k, v in row.items() if k not in core)
        cells = ["-" if row.get(k) is None else str(row[k]) for k in core]
        lines.append("| " + " | ".join(cells) + f" | {others} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/faults/fault_figures.py report.jsonl
    import sys

    with open(sys.argv[1], encoding="utf-8") as report:
        print(render([json.loads(line) for line in report if line.strip()]))
