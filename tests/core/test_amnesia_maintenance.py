"""The background maintenance (``maintenance``, redlock/_core/amnesia/maintenance.py,
docs/design.md §4.3-§4.5) on scripted nodes: judging restarted nodes (re-stamp the
durable ones, demote the others), amnesia episodes kept or begun anew by the node's
clock and server run, and the repairs it runs: when, how often, and what a second data
loss during the wait does."""

from __future__ import annotations

import threading

import pytest

from redlock import Outcome
from redlock.testing import capture_events
from tests.core.support import amnesiac_core, maintain
from tests.internals import (
    Call,
    Settings,
    drive,
    node_scripts,
    open_episodes,
)
from tests.scripted import (
    EPISODE,
    MARKER,
    PASS,
    FakeClock,
    ScriptedNodes,
    lock_key,
    make_core,
)


def test_maintenance_with_nothing_pending_ends_at_once() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    nodes.connect(core)
    assert not core.amnesia.needs_maintenance()
    maintain(core, nodes, sleeps=None)
    assert nodes.requests == []


# Leases of 60 s on the healthy nodes bound a lost node's absence to this (§4.3.1).
OUT_60 = 60.0 + Settings().drift(60.0)


def test_maintenance_stops_when_the_manager_closes() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    nodes.restart(2, keep_data=False)
    nodes.lease_horizon(60.0, [0, 1])
    core = make_core(3, clock, max_ttl=60.0, repair_interval=5.0)
    core.amnesia.health.lost_data(2)
    closed = threading.Event()
    closed.set()
    maintain(core, nodes, sleeps=None, stop=closed)  # closed before it began: nothing
    assert nodes.requests == []
    stop = maintain(core, nodes, sleeps=2)  # closed during its second wait
    assert stop.is_set()
    assert nodes.commands_sent() == ["horizon", "open_episode"]
    assert nodes.sleeps() == [5.0, 5.0]
    assert clock() == 1005.0  # the wait that the close cut short did not last
    assert core.amnesia.needs_maintenance()


@pytest.mark.parametrize("resp3", [False, True])
def test_judging_restamps_a_node_restarted_with_durable_persistence(resp3: bool) -> None:
    nodes = ScriptedNodes(3, resp3=resp3)
    judged = str(nodes.data[2][MARKER])
    nodes.restart(2, keep_data=True)  # appendonly yes, appendfsync always
    core = make_core(3)
    nodes.connect(core)
    with capture_events() as events:
        maintain(core, nodes, sleeps=None)  # ends by itself: nothing left to do
    assert nodes.commands_sent() == ["CONFIG", "restamp"]
    [config, restamp] = nodes.broadcasts()
    assert [(c.node, c.args) for c in config.calls] == [
        (2, ("CONFIG", "GET", "appendonly")), (2, ("CONFIG", "GET", "appendfsync")),
        (2, ("INFO", "replication"))]
    assert config.timeout == restamp.timeout == Settings().repair_timeout
    [call] = restamp.calls
    assert (call.node, call.keys, call.args[0]) == (2, (MARKER,),
                                                    judged.encode())
    assert nodes.healthy(2)
    assert str(nodes.data[2][MARKER]).startswith(nodes.stamp(2, "restamped at="))
    assert core.amnesia.health.benched() == set()
    assert [e["node"] for e in events if e["event"] == "redlock.node_restamped"] == ["n2:6379"]
    assert nodes.sleeps() == []
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert [r.outcome for r in result.outcomes] == [Outcome.GRANTED] * 3  # counts again


@pytest.mark.parametrize(("durable", "promoted", "why"), [
    (False, False, "restarted with appendonly no, appendfsync everysec: the last writes"
                   " may be lost"),
    (True, True, "a promoted replica (its copy may lag behind the old primary)"),
])
def test_judging_demotes_a_node_that_may_have_come_back_older(
        durable: bool, promoted: bool, why: str) -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    judged = str(nodes.data[2][MARKER])
    nodes.data[2][lock_key("r")] = "a holder"
    nodes.restart(2, keep_data=True, durable=durable, promoted=promoted)
    nodes.lease_horizon(60.0, [0, 1])  # the longest lease its peers granted
    core = make_core(3, clock, max_ttl=60.0, repair_interval=5.0)
    nodes.connect(core)
    with capture_events() as events:
        maintain(core, nodes, sleeps=1)
    assert nodes.commands_sent() == ["CONFIG", "horizon", "demote"]
    [horizon] = nodes.broadcasts()[1].calls[:1]
    assert horizon.node == 0 and [c.node for c in nodes.broadcasts()[1].calls] == [0, 1]
    [demote] = nodes.broadcasts()[2].calls
    out_ms = round(OUT_60 * 1000)
    assert (demote.keys, demote.args) == ((MARKER, EPISODE), (judged.encode(), why, out_ms))
    assert MARKER not in nodes.data[2]
    now = nodes.now_ms(2)
    assert nodes.episode(2) == (now, nodes.run_id(2), now + out_ms, why)
    assert nodes.data[2][lock_key("r")] == "a holder"  # its keys stay: they expire
    assert core.amnesia.health.suspect == {}
    assert core.amnesia.health.benched() == {2}
    assert core.amnesia.health.rejoins_in(2, clock()) == pytest.approx(OUT_60)
    assert [e["node"] for e in events if e["event"] == "redlock.node_amnesiac"] == ["n2:6379"]
    [out] = [e for e in events if e["event"] == "redlock.node_out"]
    assert (out["node"], out["rejoins_after_s"]) == ("n2:6379", pytest.approx(OUT_60))
    assert "the longest lease its peers granted or extended" in out["bounded_by"]
    assert nodes.sleeps() == [5.0]  # repair_interval: it rejoins 60.6 s from now
    # It refuses by itself now, and the acquire knows it: no look again.
    nodes.requests.clear()
    result = drive(core.acquire("s", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.outcomes[2].outcome is Outcome.AMNESIAC
    assert nodes.commands_sent() == ["acquire"]


def test_judging_identifies_the_node_again_when_its_marker_changed_meanwhile() -> None:
    nodes = ScriptedNodes(3)
    nodes.restart(2, keep_data=True)
    core = make_core(3)
    nodes.connect(core)

    def restamped_by_another_client(call: Call) -> object:
        if call.script is node_scripts.RESTAMP:
            nodes.run_script(2, node_scripts.RESTAMP, (MARKER,),
                             (nodes.data[2][MARKER], "by another client", nodes.run_id(2)))
        return PASS

    nodes.intercept = restamped_by_another_client
    maintain(core, nodes, sleeps=None)
    assert nodes.commands_sent() == ["CONFIG", "restamp", "identify"]
    assert str(nodes.data[2][MARKER]) == nodes.stamp(2, "by another client")  # left as is
    assert core.amnesia.health.benched() == set()


def test_judging_a_node_demoted_meanwhile_leaves_it_to_the_acquire_path() -> None:
    nodes = ScriptedNodes(3)
    nodes.restart(2, keep_data=True, durable=False)
    core = make_core(3)
    nodes.connect(core)

    def demoted_by_another_client(call: Call) -> object:
        if call.script is node_scripts.DEMOTE:
            nodes.run_script(2, node_scripts.DEMOTE, (MARKER, EPISODE),
                             (nodes.data[2][MARKER], "by another client", 5_000))
        return PASS

    nodes.intercept = demoted_by_another_client
    maintain(core, nodes, sleeps=None)
    assert nodes.commands_sent() == ["CONFIG", "horizon", "demote", "identify"]
    now = nodes.now_ms(2)
    assert nodes.episode(2) == (now, nodes.run_id(2), now + 5_000, "by another client")
    assert core.amnesia.health.benched() == set()  # not a suspect: no marker to judge
    nodes.intercept = None
    nodes.requests.clear()
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    assert nodes.commands_sent() == ["acquire", "EXISTS"]  # missing: looked at again
    assert core.amnesia.health.benched() == {2}


def test_a_suspect_that_cannot_be_judged_stays_suspect_and_is_judged_again_later() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    nodes.restart(2, keep_data=True)
    core = make_core(3, clock, repair_interval=5.0)
    nodes.connect(core)
    nodes.down = {2}
    maintain(core, nodes, sleeps=1)
    assert nodes.commands_sent() == ["CONFIG", "identify"]  # unreachable: nothing decided
    assert 2 in core.amnesia.health.suspect
    assert nodes.sleeps() == [5.0]
    nodes.down = set()
    nodes.requests.clear()
    maintain(core, nodes, sleeps=None)
    assert nodes.commands_sent() == ["CONFIG", "restamp"]
    assert core.amnesia.health.benched() == set() and nodes.healthy(2)


def test_an_episode_of_the_same_server_run_is_kept_one_from_another_run_begins_anew() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    nodes.data[2].clear()
    nodes.lease_horizon(60.0, [0, 1])
    begun = nodes.begin_episode(2, ago=45.0)  # another client opened it 45 s ago
    core = make_core(3, clock, max_ttl=60.0)
    health = core.amnesia.health
    health.lost_data(2)
    assert health.rejoins_in(2, clock()) is None  # not known before its episode is read
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    [call] = nodes.broadcasts()[1].calls  # (the first: its peers' horizons)
    assert (call.node, call.keys) == (2, (MARKER, EPISODE))
    assert nodes.data[2][EPISODE] == begun  # kept: the same server run, and earlier
    assert health.rejoins_in(2, clock()) == pytest.approx(15.0)  # by the node's clock
    # Restarted with its data (the episode key too): the run that began it is gone,
    # and its data may be older than the episode says.
    clock.advance(20.0)
    nodes.restart(2, keep_data=True)
    health.episode_unknown(2)
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    now = nodes.now_ms(2)
    assert nodes.episode(2) == (now, nodes.run_id(2), now + round(OUT_60 * 1000),
                                "lost its node marker")
    assert health.rejoins_in(2, clock()) == pytest.approx(OUT_60)
    # Unreachable: its rejoin time is kept until it answers.
    nodes.down = {2}
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    assert health.rejoins_in(2, clock()) == pytest.approx(OUT_60)
    # Repaired meanwhile by another client: healthy, nothing written.
    nodes.down = set()
    nodes.data[2][MARKER] = nodes.stamp(2, "repaired by another client")
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    assert health.benched() == set()


def test_a_benched_node_found_restarted_while_its_episode_is_read_is_still_judged() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock, max_ttl=60.0)
    nodes.attach(core)
    nodes.restart(2, keep_data=False)  # lost its data
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and core.amnesia.health.benched() == {2}
    # Another client repairs it; then it restarts without durable persistence: its data,
    # marker included, may be older than what it acknowledged.
    nodes.data[2][MARKER] = nodes.stamp(2, "repaired by another client")
    nodes.restart(2, keep_data=True, durable=False)
    nodes.requests.clear()
    maintain(core, nodes, sleeps=2)
    # Its peers' horizons, then its IDENTIFY rode on the first call to it.
    assert nodes.commands_sent()[:2] == ["horizon", "open_episode"]
    assert "demote" in nodes.commands_sent()
    assert MARKER not in nodes.data[2] and core.amnesia.health.benched() == {2}


def test_restamp_refuses_a_server_other_than_the_one_judged() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    nodes.attach(core)
    nodes.restart(2, keep_data=True)  # durable: would be re-stamped
    nodes.connect(core, [2])
    assert 2 in core.amnesia.health.suspect
    failovers = 0

    def failover_before_restamp(call: Call) -> object:
        nonlocal failovers
        if call.script is node_scripts.RESTAMP and not failovers:
            failovers += 1  # a replica with a copy of the marker took the node's place
            nodes.restart(2, keep_data=True, promoted=True)
        return PASS

    nodes.intercept = failover_before_restamp
    maintain(core, nodes, sleeps=1)
    assert not nodes.healthy(2)  # the promoted replica is not stamped unjudged
    assert 2 in core.amnesia.health.benched()


def test_maintenance_repairs_a_node_once_its_rejoin_time_has_come_then_ends() -> None:
    _, nodes, core = amnesiac_core(max_ttl=60.0, repair_interval=5.0)
    nodes.lease_horizon(60.0, [1, 2, 3, 4])
    with capture_events() as events:
        maintain(core, nodes, sleeps=None)
    # 60.6 s, looked at every repair_interval, and at its rejoin time.
    assert nodes.sleeps() == [5.0] * 12 + [pytest.approx(OUT_60 - 60.0)]
    assert nodes.commands_sent() == ["horizon", "open_episode", "SET", "identify"] + [
        "HGETALL"] * 4 + ["seed_counters", "finish_repair"]
    assert nodes.healthy(0) and EPISODE not in nodes.data[0]
    assert core.amnesia.health.benched() == set()
    assert [(e["node"], e["counters"], e["highest"], e["sources"]) for e in events
            if e["event"] == "redlock.node_repaired"] == [("n0:6379", 2, 12, 4)]


@pytest.mark.parametrize("loss", ["restart empty", "restart with its data", "flushall"])
def test_a_second_data_loss_during_the_wait_restarts_it(loss: str) -> None:
    clock, nodes, core = amnesiac_core(max_ttl=60.0, repair_interval=5.0)
    nodes.lease_horizon(60.0, [1, 2, 3, 4])
    maintain(core, nodes, sleeps=11)  # the episode began; 50 s of the wait went by
    first = nodes.episode(0)
    assert first is not None
    assert core.amnesia.health.rejoins_in(0, clock()) == pytest.approx(OUT_60 - 50.0)
    if loss == "flushall":
        nodes.data[0].clear()
    else:
        nodes.restart(0, keep_data=loss == "restart with its data")
    nodes.requests.clear()
    with capture_events() as events:
        maintain(core, nodes, sleeps=4)  # 60 s after the first loss: due by our clock
    assert nodes.commands_sent()[:2] == ["SET", "identify"]  # tried...
    assert nodes.commands_sent()[-4:] == [  # ...refused, and bounded anew
        "finish_repair", "DEL", "horizon", "open_episode"]
    assert "redlock.node_repaired" not in [e["event"] for e in events]
    assert MARKER not in nodes.data[0]
    again = nodes.episode(0)
    assert again is not None and again[1] == nodes.run_id(0)
    assert again[0] - first[0] == round(OUT_60 * 1000)  # begun anew at the refusal
    assert core.amnesia.health.rejoins_in(0, clock()) == pytest.approx(
        (again[2] - nodes.now_ms(0)) / 1000)


def test_maintenance_retries_a_failed_repair_only_after_repair_interval() -> None:
    clock, nodes, core = amnesiac_core(max_ttl=10.0, repair_interval=5.0, drift_factor=0.0)
    nodes.lease_horizon(10.0 - 0.002, [1, 2, 3, 4])  # rejoins 10 s after the loss
    claims: list[float] = []

    def reads_fail_twice(call: Call) -> object:
        if call.args[:1] == ("SET",):
            claims.append(clock())
        if len(claims) <= 2 and call.args[:1] == ("HGETALL",):
            return ConnectionError("reset")
        return PASS

    nodes.intercept = reads_fail_twice
    maintain(core, nodes, sleeps=None)
    assert [t - 1000.0 for t in claims] == [10.0, 15.0, 20.0]
    assert nodes.sleeps() == [5.0] * 4
    assert nodes.healthy(0) and core.amnesia.health.benched() == set()


def test_maintenance_repairs_as_soon_as_the_nodes_clock_says_after_a_too_early_try() -> None:
    """A repair tried a little early by the client's clock (the node's runs behind) is no
    failure: the episode is read again and the repair comes when the node's clock says,
    not one repair_interval later."""
    clock, nodes, core = amnesiac_core(max_ttl=10.0, repair_interval=5.0, drift_factor=0.0)
    nodes.lease_horizon(10.0 - 0.002, [1, 2, 3, 4])  # rejoins 10 s after the loss
    finishes: list[float] = []

    def node_clock_falls_behind(call: Call) -> object:
        if call.script is node_scripts.FINISH_REPAIR:
            finishes.append(clock())
            nodes.skew[0] = -2.0 if len(finishes) == 1 else nodes.skew.get(0, 0.0)
        return PASS

    nodes.intercept = node_clock_falls_behind
    maintain(core, nodes, sleeps=None)
    assert [t - 1000.0 for t in finishes] == [10.0, 12.0]
    assert nodes.healthy(0)
