"""Day one (issue 22): the mistakes a new user makes in the first hour get a message that
says what happened and what to do. Durations that look like milliseconds, the blocking
client inside ``async def`` code, one meaning per command-line option, ``status`` that
says what the table shows in its JSON too, and an API reference with every public class.
(Every documented snippet runs: tests/test_snippets.py.)"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import redlock
import redlock.admin
from redlock import (
    AsyncRedlock,
    BlockingInEventLoopWarning,
    DurationWarning,
    Redlock,
    RedlockWarning,
    cli,
)
from redlock.admin import Admin
from redlock.testing import RedisNodes
from redlock.testing.redis_nodes import free_port

ROOT = Path(__file__).resolve().parent.parent
NODE_TIMEOUT = 0.25
# A max_ttl above the durations that look like milliseconds (the default, 60 s, refuses
# them with a ValueError that says the unit instead of warning).
HOUR = 3600.0


def cli_run(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "redlock", *args], capture_output=True,
                            text=True, timeout=60, check=False)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


# -- seconds, not milliseconds -----------------------------------------------------------


def test_warning_classes_are_exported() -> None:
    assert {"RedlockWarning", "DurationWarning", "BlockingInEventLoopWarning"} <= set(
        redlock.__all__)
    assert issubclass(DurationWarning, RedlockWarning)
    assert issubclass(BlockingInEventLoopWarning, RedlockWarning)
    assert issubclass(RedlockWarning, UserWarning)


def test_a_ttl_in_milliseconds_warns_at_the_callers_line() -> None:
    dlm = Redlock([f"redis://127.0.0.1:{free_port()}"], max_ttl=HOUR)  # nothing is sent
    try:
        with pytest.warns(DurationWarning) as caught:
            dlm.lock("orders:42", ttl=1000)
        (warning,) = caught
        assert str(warning.message).startswith(
            "ttl is in seconds: ttl=1000 is 16.7 minutes; pass ttl=1.0 for 1 s.")
        assert "auto_extend=True" in str(warning.message)
        assert "category=redlock.DurationWarning" in str(warning.message)
        assert warning.filename == __file__  # the caller's line, not the library's
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert dlm.lock("orders:42", ttl=999.0).ttl == 999.0  # below: not a word
    finally:
        dlm.close()


def test_a_timeout_in_milliseconds_warns_and_a_ttl_above_max_ttl_says_the_unit() -> None:
    dlm = Redlock([f"redis://127.0.0.1:{free_port()}"], max_ttl=HOUR)
    try:
        with pytest.warns(DurationWarning, match=r"^timeout is in seconds: timeout=5000 is"
                                                 r" 83\.3 minutes; pass timeout=5\.0 for 5 s\."):
            dlm.lock("orders:42", ttl=10.0, timeout=5000)
        with pytest.raises(ValueError) as refused:
            dlm.lock("orders:42", ttl=30000)
        assert str(refused.value) == (
            "ttl=30000 s is larger than the maximum max_ttl=3600 s: ttl is in seconds"
            " (30000 s = 8.3 hours); pass ttl=30.0 for 30 s, or raise the manager's max_ttl"
            " (Redlock(..., max_ttl=...)) for locks held that long")
    finally:
        dlm.close()


def test_the_duration_warning_is_told_once_per_call_site() -> None:
    dlm = Redlock([f"redis://127.0.0.1:{free_port()}"], max_ttl=HOUR)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")  # Python's own: once per call site
            for _ in range(3):
                dlm.lock("orders:42", ttl=2000)
        assert [w.category for w in caught] == [DurationWarning]
    finally:
        dlm.close()


def test_extend_and_acquire_in_milliseconds_warn_too(nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT, max_ttl=HOUR) as dlm:
        lock = dlm.lock("day1:extend", ttl=5.0)
        with pytest.warns(DurationWarning, match="timeout=3000 is 50.0 minutes") as caught:
            assert lock.acquire(timeout=3000)
        assert caught[0].filename == __file__
        try:
            with pytest.warns(DurationWarning, match="ttl=2000 is 33.3 minutes") as caught:
                lock.extend(2000)
            assert caught[0].filename == __file__
        finally:
            lock.release()


async def test_the_asyncio_client_warns_the_same(nodes3: RedisNodes) -> None:
    async with AsyncRedlock(nodes3.urls, node_timeout=NODE_TIMEOUT, max_ttl=HOUR) as dlm:
        with pytest.warns(DurationWarning, match="ttl=1500 is 25.0 minutes") as caught:
            lock = dlm.lock("day1:async", ttl=1500)
        assert caught[0].filename == __file__
        lock = dlm.lock("day1:async", ttl=5.0)
        with pytest.warns(DurationWarning, match="timeout=2500 is 41.7 minutes") as caught:
            assert await lock.acquire(timeout=2500)
        assert caught[0].filename == __file__
        await lock.release()


def test_the_lock_docstring_and_the_readme_say_seconds() -> None:
    assert "Every duration is in seconds" in (Redlock.lock.__doc__ or "")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| option (`dlm.lock(resource, ttl, ...)`) |"):]
    assert re.search(r"^\| `ttl` \| seconds ", table, re.M)


# -- the blocking client in async def code -----------------------------------------------


async def test_a_sync_redlock_in_async_code_warns_once_per_manager(nodes3: RedisNodes
                                                                    ) -> None:
    first = Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT)
    second = Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT)
    try:
        with pytest.warns(BlockingInEventLoopWarning) as caught:
            with first.lock("day1:loop", ttl=5.0):  # on the event loop's thread
                pass
            Admin(first).is_locked("day1:loop")
            Admin(first).inspect("day1:loop")
        (warning,) = caught  # once for this manager, whatever it is asked next
        assert warning.filename == __file__
        message = str(warning.message)
        assert message.startswith("Redlock, the blocking client, was called on a thread"
                                  " running an asyncio event loop (in async def code)")
        assert "Use AsyncRedlock there" in message and "asyncio.to_thread" in message
        with pytest.warns(BlockingInEventLoopWarning):
            Admin(second).is_locked("day1:loop")  # another manager: told again
    finally:
        first.close()
        second.close()


async def test_a_sync_redlock_in_a_worker_thread_of_async_code_is_fine(nodes3: RedisNodes
                                                                       ) -> None:
    def in_a_thread() -> list[Any]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as dlm, dlm.lock(
                    "day1:thread", ttl=5.0):
                pass
        return [w for w in caught if issubclass(w.category, RedlockWarning)]

    assert await asyncio.to_thread(in_a_thread) == []


def test_a_sync_redlock_without_an_event_loop_says_nothing(nodes3: RedisNodes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as dlm, dlm.lock(
                "day1:plain", ttl=5.0):
            pass


# -- the command line: one meaning per option --------------------------------------------


def test_demo_nodes_takes_urls_and_a_count_is_named(nodes3: RedisNodes) -> None:
    old = cli_run("demo", "--nodes", "5")
    assert old.returncode == cli.EXIT_USAGE
    assert old.stderr == (
        "redlock demo: --nodes takes the nodes' URLs, as in every redlock command"
        " (redis://host:port ...); to start 5 local nodes, pass --count 5 (see --help)\n")
    bad = cli_run("demo", "--nodes", "redis://:s3cret@127.0.0.1:notaport")
    assert bad.returncode == cli.EXIT_USAGE and "s3cret" not in bad.stderr
    assert bad.stderr.startswith("redlock demo: bad node URL 'redis://:***@127.0.0.1:notaport'")
    given = cli_run("demo", "--nodes", *nodes3.urls, "--workers", "2", "--rounds", "2")
    assert given.returncode == 0, given.stdout + given.stderr
    assert "contend for 'demo:counter' on 3 nodes (quorum 2)" in given.stdout
    assert "started" not in given.stdout  # it ran on the nodes given
    assert "tokens strictly increasing: True" in given.stdout


def test_demo_count_starts_local_nodes() -> None:
    result = cli_run("demo", "--count", "1", "--workers", "2", "--rounds", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("started 1 local redis-server nodes: redis://")
    assert "on 1 nodes (quorum 1)" in result.stdout


def test_status_json_shows_what_the_table_and_stderr_show(nodes3: RedisNodes) -> None:
    down = f"redis://127.0.0.1:{free_port()}"
    dlm = Redlock(nodes3.urls[:2], node_timeout=NODE_TIMEOUT)
    lock = dlm.lock("day1:json", ttl=30.0)
    assert lock.acquire(blocking=False)
    try:
        as_json = cli_run("status", "day1:json", "--json", "--nodes", *nodes3.urls[:2], down)
        table = cli_run("status", "day1:json", "--nodes", *nodes3.urls[:2], down)
    finally:
        lock.release()
        dlm.close()
    assert as_json.returncode == table.returncode == cli.EXIT_PARTIAL
    assert as_json.stderr == table.stderr
    stderr_problem = as_json.stderr.strip().split(" unreachable: ", 1)[1]
    shape = json.loads(as_json.stdout)
    holders = {n["holder"] for n in shape["nodes"][:2]}
    assert len(holders) == 1 and None not in holders
    (holder,) = holders
    assert holder in table.stdout  # the table's holder column, in the JSON too
    assert shape["nodes"][2]["holder"] is None
    assert shape["nodes"][2]["state"] == f"unreachable: {stderr_problem}"
    assert f"unreachable: {stderr_problem}" in table.stdout
    said = f"'day1:json' is locked: holder {holder} on 2 of 3 nodes (quorum 2), at least"
    assert shape["summary"].startswith(said)  # the time left differs between the two runs
    assert table.stdout.strip().splitlines()[-1].startswith(said)


def test_status_names_the_namespaces_the_nodes_hold(nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls, namespace="billing", node_timeout=NODE_TIMEOUT) as dlm, dlm.lock(
            "orders:1", ttl=5.0):
        pass
    result = cli_run("status", "orders:1", "--json", "--nodes", *nodes3.urls)
    assert result.returncode == cli.EXIT_OK
    assert json.loads(result.stdout)["summary"] == (
        "'orders:1' is not locked, and no node has this namespace's marker: the nodes hold"
        " the namespace(s) 'billing'; try --namespace billing")
    right = cli_run("status", "orders:1", "--namespace", "billing", "--nodes", *nodes3.urls)
    assert right.stdout.strip().splitlines()[-1] == "'orders:1' is not locked"
    never = cli_run("status", "orders:2-typo", "--namespace", "billing", "--nodes",
                    *nodes3.urls)
    assert never.stdout.strip().splitlines()[-1] == (
        "'orders:2-typo' is not locked, and never was in this namespace (its fence counter is"
        " 0 on every node): check the name, and --namespace")


# -- the API reference -------------------------------------------------------------------


def _documented() -> list[str]:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    return re.findall(r"^::: (\S+)", text, re.M)


def _resolve(reference: str) -> Any:
    try:
        return importlib.import_module(reference)
    except ImportError:
        module, _, name = reference.rpartition(".")
        return getattr(importlib.import_module(module), name)


def test_the_api_reference_covers_every_export() -> None:
    documented = _documented()
    for reference in documented:  # each resolves and has a docstring to show
        assert _resolve(reference).__doc__, reference
    assert {"redlock.MultiLock", "redlock.AsyncMultiLock", "redlock.Handover",
            "redlock.admin.Admin", "redlock.admin.RepairReport", "redlock.admin.RepairStatus",
            "redlock.testing.manager"} <= set(documented)
    modules = {reference for reference in documented
               if not hasattr(_resolve(reference), "__mro__")}
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for package in (redlock, redlock.admin):
        for name in package.__all__:
            obj = getattr(package, name)
            # An entry of its own, its module's, or named in the text (an asyncio twin).
            assert (f"{package.__name__}.{name}" in documented or obj.__module__ in modules
                    or f"`{name}`" in text), name
