"""How each flavour waits and runs things in the background: events and turn locks, the
current owner (thread or task), and background work (renewal loop, maintenance, ``on_lost``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Hashable
from typing import Any


class ThreadBackend:
    """The sync client's: ``threading`` events and locks, a daemon thread each."""

    asynchronous = False

    @staticmethod
    def new_event() -> threading.Event:
        return threading.Event()

    @staticmethod
    def new_turn() -> threading.Lock:
        return threading.Lock()

    #: The owner of the calling code's acquisitions: its thread.
    current_owner: Callable[[], Hashable | None] = staticmethod(threading.current_thread)

    @staticmethod
    def spawn(run: Callable[[], object], name: str) -> threading.Thread:
        """Run ``run()`` in a daemon thread of its own; returns the thread."""
        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread


class AsyncioBackend:
    """The asyncio client's: ``asyncio`` events and locks, a task each."""

    asynchronous = True

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()  # the loop keeps only weak references

    @staticmethod
    def new_event() -> asyncio.Event:
        return asyncio.Event()

    @staticmethod
    def new_turn() -> asyncio.Lock:
        return asyncio.Lock()

    #: The owner of the calling code's acquisitions: its task (None outside one, which
    #: the handles refuse).
    current_owner: Callable[[], Hashable | None] = staticmethod(asyncio.current_task)

    def spawn(self, run: Callable[[], Coroutine[Any, Any, object]],
              name: str) -> asyncio.Task[Any]:
        """Run the coroutine ``run()`` in a task of its own; returns the task."""
        task = asyncio.get_running_loop().create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
