"""The fault tests' history checker catches what it must (synthetic histories)."""

from __future__ import annotations

from collections.abc import Sequence

from lock_history import ACCEPTED, REJECTED, History, Hold, WriteRecord


def _history(holds: Sequence[Hold], writes: Sequence[WriteRecord] = ()) -> History:
    history = History()
    for hold in holds:
        history.held(hold)
    for write in writes:
        history.wrote(write)
    return history


def test_a_clean_history_passes() -> None:
    history = _history(
        [Hold("a", "r", 1, 0.0, 1.0, 0.0), Hold("b", "r", 2, 1.5, 2.0, 1.0)],
        [WriteRecord("a", "r", 1, 0.1, 0.2, ACCEPTED),
         WriteRecord("a", "r", 1, 0.3, 0.4, ACCEPTED),
         WriteRecord("b", "r", 2, 1.6, 1.7, ACCEPTED),
         WriteRecord("a", "r", 1, 1.8, 1.9, REJECTED)])
    assert history.violations(exclusive=True) == []


def test_shared_and_backwards_tokens_are_violations() -> None:
    shared = _history([Hold("a", "r", 3, 0.0, 1.0), Hold("b", "r", 3, 2.0, 3.0)])
    assert any("committed twice" in p for p in shared.violations(exclusive=False))
    backwards = _history([Hold("a", "r", 5, 0.0, 1.0), Hold("b", "r", 4, 2.0, 3.0, 1.5)])
    assert any("acquired after" in p for p in backwards.violations(exclusive=False))
    # Concurrent acquisitions (b invoked before a completed) may complete in any order.
    concurrent = _history([Hold("a", "r", 5, 1.0, 1.2, 0.0), Hold("b", "r", 4, 1.3, 2.0, 0.5)])
    assert concurrent.tokens_out_of_order() == []


def test_writes_accepted_out_of_order_are_violations() -> None:
    history = _history([], [WriteRecord("b", "r", 2, 0.0, 0.1, ACCEPTED),
                            WriteRecord("a", "r", 1, 0.2, 0.3, ACCEPTED)])
    assert history.writes_out_of_order()
    same_token_other_client = _history([], [WriteRecord("b", "r", 2, 0.0, 0.1, ACCEPTED),
                                            WriteRecord("a", "r", 2, 0.2, 0.3, ACCEPTED)])
    assert same_token_other_client.writes_out_of_order()
    other_resource = _history([], [WriteRecord("b", "r", 2, 0.0, 0.1, ACCEPTED),
                                   WriteRecord("a", "s", 1, 0.2, 0.3, ACCEPTED)])
    assert other_resource.writes_out_of_order() == []


def test_overlaps_count_only_when_exclusion_is_required() -> None:
    history = _history([Hold("a", "r", 1, 0.0, 1.0), Hold("b", "r", 2, 0.5, 1.5),
                        Hold("c", "s", 1, 0.5, 1.5)])
    assert len(history.overlaps()) == 1
    assert history.violations(exclusive=False) == []
    assert any("overlap" in p for p in history.violations(exclusive=True))
