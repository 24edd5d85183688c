"""Changing the cluster's nodes online (docs/design.md §13.3), free of I/O: through a joint
configuration, each step idempotent, so a change that stopped anywhere is completed by running it
again. The manager that runs it must be configured with every node of the old and new sets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redlock._core.amnesia.repair import read_counters
from redlock._core.members import Members, Rule, stable, validate_change
from redlock._core.requests import Broadcast, Call, Flow, Pause
from redlock._core.tokens import quorum
from redlock._observe.log import get_logger
from redlock._scripts import node as node_scripts
from redlock._scripts.record import members_record, members_written
from redlock._scripts.replies import (
    acked,
    failure_detail,
    foreign,
    identity,
    marker_format,
    other_format,
)
from redlock.errors import MembershipError

if TYPE_CHECKING:
    from redlock._core.algorithm import RedlockCore

logger = get_logger("redlock.nodes")


@dataclass(frozen=True)
class MembersChange:
    """What a membership change did: the configuration it left (``epoch``,
    ``members``), the members before it, the nodes it seeded and retired, the nodes
    that did not take their final record (``unreached``: a removed node there keeps its
    joint record, which is safe; see docs/operations.md), and how long it waited."""

    epoch: int
    members: tuple[str, ...]
    previous: tuple[str, ...]
    seeded: tuple[str, ...]
    retired: tuple[str, ...]
    unreached: tuple[str, ...]
    waited: float


def read_members(core: RedlockCore) -> Flow[dict[int, Members | None]]:
    """Every node's membership record (None: it has none); nodes that did not answer
    are left out."""
    keys, timeout = core.keys, core.settings.repair_timeout
    replies = yield Broadcast(tuple(
        Call(i, ("HMGET", keys.members, "epoch", "members", "joining", "retired"))
        for i in range(core.n)), timeout)
    found: dict[int, Members | None] = {}
    for i, reply in enumerate(replies):
        record = members_record(reply)
        if record is None or isinstance(record, Members):
            found[i] = record
    return found


def current_members(core: RedlockCore) -> Flow[Members]:
    """The cluster's configuration as the nodes hold it: the record of the highest epoch
    read from a majority of its sets (MembershipError if too few answered), or epoch 0,
    the manager's nodes, when no node has a record."""
    found = yield from read_members(core)
    config = _highest(core, found, None)
    if config.epoch:
        core.membership.adopt(config)
    return config


def _highest(core: RedlockCore, found: dict[int, Members | None],
             fallback: Sequence[str] | None) -> Members:
    records = [r for r in found.values() if r is not None]
    top = max(records, key=lambda r: r.epoch, default=None)
    config = (Members(top.epoch, top.members, top.joining) if top is not None
              else stable(core.addresses if fallback is None else fallback))
    # Every record of a higher epoch was written on a majority of each of this one's
    # sets (or of the sets before it): reading a majority of them finds it.
    rule = Rule(core.addresses, config)
    if not rule.met(found):
        raise MembershipError(
            f"read the membership record of {len(found)} of {core.n} nodes, not a majority"
            f" of every set of {config}: a newer record may be on the others; try again"
            " once they answer")
    return config


def change_members(core: RedlockCore, new: Sequence[str], *, current: Sequence[str] | None,
                   wait: float | None) -> Flow[MembersChange]:
    """Make ``new`` the cluster's members (docs/design.md §13.3). ``current``: the
    members now, needed only for a cluster that never changed (no record on any node;
    by default its nodes that have their marker). ``wait``: how long every lock granted
    before the change may still be valid (default ``max_ttl`` and its drift)."""
    settings, addresses = core.settings, core.addresses
    timeout = settings.repair_timeout
    new = tuple(new)
    missing = [a for a in new if a not in addresses]
    if missing:
        raise ValueError(f"the manager must be configured with every node of the new set:"
                         f" {', '.join(missing)} is not among its nodes"
                         f" ({', '.join(addresses)})")
    if core.layout.clusters:  # (its record would be one per hash slot: not built yet)
        raise MembershipError(
            "a membership change with a Redis Cluster among the nodes is not supported"
            " (docs/proposals/cluster.md, P7)")
    if wait is None:
        wait = settings.max_ttl + settings.drift(settings.max_ttl)
    index = {a: i for i, a in enumerate(addresses)}

    # 1. Read: the records, and which nodes are reachable and marked.
    found = yield from read_members(core)
    probe = yield Broadcast(tuple(core.amnesia.identify_call(i) for i in range(core.n)), timeout)
    other = [i for i, reply in enumerate(probe) if foreign(reply)]
    if other:
        found_format = marker_format((identity(probe[other[0]]) or ("", b""))[1] or b"")
        raise MembershipError(f"node {addresses[other[0]]} was"
                              f" {other_format(found_format)}: upgrade this client; nothing"
                              " was changed")
    if current is None and not any(r is not None for r in found.values()):
        silent = [addresses[i] for i, reply in enumerate(probe) if identity(reply) is None]
        if silent:
            raise MembershipError(f"no node has a membership record and {', '.join(silent)}"
                                  " did not answer: pass current= (the members now)")
        current = [addresses[i] for i, reply in enumerate(probe)
                   if (identity(reply) or ("", None))[1] is not None]
        if not current:
            raise MembershipError("no node has its marker (a new cluster): initialise it"
                                  " first, or pass current=")
    config = _highest(core, found, current)
    if config.joint:
        if config.joining != new:
            raise MembershipError(f"another change is in progress ({config}): complete it"
                                  " first (run it again with its new set)")
        old, joint = config.members, config
    else:
        old = config.members
        if set(old) == set(new) and config.epoch > 0:
            # Done already (a re-run): make sure the final records are everywhere.
            old, joint = old, None
        else:
            validate_change(old, new)
            joint = Members(config.epoch + 1, old, new)
    outside = [a for a in old if a not in index]
    if outside:
        raise ValueError(f"the manager must be configured with every current member too:"
                         f" {', '.join(outside)} is not among its nodes")
    joining = [index[a] for a in new if a not in old]
    silent = [addresses[i] for i in joining if identity(probe[i]) is None]
    if silent:
        raise MembershipError(f"new node {', '.join(silent)} did not answer"
                              f" ({failure_detail(probe[index[silent[0]]])}): a node is"
                              " added only once it can be seeded; nothing was changed")
    if joint is None:
        final = Members(config.epoch, tuple(new))
        unreached = yield from _finish(core, final, old)
        return MembersChange(final.epoch, final.members, old, (), (), unreached, 0.0)
    logger.warning("redlock.members_change_started", epoch=joint.epoch, old=list(old),
                   new=list(new), wait_s=round(wait, 3))

    # 2. The joint record on every node of O and N together; a majority of O and of N must take it.
    everyone = sorted({index[a] for a in old + new})
    written = yield from _write(core, everyone, joint)
    if not Rule(addresses, joint).met(written):
        raise MembershipError(f"the joint configuration ({joint}) reached"
                              f" {', '.join(addresses[i] for i in sorted(written))} only:"
                              " a majority of the old and of the new set must take it; run"
                              " the change again once they answer")
    joined_at = core.clock()
    logger.info("redlock.members_joint", epoch=joint.epoch,
                acknowledged=[addresses[i] for i in sorted(written)])

    # 3. Seed the new nodes: they serve at once.
    seeded = yield from _seed(core, joint, [index[a] for a in old], joining)
    if len(seeded) < len(joining):
        raise MembershipError("new node(s) "
                              + ", ".join(addresses[i] for i in joining if i not in seeded)
                              + " could not be seeded; run the change again")

    # 4. Every lock granted before the joint record has expired by then.
    left = joined_at + wait - core.clock()
    if left > 0:
        logger.info("redlock.members_waiting", epoch=joint.epoch, seconds=round(left, 3))
        yield Pause(left)

    # 5. Seed every node of N again from a majority of O: tokens committed under the old
    # configuration are then below every counter a majority of N holds.
    reseeded = yield from _seed(core, joint, [index[a] for a in old], [index[a] for a in new])
    if not Rule(addresses, stable(new)).met(reseeded):
        raise MembershipError(f"the new set's counters were seeded on {len(reseeded)} of"
                              f" {len(new)} nodes, need {quorum(len(new))}; run the change"
                              " again")

    # 6. The stable record on N; the nodes that leave are retired.
    final = Members(joint.epoch + 1, tuple(new))
    unreached = yield from _finish(core, final, old)
    return MembersChange(final.epoch, final.members, old, tuple(addresses[i] for i in joining),
                         tuple(a for a in old if a not in new and a not in unreached), unreached,
                         round(max(0.0, left), 3))


def _write(core: RedlockCore, nodes: Sequence[int], record: Members) -> Flow[set[int]]:
    """WRITE_MEMBERS on ``nodes``: those that took it (or had it). A node with a newer
    record means another change overtook this one: MembershipError."""
    calls = tuple(Call(i, record.fields(), node_scripts.WRITE_MEMBERS, (core.keys.members,))
                  for i in nodes)
    replies = yield Broadcast(calls, core.settings.repair_timeout)
    written: set[int] = set()
    for call, reply in zip(calls, replies, strict=True):
        done, there = members_written(reply)
        if done:
            written.add(call.node)
        elif there is not None and not (there.retired and record.retired):
            raise MembershipError(f"node {core.addresses[call.node]} holds a newer membership"
                                  f" record ({there}) than this change's ({record}): another"
                                  " change overtook it")
    return written


def _seed(core: RedlockCore, joint: Members, sources: Sequence[int],
          targets: Sequence[int]) -> Flow[set[int]]:
    """Per bucket the highest counter of a majority of ``sources`` (the old set), written on
    ``targets`` (max-merge) with their marker if they have none; the targets that took it."""
    if not targets:
        return set()
    seed: dict[str, int] = {}
    complete = 0
    for source in sources:
        counters = yield from read_counters(core.amnesia, (source,))
        if counters is None:
            continue
        complete += 1
        for field, value in counters.items():
            seed[field] = max(value, seed.get(field, 0))
    if complete < quorum(len(sources)):
        raise MembershipError(f"read the fence counters of {complete} of the {len(sources)}"
                              f" current members, need {quorum(len(sources))}; run the change"
                              " again once they answer")
    keys = core.keys
    pairs = [arg for field, value in sorted(seed.items()) for arg in (field, value)]
    calls = tuple(Call(i, (f"joined at={int(core.env.wall_clock())} epoch={joint.epoch}",
                           joint.epoch, *pairs), node_scripts.SEED_MEMBER,
                       (keys.counter, keys.marker, keys.episode, keys.repair_guard,
                        keys.members))
                  for i in targets)
    replies = yield Broadcast(calls, core.settings.repair_timeout)
    seeded = {call.node for call, reply in zip(calls, replies, strict=True) if acked(reply)}
    for i in seeded:
        core.amnesia.health.marked(i)
    logger.info("redlock.members_seeded", epoch=joint.epoch,
                nodes=[core.addresses[i] for i in sorted(seeded)],
                highest=max(seed.values(), default=0))
    return seeded


def _finish(core: RedlockCore, final: Members, old: Sequence[str]) -> Flow[tuple[str, ...]]:
    """The stable record on the new members (a majority must take it), retired on the
    nodes that leave; the nodes that did not take theirs."""
    addresses, index = core.addresses, {a: i for i, a in enumerate(core.addresses)}
    members = [index[a] for a in final.members]
    leaving = [index[a] for a in old if a not in final.members]
    written = yield from _write(core, members, final)
    if not Rule(addresses, final).met(written):
        raise MembershipError(f"the new configuration ({final}) reached {len(written)} of"
                              f" {len(members)} nodes, need {quorum(len(members))}; run the"
                              " change again")
    retired = Members(final.epoch, final.members, None, True)
    gone = yield from _write(core, leaving, retired)
    core.membership.adopt(final, learnt=False)
    unreached = tuple(addresses[i] for i in members + leaving
                      if i not in written and i not in gone)
    logger.warning("redlock.members_changed", epoch=final.epoch, members=list(final.members),
                   retired=[addresses[i] for i in leaving if i in gone], unreached=list(unreached))
    return unreached
