"""Fixtures of the fault suite: a real Toxiproxy server with one proxy per node, the
protected resource (a fenced store on a node of its own, never faulted), and Redlock
clients that are closed after the test.

Without a toxiproxy-server binary, or a redis-server that runs under libfaketime, the
tests that need them are skipped on a developer machine and fail under CI (``$CI``
set): CI must run them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from fencing import RedisFencedStore, StaleTokenError
from redlock import Lock, LockNotAcquired, Redlock
from redlock.testing import (
    Proxies,
    RedisNode,
    RedisNodes,
    ToxiproxyServer,
    find_toxiproxy_server,
)
from redlock.testing.history import ACCEPTED, ERROR, REJECTED, History, Write
from tests.support.faketime import FaketimeRedis, FaketimeUnavailable, find_faketime_redis


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


# A healthy node on a busy 2-core machine must not look dead: the fault tests' default.
NODE_TIMEOUT = 0.25
DLM_OPTIONS: dict[str, Any] = {"node_timeout": NODE_TIMEOUT, "retry_delay_max": 0.05}

MakeDlm = Callable[..., Redlock]


@pytest.fixture
def dlm_options() -> dict[str, Any]:
    """make_dlm's defaults. A module whose scenario needs other values (a shorter node
    timeout against a short TTL, a small max_ttl so amnesiac nodes rejoin within the
    test) overrides this fixture and says why there."""
    return dict(DLM_OPTIONS)


@pytest.fixture
def make_dlm(dlm_options: dict[str, Any]) -> Iterator[MakeDlm]:
    """``make(nodes, **options)``: a Redlock on RedisNodes, Proxies or a list of nodes,
    with ``dlm_options`` as defaults; every one closed after the test."""
    made: list[Redlock] = []

    def make(nodes: RedisNodes | Proxies | Sequence[RedisNode], **options: Any) -> Redlock:
        urls = nodes.urls if isinstance(nodes, RedisNodes | Proxies) else [n.url for n in nodes]
        dlm = Redlock(urls, **{**dlm_options, **options})
        made.append(dlm)
        return dlm

    yield make
    for dlm in made:
        dlm.close()


@pytest.fixture
def store_node(tmp_path: Path) -> Iterator[RedisNode]:
    """The protected resource's own node: never faulted, normal clock."""
    node = RedisNode(data_dir=tmp_path / "fence-store").start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def store_client(store_node: RedisNode) -> Iterator[redis.Redis]:
    with store_node.client() as client:
        yield client


@pytest.fixture
def store(store_client: redis.Redis) -> RedisFencedStore:
    """The protected resource: a fenced store on ``store_node``."""
    return RedisFencedStore(store_client)


def fenced_write(store: RedisFencedStore, client: str, resource: str, token: int) -> str:
    """``client``'s write of ``resource`` with ``token`` through the fenced store: ACCEPTED,
    REJECTED (a stale token) or ERROR (the store's node did not answer)."""
    try:
        store.write(resource, token, f"{client}:{token}".encode())
    except StaleTokenError:
        return REJECTED
    except redis.RedisError:
        return ERROR
    return ACCEPTED


def recorded_write(history: History, store: RedisFencedStore, client: str, resource: str,
                   token: int) -> str:
    """:func:`fenced_write`, recorded in ``history`` with when it was invoked and ended."""
    invoked = time.monotonic()
    outcome = fenced_write(store, client, resource, token)
    history.wrote(Write(client, resource, token, invoked, time.monotonic(), outcome))
    return outcome


def acquire_or_false(lock: Lock, **options: Any) -> bool:
    """``lock.acquire(**options)``; False also where it raised LockNotAcquired (a clean
    failure, as a False return is)."""
    try:
        return lock.acquire(**options)
    except LockNotAcquired:
        return False
