"""Fixtures of the application tests: the protected resource's own Redis node (the counter
and the fenced store, never faulted), a real Toxiproxy server, and a last check that no
library thread outlives a test.

The lock nodes are the suite's session clusters (``nodes3``, ``nodes5`` of
tests/conftest.py: real redis-server processes, reset before and after every test).
Without a toxiproxy-server binary the Toxiproxy case is skipped on a developer machine
and fails under CI (``$CI`` set), as in tests/faults.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from redlock.testing import RedisNode, ToxiproxyServer, find_toxiproxy_server
from tests.apps.support import wait_no_library_threads


@pytest.fixture
def counter_node(tmp_path: Path) -> Iterator[RedisNode]:
    """A redis-server of the test's own for the application's data (the counter, the
    grants list, the fenced store): separate from the lock nodes, as in production."""
    node = RedisNode(data_dir=tmp_path / "counter").start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[ToxiproxyServer]:
    """One real Toxiproxy server for the session (each test makes and deletes its own
    proxies)."""
    try:
        find_toxiproxy_server()
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}; CI must run the Toxiproxy application test")
        pytest.skip(str(exc))
    with ToxiproxyServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _no_library_threads_left() -> Iterator[None]:
    """After every test (and all its fixtures' teardowns, this one being set up first):
    no thread of the library is still alive. The tests check this themselves right
    after closing their managers; this catches what a failing test's teardown left."""
    yield
    left = wait_no_library_threads()
    assert not left, f"library threads still alive after the test: {left}"
