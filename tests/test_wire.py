"""The hot path's own RESP (redlock/_io/resp.py): the plain packer and reader against
hiredis's, and both clients on real servers with the plain ones (as without hiredis),
through a SCRIPT FLUSH (NOSCRIPT: the bodies go again), a server restart, and over TLS
with a password (redis-py's handshake, then our reads and writes on its socket)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redlock import AsyncRedlock, Redlock
from redlock._io import resp, wire
from redlock._io.failures import NoReply, Unreachable
from redlock._io.wire import is_noscript
from redlock.testing import RedisNode, RedisNodes, capture_events, free_port
from tests.clients import Actor, Flavour
from tests.internals import KEYS, MUTEX, AcquireArgs, lock_value, with_epoch
from tests.peek import strictly_increasing

SAMPLES = [
    b"+OK\r\n",
    b":42\r\n",
    b":-7\r\n",
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n+x\r\n$-1\r\n",
    b"_\r\n",
    b"#t\r\n",
    b",1.5\r\n",
    b"%1\r\n$1\r\na\r\n:1\r\n",
]


@pytest.mark.parametrize("data", SAMPLES)
def test_plain_reader_reads_what_hiredis_reads_even_byte_by_byte(data: bytes) -> None:
    hiredis = pytest.importorskip("hiredis")
    expected = hiredis.Reader()
    expected.feed(data)
    plain = resp.PlainReader()
    for index in range(len(data)):
        assert plain.gets() is False
        plain.feed(data[index:index + 1])
    assert plain.gets() == expected.gets()
    assert plain.gets() is False
    assert not plain.has_data()


def test_error_replies_are_returned_not_raised() -> None:
    plain = resp.PlainReader()
    plain.feed(b"-NOSCRIPT No matching script\r\n-ERR boom\r\n")
    noscript, other = plain.gets(), plain.gets()
    assert isinstance(noscript, resp.ReplyError) and is_noscript(noscript)
    assert isinstance(other, resp.ReplyError) and not is_noscript(other)
    assert str(other) == "ERR boom"


def test_plain_pack_is_hiredis_pack() -> None:
    hiredis = pytest.importorskip("hiredis")
    command = ("EVALSHA", "ab" * 20, 2, "k:é", b"\x00bin", 10_000, 1.5, "")
    assert resp.plain_pack(command) == hiredis.pack_command(command)
    assert resp.pack([command, ("PING",)]) == (hiredis.pack_command(command)
                                               + hiredis.pack_command(("PING",)))


@pytest.fixture(params=["hiredis", "plain"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "plain":
        monkeypatch.setattr(resp, "Reader", resp.PlainReader)
        monkeypatch.setattr(resp, "pack_one", resp.plain_pack)
    elif not resp.HAVE_HIREDIS:
        pytest.skip("hiredis is not installed")
    return str(request.param)


async def test_scripts_flushed_and_server_restarted_under_both_parsers(
        parser: str, flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    tokens = []
    async with me.holding(dlm.lock("wire:x", timeout=5.0)) as held:
        tokens.append(await held.token())
    for node in nodes3:  # NOSCRIPT on every node: EVALSHA, then the bodies again
        with node.client() as client:
            client.script_flush()
    async with me.holding(dlm.lock("wire:x", timeout=5.0)) as held:
        tokens.append(await held.token())
    nodes3[0].restart()  # its idle connection is closed by the server: a new one
    for _ in range(3):
        async with me.holding(dlm.lock("wire:x", timeout=5.0)) as held:
            tokens.append(await held.token())
    assert strictly_increasing(tokens)


@pytest.fixture(scope="module")
def tls_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Three password-protected redis-servers that also listen with TLS (a self-signed
    certificate): their rediss:// URLs. Skipped where openssl or TLS is missing."""
    base = tmp_path_factory.mktemp("tls")
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-keyout", str(base / "key.pem"),
         "-out", str(base / "cert.pem")], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip("openssl could not make a certificate")
    nodes, urls = [], []
    try:
        for index in range(3):
            tls_port = free_port()
            node = RedisNode(data_dir=base / f"node{index}", password="s3cret", extra_args=[
                "--tls-port", str(tls_port), "--tls-cert-file", str(base / "cert.pem"),
                "--tls-key-file", str(base / "key.pem"), "--tls-auth-clients", "no"])
            nodes.append(node)
            try:
                node.start()
            except Exception as exc:  # a redis-server built without TLS
                pytest.skip(f"redis-server without TLS: {exc}")
            urls.append(f"rediss://:s3cret@127.0.0.1:{tls_port}?ssl_cert_reqs=none")
        yield urls
    finally:
        for node in nodes:
            node.stop()


def test_tls_and_password_under_both_parsers_sync(parser: str, tls_nodes: list[str]) -> None:
    tokens = []
    with Redlock(tls_nodes, node_timeout=1.0) as dlm:
        for _ in range(5):
            with dlm.lock(f"wire:tls:sync:{parser}", timeout=5.0) as held:
                tokens.append(held.token)
    assert strictly_increasing(tokens)


def test_release_messages_over_tls_hand_off_the_lock_sync(parser: str,
                                                           tls_nodes: list[str]) -> None:
    """The sync listener reads its subscription sockets itself (bytes parsed by
    redlock._io.resp): over TLS too, where select does not see decrypted bytes."""
    resource = f"wire:tls:handoff:{parser}"
    channel = KEYS.channel(resource)
    with Redlock(tls_nodes, node_timeout=1.0) as holder_dlm, \
            Redlock(tls_nodes, node_timeout=1.0, retry_delay_min=2.0,
                    retry_delay_max=3.0) as waiter_dlm:
        holder = holder_dlm.lock(resource, ttl=30.0)
        assert holder.acquire(blocking=False)
        waiter = waiter_dlm.lock(resource, ttl=10.0)
        result: dict[str, Any] = {}

        def wait() -> None:
            result["acquired"] = waiter.acquire(timeout=20.0)
            result["at"] = time.monotonic()

        with capture_events() as events:
            thread = threading.Thread(target=wait)
            thread.start()
            clients = [redis.Redis.from_url(url) for url in tls_nodes]
            try:
                deadline = time.monotonic() + 10
                while not all(c.pubsub_numsub(channel)[0][1] for c in clients):
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            finally:
                for client in clients:
                    client.close()
            time.sleep(1.2)  # an attempt since (a patient wait is 0.5 s at most)
            released_at = time.monotonic()
            holder.release()
            thread.join(25)
        assert result["acquired"]
        assert result["at"] - released_at < 1.0
        assert [e["event"] for e in events if e["event"] == "redlock.handed_off"]


async def test_tls_and_password_under_both_parsers_asyncio(parser: str,
                                                           tls_nodes: list[str]) -> None:
    tokens = []
    async with AsyncRedlock(tls_nodes, node_timeout=1.0) as dlm:
        for _ in range(5):
            async with dlm.lock(f"wire:tls:async:{parser}", timeout=5.0) as held:
                tokens.append(held.token)
    assert strictly_increasing(tokens)


async def test_one_timer_wakes_each_request_at_its_own_deadline() -> None:
    """The asyncio requests' shared timer (Deadlines): a request added after another
    with an earlier deadline is woken at its own; one that ended is not woken; the one
    with the latest deadline is woken last, by the timer armed again."""
    import asyncio
    import time

    from redlock._core.requests import Broadcast, Replies
    from redlock._io.async_transport import Deadlines, Gathering
    from redlock._io.wire import Silence

    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    start = time.monotonic()

    def gathering(after: float) -> Gathering:
        made = Gathering(loop, Broadcast((), after), Replies([]), start, start + after,
                         deadlines, [], Silence(0))
        made.arm()
        return made

    late, early, ended = gathering(0.30), gathering(0.05), gathering(0.10)
    ended.disarm()  # its request ended before its deadline
    woken: dict[str, float] = {}
    for name, item in (("early", early), ("late", late)):
        await asyncio.wait_for(item.wake, 2.0)
        woken[name] = time.monotonic() - start
    assert 0.05 <= woken["early"] < 0.25, woken  # not held back by the later one
    assert woken["late"] >= 0.30, woken
    assert not ended.wake.done()
    assert not deadlines.waiting


# ---------------------------------------------------------------------------
# The stragglers' grace and silent nodes (redlock._io.wire.Silence, docs/design.md §2.4)
# ---------------------------------------------------------------------------


def test_a_decided_request_waits_the_grace_for_a_node_that_may_still_answer() -> None:
    from redlock._io.wire import SILENT_AFTER_GRACES, STRAGGLER_GRACE_MIN, Silence

    silence = Silence(3)
    now = 100.0
    # Never written to, or answered since: as long again as the decision took, >= the min.
    assert silence.until(now - 0.0001, now, now, [0]) == now + STRAGGLER_GRACE_MIN
    assert silence.until(now - 0.5, now, now, [0, 1]) == now + 0.5
    # Owing a reply for less than SILENT_AFTER_GRACES graces: still waited for.
    silence.owed(0, now - (SILENT_AFTER_GRACES - 1) * STRAGGLER_GRACE_MIN)
    assert silence.until(now - 0.0001, now, now, [0]) == now + STRAGGLER_GRACE_MIN
    # A later request does not move "since when": it owes the older reply still.
    silence.owed(0, now)
    assert silence.since[0] == now - (SILENT_AFTER_GRACES - 1) * STRAGGLER_GRACE_MIN


def test_a_silent_straggler_is_not_waited_for_until_it_answers_again() -> None:
    from redlock._io.wire import SILENT_AFTER_GRACES, STRAGGLER_GRACE_MIN, Silence

    silence = Silence(3)
    now = 100.0
    silent_since = now - (SILENT_AFTER_GRACES + 1) * STRAGGLER_GRACE_MIN
    silence.owed(0, silent_since)
    silence.owed(1, silent_since)
    assert silence.until(now - 0.0001, now, now, [0]) == now  # nothing to wait for
    assert silence.until(now - 0.0001, now, now, [0, 1]) == now
    # One straggler that may still answer: the grace, for it (and so for all).
    assert silence.until(now - 0.0001, now, now, [0, 2]) == now + STRAGGLER_GRACE_MIN
    # Asked again later in the same request: the deadline stays the decision's.
    assert silence.until(now - 0.0001, now, now + 0.0005, [0, 2]) == now + STRAGGLER_GRACE_MIN
    # A slow decision makes a long grace, and a node is silent only for 10 of them.
    assert silence.until(now - 0.05, now, now, [0]) == now + 0.05
    # Any reply clears it: waited for again.
    silence.heard(0)
    assert silence.until(now - 0.0001, now, now, [0]) == now + STRAGGLER_GRACE_MIN


def test_a_node_that_fails_fast_is_not_silent_one_that_times_out_is() -> None:
    import asyncio

    from redlock._io.wire import SILENT_AFTER_GRACES, STRAGGLER_GRACE_MIN, Silence

    now = 100.0
    long_ago = now - (SILENT_AFTER_GRACES + 1) * STRAGGLER_GRACE_MIN
    for exc, silent in ((NoReply("Timeout reading from socket"), True),
                        (asyncio.TimeoutError(), True), (TimeoutError(), True),
                        (Unreachable("Error 111 connecting"), False),
                        (ConnectionResetError(), False), (resp.ReplyError("ERR x"), False)):
        silence = Silence(1)
        silence.owed(0, long_ago)
        silence.failed(0, exc)
        assert (silence.until(now - 0.0001, now, now, [0]) == now) is silent, exc


def test_a_release_goes_behind_an_unanswered_acquire_of_every_resource_of_a_set() -> None:
    """The (key, owner) pairs a release is matched against (docs/design.md §5.5): every
    lock key of an ACQUIRE_MANY as it is sent (with the membership key last), and none
    of its other keys. (The last resource's key was missed once, and the node's keys
    taken for lock keys.)"""
    owner = lock_value("0" * 32, 1)
    [call] = with_epoch(MUTEX.acquire_calls(KEYS, range(1), ("a", "b", "c"), AcquireArgs(
        owner, 1000, 0, "", 0)), KEYS, 0)
    assert wire.acquire_keys(call) == [(KEYS.lock(r), owner) for r in ("a", "b", "c")]
    [single] = with_epoch(MUTEX.acquire_calls(KEYS, range(1), ("a",), AcquireArgs(
        owner, 1000, 0, "", 0)), KEYS, 0)
    assert wire.acquire_keys(single) == [(KEYS.lock("a"), owner)]
    release = MUTEX.release_call(KEYS, 0, "c", (owner, "0", 100, ""))
    assert wire.release_key(release) in wire.acquire_keys(call)


def test_a_node_that_refused_a_connection_is_not_asked_again_until_its_wait_is_over() -> None:
    """Refusals (docs/design.md §2.4): the wait starts at RETRY_CONNECT_MIN and doubles
    with each fast failure up to RETRY_CONNECT_MAX; a timeout does not count; a
    connection made clears it."""
    refusals = wire.Refusals(2)
    refused = Unreachable("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    assert refusals.refusing(0, 100.0) is None
    refusals.failed(0, NoReply("Timeout connecting"), 100.0)  # (no: a timeout)
    assert refusals.refusing(0, 100.0) is None
    waits = []
    now = 100.0
    for _ in range(6):
        refusals.failed(0, refused, now)
        assert refusals.refusing(0, now) is refused and refusals.refusing(1, now) is None
        waits.append(round(refusals.retry_at[0] - now, 6))
        now = refusals.retry_at[0]
        assert refusals.refusing(0, now) is None  # its wait is over: try again
    assert waits == [wire.RETRY_CONNECT_MIN * 2 ** i if wire.RETRY_CONNECT_MIN * 2 ** i
                     < wire.RETRY_CONNECT_MAX else wire.RETRY_CONNECT_MAX for i in range(6)]
    refusals.failed(0, refused, now)
    refusals.connected(0)
    assert refusals.refusing(0, now) is None
    refusals.failed(0, refused, now)  # (after a connection: from the start again)
    assert refusals.retry_at[0] - now == pytest.approx(wire.RETRY_CONNECT_MIN)
