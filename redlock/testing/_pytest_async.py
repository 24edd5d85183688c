"""The plugin's asyncio fixture, registered only where pytest-asyncio is active (so the
plugin itself never imports it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import pytest_asyncio

if TYPE_CHECKING:
    from redlock import AsyncRedlock


class _HasUrls(Protocol):
    """What the fixture needs of the plugin's ``Cluster`` (named here, not imported:
    the plugin imports this module)."""

    @property
    def urls(self) -> list[str]: ...


@pytest_asyncio.fixture
async def redlock_async_client(redlock_cluster: _HasUrls) -> AsyncIterator[AsyncRedlock]:
    """An ``AsyncRedlock`` on ``redlock_cluster.urls``, closed after the test."""
    from redlock import AsyncRedlock

    async with AsyncRedlock(redlock_cluster.urls) as dlm:
        yield dlm
