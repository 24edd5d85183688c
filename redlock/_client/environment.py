"""The real world the core runs in (:class:`redlock._core.environment.Environment`)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

from redlock._core.environment import Environment


def real(clock: Callable[[], float] | None = None) -> Environment:
    """``time.monotonic`` (or the manager's injected ``clock``), ``time.time``,
    ``secrets.token_hex`` and ``threading.Lock``: a lock also serves asyncio, whose
    callbacks may run on other threads (on_lost, the release listener's wake-ups)."""
    return Environment(clock=time.monotonic if clock is None else clock, wall_clock=time.time,
                       random_hex=secrets.token_hex, new_mutex=threading.Lock)
