"""Fixtures of the fault suite: a real Toxiproxy server with one proxy per node.

Without a toxiproxy-server binary the network-fault tests are skipped on a developer
machine and fail under CI (``$CI`` set): CI must run them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from redlock.testing import Proxies, RedisNodes, ToxiproxyServer, find_toxiproxy_server


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[ToxiproxyServer]:
    try:
        find_toxiproxy_server()
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}; CI must run the network-fault tests")
        pytest.skip(str(exc))
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
