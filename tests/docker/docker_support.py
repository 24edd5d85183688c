"""Shared by the Docker tests and their conftest: the checkout, the timings the run's
summary prints, and how a missing engine is reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What the summary prints at the end of a run: name -> text.
TIMINGS: dict[str, str] = {}


def missing(reason: str) -> None:
    """Skip with the reason; under CI (``$CI`` set) fail instead: CI must run these."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the Docker tests")
    pytest.skip(reason)
