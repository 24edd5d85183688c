"""Fork safety (docs/design.md §5.7): :func:`os.register_at_fork` raises the :data:`generation`
in a child at once; a manager rebuilds what belongs to one process on its first use under a new
generation (not in the hook: gevent patches threading after the fork), acquisitions made before
the fork stay the parent's, and the parent's sockets are never touched by the child."""

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
