"""The membership quorum rule, pure (docs/design.md §13.2): a stable configuration needs
a majority of its set, a joint one a majority of the old set and of the new; a client
counts only the members it knows."""

from __future__ import annotations

import itertools

import pytest

from redlock._core.members import Members, Rule, from_fields, stable, validate_change
from redlock.errors import MembershipError

ABC = ("a:1", "b:1", "c:1")
ABCDE = ("a:1", "b:1", "c:1", "d:1", "e:1")


def nodes(rule_addresses: tuple[str, ...], names: str) -> set[int]:
    return {rule_addresses.index(f"{n}:1") for n in names}


def test_stable_majority() -> None:
    rule = Rule(ABCDE, stable(ABCDE))
    assert rule.met(nodes(ABCDE, "abc"))
    assert not rule.met(nodes(ABCDE, "ab"))
    assert rule.lost(nodes(ABCDE, "abc"))
    assert not rule.lost(nodes(ABCDE, "ab"))
    assert rule.possible


def test_epoch_zero_is_the_configured_nodes() -> None:
    rule = Rule(ABC, stable(ABC))
    assert rule.epoch == 0 and rule.met({0, 1}) and not rule.met({2})


def test_joint_needs_both_majorities() -> None:
    joint = Members(1, ABC, ABCDE)
    rule = Rule(ABCDE, joint)
    assert not rule.met(nodes(ABCDE, "cde"))  # a majority of the new set only
    assert not rule.met(nodes(ABCDE, "ab"))  # a majority of the old set only
    assert rule.met(nodes(ABCDE, "abd"))
    assert rule.met(nodes(ABCDE, "bce"))
    # Two no-votes among A, B, C make it impossible however D and E answer.
    assert rule.lost(nodes(ABCDE, "ab")) and not rule.lost(nodes(ABCDE, "de"))


def test_old_client_learning_the_joint_configuration_needs_all_it_knows() -> None:
    """Growing 3 -> 5: a client given A, B, C must find 3 of the new 5 among them."""
    rule = Rule(ABC, Members(1, ABC, ABCDE))
    assert rule.possible
    assert not rule.met({0, 1})
    assert rule.met({0, 1, 2})
    assert rule.lost({2})  # one no and the new majority is out of reach


def test_a_client_that_cannot_reach_a_quorum_is_told() -> None:
    rule = Rule(("a:1",), stable(ABC, 2))
    assert not rule.possible
    with pytest.raises(MembershipError, match="cannot form a quorum"):
        rule.check()


def test_unknown_names_only_make_the_rule_stricter() -> None:
    rule = Rule(("a:1", "b:1", "other:1"), stable(ABC, 3))
    assert not rule.met({0, 2}) and rule.met({0, 1})


@pytest.mark.parametrize(("old", "new"), [(ABC, ABCDE), (ABCDE, ABC), (ABC, ("c:1", "d:1",
                                                                           "e:1"))])
def test_any_two_quorums_share_a_node_except_old_against_new(old: tuple[str, ...],
                                                             new: tuple[str, ...]) -> None:
    """The intersections the safety argument (§13.4) rests on, exhaustively."""
    everyone = tuple(dict.fromkeys(old + new))
    rules = {"old": Rule(everyone, stable(old, 0)), "joint": Rule(everyone, Members(1, old, new)),
             "new": Rule(everyone, stable(new, 2))}
    subsets = [set(c) for k in range(len(everyone) + 1)
               for c in itertools.combinations(range(len(everyone)), k)]
    quorums = {name: [s for s in subsets if r.met(s)] for name, r in rules.items()}
    for a, b in itertools.combinations_with_replacement(rules, 2):
        disjoint = any(not (x & y) for x in quorums[a] for y in quorums[b])
        assert disjoint == ({a, b} == {"old", "new"}), (a, b)


def test_record_fields_round_trip() -> None:
    joint = Members(4, ABC, ABCDE)
    assert from_fields(*joint.fields()) == joint
    assert from_fields(*(f.encode() for f in joint.fields())) == joint
    assert from_fields(None, None, None, None) is None
    assert from_fields(b"x", b"a:1", None, None) is None
    assert from_fields("5", "a:1", "", "1") == Members(5, ("a:1",), None, True)


def test_bad_new_sets() -> None:
    with pytest.raises(ValueError, match="empty"):
        validate_change(ABC, [])
    with pytest.raises(ValueError, match="twice"):
        validate_change(ABC, ["a:1", "a:1"])
    with pytest.raises(MembershipError, match="nothing to change"):
        validate_change(ABC, list(reversed(ABC)))
    assert validate_change(ABC, ABCDE) == ABCDE
