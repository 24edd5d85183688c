"""The quorum, validity and token rules (docs/design.md §2, §3): pure functions, and the
token floors a manager keeps."""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from redlock._core.environment import Mutex
from redlock._core.settings import Settings
from redlock._scripts.shared import CALL_DIGITS as CALL_DIGITS  # (the scripts' too)

#: Tokens are Lua numbers on the nodes, exact integers only below 2**53: an
#: acquisition whose token would reach it fails instead of issuing an inexact one.
TOKEN_LIMIT = 2**53


def quorum(node_count: int) -> int:
    """Majority of N: N // 2 + 1."""
    return node_count // 2 + 1


#: A node keeps this many fence counters, the fields of one hash (docs/design.md §3.0):
#: a resource's tokens come from the one its name hashes to. Enough that resources
#: locked at the same moment rarely share one (sharing costs nothing in safety, only a
#: write-back round when concurrent grants reach the nodes in different orders), few
#: enough to stay a small fixed set (about 60 KiB per node). Never change it, nor
#: :func:`bucket`: a resource that moved to another bucket could get a token below one it
#: already had (tests/core/test_rules.py pins both).
COUNTER_BUCKETS = 1024


@functools.lru_cache(maxsize=4096)  # (pure; asked on every attempt: kept for recent names)
def bucket(resource: str) -> str:
    """The field of the node's counters hash that ``resource``'s tokens come from."""
    return str(zlib.crc32(resource.encode()) % COUNTER_BUCKETS)



def lock_value(call: str, attempt: int) -> str:
    """The lock value an attempt of the acquire call ``call`` sets (docs/design.md §2.1): the
    call's secret, then the attempt's number in 8 hex digits, so that two values of one call
    compare as their attempts do. A command of an earlier attempt that reaches a node late (a reply
    lost, a connection stalled) then cannot delete or refresh what a later attempt set there."""
    return f"{call}{attempt:08x}"


def waiter_id(value: str) -> str:
    """An acquire call's name in the nodes' waiting lines and wake-up messages: SHA1 of
    its secret, the lock values' first :data:`CALL_DIGITS` (the scripts compute the
    same; every attempt of the call is the same waiter), which does not reveal it."""
    return hashlib.sha1(value[:CALL_DIGITS].encode()).hexdigest()


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
    """Per bucket, the highest fence counter this manager saw a node report, sent with
    each acquire as the counter's floor (docs/design.md §3.5): it lifts a node that
    lagged behind, so that the granting nodes agree and no write-back round is needed.
    An optimisation only: every value in it was a node's counter, and raising a counter
    is always safe; forgetting it (a new process) is safe too. One int per bucket."""

    def __init__(self, mutex: Mutex) -> None:
        self._floors = [0] * COUNTER_BUCKETS
        self._mutex = mutex

    def after_fork(self, mutex: Mutex) -> None:
        self._mutex = mutex  # a parent thread may have held the old one at the fork

    def get(self, buckets: Sequence[str]) -> int:
        """The floor of a set of buckets (:func:`bucket` of each resource)."""
        if len(buckets) == 1:  # (a lock of one resource: every attempt)
            return self._floors[int(buckets[0])]
        return max(self._floors[int(b)] for b in buckets)

    def raise_to(self, buckets: Sequence[str], counter: int) -> None:
        if len(buckets) == 1:  # (every grant of one resource) without the lock: threads
            index = int(buckets[0])  # that raise one floor at once may lose the higher
            if counter > self._floors[index]:  # raise, which a hint can spare
                self._floors[index] = counter
            return
        with self._mutex:
            for b in buckets:
                if counter > self._floors[int(b)]:
                    self._floors[int(b)] = counter
