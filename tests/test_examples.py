"""Every example in examples/ runs as a real subprocess (starting its own local
redis-server nodes, and PostgreSQL for inventory_sql) and exits 0 with its story."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.postgres import postgres_available

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str, *args: str, as_script: bool = False) -> str:
    target = [str(ROOT / "examples" / f"{name}.py")] if as_script else ["-m", f"examples.{name}"]
    result = subprocess.run([sys.executable, *target, *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    return result.stdout


def test_flash_sale() -> None:
    out = run_example("flash_sale")
    assert "50 buyers compete for 10 tickets: 25 threads here and 25 threads in 5 helper" in out
    assert sum(line.startswith("  ticket ") for line in out.splitlines()) == 10
    assert "10 bought a ticket, 40 found it sold out, 0 failed; 0 tickets left" in out
    assert "OK: exactly 10 tickets sold" in out


def test_stale_writer() -> None:
    out = run_example("stale_writer", as_script=True)  # also: runnable by path
    assert "is frozen with SIGSTOP (process state 'T')" in out
    assert "the store REJECTED it" in out
    assert "<- A's stale write clobbered B's work" in out
    assert "OK: the stale holder A was rejected and B's value was kept" in out


def test_scheduled_job() -> None:
    out = run_example("scheduled_job")
    assert out.count("executed 1 time(s)") == 6
    assert "worker-1 elected at" in out and "worker-1 died at" in out  # then a failover
    assert out.count(" elected at ") >= 2
    assert "OK: each of the 6 scheduled runs executed exactly once" in out


def test_duplicate_submission() -> None:
    out = run_example("duplicate_submission", as_script=True)
    assert "-> checkout-7f3a: 1 order, 3 duplicate(s) rejected" in out
    assert "-> checkout-91c2: 1 order, 0 duplicate(s) rejected" in out
    assert "OK: each form created exactly one order" in out


def test_inventory_sql() -> None:
    out = run_example("inventory_sql")
    assert "SQLite: 30 orders by 6 workers" in out
    assert "SQLite: stalled worker Z" in out and "REJECTED" in out
    if postgres_available():
        assert "PostgreSQL: 30 orders by 6 workers" in out
        assert "OK: fenced inventory deduction correct on SQLite and PostgreSQL" in out
    elif os.environ.get("CI"):
        pytest.fail("PostgreSQL binaries missing in CI: inventory_sql must run on PostgreSQL")
    else:
        assert "PostgreSQL: skipped" in out


def test_async_worker_pool() -> None:
    out = run_example("async_worker_pool")
    assert "no instance took a job over mid-build" in out  # auto_extend held every lock
    for account in ("northwind", "initech", "globex"):
        assert f"  {account}: built by instance-" in out
    assert out.count("skipped: already built") == 3
    assert "makes a blocking call while building acme's report" in out
    # A frozen loop does not stop the renewals (a thread's): nobody takes over then.
    frozen = out.index("runs again: its lock was renewed meanwhile")
    taken = out.index("the lock report:acme is taken away")
    assert frozen < taken < out.index("took the lock over and builds acme's report")
    # Its renewal finds the key gone: on_lost cancels the build before its write.
    assert "the stale build in instance-" in out
    assert "stopped by on_lost: the lock was lost" in out
    assert ("OK: every report written exactly once by the instance that built it; "
            "the stale build wrote nothing") in out


def test_every_example_has_a_test() -> None:
    examples = {p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_")}
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert examples <= tested, f"examples without a test: {sorted(examples - tested)}"


def test_examples_fail_loudly_on_bad_arguments() -> None:
    result = subprocess.run([sys.executable, "-m", "examples.scheduled_job", "--workers", "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0 and "--workers must be at least 2" in result.stderr
