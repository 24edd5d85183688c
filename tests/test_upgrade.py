"""The upgrade from the previous format (a fence counter per resource) to one counter
per node, docs/design.md §3.8, with a real client of the previous release: its code is
taken from git history (the last commit of that format) and run in a subprocess.

- A cluster the previous release initialised and used: this release's first acquisition
  of a resource gets a token above the resource's old counter.
- Both releases contending on one resource, at once: no overlap, and every token above
  every token committed before, whichever release committed it.
- ``upgrade()``: every node moves (marker, barrier), the old counters are folded and
  removed, tokens still rise; from then on the previous release is refused (it fails
  closed) and can neither initialise nor repair the nodes.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from redlock import Redlock
from redlock.testing import RedisNodes
from tests.internals import KEYS

#: The last commit whose scripts keep a counter per resource (``ns:{R}:fence``).
PREVIOUS_FORMAT = "96e079e9d8cdcc81b0612cd39566566df486ecf1"
ROOT = Path(__file__).resolve().parent.parent
NODE_TIMEOUT = 0.25

# Run by the previous release: ``ROUNDS`` acquisitions of RESOURCE, one JSON line each
# ({"start", "end", "token"} on the shared monotonic clock, or {"error"}), then one line
# with what its initialise() and repair() say.
_PREVIOUS_CLIENT = r"""
import json, sys, time
import redlock
from redlock import Redlock
urls, resource, rounds, ttl = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), 2.0
assert redlock.__file__.startswith(sys.argv[4]), redlock.__file__
with Redlock(urls, node_timeout=0.25) as dlm:
    for _ in range(rounds):
        lock = dlm.lock(resource, ttl=ttl)
        try:
            if not lock.acquire(blocking=True, timeout=2.0):
                print(json.dumps({"error": "not acquired"}), flush=True)
                continue
        except Exception as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)
            continue
        start = time.monotonic()
        token = lock.token
        time.sleep(0.002)
        end = time.monotonic()
        lock.release()
        print(json.dumps({"start": start, "end": end, "token": token}), flush=True)
    if sys.argv[5:] == ["admin"]:
        steps = {}
        for name, step in (("initialise", dlm.initialise), ("repair", dlm.repair)):
            try:
                steps[name] = sorted({str(r.status) for r in step()})
            except Exception as exc:
                steps[name] = [type(exc).__name__]
        print(json.dumps({"admin": steps}), flush=True)
"""


@pytest.fixture(scope="module")
def previous_release() -> Iterator[Path]:
    """The previous release's ``redlock`` package, from git history."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.fail("the upgrade test needs the repository's git history (a clone)")
    folder = Path(tempfile.mkdtemp(prefix="redlock-previous-"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_FORMAT,
                                  "redlock"], check=True, capture_output=True, timeout=60)
        archive_path = folder / "previous.tar"
        archive_path.write_bytes(archive.stdout)
        with tarfile.open(archive_path) as tar:  # our own history: a trusted archive
            if hasattr(tarfile, "data_filter"):
                tar.extractall(folder, filter="data")
            else:  # Python before 3.10.12 / 3.11.4
                tar.extractall(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_previous(folder: Path, urls: list[str], resource: str, rounds: int,
                 *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    return subprocess.Popen(
        [sys.executable, "-c", _PREVIOUS_CLIENT, json.dumps(urls), resource, str(rounds),
         str(folder), *extra], env=env, cwd=folder, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True)


def finish(process: subprocess.Popen[str]) -> list[dict[str, object]]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def keys_of(nodes: RedisNodes) -> list[set[str]]:
    found = []
    for node in nodes:
        with node.client() as client:
            found.append({k.decode() for k in client.keys("*")})
    return found


def assert_in_order(holds: list[dict[str, object]]) -> None:
    """Holds of one resource, by both releases: never overlapping, tokens rising."""
    ordered = sorted((float(h["start"]), float(h["end"]), int(h["token"]))  # type: ignore[arg-type]
                     for h in holds)
    for before, after in itertools.pairwise(ordered):
        assert before[1] <= after[0], (before, after)  # (start, end, token)
        assert after[2] > before[2], (before, after)


def test_both_releases_share_a_cluster_then_the_upgrade_leaves_one_counter_per_node(
        previous_release: Path) -> None:
    with RedisNodes(3) as nodes:
        urls = list(nodes.urls)
        # The previous release initialises the cluster and locks two resources.
        warm = [finish(run_previous(previous_release, urls, "orders:1", 30)),
                finish(run_previous(previous_release, urls, "orders:2", 5))]
        assert all("token" in h for run in warm for h in run), warm
        assert [h["token"] for h in warm[0]] == list(range(1, 31))  # a counter per resource
        before = keys_of(nodes)
        for found in before:
            assert {"redlock:node-marker", "redlock:{orders:1}:fence",
                    "redlock:{orders:2}:fence"} <= found
            assert KEYS.marker not in found and KEYS.counter not in found

        with Redlock(urls, node_timeout=NODE_TIMEOUT) as dlm:
            # This release's first acquisitions: above each resource's old counter.
            with dlm.lock("orders:2", ttl=2.0) as held:
                assert held.token == 6
            with dlm.lock("orders:1", ttl=2.0) as held:
                assert held.token == 31
            with dlm.lock("orders:2", ttl=2.0) as held:
                assert held.token == 7  # its bucket's counter: still above its old one

            # Both releases contend on one resource at once.
            ours: list[dict[str, object]] = []

            def contend() -> None:
                for _ in range(40):
                    lock = dlm.lock("orders:1", ttl=2.0)
                    if not lock.acquire(blocking=True, timeout=2.0):
                        continue
                    start = time.monotonic()
                    token = lock.token
                    time.sleep(0.002)
                    ours.append({"start": start, "end": time.monotonic(), "token": token})
                    lock.release()

            previous = run_previous(previous_release, urls, "orders:1", 40)
            thread = threading.Thread(target=contend)
            thread.start()
            theirs = finish(previous)
            thread.join(60)
            assert not thread.is_alive()
            assert [h for h in theirs if "error" in h] == []
            assert len(ours) >= 30 and len(theirs) == 40
            assert_in_order(ours + theirs + warm[0])
            highest = max(int(h["token"]) for h in ours + theirs)  # type: ignore[call-overload]

            # The upgrade: every node moves, the old counters are folded and removed.
            reports = dlm.upgrade()
            assert [r.status for r in reports] == ["upgraded"] * 3, reports
            assert all(r.detail.endswith("per-resource counters folded") for r in reports)
            for found in keys_of(nodes):
                assert found == {KEYS.marker, KEYS.counter, *KEYS.barrier}, found
            assert [r.status for r in dlm.upgrade()] == ["healthy"] * 3  # idempotent
            with dlm.lock("orders:1", ttl=2.0) as held:
                assert held.token > highest
            with dlm.lock("orders:9", ttl=2.0) as held:  # a new name, another bucket
                assert held.token == 1

        # The previous release is refused now, fails closed, and cannot undo the barrier.
        refused = finish(run_previous(previous_release, urls, "orders:1", 2, "admin"))
        assert all("error" in h for h in refused[:2]), refused
        assert "ClusterAmnesiaError" in str(refused[0]["error"]), refused
        admin = refused[-1]["admin"]
        assert isinstance(admin, dict) and "failed" in admin["initialise"], admin
        assert admin["repair"] != ["repaired"], admin
        for found in keys_of(nodes):
            assert "redlock:node-marker" not in found
            assert not any(k.endswith(":fence") and k != KEYS.counter for k in found)
        with Redlock(urls, node_timeout=NODE_TIMEOUT) as dlm, \
                dlm.lock("orders:1", ttl=2.0) as held:
            assert held.token > highest


def test_a_cluster_this_release_initialised_refuses_the_previous_release(
        previous_release: Path) -> None:
    with RedisNodes(3) as nodes:
        urls = list(nodes.urls)
        with Redlock(urls, node_timeout=NODE_TIMEOUT) as dlm, dlm.lock("jobs:1") as held:
            assert held.token == 1
        # A client of the previous release, new to this cluster, would take it for a new
        # one and initialise it (then count from its own floor): the barrier stops it.
        refused = finish(run_previous(previous_release, urls, "jobs:1", 2, "admin"))
        assert all("error" in h for h in refused[:2]), refused
        for found in keys_of(nodes):
            assert "redlock:node-marker" not in found, found
        with Redlock(urls, node_timeout=NODE_TIMEOUT) as dlm, dlm.lock("jobs:1") as held:
            assert held.token == 2
