"""How managers reach their nodes, on both clients (tests/clients.py): the caller's own
redis-py clients (alone or mixed with URLs), passwords and ACL users."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from redlock import Outcome, QuorumUnavailable
from redlock.testing import RedisNode, RedisNodes, capture_events
from tests.clients import Actor, Flavour, Stopwatch, resolve
from tests.internals import KEYS
from tests.peek import any_lock_keys, lock_keys, markers, node_address, strictly_increasing


async def test_nodes_given_as_redis_clients_alone_and_mixed_with_urls(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    clients = [flavour.redis_client(node, decode_responses=True, socket_timeout=5)
               for node in nodes3]
    dlm = flavour.manager(clients)
    assert dlm.nodes == tuple(node_address(node) for node in nodes3)
    tokens = []
    for _ in range(3):
        async with me.holding(dlm.lock("cli:x", timeout=5.0)) as held:
            tokens.append(await held.token())
            assert all([await resolve(c.get(KEYS.lock("cli:x"))) for c in clients])
            assert lock_keys(nodes3, "cli:x") == [True] * 3
    assert strictly_increasing(tokens)
    mixed = flavour.manager([clients[0], nodes3.urls[1], clients[2]])
    assert await me.cycle(mixed.lock("cli:x", ttl=5.0, timeout=5.0)) > tokens[-1]
    for manager in (dlm, mixed):
        await resolve(manager.close())
    for client in clients:  # the caller's clients stay open and usable
        assert await resolve(client.ping())
    assert any_lock_keys(nodes3) == [[]] * 3


async def test_clients_with_credentials(flavour: Flavour, me: Actor,
                                        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3, password="s3cret")
    dlm = flavour.manager([flavour.redis_client(node, password="s3cret") for node in nodes])
    assert await me.cycle(dlm.lock("r", ttl=5.0, timeout=5.0)) == 1


async def test_wrong_password_fails_fast_with_a_typed_error(
        flavour: Flavour, me: Actor, fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3, password="right")
    good = me.on(flavour.manager(nodes).lock("auth:x"))
    assert await good.acquire(blocking=False)
    await good.release()
    for auth in (":wrong@", ""):
        urls = [f"redis://{auth}{node.host}:{node.port}" for node in nodes]
        lock = me.on(flavour.manager(urls).lock("auth:x", timeout=10.0))
        took = Stopwatch()
        with pytest.raises(QuorumUnavailable) as caught:
            await lock.acquire()  # blocking, 10 s deadline: a credential error is not retried
        assert took() < 2.0, f"{took():.2f} s"
        assert [r.outcome for r in caught.value.outcomes] == [Outcome.ERROR] * 3
        # The login refused (a wrong password), or, without one, the node's NOAUTH or
        # "Protocol error: unauthenticated" reply to the script's call.
        assert "the node refused the credentials" in str(caught.value)
        assert "after 1 attempt(s)" in str(caught.value)


def _acl_node(fresh_nodes: Callable[..., RedisNodes]) -> tuple[RedisNode, str]:
    node = fresh_nodes(1)[0]
    with node.client() as client:
        client.execute_command("ACL", "SETUSER", "alice", "on", ">pw", "~*", "+@all")
    return node, f"redis://alice:pw@{node.host}:{node.port}"


async def test_acl_user_url_works(flavour: Flavour, me: Actor,
                                  fresh_nodes: Callable[..., RedisNodes]) -> None:
    node, url = _acl_node(fresh_nodes)
    lock = me.on(flavour.manager([url]).lock("acl:x"))
    assert await lock.acquire(blocking=False)
    assert await lock.token() == 1
    with node.client() as client:
        assert "user=alice" in client.execute_command("CLIENT", "LIST").decode()
    assert lock_keys([node], "acl:x") == [True]
    await lock.release()
    assert lock_keys([node], "acl:x") == [False]
    bad = me.on(flavour.manager([f"redis://alice:nope@{node.host}:{node.port}"]).lock("acl:x"))
    with pytest.raises(QuorumUnavailable, match="WRONGPASS"):
        await bad.acquire(blocking=False)


async def test_acl_user_without_channel_permission_releases_cleanly(
        flavour: Flavour, me: Actor, fresh_nodes: Callable[..., RedisNodes]) -> None:
    node, url = _acl_node(fresh_nodes)
    lock = me.on(flavour.manager([url]).lock("acl:y"))
    assert await lock.acquire(blocking=False)
    with capture_events() as events:
        await lock.release()
    assert lock_keys([node], "acl:y") == [False]
    assert [e for e in events if e["event"] == "redlock.release_incomplete"] == []


async def test_a_user_who_may_not_run_info_still_locks_and_is_warned(
        flavour: Flavour, me: Actor, fresh_nodes: Callable[..., RedisNodes]) -> None:
    """INFO is an @dangerous command: a lock user without it cannot tell which server run
    answers, so restarts go unseen. Locks must still work (markers stamped 'unknown'),
    and the manager says what is lost and how to fix it."""
    nodes = fresh_nodes(3)
    for node in nodes:
        with node.client() as client:
            client.execute_command("ACL", "SETUSER", "bob", "on", ">pw", "~*", "&*",
                                   "+@all", "-@dangerous")
    urls = [f"redis://bob:pw@{node.host}:{node.port}" for node in nodes]
    with capture_events() as events:
        dlm = flavour.manager(urls)
        first = await me.cycle(dlm.lock("acl:noinfo", timeout=5.0))
        second = await me.cycle(flavour.manager(urls).lock("acl:noinfo", timeout=5.0))
    assert second > first
    assert all(str(marker).startswith("b'format=1 run_id=unknown ") for marker in markers(nodes))
    warned = {e["node"] for e in events if e["event"] == "redlock.node_unidentifiable"}
    assert warned == {f"{node.host}:{node.port}" for node in nodes}
    assert "allow +info" in next(e["problem"] for e in events
                                 if e["event"] == "redlock.node_unidentifiable")


async def test_a_closed_manager_opens_no_connection(flavour: Flavour, me: Actor,
                                                   nodes3: RedisNodes) -> None:
    """After close(), nothing is sent: a request (a background maintenance racing the
    close, or the caller's) would open connections nobody closes."""
    dlm = flavour.manager(nodes3)
    assert await me.cycle(dlm.lock("closed:x", ttl=5.0)) >= 1
    await resolve(dlm.close())

    def connected() -> list[int]:
        counts = []
        for node in nodes3:
            with node.client() as client:  # itself one connection
                counts.append(len(client.client_list()) - 1)
        return counts

    before = connected()
    lock = me.on(dlm.lock("closed:x", ttl=5.0))
    with pytest.raises(QuorumUnavailable) as caught:
        await lock.acquire(blocking=False)
    assert "the manager is closed" in str(caught.value)
    assert connected() == before
