"""Fixtures of the fault suite: a real Toxiproxy server with one proxy per node.

Without a toxiproxy-server binary, or a redis-server that runs under libfaketime, the
tests that need them are skipped on a developer machine and fail under CI (``$CI``
set): CI must run them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from redlock.testing import Proxies, RedisNodes, ToxiproxyServer, find_toxiproxy_server
from redlock.testing.faketime import FaketimeRedis, FaketimeUnavailable, find_faketime_redis


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what}; CI must run these fault tests")
    pytest.skip(what)


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[ToxiproxyServer]:
    try:
        find_toxiproxy_server()
    except FileNotFoundError as exc:
        _missing(str(exc))
    with ToxiproxyServer() as server:
        yield server


@pytest.fixture(scope="session")
def _proxies5(toxiproxy: ToxiproxyServer, _pool5: RedisNodes) -> Proxies:
    return toxiproxy.front(_pool5)


@pytest.fixture
def proxied5(nodes5: RedisNodes, _proxies5: Proxies,
             toxiproxy: ToxiproxyServer) -> Iterator[Proxies]:
    """Five real nodes (``proxies[i].node``), each behind its own proxy; every proxy is
    healed before and after the test, the nodes reset as for ``nodes5``."""
    toxiproxy.heal()
    yield _proxies5
    toxiproxy.heal()


@pytest.fixture(scope="session")
def fake() -> FaketimeRedis:
    """A redis-server build that runs under libfaketime (clock-drift tests)."""
    try:
        return find_faketime_redis()
    except FaketimeUnavailable as exc:
        _missing(f"no redis-server under libfaketime: {exc}")
        raise  # unreachable: skip/fail raise
