"""Repair (redlock/_core/amnesia/repair.py, docs/design.md §4.5) on scripted nodes:
``repair_node`` claims the node, reads every healthy node's counters (``read_counters``),
seeds the maximum and gives the marker back once the episode is one max_ttl old by the
node's clock; what makes it fail or wait; and the admin step ``repair()`` over every
node (judging restarted ones first, leaving nodes of another format alone)."""

from __future__ import annotations

import pytest

from tests.core.support import amnesiac_cluster, amnesiac_core
from tests.internals import (
    Call,
    bucket,
    drive,
    node_scripts,
    open_episodes,
    read_counters,
    repair_node,
)
from tests.scripted import (
    COUNTER,
    EPISODE,
    GUARD,
    MARKER,
    PASS,
    FakeClock,
    ScriptedNodes,
    make_core,
)


def test_repair_claims_the_node_reads_every_healthy_node_seeds_the_max_and_marks_it() -> None:
    _, nodes, core = amnesiac_core(max_ttl=60.0)
    nodes.begin_episode(0, ago=60.0)
    report = drive(repair_node(core, 0), nodes.execute)
    assert (report.node, report.status) == ("n0:6379", "repaired")
    assert report.detail == "2 fence counters re-seeded (highest 12)"
    assert {k: v for k, v in nodes.data[0].items() if k != MARKER} == {
        COUNTER: {bucket("a"): 12, bucket("b"): 6}}  # the highest of each bucket
    assert str(nodes.data[0][MARKER]).startswith(
        f"format=1 run_id={nodes.run_id(0)} repaired at=")
    assert core.amnesia.health.benched() == set()
    claim = nodes.broadcasts()[0].calls[0]
    assert claim.node == 0
    assert claim.args[:2] == ("SET", GUARD) and claim.args[3:] == ("NX", "PX", 60_000)
    probe = nodes.broadcasts()[1]
    assert [(c.node, c.args) for c in probe.calls] == [
        (i, ("EVAL", node_scripts.IDENTIFY.source, 1, MARKER)) for i in (1, 2, 3, 4)]
    assert nodes.commands_sent() == ["SET", "identify"] + ["HGETALL"] * 4 + [
        "seed_counters", "finish_repair"]
    [finish] = nodes.broadcasts()[-1].calls
    assert finish.keys == (GUARD, MARKER, EPISODE)
    assert (finish.args[0], finish.args[2]) == (claim.args[2], "1")  # its rejoin time:
    # checked node-side


def test_repair_reads_only_nodes_stamped_by_their_running_server() -> None:
    nodes = amnesiac_cluster()
    nodes.restart(4, keep_data=True)  # a suspect: its counters may be an older copy
    core = make_core(5)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "repaired"
    read = [b.calls[0].node for b in nodes.broadcasts()
            if b.calls[0].args[:1] == ("HGETALL",)]
    assert read == [1, 2, 3]
    assert nodes.counter(0, "a") == 10  # node 2's counter of a; only the suspect had 12


def test_repair_neither_reads_nor_repairs_a_node_of_another_format() -> None:
    """A node a newer release initialised (its marker names format 2, docs/design.md
    §4.1) is no source for this client's repair, and ``repair()`` reports it failed,
    naming the format, without touching it."""
    nodes = amnesiac_cluster()
    newer = f"format=2 run_id={nodes.run_id(4)} initialised by a newer release"
    nodes.data[4][MARKER] = newer
    core = make_core(5)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "repaired"
    read = [b.calls[0].node for b in nodes.broadcasts()
            if b.calls[0].args[:1] == ("HGETALL",)]
    assert read == [1, 2, 3]
    assert nodes.counter(0, "a") == 10  # node 4's 12 was not read
    nodes.data[0].clear()
    reports = drive(core.repair(force=True), nodes.execute)
    assert [(r.status, r.detail) for r in reports][4] == (
        "failed", "initialised by a newer format 2 of redlock-fenced (this client reads"
        " format 1): upgrade this client")
    assert [r.status for r in reports][:4] == ["repaired", "healthy", "healthy", "healthy"]
    assert nodes.data[4][MARKER] == newer
    assert core.amnesia.health.incompatible == {4: reports[4].detail.removesuffix(
        ": upgrade this client")}


def test_repair_fails_cleanly_when_fewer_than_a_quorum_of_healthy_nodes_answer() -> None:
    nodes = amnesiac_cluster(down={3})
    nodes.data[4].clear()  # another amnesiac node: no source
    core = make_core(5)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed"
    assert report.detail == ("read counters from 2 healthy nodes, need 3; the others could"
                             " not be read now: repair tries again")
    assert nodes.commands_sent()[-1] == "DEL"  # gave the claim back
    assert nodes.data[0] == {}  # no counter, no marker, no guard


def test_repair_with_a_majority_lost_names_the_way_out() -> None:
    nodes = amnesiac_cluster()
    for i in (3, 4):  # with node 0: three of five lost their data
        nodes.data[i].clear()
    report = drive(repair_node(make_core(5), 0, force=True), nodes.execute)
    assert report.status == "failed"
    assert report.detail == (
        "read counters from 2 healthy nodes, need 3; a majority of the nodes lost their"
        " data or are not trusted, so no repair can succeed and no lock can be granted:"
        " restore their data, or once every lock held before the loss has expired run"
        " `redlock initialise --force` (tokens may then restart below earlier ones, which"
        " fenced stores refuse; docs/design.md §4.8)")


@pytest.mark.parametrize("broken", ["HGETALL"])
def test_repair_does_not_count_a_source_whose_counters_could_not_be_read(broken: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)

    def sources_2_and_3_fail(call: Call) -> object:
        if call.node in (2, 3) and call.args[:1] == (broken,):
            return ConnectionError("reset")
        return PASS

    nodes.intercept = sources_2_and_3_fail
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed"
    assert report.detail.startswith("read counters from 2 healthy nodes, need 3; the others")
    assert nodes.data[0] == {}


@pytest.mark.parametrize(("claim", "detail"), [(None, "busy"),
                                                (TimeoutError("no reply"), "TimeoutError")])
def test_repair_that_cannot_claim_the_node_does_nothing(claim: object, detail: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)
    nodes.intercept = lambda call: claim if call.args[:1] == ("SET",) else PASS
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed"
    assert report.detail.startswith("could not claim the repair: " + detail)
    assert nodes.commands_sent() == ["SET"]


@pytest.mark.parametrize(("step", "detail"), [(node_scripts.SEED_COUNTERS, "seeding interrupted"),
                                              (node_scripts.FINISH_REPAIR, "marker not written")])
def test_repair_interrupted_by_the_node_losing_its_data_writes_no_marker(
        step: object, detail: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)
    core.amnesia.health.lost_data(0)

    def restarts_empty_first(call: Call) -> object:
        if call.script is step:
            nodes.restart(0, keep_data=False)  # the guard goes with the data
        return PASS

    nodes.intercept = restarts_empty_first
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed" and report.detail.startswith(detail)
    assert nodes.data[0] == {}
    assert core.amnesia.health.benched() == {0}


def test_read_counters_reads_the_nodes_counters_or_gives_up() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    assert drive(read_counters(core, 2), nodes.execute) == {}  # nothing yet
    nodes.set_counter(1, 9, "a")
    nodes.set_counter(1, 3, "b")
    assert drive(read_counters(core, 1), nodes.execute) == {bucket("a"): 9, bucket("b"): 3}
    assert nodes.commands_sent() == ["HGETALL"] * 2
    nodes.intercept = lambda call: TimeoutError() if call.args[:1] == ("HGETALL",) else PASS
    assert drive(read_counters(core, 1), nodes.execute) is None


def test_a_repair_waits_for_the_rejoin_time_by_the_nodes_clock_not_the_clients() -> None:
    clock, nodes, core = amnesiac_core(max_ttl=60.0)
    nodes.lease_horizon(60.0, [1, 2, 3, 4])
    out = 60.0 + core.settings.drift(60.0)
    drive(open_episodes(core.amnesia, [0]), nodes.execute)  # begins now, by node 0's clock
    begun = nodes.data[0][EPISODE]
    clock.advance(out)
    nodes.skew[0] = -10.0  # node 0's clock was set back 10 s meanwhile
    nodes.requests.clear()
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "waiting"
    assert nodes.commands_sent()[-5:] == ["seed_counters", "finish_repair", "DEL",
                                          "horizon", "open_episode"]
    assert MARKER not in nodes.data[0] and GUARD not in nodes.data[0]
    assert nodes.data[0][EPISODE] == begun  # (kept: earlier than a new bound from now)
    assert core.amnesia.health.rejoins_in(0, clock()) == pytest.approx(10.0)  # its clock
    clock.advance(10.0)  # its rejoin time by its clock now
    assert drive(repair_node(core, 0), nodes.execute).status == "repaired"
    assert nodes.healthy(0) and EPISODE not in nodes.data[0]


def test_repair_reports_every_node_and_repairs_only_at_its_rejoin_time_unless_forced() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(down={4}, clock=clock)
    nodes.lease_horizon(60.0, [1, 2, 3])  # node 4 is silent: the other three cover it
    core = make_core(5, clock, max_ttl=60.0)
    statuses = drive(core.repair(force=False), nodes.execute)
    assert nodes.commands_sent() == ["identify", "horizon", "open_episode"]
    assert [(r.status, r.detail[:12]) for r in statuses] == [
        ("waiting", "rejoins in 6"), ("healthy", ""), ("healthy", ""), ("healthy", ""),
        ("failed", "TimeoutError")]
    assert statuses[0].detail == ("rejoins in 60.6 s, once every lock it may have granted"
                                  " before it lost its data has expired")
    clock.advance(30.0)
    assert drive(core.repair(force=False), nodes.execute)[0].detail.startswith(
        "rejoins in 30.6 s")
    assert MARKER not in nodes.data[0]
    forced = drive(core.repair(force=True), nodes.execute)
    assert forced[0].status == "repaired"
    # The max over the sources that answered: 12 was only on the silent node.
    assert nodes.counter(0, "a") == 10
    assert [r.status for r in drive(core.repair(force=False), nodes.execute)] == [
        "healthy", "healthy", "healthy", "healthy", "failed"]


def test_repair_repairs_a_node_whose_episode_is_old_enough_without_force() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    nodes.begin_episode(0, ago=61.0)  # opened by another client a while ago
    core = make_core(5, clock, max_ttl=60.0)
    reports = drive(core.repair(force=False), nodes.execute)
    assert [r.status for r in reports] == ["repaired"] + ["healthy"] * 4
    assert nodes.healthy(0)


def test_repair_judges_restarted_nodes() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(5, clock=clock)
    nodes.restart(1, keep_data=True)  # durable: re-stamped
    nodes.restart(2, keep_data=True)  # its replication cannot be read: undecided

    def replication_unreadable(call: Call) -> object:
        return TimeoutError("no reply") if call.node == 2 and call.args[:1] == (
            "INFO",) else PASS

    nodes.intercept = replication_unreadable
    core = make_core(5, clock, max_ttl=60.0)
    reports = drive(core.repair(force=False), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [
        ("healthy", ""), ("healthy", ""),
        ("failed", "restarted; its persistence could not be checked"),
        ("healthy", ""), ("healthy", "")]
    assert nodes.healthy(1) and not nodes.healthy(2)
    assert core.amnesia.health.benched() == {2}


def test_repair_reports_a_node_it_demoted_as_waiting_for_its_episode() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(5, clock=clock)
    nodes.restart(2, keep_data=True, durable=False)
    nodes.lease_horizon(60.0, [0, 1, 3, 4])
    core = make_core(5, clock, max_ttl=60.0)
    reports = drive(core.repair(force=False), nodes.execute)
    assert MARKER not in nodes.data[2] and nodes.episode(2) is not None  # demoted
    assert (reports[2].status, reports[2].detail[:16]) == ("waiting", "rejoins in 60.6 ")


def test_repair_of_an_uninitialised_cluster_reports_it_healthy_and_writes_nothing() -> None:
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    reports = drive(core.repair(force=True), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [("healthy", "uninitialised cluster")] * 3
    assert nodes.commands_sent() == ["identify"]
    assert all(db == {} for db in nodes.data)
