"""The last line of clean-up: whatever this harness started and a test did not close
(it died between start and close) is closed at interpreter exit."""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


_LIVE: weakref.WeakSet[Closable] = weakref.WeakSet()


def track(item: Closable) -> None:
    """``item`` runs now: close it at exit unless :func:`untrack` came first."""
    _LIVE.add(item)


def untrack(item: Closable) -> None:
    _LIVE.discard(item)


@atexit.register
def _close_leftovers() -> None:
    for item in list(_LIVE):
        with contextlib.suppress(Exception):
            item.close()
