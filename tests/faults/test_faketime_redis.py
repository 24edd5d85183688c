"""The clock-drift harness itself: a redis-server under libfaketime really runs fast or slow.

Reruns: ``.venv/bin/python -m pytest tests/faults/test_faketime_redis.py -v``
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from redlock.testing import RedisNode
from tests.support.faketime import (
    FaketimeRedis,
    check_under_faketime,
    find_faketime_lib,
    links_system_jemalloc,
    measure_clock_rate,
)

pytestmark = pytest.mark.faults

MakeNode = Callable[[float], RedisNode]


@pytest.fixture
def make_node(fake: FaketimeRedis, tmp_path: Path) -> Iterator[MakeNode]:
    made: list[RedisNode] = []

    def make(rate: float) -> RedisNode:
        node = RedisNode(data_dir=tmp_path / f"node{len(made)}", redis_server=fake.redis_server,
                         env=fake.env(rate))
        made.append(node)
        return node.start()

    yield make
    for node in made:
        node.close()


def _wait_gone(node: RedisNode, key: str, limit: float) -> float:
    """Seconds (real, monotonic) until ``key`` disappears; fails after ``limit``."""
    started = time.monotonic()
    with node.client() as client:
        while client.exists(key):
            if time.monotonic() - started > limit:
                pytest.fail(f"{key} still there after {limit} s")
            time.sleep(0.01)
    return time.monotonic() - started


def test_fast_clock_expires_keys_early(make_node: MakeNode, fake: FaketimeRedis) -> None:
    node = make_node(2.0)
    with node.client() as client:
        client.set("k", "v", px=2000)
    gone_after = _wait_gone(node, "k", limit=5.0)
    rate = measure_clock_rate(node, 1.0)
    print(f"\n2x node ({fake.redis_server}): PX 2000 expired after {gone_after:.3f} s real;"
          f" TIME ran {rate:.2f}x")
    # About 1 s; generous bounds for a loaded 2-core machine.
    assert 0.6 < gone_after < 1.6
    assert 1.6 < rate < 2.4


def test_slow_clock_expires_keys_late(make_node: MakeNode) -> None:
    node = make_node(0.5)
    with node.client() as client:
        client.set("k", "v", px=1000)
        time.sleep(1.2)
        assert client.exists("k") == 1  # a real node would have expired it by now
    gone_after = _wait_gone(node, "k", limit=5.0) + 1.2
    rate = measure_clock_rate(node, 1.0)
    print(f"\n0.5x node: PX 1000 expired after {gone_after:.3f} s real; TIME ran {rate:.2f}x")
    assert 1.5 < gone_after < 3.0
    assert 0.35 < rate < 0.65


def test_debian_redis_server_does_not_run_under_faketime(tmp_path: Path) -> None:
    """Why the harness needs another build: the system jemalloc one never comes up."""
    lib = find_faketime_lib()
    system = shutil.which("redis-server")
    if lib is None or system is None or not links_system_jemalloc(system):
        pytest.skip("needs libfaketime and a system redis-server linked to libjemalloc")
    with pytest.raises((RuntimeError, TimeoutError)):
        check_under_faketime(system, lib, start_timeout=3.0)
