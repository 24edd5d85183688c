"""Fixtures for the fencing tests: a Redis node comes from tests/conftest.py (nodes1);
the PostgreSQL server is started here once per session."""

from __future__ import annotations

import sys
from pathlib import Path

# fence_history.py (the history checker) sits next to the tests that use it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
