"""The sync transport's own I/O on its own sockets (docs/design.md §2.4): a reply half
received on one node holds up neither the other nodes' replies nor the drainer's other
connections, the drainer waits instead of spinning when it has nothing to read, and the
idle connections a burst of threads opened are closed once they sat unused."""

from __future__ import annotations

import _thread
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from redlock import Redlock
from redlock._io.connection import Connection
from redlock._io.endpoint import from_url, labels
from redlock._io.wire import Silence
from redlock.testing import RedisNodes
from tests.internals import (
    PENDING,
    Broadcast,
    Call,
    SyncDrainer,
    SyncTransport,
    idle_connections,
    idle_count,
    late_entries,
    put_idle,
    scripts,
    sync_transport,
)


@pytest.fixture(params=["general", "warm"])
def three_fake_nodes(request: pytest.FixtureRequest
                     ) -> Iterator[tuple[SyncTransport, list[socket.socket]]]:
    """A transport over 3 nodes, each with one open connection: the server ends. "warm":
    connections that met their server before (identified); "general": new ones, whose
    requests go out with the script bodies (the same route, another branch of it)."""
    found = [from_url(f"redis://127.0.0.1:{port}") for port in (1, 2, 3)]
    transport = SyncTransport(found, labels(found), 2.0)
    servers = []
    for node in range(3):
        ours, theirs = socket.socketpair()
        ours.settimeout(2.0)  # (as open_connection's: the connect budget)
        conn = Connection(ours)
        conn.identified = request.param == "warm"
        put_idle(transport, node, conn)
        servers.append(theirs)
    yield transport, servers
    transport.close()
    for sock in servers:
        sock.close()


def test_a_half_received_reply_does_not_hold_up_the_other_nodes(
        three_fake_nodes: tuple[SyncTransport, list[socket.socket]]) -> None:
    transport, servers = three_fake_nodes

    def serve() -> None:
        for sock in servers:
            sock.recv(1024)  # the request
        servers[0].sendall(b"$10\r\nhal")  # node 0: the start of its reply, then nothing
        time.sleep(0.1)  # (the request is reading node 0 by now)
        servers[1].sendall(b"+PONG\r\n")
        servers[2].sendall(b"+PONG\r\n")

    def two_answered(replies: Any, identities: Any) -> bool:
        return replies[1] is not PENDING and replies[2] is not PENDING

    server = threading.Thread(target=serve)
    server.start()
    started = time.monotonic()
    replies = transport.broadcast(Broadcast(
        tuple(Call(node, ("PING",)) for node in range(3)), timeout=3.0, enough=two_answered))
    took = time.monotonic() - started
    server.join()
    assert replies[1] == replies[2] == b"PONG"
    # Decided by nodes 1 and 2 as they answered (then the straggler grace), not after
    # waiting for the rest of node 0's reply until the deadline.
    assert took < 1.0, took
    # The rest of node 0's reply is read in the background: the connection goes back.
    servers[0].sendall(b"f-reply\r\n")
    until = time.monotonic() + 2
    while idle_count(transport, 0) == 0 and time.monotonic() < until:
        time.sleep(0.01)
    assert idle_count(transport, 0) == 1


def wait_until_idle(transport: SyncTransport, counts: list[int]) -> list[int]:
    """The idle connections per node once they are ``counts`` (or after 2 s)."""
    until = time.monotonic() + 2
    while time.monotonic() < until:
        now = [idle_count(transport, node) for node in range(len(counts))]
        if now == counts:
            break
        time.sleep(0.01)
    return now


def test_a_script_the_node_forgot_is_sent_with_its_body(
        three_fake_nodes: tuple[SyncTransport, list[socket.socket]]) -> None:
    transport, servers = three_fake_nodes
    asked: list[list[bytes]] = [[] for _ in servers]

    def serve() -> None:
        for node, sock in enumerate(servers):
            asked[node].append(sock.recv(4096))
            if b"EVALSHA" in asked[node][-1]:  # a server that lost its scripts
                sock.sendall(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
                asked[node].append(sock.recv(4096))
            sock.sendall(b":1\r\n")

    server = threading.Thread(target=serve)
    server.start()
    calls = tuple(Call(node, ("owner", "1"), scripts.EXTEND, ("k",)) for node in range(3))
    replies = transport.broadcast(Broadcast(calls, timeout=2.0))
    server.join()
    assert list(replies) == [1, 1, 1]
    for sent in asked:  # EVALSHA on a warm connection, the body on a new one at once
        assert b"EVAL\r\n" in sent[-1] and b"redis.call" in sent[-1]
    assert wait_until_idle(transport, [1, 1, 1]) == [1, 1, 1]


def test_a_node_that_closes_its_connection_fails_alone(
        three_fake_nodes: tuple[SyncTransport, list[socket.socket]]) -> None:
    transport, servers = three_fake_nodes

    def serve() -> None:
        for sock in servers:
            sock.recv(1024)
        servers[0].close()  # node 0: gone (a restart)
        servers[1].sendall(b"+PONG\r\n")
        servers[2].sendall(b"+PONG\r\n")

    server = threading.Thread(target=serve)
    server.start()
    replies = transport.broadcast(Broadcast(
        tuple(Call(node, ("PING",)) for node in range(3)), timeout=2.0))
    server.join()
    assert isinstance(replies[0], Exception) and replies[1] == replies[2] == b"PONG"
    assert wait_until_idle(transport, [0, 1, 1]) == [0, 1, 1]  # node 0's: closed


def test_a_request_interrupted_while_waiting_leaves_no_connection_behind(
        three_fake_nodes: tuple[SyncTransport, list[socket.socket]]) -> None:
    transport, servers = three_fake_nodes
    timer = threading.Timer(0.2, _thread.interrupt_main)  # (Ctrl-C, mid-request)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            transport.broadcast(Broadcast(
                tuple(Call(node, ("PING",)) for node in range(3)), timeout=1.5))
    finally:
        timer.cancel()
    for sock in servers:  # the replies come after all: read in the background
        sock.recv(1024)
        sock.sendall(b"+PONG\r\n")
    assert wait_until_idle(transport, [1, 1, 1]) == [1, 1, 1]


def test_a_half_received_reply_does_not_hold_up_the_drainer() -> None:
    given_back: list[int] = []
    conns: list[Connection] = []

    def give_back(node: int, conn: Any) -> None:
        given_back.append(node)
        conn.close()

    silence = Silence(2)
    silence.owed(0, 1.0)
    silence.owed(1, 1.0)
    drainer = SyncDrainer(2, 5.0, give_back=give_back,
                          discard=lambda node, conn: conn.close(), silence=silence)
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        for node, (ours, _) in enumerate(pairs):
            ours.settimeout(5.0)
            conns.append(Connection(ours))
            drainer.keep(node, conns[-1], [Call(node, ("PING",))], 1)
        pairs[0][1].sendall(b"$10\r\nhal")  # node 0: half a reply, and no more
        time.sleep(0.1)  # (the drainer is on node 0's socket by now)
        pairs[1][1].sendall(b"+PONG\r\n")
        until = time.monotonic() + 1
        while not given_back and time.monotonic() < until:
            time.sleep(0.005)
        assert given_back == [1]  # within the second, not after node 0's 5 s
        # Node 1 answered, node 0 did not (half a reply is none): redlock._io.wire.Silence
        assert silence.since == [1.0, 0.0]
    finally:
        drainer.close()
        for conn in conns:
            conn.close()
        for _, theirs in pairs:
            theirs.close()


def test_the_drainer_waits_instead_of_spinning_when_nothing_is_live() -> None:
    drainer = SyncDrainer(1, 5.0, give_back=lambda node, conn: None,
                          discard=lambda node, conn: conn.close(), silence=Silence(1))
    ours, theirs = socket.socketpair()
    looks = 0
    late = late_entries(drainer)
    entries = late.entries

    def counted() -> list[Any]:
        nonlocal looks
        looks += 1
        found = entries()
        for late in found:  # as if another thread were disposing of each just now
            late.closed = True
        return found

    late.entries = counted
    try:
        drainer.keep(0, Connection(ours), [Call(0, ("PING",))], 1)
        time.sleep(0.5)
        # A look every 50 ms at most (a spin looked hundreds of thousands of times).
        assert 1 <= looks <= 20, looks
    finally:
        drainer.close()
        ours.close()
        theirs.close()


def _connected_clients(nodes: RedisNodes) -> int:
    with nodes[0].client() as probe:
        return int(probe.info("clients")["connected_clients"])


def test_connections_a_burst_opened_are_closed_once_unused(
        nodes1: RedisNodes, monkeypatch: pytest.MonkeyPatch) -> None:
    with Redlock(nodes1.urls, node_timeout=1.0) as dlm:
        for _ in range(5):  # until a burst needed several connections at once
            start = threading.Barrier(16)

            def burst(index: int, start: threading.Barrier) -> None:
                start.wait()
                for round_ in range(3):
                    with dlm.lock(f"burst-{index}-{round_}", ttl=10):
                        time.sleep(0.01)

            threads = [threading.Thread(target=burst, args=(i, start)) for i in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if idle_connections(dlm) >= 4:
                break
        opened = idle_connections(dlm)
        assert opened >= 4, opened
        before = _connected_clients(nodes1)
        # Kept while the burst's connections are still recent.
        with dlm.lock("after-burst", ttl=10):
            pass
        assert idle_connections(dlm) >= opened  # (a late one may come back meanwhile)
        monkeypatch.setattr(sync_transport, "IDLE_KEPT_FOR", 0.2)
        time.sleep(0.3)
        with dlm.lock("later", ttl=10):  # one thread: one connection used, given back
            pass
        assert idle_connections(dlm) == 1
        assert _connected_clients(nodes1) <= before - (opened - 1)
        with dlm.lock("and-later", ttl=10):  # the one kept still works
            pass
        assert idle_connections(dlm) == 1
