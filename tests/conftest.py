"""Shared fixtures: real redis-server processes on loopback, started once per session
and reset (resumed, restarted if dead, flushed) before every test that uses them; and
the client flavours (tests/clients.py) that run one behaviour test on both clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour

# The library logs through the standard library and is silent unless configured: pytest
# captures its warnings like any others (shown for failing tests), and tests that look
# at events use caplog or redlock.testing.capture_events.


def _cluster_fixtures(count: int) -> tuple[Any, Any]:
    """``_pool<count>``: ``count`` nodes started once per session; ``nodes<count>``: that
    pool, reset before and after the test that uses it."""

    @pytest.fixture(scope="session", name=f"_pool{count}")
    def pool() -> Iterator[RedisNodes]:
        with RedisNodes(count) as nodes:
            yield nodes

    @pytest.fixture(name=f"nodes{count}")
    def reset_pool(request: pytest.FixtureRequest) -> Iterator[RedisNodes]:
        nodes: RedisNodes = request.getfixturevalue(f"_pool{count}")
        nodes.reset()
        yield nodes
        nodes.reset()

    return pool, reset_pool


_pool1, nodes1 = _cluster_fixtures(1)
_pool3, nodes3 = _cluster_fixtures(3)
_pool5, nodes5 = _cluster_fixtures(5)


@pytest.fixture
def fresh_nodes() -> Iterator[Callable[..., RedisNodes]]:
    """Factory for nodes private to one test (AOF, passwords, ...); all closed afterwards."""
    made: list[RedisNodes] = []

    def make(count: int = 3, **options: object) -> RedisNodes:
        nodes = RedisNodes(count, **options)  # type: ignore[arg-type]
        made.append(nodes)
        return nodes

    yield make
    for nodes in made:
        nodes.close()


@pytest.fixture(params=[1, 3, 5], ids=lambda n: f"N={n}")
def cluster(request: pytest.FixtureRequest) -> RedisNodes:
    """The session's 1-, 3- or 5-node cluster, reset (running, empty) for this test."""
    nodes: RedisNodes = request.getfixturevalue(f"nodes{request.param}")
    return nodes


@pytest.fixture(params=["sync", "async"])
async def flavour(request: pytest.FixtureRequest) -> AsyncIterator[Flavour]:
    """The test runs twice: on Redlock (sync) and on AsyncRedlock (async)."""
    made = Flavour(str(request.param))
    yield made
    await made.close()


@pytest.fixture
def me(flavour: Flavour) -> Actor:
    """The test's own lock owner (a thread or a task of its own)."""
    return flavour.actor("me")
