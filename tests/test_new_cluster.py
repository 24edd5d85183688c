"""A new cluster (no node has a marker yet) is initialised only by a client that hears
from every node (docs/design.md §4.2: a partial view never counts as fresh). While a node is
down, the others are not amnesiac and must not be reported or benched as such."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from redlock import LockNotAcquired, QuorumUnavailable, Redlock
from redlock._io import wire
from redlock.testing import RedisNodes, capture_events


def test_new_cluster_with_a_node_down_waits_for_it_without_calling_anyone_amnesiac(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3)
    nodes[2].stop()
    with capture_events() as events, Redlock(nodes.urls, node_timeout=0.2) as dlm:
        lock = dlm.lock("new:x", ttl=5.0)
        with pytest.raises(LockNotAcquired) as failure, \
                dlm.lock("new:x", ttl=5.0, timeout=0.5):
            pass
        assert "new cluster not initialised yet" in str(failure.value)
        with pytest.raises(QuorumUnavailable, match="1 did not"):
            lock.acquire(blocking=False)
        nodes[2].start()
        # Refused a moment ago: asked again once its wait is over (wire.Refusals).
        time.sleep(wire.RETRY_CONNECT_MAX)
        assert lock.acquire(blocking=False)  # full view now: initialised, then granted
        assert lock.token == 1
        lock.release()
    # (the suite's logger filters below WARNING; node_amnesiac is a warning)
    assert "redlock.node_amnesiac" not in [e["event"] for e in events]
