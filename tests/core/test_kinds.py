"""The kinds of grant (docs/design.md §12.0), pure logic: which keys each kind uses (its
own, so a name's kinds never interfere), how a permit attempt picks its slot, and that
read and write lines keep the tickets' order with the mode in the score's parity."""

from __future__ import annotations

from tests.internals import KEYS, MUTEX, READ, WRITE, AcquireArgs, Leadership, Permit

ARGS = AcquireArgs("owner", 5000, 0, "1764086400123456", 1100)


def test_each_kind_has_keys_of_its_own() -> None:
    keys = {
        "lock": MUTEX.lock_key(KEYS, "x"),
        "leader": Leadership(identity="a").lock_key(KEYS, "x"),
        "permit": Permit(permits=2, slot=1).lock_key(KEYS, "x"),
        "write": WRITE.lock_key(KEYS, "x"),
        "read": READ.lock_key(KEYS, "x"),
    }
    assert len(set(keys.values())) == 5
    assert all("{x}" in key for key in keys.values())  # one hash tag per name
    channels = {kind.channel(KEYS, "x") for kind in (MUTEX, Leadership(), Permit(), WRITE)}
    assert len(channels) == 4 and READ.channel(KEYS, "x") == WRITE.channel(KEYS, "x")


def test_tokens_come_from_the_name_or_the_slot() -> None:
    assert WRITE.token_name("doc") == READ.token_name("doc") == "doc"
    assert Leadership().token_name("cron") == "cron"
    assert Permit(permits=3, slot=2).token_name("jobs") == "jobs:permit:2"
    assert len(Permit(permits=3).buckets(["jobs"])) == 3  # any slot, before a grant


def test_a_permit_keeps_the_slot_most_nodes_granted() -> None:
    kind = Permit(permits=3, preferred=0)
    replies = {0: [1, 7, 2], 1: [1, 9, 2], 2: [1, 4, 0], 3: [2, 5, 2]}
    held, kept = kind.granted(replies)
    assert isinstance(held, Permit) and held.slot == 2 and sorted(kept) == [0, 1, 3]
    assert held.stray(replies) == (2,)
    # A tie goes to the preferred slot, then the lowest.
    held, _ = Permit(permits=3, preferred=1).granted({0: [1, 1, 0], 1: [1, 1, 1]})
    assert held.slot == 1  # type: ignore[attr-defined]
    held, _ = Permit(permits=3, preferred=2).granted({0: [1, 1, 0], 1: [1, 1, 1]})
    assert held.slot == 0  # type: ignore[attr-defined]


def test_a_failed_permit_attempt_prefers_the_best_granted_slot_next() -> None:
    kind = Permit(permits=4, preferred=3)
    nxt = kind.next_attempt([[1, 5, 1], [0, 300], [1, 6, 1], [1, 2, 0], RuntimeError()])
    assert isinstance(nxt, Permit) and nxt.preferred == 1 and nxt.slot is None
    assert kind.next_attempt([[0, 300], [3, 1]]).preferred == 3  # type: ignore[attr-defined]


def test_concurrent_callers_start_on_different_slots() -> None:
    firsts = {Permit(permits=8).for_call(f"{i:032x}").preferred  # type: ignore[attr-defined]
              for i in range(64)}
    assert len(firsts) >= 6


def test_a_permit_release_names_every_slot_until_one_is_known() -> None:
    unknown = Permit(permits=3).release_call(KEYS, 0, "jobs", ("owner", "0", 500))
    known = Permit(permits=3, slot=1).release_call(KEYS, 0, "jobs", ("owner", "1"))
    assert len(unknown.keys) == 3 + 3 and len(known.keys) == 3 + 1
    assert unknown.args == ("owner", "0")  # no waiter's place to give back
    # A failed attempt of a waiter in line: its place back where the grant took it (§12.2).
    given_back = Permit(permits=3).release_call(KEYS, 0, "jobs", ("owner", "0", 500, "77"))
    assert given_back.args == ("owner", "0", 500, "77")
    read = READ.release_call(KEYS, 0, "doc", ("owner", "0", 500, "77"))
    assert read.args == ("owner", "0", 500, "154")  # a reader's score: the ticket, even
    assert READ.release_call(KEYS, 0, "doc", ("owner", "1")).args == ("owner", "1")


def test_read_write_lines_keep_ticket_order_with_the_mode_in_the_parity() -> None:
    [write] = WRITE.acquire_calls(KEYS, range(1), ("doc",), ARGS)
    [read] = READ.acquire_calls(KEYS, range(1), ("doc",), ARGS)
    w_score, r_score = int(write.args[4]), int(read.args[4])  # type: ignore[arg-type]
    assert w_score % 2 == 1 and r_score % 2 == 0 and w_score == r_score + 1
    assert w_score == 2 * int(ARGS.ticket) + 1  # exact: Lua would print 16 digits inexactly
    single = AcquireArgs("owner", 5000, 0, "", 1100)
    assert READ.acquire_calls(KEYS, range(1), ("doc",), single)[0].args[4] == ""
