"""What the core's protocol tests share: a lock held on scripted nodes, the background
maintenance driven to its end, and a cluster with one amnesiac node."""

from __future__ import annotations

import threading

from tests.internals import (
    Broadcast,
    Invoke,
    LockState,
    RedlockCore,
    Wait,
    drive,
    maintenance,
)
from tests.scripted import (
    FakeClock,
    ScriptedNodes,
    lock_key,
    make_core,
)


def held(core: RedlockCore, nodes: ScriptedNodes, resource: str = "r",
         ttl: float = 10.0) -> LockState:
    """A lock acquired on the scripted nodes; the requests log starts empty after it."""
    result = drive(core.acquire(resource, ttl, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None, result.reason
    nodes.requests.clear()
    return result.state


def held_lock(n: int = 3, *, ttl: float = 10.0,
              **settings: object) -> tuple[FakeClock, ScriptedNodes, RedlockCore, LockState]:
    """A fake clock, ``n`` scripted nodes on it, a core on it (``settings``) and a lock on
    "r" it holds there for ``ttl`` (:func:`held`)."""
    clock = FakeClock()
    nodes = ScriptedNodes(n, clock=clock)
    core = make_core(n, clock, **settings)
    return clock, nodes, core, held(core, nodes, ttl=ttl)


def maintain(core: RedlockCore, nodes: ScriptedNodes, *, sleeps: int | None = 1,
             stop: threading.Event | None = None) -> threading.Event:
    """Run the background maintenance on the scripted nodes; the manager closes (sets
    its stop event) when the maintenance asks for sleep number ``sleeps`` (None: never,
    the maintenance must end by itself). Returns the stop event."""
    stop = stop if stop is not None else threading.Event()
    news = threading.Event()  # the manager sets it on close, and when a node needs it
    asked = 0

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        nonlocal asked
        if isinstance(request, Wait):
            assert request.wake is news  # news or closing cut the wait short
            asked += 1
            if sleeps is not None and asked >= sleeps:
                stop.set()
                news.set()
        return nodes.execute(request)

    assert drive(maintenance(core.amnesia, stop, news), execute) is None
    return stop


def amnesiac_cluster(n: int = 5, **options: object) -> ScriptedNodes:
    """Node 0 restarted empty; the others hold diverged counters of a's bucket (7, 10, 5,
    12), and node 3 also one of b's (6)."""
    nodes = ScriptedNodes(n, **options)  # type: ignore[arg-type]
    nodes.restart(0, keep_data=False)
    for i, value in enumerate([7, 10, 5, 12], start=1):
        if i < n:
            nodes.set_counter(i, value, "a")
    if n > 3:
        nodes.set_counter(3, 6, "b")
    nodes.data[1][lock_key("a")] = "a holder"  # not a counter: never read
    return nodes


def amnesiac_core(**settings: object) -> tuple[FakeClock, ScriptedNodes, RedlockCore]:
    """:func:`amnesiac_cluster` on a fake clock, and a core on it (``settings``) that knows
    node 0 lost its data."""
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, **settings)
    core.amnesia.health.lost_data(0)
    return clock, nodes, core
