"""The library's warnings: mistakes in the calling code that still work, told through
:mod:`warnings` (never through logging, never printed by the library itself).

Each is shown once per call site by Python's default filter, at the caller's line: :func:`warn`
points the warning at the first frame outside the library, however deep the call that noticed it.
``warnings.filterwarnings("ignore", category=...)`` silences one kind; ``"error"`` turns it into an
exception (as the test suites of careful applications do)."""

from __future__ import annotations

import sys
import warnings

# A duration at or above this many seconds (16.7 minutes) is likely milliseconds.
MILLISECONDS_SUSPECT = 1000.0


class RedlockWarning(UserWarning):
    """The base of the library's warnings: code that works, but not as its author
    probably meant."""


class DurationWarning(RedlockWarning):
    """A ``ttl`` or ``timeout`` so large that it was probably meant in milliseconds (every duration
    of the library is in seconds). Silence it with ``warnings.filterwarnings("ignore",
    category=redlock.DurationWarning)`` where such durations are meant."""


class BlockingInEventLoopWarning(RedlockWarning):
    """The blocking client (:class:`redlock.Redlock`) was called on a thread that runs
    an asyncio event loop: each call stops every task of that loop until the nodes
    answer. Use :class:`redlock.AsyncRedlock` there, or run the call in a thread
    (``asyncio.to_thread``). Told once per manager."""


def _library(module: str) -> bool:
    return module == "redlock" or module.startswith("redlock.")


def warn(message: str, category: type[RedlockWarning]) -> None:
    """Warn at the caller's line: the first frame outside the library."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and _library(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def spoken(seconds: float) -> str:
    """A long duration in the unit a person reads it in: ``16.7 minutes``."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.1f} minutes"


def check_units(name: str, seconds: float, value: object, upper: float | None = None) -> None:
    """``ttl=1000`` or ``timeout=5000``: most likely milliseconds. Warn (once per call
    site) with the value in seconds that was probably meant; ``upper`` is the largest
    value the caller accepts at all (above it the caller raises instead)."""
    if seconds < MILLISECONDS_SUSPECT or (upper is not None and seconds > upper):
        return
    warn(f"{name} is in seconds: {name}={value!r} is {spoken(seconds)}; pass"
         f" {name}={seconds / 1000!r} for {seconds / 1000:g} s."
         + (" For long work, a short ttl with auto_extend=True is safer (a crashed holder"
            " frees the lock sooner)." if name == "ttl" else "")
         + f" Meant {spoken(seconds)}? Silence this with warnings.filterwarnings('ignore',"
         " category=redlock.DurationWarning)", DurationWarning)


def milliseconds_hint(name: str, value: object, seconds: float, limit_name: str,
                      limit: float) -> str:
    """Why a duration above its limit was refused, in seconds, and the ways out."""
    raise_it = (f"raise the manager's {limit_name} (Redlock(..., {limit_name}=...)) for locks"
                " held that long")
    refused = f"{name}={value!r} s is larger than the maximum {limit_name}={limit:g} s"
    if seconds < MILLISECONDS_SUSPECT:
        return f"{refused}: {raise_it}"
    return (f"{refused}: {name} is in seconds ({seconds:g} s = {spoken(seconds)}); pass"
            f" {name}={seconds / 1000!r} for {seconds / 1000:g} s, or {raise_it}")
