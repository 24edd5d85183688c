"""The wheel a user installs: built from this checkout, it carries the library and the
user-facing harness of ``redlock.testing``, and none of the repository's own tooling
(tests/support: private dockerd, image building, PostgreSQL, faketime). Installed into a
clean virtualenv (its dependencies from PyPI), its demo runs and it takes a lock on
local redis-server nodes, from outside the repository and without PYTHONPATH.

Needs PyPI (the build backend, redis, tenacity) and a redis-server on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MOVED = ("dockerd", "images", "postgres", "faketime")  # now tests/support/<name>.py

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Never copied into the build: a stale build/ or *.egg-info would put old files into the
# wheel (setuptools copies into build/lib and packs all it finds there).
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".tools", "build", "dist", "*.egg-info",
                                     "__pycache__", ".*_cache", ".hypothesis", "site")


@dataclass
class Installed:
    wheel: Path
    names: list[str]
    python: Path
    outside: Path  # an empty working directory, not in the repository
    seconds: dict[str, float]


def clean_env() -> dict[str, str]:
    """This environment minus what would let the repository's code in."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV",
                        "PYTHONSAFEPATH", "PYTHONUSERBASE")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == 0, (f"{' '.join(command)} exited {result.returncode}:\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    seconds: dict[str, float] = {}
    try:
        started = time.monotonic()
        source = base / "source"
        shutil.copytree(ROOT, source, ignore=_NOT_SOURCE, symlinks=True)
        wheels = base / "wheels"
        run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q",
             "-w", str(wheels)], cwd=base, timeout=300)
        (wheel,) = wheels.glob("redlock_fenced-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
        seconds["build"] = time.monotonic() - started

        started = time.monotonic()
        venv = base / "venv"
        run([sys.executable, "-m", "venv", str(venv)], cwd=base, timeout=120)
        python = venv / "bin" / "python"
        run([str(python), "-m", "pip", "install", "-q", str(wheel)], cwd=base, timeout=300)
        seconds["venv and install"] = time.monotonic() - started
        outside = base / "elsewhere"
        outside.mkdir()
        yield Installed(wheel, names, python, outside, seconds)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # a virtualenv and a source copy: large


def test_the_wheel_carries_the_library_and_no_repository_tooling(installed: Installed
                                                                  ) -> None:
    names = installed.names
    tops = {name.split("/")[0] for name in names}
    assert {"redlock", "fencing"} <= tops
    assert tops - {"redlock", "fencing"} == {installed.wheel.name.split("-py")[0]
                                             + ".dist-info"}
    for expected in ("redlock/__init__.py", "redlock/py.typed", "fencing/__init__.py",
                     "fencing/py.typed", "redlock/testing/__init__.py",
                     "redlock/testing/pytest_plugin.py", "redlock/testing/containers.py",
                     "redlock/testing/redis_nodes.py", "redlock/testing/toxiproxy.py",
                     "redlock/testing/sentinel.py", "redlock/testing/logs.py"):
        assert expected in names, expected
    shipped_modules = {Path(name).stem for name in names if name.endswith(".py")}
    assert not shipped_modules & set(MOVED), sorted(shipped_modules & set(MOVED))
    assert not [name for name in names if "tests/" in name or name.startswith("tests")]
    assert not [name for name in names if "/examples/" in name or "compose/" in name]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(installed.wheel) as archive:
        text = archive.read(entry_points).decode()
    assert "[pytest11]" in text and "redlock = redlock.testing.pytest_plugin" in text


def test_the_installed_demo_runs(installed: Installed) -> None:
    started = time.monotonic()
    result = run([str(installed.python), "-m", "redlock", "demo", "--workers", "2",
                  "--rounds", "2"], cwd=installed.outside, timeout=120)
    installed.seconds["demo"] = time.monotonic() - started
    assert "started 3 local redis-server nodes" in result.stdout
    assert "tokens strictly increasing: True" in result.stdout, result.stdout


ROUND_TRIP = textwrap.dedent("""
    import importlib.util, json, sys
    from pathlib import Path

    import fencing, redlock
    from redlock import Redlock
    from redlock.admin import Admin
    from redlock.testing import RedisNodes, start_nodes
    from redlock.testing.containers import DockerUnavailable

    where = {m.__name__: m.__file__ for m in (redlock, fencing)}
    with RedisNodes(3) as nodes, Redlock(nodes.urls) as dlm:
        lock = dlm.lock("wheel:check", ttl=5.0)
        acquired = lock.acquire(blocking=False)
        first = lock.token
        lock.release()
        with dlm.lock("wheel:check", ttl=5.0, timeout=5.0) as held:
            second = held.token
        released = not Admin(dlm).is_locked("wheel:check")

    def importable(name):
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            return False

    try:  # the docker extra is not installed: the backend says what to install
        start_nodes(1, backend="docker")
        docker = "started"
    except DockerUnavailable as exc:
        docker = str(exc)
    print(json.dumps({
        "prefix": sys.prefix, "where": where, "acquired": acquired, "first": first,
        "second": second, "released": released, "docker": docker,
        "importable": [n for n in ("redlock.testing.dockerd", "redlock.testing.images",
                                   "redlock.testing.postgres", "redlock.testing.faketime",
                                   "tests.support", "testcontainers") if importable(n)],
    }))
""")


def test_the_installed_package_takes_a_lock(installed: Installed) -> None:
    started = time.monotonic()
    result = run([str(installed.python), "-c", ROUND_TRIP], cwd=installed.outside,
                 timeout=120)
    installed.seconds["lock round trip"] = time.monotonic() - started
    report = json.loads(result.stdout.strip().splitlines()[-1])
    site = Path(report["prefix"]).resolve()
    for module, path in report["where"].items():  # the wheel's code, not the checkout's
        assert Path(path).resolve().is_relative_to(site), (module, path)
        assert not Path(path).resolve().is_relative_to(ROOT), (module, path)
    assert report["acquired"] is True
    assert isinstance(report["first"], int) and report["second"] > report["first"]
    assert report["released"] is True
    assert report["importable"] == []
    assert "pip install 'redlock-fenced[docker]'" in report["docker"]
    print(f"wheel test timings: {installed.seconds}")
