"""Nodes may come in any collection (pottery's docs pass a set), not only a list; the
order of a set is its iteration order, and node names follow it. Real nodes, both
clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from redlock import AsyncRedlock, Redlock
from redlock.testing import RedisNodes


def _address(url: str) -> str:
    return url.removeprefix("redis://")


def _collections(urls: list[str]) -> dict[str, Any]:
    def generate() -> Iterator[str]:
        yield from urls

    return {
        "tuple": tuple(urls),
        "set": set(urls),
        "frozenset": frozenset(urls),
        "generator": generate(),
        "dict keys": dict.fromkeys(urls).keys(),
        "map": map(str, urls),
    }


@pytest.mark.parametrize("kind", ["tuple", "set", "frozenset", "generator", "dict keys", "map"])
def test_sync_client_takes_any_collection(nodes3: RedisNodes, kind: str) -> None:
    nodes = _collections(nodes3.urls)[kind]
    expected_order = ([_address(u) for u in nodes] if isinstance(nodes, set | frozenset)
                      else [_address(u) for u in nodes3.urls])
    with Redlock(nodes) as dlm:
        assert list(dlm.nodes) == expected_order  # iteration order, read exactly once
        with dlm.lock(f"coll:{kind}", ttl=5.0, timeout=5.0) as held:
            assert held.token == 1
            for node in nodes3:
                with node.client() as client:
                    assert client.exists(f"redlock:{{coll:{kind}}}:lock")


@pytest.mark.parametrize("kind", ["tuple", "set", "generator"])
async def test_async_client_takes_any_collection(nodes3: RedisNodes, kind: str) -> None:
    nodes = _collections(nodes3.urls)[kind]
    async with AsyncRedlock(nodes) as dlm:
        assert sorted(dlm.nodes) == sorted(_address(u) for u in nodes3.urls)
        async with dlm.lock(f"coll:a:{kind}", ttl=5.0, timeout=5.0) as held:
            assert held.token == 1


def test_clients_in_a_set(nodes3: RedisNodes) -> None:
    clients = nodes3.clients()
    try:
        with Redlock(set(clients)) as dlm, dlm.lock("coll:clients", ttl=5.0, timeout=5.0):
            assert len(dlm.nodes) == 3
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("cls", [Redlock, AsyncRedlock])
@pytest.mark.parametrize("nodes", [
    {"redis://127.0.0.1:1": 1},            # a mapping: its keys or its values?
    "redis://127.0.0.1:1",                 # a string is an iterable of characters
    b"redis://127.0.0.1:1",
    bytearray(b"redis://127.0.0.1:1"),
    42,
    set(),
    iter(()),
])
def test_what_is_still_refused(cls: type[Any], nodes: object) -> None:
    with pytest.raises((TypeError, ValueError)) as refused:
        cls(nodes)
    if not isinstance(nodes, set) and not hasattr(nodes, "__next__"):
        assert refused.type is TypeError
        assert "collection" in str(refused.value)


def test_a_duplicate_inside_a_set_of_spellings_is_still_found(nodes1: RedisNodes) -> None:
    port = nodes1[0].port
    with pytest.raises(ValueError, match="same Redis server"):
        Redlock({f"redis://127.0.0.1:{port}", f"redis://localhost:{port}"})
