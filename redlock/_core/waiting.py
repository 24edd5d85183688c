"""Between two attempts of a blocking acquire: how long to wait (docs/design.md §6.1,
§6.2, §6.4). Pure: the algorithm asks, the shells wait. (How long a waiter's place in
the nodes' line lasts is a setting's: :meth:`Settings.patience`.)"""

from __future__ import annotations

from collections.abc import Sequence

import tenacity

from redlock._core.settings import LINE_POLL_MAX, Settings
from redlock.errors import NodeResult


class Waits:
    """The waits of one acquire call: ``next()`` after each failed attempt."""

    def __init__(self, settings: Settings, *, queued: bool) -> None:
        self._settings = settings
        self._queued = queued
        # Made on the first retry (most calls never wait).
        self._state: tenacity.RetryCallState | None = None
        self._wait: tenacity.wait_random_exponential | None = None

    def next(self, attempt: int, outcomes: Sequence[NodeResult], *, unavailable: bool,
             left: float | None) -> tuple[float, float | None]:
        """(wait, patient wait or None) after failed attempt number ``attempt``;
        ``left``: seconds to the caller's deadline (None: no deadline)."""
        settings = self._settings
        if self._state is None or self._wait is None:
            self._state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
            self._wait = tenacity.wait_random_exponential(
                multiplier=settings.retry_delay_min, max=settings.retry_delay_max)
        self._state.attempt_number = attempt
        # tenacity's full jitter draws from [0, cap]; retry_delay_min is the floor its
        # name promises (a near-zero wait only hammers the nodes the holder still holds).
        delay = max(settings.retry_delay_min, float(self._wait(self._state)))
        # The holder's key cannot free itself before its PTTL: no point polling faster
        # than that, but never sleep past it either.
        pttls = [r.pttl_ms for r in outcomes if r.pttl_ms is not None and r.pttl_ms > 0]
        expiry = None if not pttls else max(min(pttls) / 1000.0, settings.retry_delay_min)
        if expiry is not None:
            delay = min(delay, expiry)
        # Waiting in line where releases are heard, a release wakes the first in line:
        # the next attempt is due only when the holder's key would expire by itself, or
        # to keep our place (entries lapse after the patience without an attempt).
        patient = None
        if self._queued and not unavailable:
            patient = LINE_POLL_MAX if expiry is None else min(LINE_POLL_MAX, expiry)
        if left is not None:
            delay = min(delay, left)
            patient = None if patient is None else min(patient, left)
        return delay, patient
