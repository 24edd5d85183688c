"""The Toxiproxy harness does to real connections what its names say."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
import redis

from redlock.testing import Proxies, RedisNodes, ToxiproxyError, ToxiproxyServer

pytestmark = pytest.mark.faults


def _client(url: str, timeout: float = 0.3) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def test_proxies_forward_to_their_own_node(proxied5: Proxies) -> None:
    for index, proxy in enumerate(proxied5):
        assert proxy.node is not None
        with _client(proxy.url) as client:
            client.set("who", index)
        with proxy.node.client() as direct:
            assert direct.get("who") == str(index).encode()


def test_lose_replies_runs_the_command_but_the_client_times_out(proxied5: Proxies) -> None:
    proxy = proxied5[0]
    with _client(proxy.url) as client:
        assert client.ping()  # connected before the fault: the SET itself gets through
        proxy.lose_replies()
        with pytest.raises(redis.TimeoutError):
            client.set("k", "v")
    assert proxy.node is not None
    with proxy.node.client() as direct:
        assert direct.get("k") == b"v"


def test_blackhole_drops_requests_too(proxied5: Proxies) -> None:
    proxy = proxied5[1]
    with _client(proxy.url) as client:
        assert client.ping()
        proxy.blackhole()
        with pytest.raises(redis.TimeoutError):
            client.set("k", "v")
    assert proxy.node is not None
    with proxy.node.client() as direct:
        assert direct.get("k") is None


def test_refuse_and_reset_fail_at_once(proxied5: Proxies) -> None:
    proxied5[2].refuse()
    proxied5[3].reset_connections()
    for proxy in (proxied5[2], proxied5[3]):
        started = time.monotonic()
        with _client(proxy.url, timeout=5.0) as client, pytest.raises(redis.ConnectionError):
            client.ping()
        assert time.monotonic() - started < 2.0


def test_latency_delays_replies_and_heal_removes_every_toxic(proxied5: Proxies,
                                                            toxiproxy: ToxiproxyServer) -> None:
    proxy = proxied5[4]
    with _client(proxy.url, timeout=5.0) as client:
        client.ping()
        proxy.latency(0.3)
        started = time.monotonic()
        client.ping()
        assert time.monotonic() - started >= 0.25
        proxy.blackhole()
        assert {t["name"] for t in proxy.toxics()} == {
            "latency_downstream", "timeout_upstream", "timeout_downstream"}
    toxiproxy.heal()
    assert proxy.toxics() == []
    with _client(proxy.url) as client:
        assert client.ping()


def test_api_errors_are_typed(proxied5: Proxies) -> None:
    with pytest.raises(ToxiproxyError, match="HTTP 404"):
        proxied5[0].remove_toxic("no-such-toxic")


def test_set_upstream_moves_the_proxy_and_resets_its_connections(
    toxiproxy: ToxiproxyServer, fresh_nodes: Callable[..., RedisNodes],
) -> None:
    first, second = fresh_nodes(2)
    for node, name in ((first, "first"), (second, "second")):
        with node.client() as client:
            client.set("who", name)
    proxy = toxiproxy.create_proxy(f"{first.host}:{first.port}", name="moving", node=first)
    try:
        port = proxy.port
        with socket.create_connection((proxy.host, proxy.port), timeout=5.0) as old:
            old.sendall(b"GET who\r\n")
            assert old.recv(100) == b"$5\r\nfirst\r\n"
            proxy.set_upstream(f"{second.host}:{second.port}", second)
            assert old.recv(100) == b""  # closed by the proxy: clients must reconnect
        assert (proxy.port, proxy.node, proxy.upstream) == (
            port, second, f"{second.host}:{second.port}")
        with _client(proxy.url) as client:
            assert client.get("who") == b"second"
    finally:
        proxy.delete()
    with pytest.raises(redis.ConnectionError), _client(proxy.url) as client:
        client.ping()
