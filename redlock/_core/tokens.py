"""The quorum, validity and token rules (docs/design.md §2, §3): pure functions, and the
token floors a manager keeps."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from redlock._core.environment import Mutex
from redlock._core.settings import Settings

#: Tokens are Lua numbers on the nodes, exact integers only below 2**53: an
#: acquisition whose token would reach it fails instead of issuing an inexact one.
TOKEN_LIMIT = 2**53


def quorum(node_count: int) -> int:
    """Majority of N: N // 2 + 1."""
    return node_count // 2 + 1


def waiter_id(owner: str) -> str:
    """An acquisition's name in the nodes' waiting lines and wake-up messages: SHA1 of
    its owner value (the scripts compute the same), which does not reveal the owner."""
    return hashlib.sha1(owner.encode()).hexdigest()


def validity_left(settings: Settings, ttl: float, started: float, now: float) -> float:
    """ttl - elapsed - drift, measured from the attempt's start on a monotonic clock."""
    return ttl - (now - started) - settings.drift(ttl)


@dataclass(frozen=True)
class TokenChoice:
    token: int
    committed: tuple[int, ...]  # nodes known to hold counter >= token under our key
    write_back: tuple[int, ...]  # granting nodes whose counter is lower: need the write-back


def choose_token(counters: dict[int, int]) -> TokenChoice:
    """Token = max over the granting nodes; nodes that returned it are already committed."""
    token = max(counters.values())
    committed = tuple(i for i, c in counters.items() if c == token)
    lower = tuple(i for i, c in counters.items() if c < token)
    return TokenChoice(token, committed, lower)


class TokenFloors:
    """The highest token this manager saw per resource, sent with each acquire as the
    counter's floor (docs/design.md §3). An optimisation only: forgetting one is safe,
    so the table is bounded (least recently used resources are dropped)."""

    CAPACITY = 4096

    def __init__(self, mutex: Mutex) -> None:
        self._floors: OrderedDict[str, int] = OrderedDict()
        self._mutex = mutex

    def after_fork(self, mutex: Mutex) -> None:
        self._mutex = mutex  # a parent thread may have held the old one at the fork

    def get(self, resource: str) -> int:
        with self._mutex:
            return self._floors.get(resource, 0)

    def raise_to(self, resource: str, token: int) -> None:
        with self._mutex:
            if token > self._floors.get(resource, 0):
                self._floors[resource] = token
            self._floors.move_to_end(resource)
            while len(self._floors) > self.CAPACITY:
                self._floors.popitem(last=False)
