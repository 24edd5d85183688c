"""Fork safety (docs/design.md §5.7): a child process gets its own connections, threads
and bookkeeping, and holds nothing its parent held.

A process that forks after using a manager (gunicorn ``--preload``, Celery's prefork
pool, ``multiprocessing`` with the fork start method) copies the manager into the child
as it was at that instant: connections whose sockets the parent keeps using, a renewal
loop and a release listener whose threads do not exist in the child (only the forking
thread survives a fork), thread locks that another parent thread may have held at that
instant (and that nobody will ever release in the child), and the parent's held locks.

As redis-py and gRPC do, :func:`os.register_at_fork` tells the child at once: the
:data:`generation` goes up. Everything made under an older generation belongs to an ancestor: a
manager rebuilds what belongs to one process (transport, lines, renewals, listener, thread locks)
on its first use in the new generation, not in the fork hook itself, so that the locks it makes are
those of the child's threading as the child runs it (gevent's workers monkey-patch threading after
the fork: a real lock made before that, held by one greenlet while another waits for it, stops the
whole worker). Acquisitions and handles made before the fork know they are the parent's. The
parent's sockets are never written, read, shut down or closed by the child: it keeps the old
transport referenced until it exits, so that no finaliser touches them."""

from __future__ import annotations

import os

#: How many forks this process descends from since the module was imported: objects made
#: under another generation belong to an ancestor process.
generation = 0

# What the child must neither use nor let a finaliser close (the parent's sockets).
_inherited: list[object] = []


def keep_forever(obj: object) -> None:
    """Keep a parent's object (a transport) alive in the child until it exits: collected,
    its connections' finalisers would close or shut down sockets the parent still uses."""
    _inherited.append(obj)


def _after_fork_in_child() -> None:
    global generation
    generation += 1


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
