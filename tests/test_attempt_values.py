"""Each attempt of an acquire call sets a lock value of its own (docs/design.md §2.1),
for every kind of grant, on a real node: what an earlier attempt sent and the node ran
late (a lost reply, a stalled connection) changes nothing a later attempt of the call
set there, and a release that ends the call takes what any attempt of it set.

The mutex's scripts are also held to the model by tests/core/test_scripts_contract.py
(sequence ``attempts_of_one_call``); tests/faults/test_late_attempts.py plays the
whole sequence with both clients.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import redis

from redlock.testing import RedisNodes
from tests.internals import (
    KEYS,
    MUTEX,
    READ,
    WRITE,
    AcquireArgs,
    Call,
    Leadership,
    Permit,
    lock_value,
    waiter_id,
    with_epoch,
)
from tests.peek import write_markers

R = "attempts"
CALL = "89abcdef01234567" * 2
FIRST, SECOND = lock_value(CALL, 1), lock_value(CALL, 2)
TTL_MS = 30_000

KINDS: dict[str, Any] = {"lock": MUTEX, "semaphore": Permit(permits=2), "write": WRITE,
                         "read": READ, "election": Leadership(identity="me")}


def run(client: redis.Redis, call: Call) -> Any:
    assert call.script is not None
    return client.eval(call.script.source, len(call.keys), *call.keys, *call.args)


def acquire(client: redis.Redis, kind: Any, owner: str, attempt: int) -> list[Any]:
    """An attempt of a blocking acquire (ticket 1), as the flow sends it."""
    [call] = with_epoch(kind.acquire_calls(KEYS, range(1), (R,), AcquireArgs(
        owner, TTL_MS, 0, "1", 60_000, attempt)), KEYS, 0)
    return list(run(client, call))


def release(client: redis.Redis, kind: Any, owner: str, *, over: bool) -> int:
    """A failed attempt's give-back (``over`` False) or the release that ends the call."""
    args = (owner, "1") if over else (owner, "0", 60_000, "")
    return int(run(client, kind.release_call(KEYS, 0, R, args)))


def extend(client: redis.Redis, kind: Any, owner: str) -> int:
    [call] = with_epoch([kind.extend_call(KEYS, 0, R, owner, TTL_MS)], KEYS, 0)
    return int(run(client, call))


@pytest.mark.parametrize("name", list(KINDS))
def test_a_late_command_of_an_earlier_attempt_leaves_the_later_attempts_grant(
        nodes1: RedisNodes, name: str) -> None:
    kind = KINDS[name]
    write_markers(nodes1)
    with nodes1[0].client() as client:
        first = acquire(client, kind, FIRST, 1)
        assert first[0] == 1  # granted
        if isinstance(kind, Permit):  # (its extends and its release name the slot)
            kind = replace(kind, slot=first[2])
        # The first attempt failed elsewhere; its give-back did not arrive (yet). The
        # second attempt finds the first's grant: ours. (A reader: a grant of its own.)
        assert acquire(client, kind, SECOND, 2)[0] == (1 if kind is READ else 2)

        # Now the first attempt's ACQUIRE and RELEASE arrive, late.
        late = acquire(client, kind, FIRST, 1)
        if kind is READ:
            assert late[0] == 2  # its own read, as it was: the second's is not touched
        else:
            assert late[0] == 0  # refused: a later attempt of its call holds it
        release(client, kind, FIRST, over=False)
        assert extend(client, kind, SECOND) == 1  # the second attempt's grant is there

        if kind is not READ:  # a grant's key holds the second attempt's value
            [key] = [k.decode() for k in client.keys(f"*{{{R}}}*")
                     if client.type(k) == b"string"]
            assert client.get(key) == SECOND.encode()
            # The release that ends the call takes what any of its attempts set.
            assert release(client, kind, FIRST, over=True) == 1
            assert client.exists(key) == 0
        else:  # a reader's entry is its attempt's: the holder's release takes its own
            readers = KEYS.part(R, "read")
            assert [m.decode()[:40] for m in client.zrange(readers, 0, -1)] == [
                waiter_id(CALL)]
            assert release(client, kind, SECOND, over=True) == 1
            assert client.exists(readers) == 0
