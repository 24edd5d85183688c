"""The history checker (redlock/testing/history.py) catches what it must, on synthetic histories:
lock runs (holds and their writes) and fenced-store runs (:func:`check`)."""

from __future__ import annotations

from collections.abc import Sequence

from redlock.testing.history import ACCEPTED, REJECTED, History, Hold, Write, check


def _history(holds: Sequence[Hold], writes: Sequence[Write] = ()) -> History:
    history = History()
    for hold in holds:
        history.held(hold)
    for write in writes:
        history.wrote(write)
    return history


def test_a_clean_history_passes() -> None:
    history = _history(
        [Hold("a", "r", 1, 0.0, 1.0, 0.0), Hold("b", "r", 2, 1.5, 2.0, 1.0)],
        [Write("a", "r", 1, 0.1, 0.2, ACCEPTED),
         Write("a", "r", 1, 0.3, 0.4, ACCEPTED),
         Write("b", "r", 2, 1.6, 1.7, ACCEPTED),
         Write("a", "r", 1, 1.8, 1.9, REJECTED)])
    assert history.violations(exclusive=True) == []


def test_shared_and_backwards_tokens_are_violations() -> None:
    shared = _history([Hold("a", "r", 3, 0.0, 1.0), Hold("b", "r", 3, 2.0, 3.0)])
    assert any("committed twice" in p for p in shared.violations(exclusive=False))
    backwards = _history([Hold("a", "r", 5, 0.0, 1.0),
                          Hold("b", "r", 4, 2.0, 3.0, 1.5)])
    assert any("acquired after" in p for p in backwards.violations(exclusive=False))
    # Concurrent acquisitions (b invoked before a completed) may complete in any order.
    concurrent = _history([Hold("a", "r", 5, 1.0, 1.2, 0.0), Hold("b", "r", 4, 1.3, 2.0, 0.5)])
    assert concurrent.tokens_out_of_order() == []


def test_writes_accepted_out_of_order_are_violations() -> None:
    history = _history([], [Write("b", "r", 2, 0.0, 0.1, ACCEPTED),
                            Write("a", "r", 1, 0.2, 0.3, ACCEPTED)])
    assert history.writes_out_of_order()
    same_token_other_client = _history([], [Write("b", "r", 2, 0.0, 0.1, ACCEPTED),
                                            Write("a", "r", 2, 0.2, 0.3, ACCEPTED)])
    assert same_token_other_client.writes_out_of_order()
    other_resource = _history([], [Write("b", "r", 2, 0.0, 0.1, ACCEPTED),
                                   Write("a", "s", 1, 0.2, 0.3, ACCEPTED)])
    assert other_resource.writes_out_of_order() == []


def test_overlaps_count_only_when_exclusion_is_required() -> None:
    history = _history([Hold("a", "r", 1, 0.0, 1.0), Hold("b", "r", 2, 0.5, 1.5),
                        Hold("c", "s", 1, 0.5, 1.5)])
    assert len(history.overlaps()) == 1
    assert history.violations(exclusive=False) == []
    assert any("overlap" in p for p in history.violations(exclusive=True))


def test_store_check_passes_a_clean_run_and_counts_equal_tokens() -> None:
    stats = check([Write("a", "r", 1, 0.0, 0.1, ACCEPTED, "a1"),
                   Write("b", "r", 1, 0.2, 0.3, ACCEPTED, "b1"),  # equal: fine for a store
                   Write("a", "r", 0, 0.4, 0.5, REJECTED, "a0", highest=1),
                   Write("b", "r", 2, 0.6, 0.7, ACCEPTED, "b2")],
                  {"r": (b"b2", 2)})
    stats.assert_clean()
    assert (stats.tried, stats.accepted, stats.rejected, stats.equal_token_accepts) == (4, 3, 1, 1)


def test_store_check_finds_lost_updates_undeserved_rejections_and_a_wrong_final_state() -> None:
    lost = check([Write("a", "r", 5, 0.0, 0.1, ACCEPTED, "a5"),
                  Write("b", "r", 4, 0.2, 0.3, ACCEPTED, "b4")], {"r": (b"a5", 5)})
    assert lost.lost == 1 and "update was lost" in lost.problems[0]
    # Overlapping writes may be accepted in either order.
    assert check([Write("a", "r", 5, 0.0, 0.3, ACCEPTED, "a5"),
                  Write("b", "r", 4, 0.2, 0.4, ACCEPTED, "b4")], {"r": (b"a5", 5)}).lost == 0
    undeserved = check([Write("a", "r", 3, 0.0, 0.1, REJECTED, "a3", highest=9)], {})
    assert undeserved.undeserved_rejections == 1
    final = check([Write("a", "r", 5, 0.0, 0.1, ACCEPTED, "a5")], {"r": (b"other", 5)})
    assert final.lost == 1 and "final state" in final.problems[0]


def test_permits_held_at_once_are_counted() -> None:
    history = _history([Hold("a", "s:permit:0", 1, 0.0, 2.0),
                        Hold("b", "s:permit:1", 1, 1.0, 3.0),
                        Hold("c", "s:permit:0", 2, 2.0, 4.0),
                        Hold("d", "t:permit:0", 1, 0.0, 9.0)])
    assert history.most_at_once("s:permit:") == 2  # c starts as a ends: not three
    assert history.most_at_once() == 3


def test_read_write_rules() -> None:
    clean = _history([Hold("w1", "d", 4, 0.0, 1.0, mode="w"),
                      Hold("r1", "d", 4, 1.1, 2.0, 1.05, mode="r"),
                      Hold("r2", "d", 4, 1.2, 2.1, 1.1, mode="r"),
                      Hold("w2", "d", 5, 2.2, 3.0, 2.15, mode="w")])
    assert clean.rw_violations("d") == []
    overlap = _history([Hold("w", "d", 4, 0.0, 1.0, mode="w"),
                        Hold("r", "d", 4, 0.5, 2.0, mode="r")])
    assert any("overlaps" in p for p in overlap.rw_violations("d"))
    blind = _history([Hold("w", "d", 7, 0.0, 1.0, mode="w"),
                      Hold("r", "d", 6, 1.5, 2.0, 1.2, mode="r")])
    assert any("below earlier write" in p for p in blind.rw_violations("d"))
    stale = _history([Hold("r", "d", 6, 0.0, 1.0, mode="r"),
                      Hold("w", "d", 6, 1.5, 2.0, 1.2, mode="w")])
    assert any("no larger token" in p for p in stale.rw_violations("d"))
    backwards = _history([Hold("a", "d", 6, 0.0, 1.0, mode="w"),
                          Hold("b", "d", 5, 1.5, 2.0, 1.2, mode="w")])
    assert any("acquired after" in p for p in backwards.rw_violations("d"))
