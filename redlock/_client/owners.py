"""Values per owner (the thread or task that acquired), held weakly: a finished thread or
task takes its entry along (docs/design.md §2.6, §3.6)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class OwnerMap(Generic[V]):
    """A dict from owners, held weakly, to values: each access one operation on a dict,
    atomic as such, so threads share it without a lock (a handle asks it on every acquire
    and release, where weakref.WeakKeyDictionary's Python-level methods and a lock around
    them cost more than the lookup; BENCHMARKS.md, "Issue 21", eleventh session)."""

    __slots__ = ("_data", "_drop")

    def __init__(self) -> None:
        data: dict[weakref.ref[Any], V] = {}
        self._data = data

        def drop(ref: weakref.ref[Any]) -> None:  # the owner is gone: so is its entry
            data.pop(ref, None)
        self._drop: Callable[[weakref.ref[Any]], None] = drop

    def get(self, owner: object) -> V | None:
        return self._data.get(weakref.ref(owner))

    def __setitem__(self, owner: object, value: V) -> None:
        self._data[weakref.ref(owner, self._drop)] = value

    def __len__(self) -> int:
        return len(self._data)
