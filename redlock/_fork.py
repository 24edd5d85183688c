"""Fork safety (docs/design.md §5.7): a child process starts with its own connections,
threads and bookkeeping, and holds nothing its parent held.

A process that forks after using a manager (gunicorn ``--preload``, Celery's prefork
pool, ``multiprocessing`` with the fork start method) copies the manager into the child
as it was at that instant: connections whose sockets the parent keeps using, a renewal
loop and a release listener whose threads do not exist in the child (only the forking
thread survives a fork), thread locks that another parent thread may have held at that
instant (and that nobody will ever release in the child), and the parent's held locks.

As redis-py and gRPC do, :func:`os.register_at_fork` runs :func:`_after_fork_in_child`
in the child, in the forking thread, before anything else: every live manager rebuilds
its transport, lines, renewals, listener and locks there, and :data:`generation` goes up,
so acquisitions and handles made before the fork know they are the parent's. The
parent's own objects are left alone: its sockets are never written, read, shut down or
closed by the child (the child keeps the old transport referenced until it exits, so
that no finaliser touches them).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Protocol


class ForkAware(Protocol):
    def _after_fork(self) -> None: ...


#: How many forks this process descends from since the module was imported: objects made
#: under another generation belong to an ancestor process.
generation = 0

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_mutex = threading.Lock()
# What the child must neither use nor let a finaliser close (the parent's sockets).
_inherited: list[object] = []


def register(obj: ForkAware) -> None:
    """Call ``obj._after_fork()`` in every child forked from now on (held weakly)."""
    with _mutex:
        _live.add(obj)


def keep_forever(obj: object) -> None:
    """Keep a parent's object (a transport) alive in the child until it exits: collected,
    its connections' finalisers would close or shut down sockets the parent still uses."""
    _inherited.append(obj)


def _after_fork_in_child() -> None:
    global _mutex, generation
    generation += 1
    _mutex = threading.Lock()  # another parent thread may have held it at the fork
    for obj in list(_live):
        obj._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
