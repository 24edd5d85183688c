"""The `redlock` command line on real redis-server nodes: exit codes, --json shapes, the
one-line errors (never a traceback), confirmation of forced steps. Run both in a
subprocess (`python -m redlock`, the console script) and in-process (`cli.main`)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from redlock import LockLost, Redlock, cli
from redlock._scripts.hash_slots import hash_slot
from redlock.testing import RedisNodes
from redlock.testing.redis_cluster import RedisClusterNodes
from redlock.testing.redis_nodes import free_port
from tests.internals import KEYS, bucket, cli_render


def run(*args: str, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m redlock ARGS` in a subprocess; never a traceback, whatever happens."""
    result = subprocess.run([sys.executable, "-m", "redlock", *args], capture_output=True,
                            text=True, timeout=60, check=False, input=stdin,
                            env={**os.environ, **(env or {})})
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def dead_url() -> str:
    return f"redis://127.0.0.1:{free_port()}"


def hold(urls: list[str], resource: str, ttl: float = 30.0, times: int = 1) -> Any:
    dlm = Redlock(urls)
    lock = dlm.lock(resource, ttl=ttl)
    for _ in range(times - 1):
        assert lock.acquire(blocking=False)
        lock.release()
    assert lock.acquire(blocking=False)
    return dlm, lock


def lock_keys_present(nodes: RedisNodes, resource: str) -> int:
    count = 0
    for node in nodes:
        with node.client() as client:
            count += client.exists(KEYS.lock(resource))
    return count


class FakeTerminal(io.StringIO):
    """stdin at a terminal with the operator's answer typed in."""

    def isatty(self) -> bool:
        return True


# -- status -----------------------------------------------------------------------------


def test_status_json_has_the_stable_shape(nodes3: RedisNodes) -> None:
    dlm, lock = hold(nodes3.urls, "cli:json", times=3)
    try:
        result = run("status", "cli:json", "--json", "--nodes", *nodes3.urls)
    finally:
        lock.release()
        dlm.close()
    assert result.returncode == cli.EXIT_OK, result.stderr
    assert result.stderr == ""
    shape = json.loads(result.stdout)
    assert set(shape) == {"resource", "quorum", "locked", "nodes", "summary"}
    assert (shape["resource"], shape["quorum"], shape["locked"]) == ("cli:json", 2, True)
    assert [n["node"] for n in shape["nodes"]] == [u.removeprefix("redis://")
                                                   for u in nodes3.urls]
    for node in shape["nodes"]:
        assert set(node) == {"node", "held", "holder", "pttl_ms", "fence", "marker", "error",
                             "state"}
        assert node["held"] is True and node["marker"] is True and node["error"] is None
        assert len(node["holder"]) == 12 and node["state"] == "ok"
        assert node["fence"] == 3 and 0 < node["pttl_ms"] <= 30_000
    assert len({node["holder"] for node in shape["nodes"]}) == 1  # one holder everywhere
    assert shape["summary"].startswith(
        f"'cli:json' is locked: holder {shape['nodes'][0]['holder']} on 3 of 3 nodes")


@pytest.mark.parametrize("table", ["rich", "plain"])
def test_status_table_for_people(nodes3: RedisNodes, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch, table: str) -> None:
    if table == "plain":  # what a user without the [cli] extra (no rich) sees
        monkeypatch.setattr(cli_render, "rich_available", lambda: False)
    dlm, lock = hold(nodes3.urls, "cli:table")
    try:
        code, out, err = run_in_process(capsys, "status", "cli:table", "--nodes", *nodes3.urls)
    finally:
        lock.release()
        dlm.close()
    assert code == cli.EXIT_OK and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["node", "held", "holder", "ttl", "left", "fence", "marker",
                                "state"]
    for url in nodes3.urls:
        row = next(line for line in lines if url.removeprefix("redis://") in line).split()
        assert row[1] == "yes" and row[5] == "1" and row[6] == "yes" and row[7] == "ok"
    assert "'cli:table' is locked: holder" in lines[-1]
    assert "on 3 of 3 nodes (quorum 2)" in lines[-1]


def test_status_of_a_free_resource(nodes3: RedisNodes, capsys: pytest.CaptureFixture[str]
                                   ) -> None:
    code, out, _ = run_in_process(capsys, "status", "cli:free", "--json", "--nodes",
                                  *nodes3.urls)
    assert code == cli.EXIT_OK
    shape = json.loads(out)
    assert shape["locked"] is False
    assert all(n["held"] is False and n["pttl_ms"] == 0 and n["fence"] == 0
               for n in shape["nodes"])
    code, out, _ = run_in_process(capsys, "status", "cli:free", "--nodes", *nodes3.urls)
    assert code == cli.EXIT_OK
    rows = [line for line in out.splitlines() if line.rstrip().endswith("new cluster")]
    assert len(rows) == 3  # no node has a marker: never used, not amnesia
    assert out.splitlines()[-1] == (
        "'cli:free' is not locked, and no node has this namespace's marker: a new cluster"
        " (the first acquire writes the markers), or the wrong --namespace")


def test_status_given_a_key_name_says_which_resource_to_ask_for(
        nodes3: RedisNodes, capsys: pytest.CaptureFixture[str]) -> None:
    dlm, lock = hold(nodes3.urls, "orders:99")
    try:
        code, out, _ = run_in_process(capsys, "status", "billing:{orders:99}:lock",
                                      "--nodes", *nodes3.urls)
        assert code == cli.EXIT_OK
        assert out.splitlines()[-1] == (
            "'billing:{orders:99}:lock' is not locked: that is a key's name, not a"
            " resource's; try `redlock status orders:99 --namespace billing`")
        code, out, _ = run_in_process(capsys, "status", "orders:99", "--nodes", *nodes3.urls)
        assert "'orders:99' is locked: holder" in out.splitlines()[-1]
    finally:
        lock.release()
        dlm.close()


def test_status_with_a_node_down_says_so_in_one_line(nodes3: RedisNodes) -> None:
    down = dead_url()
    result = run("status", "cli:down", "--nodes", *nodes3.urls[:2], down)
    assert result.returncode == cli.EXIT_PARTIAL
    address = down.removeprefix("redis://")
    assert result.stderr.splitlines() == [
        f"redlock: node {address} unreachable: connection refused"
        " (is redis-server running on that port?)"]
    assert "'cli:down' is not locked" in result.stdout


def test_status_with_most_nodes_down_fails(nodes3: RedisNodes) -> None:
    result = run("status", "cli:down", "--json", "--nodes", nodes3.urls[0], dead_url(),
                 dead_url())
    assert result.returncode == cli.EXIT_FAILED
    assert len(result.stderr.splitlines()) == 2
    shape = json.loads(result.stdout)  # scripts still get the JSON, errors included
    assert shape["locked"] is None  # the two silent nodes could hold a quorum between them
    assert [n["error"] is None for n in shape["nodes"]] == [True, False, False]
    assert shape["nodes"][1]["held"] is None and shape["nodes"][1]["fence"] is None


def test_bad_urls_and_arguments_are_usage_errors() -> None:
    bad = run("status", "r", "--nodes", "redis://:s3cret@127.0.0.1:6379", "localhost:6379")
    assert bad.returncode == cli.EXIT_USAGE
    assert bad.stderr == ("redlock: bad node URL 'localhost:6379': a Redis URL starts with"
                          " redis://, rediss:// or unix://\n")
    port = run("nodes", "--nodes", "redis://:s3cret@host:notaport")
    assert port.returncode == cli.EXIT_USAGE
    assert port.stderr == ("redlock: bad node URL 'redis://:***@host:notaport': Port could not"
                           " be cast to integer value as 'notaport'\n")  # no password shown
    twice = run("status", "r", "--nodes", "redis://127.0.0.1:7001", "redis://localhost:7001")
    assert twice.returncode == cli.EXIT_USAGE
    assert "are the same Redis server" in twice.stderr and len(twice.stderr.splitlines()) == 1
    none = run("status", "r", env={"REDLOCK_NODES": ""})
    assert none.returncode == cli.EXIT_USAGE
    assert none.stderr == ("redlock: no nodes given: pass --nodes URL [URL ...] or set"
                           " REDLOCK_NODES\n")
    timeout = run("status", "r", "--timeout", "-1", "--nodes", "redis://127.0.0.1:7001")
    assert timeout.returncode == cli.EXIT_USAGE
    assert len(timeout.stderr.splitlines()) == 1 and "--timeout" in timeout.stderr
    unknown = run("frobnicate")
    assert unknown.returncode == cli.EXIT_USAGE and len(unknown.stderr.splitlines()) == 1


def test_nodes_from_the_environment(nodes3: RedisNodes) -> None:
    result = run("status", "cli:env", "--json", env={"REDLOCK_NODES": ",".join(nodes3.urls)})
    assert result.returncode == cli.EXIT_OK
    assert len(json.loads(result.stdout)["nodes"]) == 3


def test_wrong_or_missing_password_is_one_clear_line(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3, password="s3cret")
    wrong = [url.replace(":s3cret@", ":badpass77@") for url in nodes.urls]
    result = run("status", "cli:auth", "--nodes", *wrong)
    assert result.returncode == cli.EXIT_FAILED
    lines = result.stderr.splitlines()
    assert len(lines) == 3 and all(
        line.endswith("unreachable: authentication failed: check the user and password in"
                      " the URL") for line in lines), lines
    assert "badpass77" not in result.stdout + result.stderr  # passwords are never shown
    missing = run("nodes", "--nodes", *[url.replace(":s3cret@", "") for url in nodes.urls])
    assert missing.returncode == cli.EXIT_FAILED
    assert all("authentication failed" in line for line in missing.stderr.splitlines())
    right = run("status", "cli:auth", "--nodes", *nodes.urls)
    assert right.returncode == cli.EXIT_OK and right.stderr == ""


def test_a_hung_node_times_out_in_one_line(fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3)
    nodes[2].pause()
    try:
        result = run("status", "cli:hung", "--timeout", "0.3", "--nodes", *nodes.urls)
        nodes_result = run("nodes", "--timeout", "0.3", "--nodes", *nodes.urls)
    finally:
        nodes[2].resume()
    for outcome in (result, nodes_result):
        assert outcome.returncode == cli.EXIT_PARTIAL
        assert outcome.stderr.splitlines() == [
            f"redlock: node {nodes[2].host}:{nodes[2].port} unreachable: no answer within the"
            " timeout (--timeout): down, overloaded or firewalled"]
    # Every node has its row in the nodes table, the hung one too.
    rows = {line.split()[0]: line.split()[1] for line in nodes_result.stdout.splitlines()[2:5]}
    assert rows == {f"{n.host}:{n.port}": "yes" for n in nodes[:2]} | {
        f"{nodes[2].host}:{nodes[2].port}": "no"}


# -- nodes ------------------------------------------------------------------------------


def test_nodes_json_shape_and_a_clean_cluster(nodes3: RedisNodes) -> None:
    dlm, lock = hold(nodes3.urls, "cli:nodes")  # the first acquire writes the markers
    lock.release()
    dlm.close()
    result = run("nodes", "--json", "--nodes", *nodes3.urls)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    shape = json.loads(result.stdout)
    assert shape["quorum"] == 2
    for node, url in zip(shape["nodes"], nodes3.urls, strict=True):
        assert set(node) == {"node", "reachable", "rtt_ms", "marker", "marker_value",
                             "format", "fence_counter", "repairing", "run_id",
                             "version", "role", "replicas", "replica_lag_s", "appendonly",
                             "appendfsync", "save", "maxmemory", "maxmemory_policy",
                             "warnings", "notes", "error", "shard_of", "hash_slots",
                             "slots_marked"}
        assert node["shard_of"] is None and node["hash_slots"] is None
        assert node["node"] == url.removeprefix("redis://")
        assert node["reachable"] is True and node["error"] is None
        assert node["rtt_ms"] > 0 and node["marker"] is True
        # Stamped with the run id of the server that answers (restart detection).
        assert node["marker_value"].startswith(f"format=1 run_id={node['run_id']} initialised ")
        assert node["role"] == "master" and node["maxmemory_policy"] == "noeviction"
        assert node["replicas"] == 0 and node["replica_lag_s"] is None
        assert node["appendonly"] is False and node["save"] == ""  # the harness's nodes
        assert node["warnings"] == [] and len(node["notes"]) == 1  # no persistence: a note
        assert len(node["run_id"]) == 40
    assert len({n["run_id"] for n in shape["nodes"]}) == 3


def test_nodes_reports_a_cluster_node_per_shard(
        redlock_redis_cluster: RedisClusterNodes, nodes3: RedisNodes) -> None:
    """docs/operations.md, "Redis Cluster": each master of a cluster node, its replica and
    its hash slots' markers; a hash slot that lost its marker is a warning of its shard."""
    seed = redlock_redis_cluster.masters()[0]
    cluster = redlock_redis_cluster.node_url
    urls = [*nodes3.urls[:2], cluster]
    with Redlock(urls) as dlm, dlm.lock("cli:shards", ttl=5.0, timeout=10.0):
        pass  # (the first acquire marks every hash slot: about half a second)
    result = run("nodes", "--json", "--nodes", *urls)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    shape = json.loads(result.stdout)
    assert shape["quorum"] == 2  # three nodes, the cluster one of them
    shards = [n for n in shape["nodes"] if n["shard_of"] is not None]
    assert len(shards) == 3 and {n["shard_of"] for n in shards} == {f"{seed.host}:{seed.port}"}
    assert sum(n["hash_slots"] for n in shards) == 16384
    assert all(n["slots_marked"] == n["hash_slots"] and n["marker"] for n in shards)
    assert all(n["role"] == "master" and n["replicas"] == 1 for n in shards)
    assert all(n["warnings"] == [] for n in shape["nodes"]), shape
    slot = hash_slot(KEYS.lock("cli:shards"))
    with redlock_redis_cluster.master_of(slot).client() as client:
        client.delete(KEYS.beside("cli:shards").marker)
    shape = json.loads(run("nodes", "--json", "--nodes", *urls).stdout)
    [lost] = [n for n in shape["nodes"] if n["shard_of"] and not n["marker"]]
    assert lost["slots_marked"] == lost["hash_slots"] - 1
    assert "1 of its" in lost["warnings"][0]


def test_nodes_table_and_the_warnings_the_library_knows(
        fresh_nodes: Callable[..., RedisNodes], capsys: pytest.CaptureFixture[str]) -> None:
    sound = fresh_nodes(1, appendonly=True)  # appendfsync always: nothing to say
    evicting = fresh_nodes(1, extra_args=["--maxmemory", "64mb",
                                          "--maxmemory-policy", "volatile-lru"])
    replica = fresh_nodes(1, extra_args=["--replicaof", sound[0].host, str(sound[0].port)])
    everysec = fresh_nodes(1, appendonly=True, extra_args=["--appendfsync", "everysec"])
    urls = [sound.urls[0], evicting.urls[0], replica.urls[0], everysec.urls[0]]
    code, out, err = run_in_process(capsys, "nodes", "--nodes", *urls)
    assert code == cli.EXIT_PARTIAL and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["node", "reachable", "rtt", "marker"]
    rows = {line.split()[0]: line for line in lines[2:6]}
    assert "aof always" in rows[sound.urls[0].removeprefix("redis://")]
    assert "volatile-lru (67108864 bytes)" in rows[evicting.urls[0].removeprefix("redis://")]
    assert " slave " in rows[replica.urls[0].removeprefix("redis://")]
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert any(evicting.urls[0].removeprefix("redis://") in w and "volatile-lru" in w
               for w in warnings)
    assert any(replica.urls[0].removeprefix("redis://") in w and "replica" in w
               for w in warnings)
    assert any(everysec.urls[0].removeprefix("redis://") in w and "appendfsync everysec" in w
               for w in warnings)
    assert not any(sound.urls[0].removeprefix("redis://") in w for w in warnings)


def test_nodes_sees_one_server_listed_under_two_addresses(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    # Two addresses of one server that the library cannot tell apart without asking it
    # (here two loopback addresses; in production a DNS alias or a load balancer).
    nodes = fresh_nodes(2, extra_args=["--bind", "127.0.0.1", "127.0.0.2"])
    alias = f"redis://127.0.0.2:{nodes[0].port}"
    result = run("nodes", "--json", "--nodes", nodes.urls[0], alias, nodes.urls[1])
    assert result.returncode == cli.EXIT_PARTIAL
    first, second, third = json.loads(result.stdout)["nodes"]
    assert first["run_id"] == second["run_id"] != third["run_id"]
    assert any(w.startswith("same run_id as 127.0.0.2:") for w in first["warnings"])
    assert any(w.startswith("same run_id as 127.0.0.1:") for w in second["warnings"])
    assert third["warnings"] == []
    # Given the same address twice, the library refuses before any I/O.
    twice = run("nodes", "--nodes", nodes.urls[0], f"redis://localhost:{nodes[0].port}/1")
    assert twice.returncode == cli.EXIT_USAGE and "are the same Redis server" in twice.stderr


def test_nodes_with_a_node_missing_its_marker(fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3)
    dlm, lock = hold(nodes.urls, "cli:marker")
    lock.release()
    dlm.close()
    nodes[1].restart(keep_data=False)
    result = run("nodes", "--json", "--nodes", *nodes.urls)
    assert result.returncode == cli.EXIT_PARTIAL
    shape = json.loads(result.stdout)
    assert [n["marker"] for n in shape["nodes"]] == [True, False, True]
    status = run("status", "cli:marker", "--nodes", *nodes.urls)
    assert status.returncode == cli.EXIT_OK
    states = [line.split()[-2:] for line in status.stdout.splitlines()[2:5]]
    assert states == [["yes", "ok"], ["no", "marker"], ["yes", "ok"]]
    assert any("no node marker while 2 other node(s) have one" in w
               for w in shape["nodes"][1]["warnings"])


# -- release --force ----------------------------------------------------------------------


def test_release_needs_force_and_confirmation(nodes3: RedisNodes,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    dlm, lock = hold(nodes3.urls, "cli:release", times=2)
    try:
        no_force = run("release", "cli:release", "--nodes", *nodes3.urls)
        assert no_force.returncode == cli.EXIT_USAGE
        assert "--force" in no_force.stderr
        no_tty = run("release", "cli:release", "--force", "--nodes", *nodes3.urls, stdin="y\n")
        assert no_tty.returncode == cli.EXIT_NOT_CONFIRMED
        assert no_tty.stderr == ("redlock: refusing to force-release 'cli:release' without"
                                 " confirmation: stdin is not a terminal (pass --yes to"
                                 " confirm from a script)\n")
        assert lock_keys_present(nodes3, "cli:release") == 3  # nothing was deleted
        monkeypatch.setattr(sys, "stdin", FakeTerminal("n\n"))
        code, out, err = run_in_process(capsys, "release", "cli:release", "--force",
                                        "--nodes", *nodes3.urls)
        assert code == cli.EXIT_NOT_CONFIRMED
        assert "Delete the lock on 'cli:release' on all 3 nodes" in err
        assert "is locked: holder" in out  # the operator sees whom they would evict
        assert lock_keys_present(nodes3, "cli:release") == 3
        monkeypatch.setattr(sys, "stdin", FakeTerminal("y\n"))
        code, out, err = run_in_process(capsys, "release", "cli:release", "--force",
                                        "--nodes", *nodes3.urls)
        assert code == cli.EXIT_OK
        assert "key deleted on 3 of 3 nodes" in out
        assert lock_keys_present(nodes3, "cli:release") == 0
        assert lock.locked()  # the holder is not told...
        with pytest.raises(LockLost):
            lock.extend()  # ...until it next talks to the nodes
    finally:
        dlm.close()


def test_release_yes_for_scripts_with_json(nodes3: RedisNodes) -> None:
    dlm, _ = hold(nodes3.urls, "cli:yes")
    try:
        result = run("release", "cli:yes", "--force", "--yes", "--json", "--nodes",
                     *nodes3.urls[:2], dead_url())
    finally:
        dlm.close()
    assert result.returncode == cli.EXIT_PARTIAL
    assert len(result.stderr.splitlines()) == 1 and "connection refused" in result.stderr
    shape = json.loads(result.stdout)
    assert shape["resource"] == "cli:yes"
    assert [n["status"] for n in shape["nodes"]] == ["deleted", "deleted", "failed"]
    assert set(shape["nodes"][0]) == {"node", "status", "detail"}
    assert lock_keys_present(nodes3, "cli:yes") == 1  # on the node not listed


# -- repair / initialise ------------------------------------------------------------------


def test_repair_reports_then_repairs_an_amnesiac_node(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3)
    dlm, lock = hold(nodes.urls, "cli:repair", times=5)
    lock.release()
    dlm.close()
    healthy = run("repair", "--json", "--nodes", *nodes.urls)
    assert healthy.returncode == cli.EXIT_OK
    assert [n["status"] for n in json.loads(healthy.stdout)["nodes"]] == ["healthy"] * 3
    nodes[0].restart(keep_data=False)
    waiting = run("repair", "--json", "--nodes", *nodes.urls)
    assert waiting.returncode == cli.EXIT_PARTIAL
    assert [n["status"] for n in json.loads(waiting.stdout)["nodes"]] == [
        "waiting", "healthy", "healthy"]
    refused = run("repair", "--force", "--nodes", *nodes.urls)
    assert refused.returncode == cli.EXIT_NOT_CONFIRMED
    forced = run("repair", "--force", "--yes", "--json", "--nodes", *nodes.urls)
    assert forced.returncode == cli.EXIT_OK, forced.stdout + forced.stderr
    assert json.loads(forced.stdout)["nodes"][0]["status"] == "repaired"
    with nodes[0].client() as client:  # re-seeded: the next token continues past 5
        assert int(client.hget(KEYS.counter, bucket("cli:repair"))) == 5
        assert client.exists(KEYS.marker)


def test_initialise_marks_a_new_cluster(fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3)
    result = run("initialise", "--json", "--nodes", *nodes.urls)
    assert result.returncode == cli.EXIT_OK, result.stderr
    assert len(json.loads(result.stdout)["nodes"]) == 3
    for node in nodes:
        with node.client() as client:
            assert client.exists(KEYS.marker)


# -- entry points and the demo -----------------------------------------------------------


def test_help_from_the_module_and_the_console_script() -> None:
    module = run("--help")
    assert module.returncode == 0 and "exit codes:" in module.stdout
    for command in ("status", "nodes", "release", "repair", "initialise", "demo"):
        assert command in module.stdout
    script = shutil.which("redlock", path=str(Path(sys.executable).parent))
    assert script is not None, "the console script is not installed (pip install -e .)"
    result = subprocess.run([script, "status", "--help"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and "RESOURCE" in result.stdout and "--json" in result.stdout


@pytest.mark.parametrize("entry", [["-m", "redlock", "demo"], ["-m", "redlock.demo"]])
def test_demo_runs_from_both_entry_points(entry: list[str]) -> None:
    result = subprocess.run([sys.executable, *entry, "--workers", "2", "--rounds", "2"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tokens strictly increasing: True" in result.stdout
    assert result.stderr == ""  # warnings only, and there are none
