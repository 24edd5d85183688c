"""The plugin's asyncio fixture, registered only where pytest-asyncio is active (so the
plugin itself never imports it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest_asyncio

if TYPE_CHECKING:
    from redlock import AsyncRedlock
    from redlock.testing.pytest_plugin import Cluster


@pytest_asyncio.fixture
async def redlock_async_client(redlock_cluster: Cluster) -> AsyncIterator[AsyncRedlock]:
    """An ``AsyncRedlock`` on ``redlock_cluster.urls``, closed after the test."""
    from redlock import AsyncRedlock

    async with AsyncRedlock(redlock_cluster.urls) as dlm:
        yield dlm
