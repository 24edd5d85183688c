"""RedisFencedStore / AsyncRedisFencedStore against a real redis-server."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio

from fencing import (
    MAX_STORED_TTL,
    AsyncRedisFencedStore,
    FencingError,
    RedisFencedStore,
    StaleTokenError,
)
from fencing.errors import RowNotFoundError
from fencing.redis_store import FENCED_WRITE
from redlock.testing import RedisNodes
from redlock.testing.history import ACCEPTED, REJECTED, Write, check
from tests.fencing.workload import TokenSource, WriteFunction, run_mixed, run_threads, write_loop


@pytest.fixture
def client(nodes1: RedisNodes) -> Iterator[redis.Redis]:
    with nodes1[0].client() as c:
        yield c


@pytest.fixture
def store(client: redis.Redis) -> RedisFencedStore:
    return RedisFencedStore(client)


def test_first_write_is_accepted_and_read_back(store: RedisFencedStore) -> None:
    assert store.read("orders:42") is None
    assert store.highest("orders:42") == 0
    store.write("orders:42", 5, b"paid")
    assert store.read("orders:42") == b"paid"
    assert store.highest("orders:42") == 5


def test_lower_token_rejected_equal_accepted_higher_accepted(store: RedisFencedStore) -> None:
    store.write("r", 10, b"ten")
    with pytest.raises(StaleTokenError) as caught:
        store.write("r", 9, b"nine")
    assert (caught.value.resource, caught.value.offered, caught.value.highest) == ("r", 9, 10)
    assert "offered 9" in str(caught.value) and "accepted 10" in str(caught.value)
    assert isinstance(caught.value, FencingError)
    assert store.read("r") == b"ten"
    store.write("r", 10, b"ten again")  # the same holder writing twice
    assert store.read("r") == b"ten again"
    store.write("r", 11, b"eleven")
    assert (store.read("r"), store.highest("r")) == (b"eleven", 11)


def test_fence_and_value_live_in_one_hash_tagged_key(store: RedisFencedStore,
                                                     client: redis.Redis) -> None:
    store.write("orders:42", 3, b"v")
    assert store.key("orders:42") == "fence:{orders:42}"
    assert client.hgetall("fence:{orders:42}") == {b"fence": b"3", b"value": b"v"}
    assert client.keys("*") == [b"fence:{orders:42}"]


def test_namespaces_are_separate(client: redis.Redis) -> None:
    a, b = RedisFencedStore(client, "a"), RedisFencedStore(client, namespace="b")
    a.write("x", 100, b"a")
    b.write("x", 1, b"b")
    assert (a.read("x"), b.read("x")) == (b"a", b"b")


def test_tokens_are_exact_beyond_double_precision(store: RedisFencedStore) -> None:
    big = 2**63 - 1
    store.write("big", big - 1, b"1")
    with pytest.raises(StaleTokenError):
        store.write("big", big - 2, b"2")  # a double would call these equal
    store.write("big", big, b"3")
    assert store.highest("big") == big
    store.write("digits", 99, b"x")
    store.write("digits", 100, b"y")  # longer decimal string wins
    with pytest.raises(StaleTokenError):
        store.write("digits", 99, b"z")


def test_binary_values_round_trip(store: RedisFencedStore) -> None:
    value = bytes(range(256)) * 3
    store.write("bin", 1, value)
    assert store.read("bin") == value
    store.write("bin", 2, bytearray(b"ba"))
    assert store.read("bin") == b"ba"
    store.write("bin", 3, b"")
    assert store.read("bin") == b""


def test_fence_raises_the_fence_then_reads(store: RedisFencedStore) -> None:
    store.write("stock", 1, b"10")
    assert store.fence("stock", 2) == b"10"  # new holder: raise first, then read
    with pytest.raises(StaleTokenError) as caught:
        store.write("stock", 1, b"9")  # the old holder can no longer slip a write in
    assert caught.value.highest == 2
    store.write("stock", 2, b"9")
    assert store.read("stock") == b"9"
    assert store.fence("empty", 4) is None
    with pytest.raises(StaleTokenError):
        store.fence("stock", 1)


def test_survives_script_flush(store: RedisFencedStore, client: redis.Redis) -> None:
    store.write("r", 1, b"a")
    client.script_flush()
    store.write("r", 2, b"b")  # EVALSHA falls back to loading the script
    assert store.read("r") == b"b"


@pytest.mark.parametrize("token, error", [
    (True, TypeError), (1.0, TypeError), ("3", TypeError), (None, TypeError),
    (-1, ValueError), (2**63, ValueError),
])
def test_invalid_tokens(store: RedisFencedStore, token: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.write("r", token, b"v")  # type: ignore[arg-type]
    with pytest.raises(error):
        store.fence("r", token)  # type: ignore[arg-type]
    assert store.highest("r") == 0


def test_invalid_resources_values_and_clients(store: RedisFencedStore, nodes1: RedisNodes) -> None:
    with pytest.raises(ValueError):
        store.write("", 1, b"v")
    with pytest.raises(TypeError):
        store.write(b"r", 1, b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.read(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.write("r", 1, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RedisFencedStore("redis://localhost")  # type: ignore[arg-type]
    with nodes1[0].client() as client:
        with pytest.raises(ValueError):
            RedisFencedStore(client, namespace="")
        with pytest.raises(ValueError):
            RedisFencedStore(client, namespace="has space")
        with pytest.raises(TypeError, match=r"client must be a redis\.asyncio\.Redis, not"
                           r" redis\.Redis: a blocking client goes to RedisFencedStore$"):
            AsyncRedisFencedStore(client)  # type: ignore[arg-type]
    wrong = redis.asyncio.Redis(host="127.0.0.1", port=nodes1[0].port)
    with pytest.raises(TypeError, match=r"client must be a redis\.Redis, not redis\.asyncio\."
                       r"Redis: an asyncio client goes to AsyncRedisFencedStore$"):
        RedisFencedStore(wrong)  # type: ignore[arg-type]
    with nodes1[0].client(decode_responses=True) as client, pytest.raises(ValueError):
        RedisFencedStore(client)


def test_errors_pickle() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(StaleTokenError("r", 1, 2)))
    assert (error.resource, error.offered, error.highest) == ("r", 1, 2)
    missing = pickle.loads(pickle.dumps(RowNotFoundError("t", 5)))
    assert (missing.table, missing.key) == ("t", 5)


def test_every_lower_token_rejected_under_concurrency(nodes1: RedisNodes) -> None:
    """8 writer threads and 3 writer processes, random tokens, 3 resources, ~1.5 s."""
    url = nodes1[0].url
    resources = ["acct:1", "acct:2", "acct:3"]

    def make_write() -> tuple[WriteFunction, Callable[[], None]]:
        client = redis.Redis.from_url(url)
        return RedisFencedStore(client).write, client.close

    records = run_mixed("redis", url, make_write, resources, threads=8, processes=3,
                        seconds=1.5, seed=random.randrange(1 << 30))
    with nodes1[0].client() as client:
        store = RedisFencedStore(client)
        finals = {r: (store.read(r), store.highest(r)) for r in resources}
    stats = check(records, finals)
    print(stats.line("redis"))
    stats.assert_clean()
    assert stats.accepted > 100 and stats.rejected > 100
    assert {r.writer.split("-")[0] for r in records} == {"thread", "process"}


# -- expiring data (ttl=) -------------------------------------------------------------

SHORT_TTL = 0.5  # seconds: long enough for the checks before it runs out, short to wait
SHORT_MS = int(SHORT_TTL * 1000)


def wait_until_gone(client: redis.Redis, key: str, seconds: float = 5.0) -> float:
    """Poll until ``key`` has expired; the time it took. Meanwhile the key is always the
    whole record (fence and value as they were) or nothing: they go together."""
    start = time.monotonic()
    record = client.hgetall(key)
    assert record
    while client.exists(key):
        assert client.hgetall(key) in (record, {})
        assert time.monotonic() - start < seconds, f"{key} did not expire in {seconds} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_ttl_keeps_the_mark_in_the_value_key_and_both_expire_together(
        client: redis.Redis) -> None:
    store = RedisFencedStore(client, ttl=SHORT_TTL)
    assert store.ttl == SHORT_TTL
    store.write("orders:42", 5, b"paid")
    key = store.key("orders:42")
    assert client.keys("*") == [key.encode()]  # one key per resource: no mark of its own
    assert client.type(key) == b"hash"
    assert client.hgetall(key) == {b"fence": b"5", b"value": b"paid"}
    assert 0 < client.pttl(key) <= SHORT_MS
    left = client.pttl(key)
    with pytest.raises(StaleTokenError) as caught:
        store.write("orders:42", 4, b"stale")
    assert caught.value.highest == 5
    assert 0 < client.pttl(key) <= left  # a rejected write does not prolong the data
    assert store.read("orders:42") == b"paid"
    wait_until_gone(client, key)
    assert client.keys("*") == []  # nothing of the resource is left, its mark neither
    assert (store.read("orders:42"), store.highest("orders:42")) == (None, 0)


def test_after_expiry_any_token_is_a_first_write(client: redis.Redis) -> None:
    """The documented price of ttl=: once value and mark have expired, the store no
    longer remembers the mark, and a lower (stale) token is accepted."""
    store = RedisFencedStore(client, ttl=SHORT_TTL)
    store.write("r", 100, b"new holder")
    wait_until_gone(client, store.key("r"))
    store.write("r", 3, b"stale holder, after expiry")
    assert (store.read("r"), store.highest("r")) == (b"stale holder, after expiry", 3)
    assert 0 < client.pttl(store.key("r")) <= SHORT_MS


def test_accepted_writes_and_fences_renew_the_ttl(client: redis.Redis) -> None:
    store = RedisFencedStore(client, ttl=SHORT_TTL)
    key = store.key("r")
    start = time.monotonic()
    store.write("r", 1, b"a")
    for token in (1, 2, 2, 3):  # equal and higher tokens, for about twice the TTL
        time.sleep(SHORT_TTL / 2)
        if token == 2:
            assert store.fence("r", token) is not None
        else:
            store.write("r", token, b"b")
        assert 0 < client.pttl(key) <= SHORT_MS
    assert time.monotonic() - start > SHORT_TTL * 1.5
    assert (store.read("r"), store.highest("r")) == (b"b", 3)
    # fence() on a missing resource leaves a mark, and it expires too.
    assert store.fence("new", 7) is None
    assert client.hgetall(store.key("new")) == {b"fence": b"7"}
    assert 0 < client.pttl(store.key("new")) <= SHORT_MS
    wait_until_gone(client, store.key("new"))


def test_ttl_is_seconds_float_or_int(client: redis.Redis) -> None:
    store = RedisFencedStore(client, ttl=2.0005)  # 2001 ms: rounded up, never down
    store.write("r", 1, b"v")
    assert 1500 < client.pttl(store.key("r")) <= 2001
    store = RedisFencedStore(client, ttl=86400)  # an int is seconds too
    store.write("r", 2, b"v")
    assert 86_399_000 < client.pttl(store.key("r")) <= 86_400_000


def test_default_store_is_unchanged_and_never_sets_an_expiry(client: redis.Redis) -> None:
    """ttl=None (the default): the same key, fields and replies as before ttl= existed,
    and the store neither sets an expiry nor removes one set by other means."""
    old = RedisFencedStore(client)
    assert old.ttl is None
    old.write("r", 1, b"a")
    assert client.hgetall("fence:{r}") == {b"fence": b"1", b"value": b"a"}
    assert client.pttl("fence:{r}") == -1  # no expiry
    client.pexpire("fence:{r}", 60_000)
    old.write("r", 2, b"b")
    assert 0 < client.pttl("fence:{r}") <= 60_000  # kept, as HSET always did
    # The script without the new argument (as a caller of the old script sent it).
    reply = client.eval(FENCED_WRITE, 1, "fence:{x}", "4", "w", b"v")
    assert reply == [1, b"4"]
    assert client.pttl("fence:{x}") == -1
    # A ttl store and a default store over the same keys read the same record.
    RedisFencedStore(client, ttl=60).write("r", 3, b"c")
    assert (old.read("r"), old.highest("r")) == (b"c", 3)
    with pytest.raises(StaleTokenError):
        old.write("r", 2, b"stale")


BAD_TTLS = [
    (0, ValueError), (0.0, ValueError), (-1, ValueError), (-0.5, ValueError),
    (float("nan"), ValueError), (float("inf"), ValueError), (float("-inf"), ValueError),
    (0.0005, ValueError), (MAX_STORED_TTL * 1.01, ValueError), (10**400, ValueError),
    (True, TypeError), ("30", TypeError), (b"30", TypeError), ([30], TypeError),
]


@pytest.mark.parametrize("ttl, error", BAD_TTLS, ids=lambda v: repr(v)[:20])
def test_invalid_ttls(client: redis.Redis, ttl: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="ttl"):
        RedisFencedStore(client, ttl=ttl)  # type: ignore[arg-type]
    async_client = redis.asyncio.Redis(port=1)  # never connects: the check comes first
    with pytest.raises(error, match="ttl"):
        AsyncRedisFencedStore(async_client, ttl=ttl)  # type: ignore[arg-type]


def test_valid_ttl_bounds(client: redis.Redis) -> None:
    assert RedisFencedStore(client, ttl=0.001).ttl == 0.001
    assert RedisFencedStore(client, ttl=MAX_STORED_TTL).ttl == MAX_STORED_TTL
    with pytest.raises(TypeError):
        RedisFencedStore(client, "ns", 30)  # type: ignore[call-arg]  # ttl is keyword-only


# -- asyncio twin -------------------------------------------------------------------


async def test_async_store_semantics(nodes1: RedisNodes) -> None:
    client = redis.asyncio.Redis.from_url(nodes1[0].url)
    try:
        store = AsyncRedisFencedStore(client)
        assert await store.read("r") is None
        assert await store.highest("r") == 0
        await store.write("r", 7, b"seven")
        await store.write("r", 7, b"seven again")
        with pytest.raises(StaleTokenError) as caught:
            await store.write("r", 6, b"six")
        assert (caught.value.offered, caught.value.highest) == (6, 7)
        assert await store.fence("r", 8) == b"seven again"
        with pytest.raises(StaleTokenError):
            await store.write("r", 7, b"late")
        assert (await store.read("r"), await store.highest("r")) == (b"seven again", 8)
        with pytest.raises(TypeError):
            await store.write("r", False, b"x")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await store.write("", 9, b"x")
    finally:
        await client.aclose()


async def test_async_store_ttl_keeps_value_and_mark_together(nodes1: RedisNodes) -> None:
    client = redis.asyncio.Redis.from_url(nodes1[0].url)
    try:
        store = AsyncRedisFencedStore(client, "async", ttl=SHORT_TTL)
        assert store.ttl == SHORT_TTL
        await store.write("orders:42", 9, b"paid")
        key = store.key("orders:42")
        assert await client.keys("*") == [key.encode()]
        assert await client.type(key) == b"hash"
        assert await client.hgetall(key) == {b"fence": b"9", b"value": b"paid"}
        assert 0 < await client.pttl(key) <= SHORT_MS
        with pytest.raises(StaleTokenError):
            await store.write("orders:42", 8, b"stale")
        assert await store.fence("orders:42", 9) == b"paid"
        assert 0 < await client.pttl(key) <= SHORT_MS
        deadline = time.monotonic() + 5.0
        record = await client.hgetall(key)
        while await client.exists(key):
            assert await client.hgetall(key) in (record, {})
            assert time.monotonic() < deadline, "the key did not expire"
            await asyncio.sleep(0.02)
        assert await client.keys("*") == []
        assert (await store.read("orders:42"), await store.highest("orders:42")) == (None, 0)
        await store.write("orders:42", 1, b"after expiry")  # any token: a first write
        assert await store.highest("orders:42") == 1
        assert await AsyncRedisFencedStore(client, "async").read("orders:42") == b"after expiry"
    finally:
        await client.aclose()


async def test_async_store_rejects_every_lower_token_under_concurrency(
        nodes1: RedisNodes) -> None:
    """40 tasks on one loop, random tokens; the same history check as the threads."""
    client = redis.asyncio.Redis.from_url(nodes1[0].url, max_connections=40)
    resources = ["a", "b"]
    try:
        store = AsyncRedisFencedStore(client, namespace="async")
        t0 = time.monotonic()
        deadline = t0 + 1.0

        async def task(index: int) -> list[Write]:
            # Reuse the synchronous loop's token scheme; awaiting each write in turn.
            tokens = TokenSource(t0, 100 + index)
            pick = random.Random(index)
            out: list[Write] = []
            seq = 0
            while time.monotonic() < deadline:
                resource, token = pick.choice(resources), tokens.next()
                value = f"task-{index}:{seq}:{token}"
                seq += 1
                start = time.monotonic()
                try:
                    await store.write(resource, token, value.encode())
                except StaleTokenError as exc:
                    out.append(Write(f"task-{index}", resource, token, start,
                                     time.monotonic(), REJECTED, value, exc.highest))
                else:
                    out.append(Write(f"task-{index}", resource, token, start,
                                     time.monotonic(), ACCEPTED, value))
            return out

        results = await asyncio.gather(*(task(i) for i in range(40)))
        finals = {r: (await store.read(r), await store.highest(r)) for r in resources}
    finally:
        await client.aclose()
    stats = check([rec for result in results for rec in result], finals)
    print(stats.line("redis-async"))
    stats.assert_clean()
    assert stats.accepted > 50 and stats.rejected > 50


def test_write_loop_records_unexpected_errors() -> None:
    def broken(resource: str, token: int, value: bytes) -> None:
        raise RuntimeError("boom")

    records = write_loop("w", broken, ["r"], time.monotonic(), time.monotonic() + 0.01, 1, 3)
    stats = check(records, {})
    assert stats.errors == len(records) > 0
    with pytest.raises(AssertionError):
        stats.assert_clean()


def test_checker_catches_a_check_then_write_store(nodes1: RedisNodes) -> None:
    """The history check has teeth: a store that checks the fence and writes in two
    round trips (what docs/design.md §7 forbids) loses updates under the same load."""
    url = nodes1[0].url

    def make_write() -> tuple[WriteFunction, Callable[[], None]]:
        client = redis.Redis.from_url(url)

        def racy(resource: str, token: int, value: bytes) -> None:
            stored = int(client.hget(f"racy:{resource}", "fence") or 0)
            if token < stored:
                raise StaleTokenError(resource, token, stored)
            time.sleep(0.0005)  # anything may happen between the check and the write
            client.hset(f"racy:{resource}", mapping={"fence": token, "value": value})

        return racy, client.close

    t0 = time.monotonic()
    records = run_threads(make_write, ["x"], 8, t0, t0 + 0.8, seed=5)
    with nodes1[0].client() as client:
        final = (client.hget("racy:x", "value"), int(client.hget("racy:x", "fence") or 0))
    stats = check(records, {"x": final})
    print(stats.line("racy (check-then-write) store"))
    assert stats.lost > 0
