"""What the core takes from the world, as inputs (docs/design.md §10): clocks, randomness and
thread locks, in an :class:`Environment` (:func:`redlock._client.environment.real` builds the real
one; tests hand fakes), so the core imports no ``time``, ``secrets``, ``threading``, ``asyncio`` or
redis-py (an import-linter contract keeps it so)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol


class Mutex(Protocol):
    """A lock for state that threads (or tasks and the threads of callbacks) share:
    ``with mutex: ...``. It is held only for bookkeeping, never across I/O or a wait."""

    def __enter__(self) -> object: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None: ...


@dataclass(frozen=True)
class Environment:
    """The core's inputs from the world.

    ``clock``: monotonic seconds (validity, deadlines, waits); ``wall_clock``: seconds since the
    epoch, only where hosts must agree (the waiting line's tickets, node marker texts, a
    hand-over's age); ``random_hex(n)``: n random bytes as hex, from a source fit for secrets (lock
    values let their holder release the lock); ``new_mutex``: a new lock for shared state."""

    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    random_hex: Callable[[int], str]
    new_mutex: Callable[[], Mutex]
