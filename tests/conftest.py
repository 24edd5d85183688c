"""Shared fixtures: real redis-server processes on loopback, started once per session
and reset (resumed, restarted if dead, flushed) before every test that uses them; and
the client flavours (tests/clients.py) that run one behaviour test on both clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour

# The library logs through the standard library and is silent unless configured: pytest
# captures its warnings like any others (shown for failing tests), and tests that look
# at events use caplog or redlock.testing.capture_events.


@pytest.fixture(scope="session")
def _pool1() -> Iterator[RedisNodes]:
    with RedisNodes(1) as nodes:
        yield nodes


@pytest.fixture(scope="session")
def _pool3() -> Iterator[RedisNodes]:
    with RedisNodes(3) as nodes:
        yield nodes


@pytest.fixture(scope="session")
def _pool5() -> Iterator[RedisNodes]:
    with RedisNodes(5) as nodes:
        yield nodes


@pytest.fixture
def nodes1(_pool1: RedisNodes) -> Iterator[RedisNodes]:
    _pool1.reset()
    yield _pool1
    _pool1.reset()


@pytest.fixture
def nodes3(_pool3: RedisNodes) -> Iterator[RedisNodes]:
    _pool3.reset()
    yield _pool3
    _pool3.reset()


@pytest.fixture
def nodes5(_pool5: RedisNodes) -> Iterator[RedisNodes]:
    _pool5.reset()
    yield _pool5
    _pool5.reset()


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
