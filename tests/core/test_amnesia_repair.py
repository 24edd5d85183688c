"""Repair (redlock/_core/amnesia/repair.py, docs/design.md §4.5) on scripted nodes:
``repair_node`` claims the node, reads every healthy node's counter and any per-resource
counters of the previous format it still holds (``read_counters``: page by page), seeds
the maximum and gives the marker back once the episode is one max_ttl old by the
node's clock; what makes it fail or wait; and the admin step ``repair()`` over every
node (judging restarted ones first)."""

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
    read_legacy_counters,
    repair_node,
)
from tests.scripted import (
    COUNTER,
    EPISODE,
    GUARD,
    KEYS,
    MARKER,
    PASS,
    FakeClock,
    ScriptedNodes,
    legacy_fence_key,
    lock_key,
    make_core,
)


def test_repair_claims_the_node_reads_every_healthy_node_seeds_the_max_and_marks_it() -> None:
    _, nodes, core = amnesiac_core(max_ttl=60.0)
    nodes.begin_episode(0, ago=60.0)
    report = drive(repair_node(core, 0), nodes.execute)
    assert (report.node, report.status) == ("n0:6379", "repaired")
    assert report.detail == "2 fence counters re-seeded (highest 12)"
    assert {k: v for k, v in nodes.data[0].items() if k not in (MARKER, *KEYS.barrier)} == {
        COUNTER: {bucket("a"): 12, bucket("b"): 6}}  # a's bucket, and b's old counter
    assert [nodes.data[0][k] for k in KEYS.barrier] == [
        node_scripts.BARRIER_EPISODE, node_scripts.BARRIER_CLAIM]
    assert str(nodes.data[0][MARKER]).startswith(f"run_id={nodes.run_id(0)} repaired at=")
    assert core.amnesia.health.benched() == set()
    claim = nodes.broadcasts()[0].calls[0]
    assert claim.node == 0
    assert claim.args[:2] == ("SET", GUARD) and claim.args[3:] == ("NX", "PX", 60_000)
    probe = nodes.broadcasts()[1]
    assert [(c.node, c.args) for c in probe.calls] == [
        (i, ("EVAL", node_scripts.IDENTIFY.source, 2, MARKER, KEYS.legacy_marker))
        for i in (1, 2, 3, 4)]
    # Each source: its counter, then the previous format's (MGET only where SCAN found some).
    assert nodes.commands_sent() == ["SET", "identify", "HGETALL", "SCAN"] + [
        "HGETALL", "SCAN", "MGET"] * 2 + ["HGETALL", "SCAN", "seed_counters", "finish_repair"]
    [finish] = nodes.broadcasts()[-1].calls
    assert finish.keys == (GUARD, MARKER, EPISODE, *KEYS.barrier)
    assert (finish.args[0], finish.args[2]) == (claim.args[2], 60_000)  # checked node-side


def test_repair_reads_only_nodes_stamped_by_their_running_server() -> None:
    nodes = amnesiac_cluster()
    nodes.restart(4, keep_data=True)  # a suspect: its counters may be an older copy
    core = make_core(5)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "repaired"
    scanned = [b.calls[0].node for b in nodes.broadcasts() if b.calls[0].args[:1] == ("SCAN",)]
    assert scanned == [1, 2, 3]
    assert nodes.counter(0, "a") == 10  # node 2's old counter of a; only the suspect had 12


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
        " data or are not trusted, so no repair can succeed: restore their data, or once"
        " every lock held before the loss has expired (max_ttl) run `redlock initialise"
        " --force` (docs/design.md §4.8)")


@pytest.mark.parametrize("broken", ["HGETALL", "SCAN", "MGET"])
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


def test_repair_reads_the_previous_formats_counters_page_by_page_and_seeds_the_max() -> None:
    nodes = ScriptedNodes(3, scan_page=100)
    nodes.restart(0, keep_data=False)
    for i in range(1200):
        for source in (1, 2):
            nodes.data[source][legacy_fence_key(f"r{i}")] = i + source
    core = make_core(3)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    buckets = {bucket(f"r{i}") for i in range(1200)}
    assert report.status == "repaired"
    assert report.detail == f"{len(buckets)} fence counters re-seeded (highest 1201)"
    # Each name's bucket holds at least its old counter (the highest of those sharing it).
    assert all(nodes.counter(0, f"r{i}") >= i + 2 for i in range(1200))
    assert not any(k.endswith(":fence") and k != COUNTER for k in nodes.data[0])
    seeds = [b for b in nodes.broadcasts() if b.calls[0].script is node_scripts.SEED_COUNTERS]
    assert [len(b.calls[0].args) for b in seeds] == [1 + 2 * len(buckets)]  # one call
    scans = [b.calls[0] for b in nodes.broadcasts() if b.calls[0].args[:1] == ("SCAN",)]
    assert len(scans) == 2 * 13  # 1201 keys on each source (the marker too): 13 pages


def test_read_counters_skips_keys_that_vanished_and_gives_up_on_a_malformed_page() -> None:
    nodes = ScriptedNodes(3, scan_page=3)
    for i, resource in enumerate("abc", start=1):
        nodes.data[1][legacy_fence_key(resource)] = i
    nodes.data[1][lock_key("a")] = "holder"
    core = make_core(3)
    nodes.intercept = lambda call: ([b"7"] + [None] * (len(call.args) - 2)
                                    if call.args[:1] == ("MGET",) else PASS)
    # Pages of three keys: (the marker, a, a's lock key), then (b, c); MATCH leaves the
    # counters. On each page MGET answers for the first key only: the others vanished.
    assert drive(read_legacy_counters(core, 1), nodes.execute) == {
        legacy_fence_key("a"): 7, legacy_fence_key("b"): 7}
    assert nodes.commands_sent() == ["SCAN", "MGET", "SCAN", "MGET"]
    assert [b.calls[0].args for b in nodes.broadcasts()][::2] == [
        ("SCAN", 0, "MATCH", "redlock:{*}:fence", "COUNT", 1000),
        ("SCAN", b"3", "MATCH", "redlock:{*}:fence", "COUNT", 1000)]  # cursor followed
    nodes.intercept = lambda call: b"garbage" if call.args[:1] == ("SCAN",) else PASS
    assert drive(read_legacy_counters(core, 1), nodes.execute) is None
    assert drive(read_counters(core, 1), nodes.execute) is None
    nodes.intercept = lambda call: TimeoutError() if call.args[:1] == ("MGET",) else PASS
    assert drive(read_legacy_counters(core, 1), nodes.execute) is None
    nodes.intercept = None
    nodes.scan_page = 1
    nodes.requests.clear()
    # A page that MATCH leaves empty is no reason to stop, nor to ask MGET.
    assert drive(read_legacy_counters(core, 1), nodes.execute) == {
        legacy_fence_key("a"): 1, legacy_fence_key("b"): 2, legacy_fence_key("c"): 3}
    assert nodes.commands_sent() == ["SCAN", "SCAN", "MGET", "SCAN", "SCAN", "MGET",
                                     "SCAN", "MGET"]
    assert drive(read_legacy_counters(core, 2), nodes.execute) == {}  # no counter at all
    # read_counters: per bucket, the highest of the node's own counters and those.
    assert drive(read_counters(core, 1), nodes.execute) == {
        bucket("a"): 1, bucket("b"): 2, bucket("c"): 3}
    nodes.set_counter(1, 9, "a")
    assert drive(read_counters(core, 1), nodes.execute)[bucket("a")] == 9  # type: ignore[index]
    assert drive(read_counters(core, 2), nodes.execute) == {}  # nothing yet


def test_a_repair_waits_for_max_ttl_by_the_nodes_clock_not_the_clients() -> None:
    clock, nodes, core = amnesiac_core(max_ttl=60.0)
    drive(open_episodes(core.amnesia, [0]), nodes.execute)  # begins now, by node 0's clock
    begun = nodes.data[0][EPISODE]
    clock.advance(60.0)
    nodes.skew[0] = -10.0  # node 0's clock was set back 10 s meanwhile
    nodes.requests.clear()
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "waiting"
    assert nodes.commands_sent()[-4:] == ["seed_counters", "finish_repair", "DEL",
                                          "open_episode"]
    assert MARKER not in nodes.data[0] and GUARD not in nodes.data[0]
    assert nodes.data[0][EPISODE] == begun
    assert core.amnesia.health.rejoins_in(0, clock()) == 10.0  # read again: its clock says
    clock.advance(10.0)  # one max_ttl by its clock now
    assert drive(repair_node(core, 0), nodes.execute).status == "repaired"
    assert nodes.healthy(0) and EPISODE not in nodes.data[0]


def test_repair_reports_every_node_and_repairs_only_after_one_max_ttl_unless_forced() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(down={4}, clock=clock)
    core = make_core(5, clock, max_ttl=60.0)
    statuses = drive(core.repair(force=False), nodes.execute)
    assert nodes.commands_sent() == ["identify", "open_episode"]
    assert [(r.status, r.detail[:12]) for r in statuses] == [
        ("waiting", "rejoins in 6"), ("healthy", ""), ("healthy", ""), ("healthy", ""),
        ("failed", "TimeoutError")]
    assert statuses[0].detail.startswith("rejoins in 60.0 s")
    clock.advance(30.0)
    assert drive(core.repair(force=False), nodes.execute)[0].detail.startswith(
        "rejoins in 30.0 s")
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
    core = make_core(5, clock, max_ttl=60.0)
    reports = drive(core.repair(force=False), nodes.execute)
    assert MARKER not in nodes.data[2] and nodes.episode(2) is not None  # demoted
    assert (reports[2].status, reports[2].detail[:16]) == ("waiting", "rejoins in 60.0 ")


def test_repair_of_an_uninitialised_cluster_reports_it_healthy_and_writes_nothing() -> None:
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    reports = drive(core.repair(force=True), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [("healthy", "uninitialised cluster")] * 3
    assert nodes.commands_sent() == ["identify"]
    assert all(db == {} for db in nodes.data)
