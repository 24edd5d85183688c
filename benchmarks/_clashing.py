"""The peers whose module is also called ``redlock``: redlock-py and redlock-ng.

Both install a top-level module named ``redlock``, like ours, so each is measured only
from its own ``pip install --target`` directory, in a subprocess whose PYTHONPATH
starts with that directory (benchmarks/_subprocess_worker.py, and the contention
children of benchmarks/_contention.py). This module is imported on both sides, so it
never imports a ``redlock`` module itself except in :func:`adapter`, which only the
subprocess calls, and which checks that it got the right one.

* redlock-py 1.0.8 (2016): asks the nodes one after another; ``lock()`` gives up after
  3 tries 0.2 s apart and returns False. Installed without dependencies (it takes the
  benchmark's redis-py).
* redlock-ng 2.0.4: the sync ``Redlock`` asks the nodes one after another (SET NX PX),
  the ``AsyncRedlock`` in parallel (``asyncio.gather``); ``acquire()`` makes 4 tries
  0.1-0.3 s apart and returns None (``blocking=True`` loops for ever); release is an
  EVAL of the full script on every node. Socket and connect timeouts 0.1 s by default.
  Installed *with* its dependencies (it pins redis-py < 6 and needs pydantic), so it runs
  on its own redis-py, as its users would.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TTL_MS = 10_000
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "redlock-bench"


@dataclass(frozen=True)
class Clashing:
    distribution: str
    version: str
    with_dependencies: bool

    @property
    def default_dir(self) -> Path:
        return CACHE / self.distribution

    @property
    def option(self) -> str:
        return f"--install-{self.distribution}"


LIBRARIES = {
    "redlock-py": Clashing("redlock-py", "1.0.8", with_dependencies=False),
    "redlock-ng": Clashing("redlock-ng", "2.0.4", with_dependencies=True),
}


def ensure_installed(name: str, target: Path, install: bool) -> None:
    """Install ``name`` into ``target`` if asked and missing; raise LookupError (the
    peer is then skipped, with this reason) when it is not there."""
    library = LIBRARIES[name]
    module = target / "redlock" / "__init__.py"
    if install and not module.is_file():
        print(f"installing {name} {library.version} into {target} ...", flush=True)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                   f"{name}=={library.version}"]
        if not library.with_dependencies:
            command.insert(5, "--no-deps")
        subprocess.run(command, check=True)
    if not module.is_file():
        raise LookupError(
            f"not installed in {target}: its module name 'redlock' clashes with ours, so it"
            f" is only measured from a separate --target dir (run with {library.option})")


def describe(name: str, target: Path) -> str:
    """'redlock-ng 2.0.4 (own dir, its own redis-py 5.3.1)', or why it is missing."""
    library = LIBRARIES[name]
    if not (target / "redlock" / "__init__.py").is_file():
        return f"{name}: not installed ({library.option})"
    own = sorted(target.glob("redis-*.dist-info"))
    redis_text = (f"its own redis-py {own[-1].name[6:-10]}" if own
                  else "the benchmark's redis-py")
    return f"{name} {library.version} (own dir, {redis_text})"


def subprocess_env(target: Path) -> dict[str, str]:
    """The environment of a subprocess that imports the library from ``target``."""
    return {**os.environ, "PYTHONPATH": str(target), "CLASHING_DIR": str(target)}


def imported(name: str) -> Any:
    """The ``redlock`` module of ``name``, checked to come from $CLASHING_DIR."""
    target = os.path.realpath(os.environ["CLASHING_DIR"])
    module = importlib.import_module("redlock")
    if not os.path.realpath(module.__file__ or "").startswith(target + os.sep):
        raise SystemExit(f"{name}: imported the wrong redlock: {module.__file__}")
    return module


def redis_version() -> str:
    import redis

    return str(redis.__version__)


Calls = tuple[Callable[[str], Any], Callable[[Any], Any], Callable[[Any, Any], Any],
              Callable[[Any], Any]]


def adapter(name: str, urls: list[str], *, asynchronous: bool = False) -> Calls:
    """``(make, acquire, release, attempt)`` for the library: ``acquire`` blocks until
    held (it calls the library again when it gives up, as a blocking caller would);
    ``attempt`` is one call of the library's own acquire with its defaults and raises
    when that fails. Coroutine functions when ``asynchronous`` (redlock-ng only)."""
    module = imported(name)

    def make(resource: str) -> str:
        return resource

    if name == "redlock-py":
        if asynchronous:
            raise ValueError("redlock-py has no asyncio client")
        dlm = module.Redlock(urls)

        def attempt(resource: str) -> Any:
            held = dlm.lock(resource, TTL_MS)
            if not held:
                raise RuntimeError("lock() returned False (3 tries)")
            return held

        def release(_resource: str, held: Any) -> None:
            dlm.unlock(held)
    elif asynchronous:
        return _redlock_ng_async(module, urls)
    else:
        dlm = module.Redlock(urls)

        def attempt(resource: str) -> Any:
            held = dlm.acquire(resource, TTL_MS)
            if held is None:
                raise RuntimeError("acquire() returned None (4 tries)")
            return held

        def release(_resource: str, held: Any) -> None:
            dlm.release(held)

    def acquire(resource: str) -> Any:
        while True:
            try:
                return attempt(resource)
            except RuntimeError:
                continue

    return make, acquire, release, attempt


def _redlock_ng_async(module: Any, urls: list[str]) -> Calls:
    dlm = module.AsyncRedlock(urls)

    def make(resource: str) -> str:
        return resource

    async def attempt(resource: str) -> Any:
        held = await dlm.acquire(resource, TTL_MS)
        if held is None:
            raise RuntimeError("acquire() returned None (4 tries)")
        return held

    async def acquire(resource: str) -> Any:
        while True:
            try:
                return await attempt(resource)
            except RuntimeError:
                continue

    async def release(_resource: str, held: Any) -> None:
        await dlm.release(held)

    return make, acquire, release, attempt
