"""Logging: silent by default, under the application's control, events with their fields,
and docs/events.md in step with the code."""

from __future__ import annotations

import ast
import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from redlock import AsyncRedlock, EventFormatter, Redlock
from redlock.testing import RedisNodes, capture_events
from redlock.testing.redis_nodes import free_port
from tests.internals import RESERVED_FIELDS, event_fields

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "workers" / "log_scenario.py"
DEBUG_EVENTS = ("redlock.acquired", "redlock.quorum_failed", "redlock.extended",
                "redlock.released")
WARNING_EVENTS = ("redlock.even_node_count", "redlock.lost")


def run_scenario(mode: str, nodes: RedisNodes) -> subprocess.CompletedProcess[str]:
    dead = f"redis://127.0.0.1:{free_port()}"
    result = subprocess.run([sys.executable, str(SCENARIO), mode, dead, *nodes.urls],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


# -- the application decides ------------------------------------------------------------


def test_an_unconfigured_application_prints_nothing(nodes3: RedisNodes) -> None:
    result = run_scenario("none", nodes3)
    assert result.stdout == "done\n"
    assert result.stderr == ""


def test_the_scenario_does_log_when_asked(nodes3: RedisNodes) -> None:
    # The silence above is the library's, not a scenario that logs nothing.
    result = run_scenario("debug", nodes3)
    assert result.stdout == "done\n"
    for event in (*DEBUG_EVENTS, *WARNING_EVENTS):
        assert event in result.stderr, event
    assert result.stderr.count("redlock.quorum_failed") >= 2  # one per failed attempt


def test_basic_config_at_warning_silences_debug_and_info(nodes3: RedisNodes) -> None:
    result = run_scenario("warning", nodes3)
    assert result.stdout == "done\n"
    for event in WARNING_EVENTS:
        assert f"WARNING:redlock._algorithm:{event}" in result.stderr, result.stderr
    for event in (*DEBUG_EVENTS, "redlock.cluster_initialised"):
        assert event not in result.stderr, result.stderr
    assert "DEBUG" not in result.stderr and "INFO" not in result.stderr


# -- what a configured application gets ------------------------------------------------


@pytest.fixture(params=["sync", "async"])
async def managers(request: pytest.FixtureRequest,
                   nodes3: RedisNodes) -> AsyncIterator[tuple[Any, Any]]:
    cls = Redlock if request.param == "sync" else AsyncRedlock
    pair = (cls(nodes3.urls), cls(nodes3.urls))
    yield pair
    for dlm in pair:
        closed = dlm.close()
        if closed is not None:
            await closed


async def _maybe(value: Any) -> Any:
    return await value if hasattr(value, "__await__") else value


async def test_caplog_sees_events_with_their_fields(managers: tuple[Any, Any],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    holder_dlm, contender_dlm = managers
    caplog.set_level(logging.DEBUG, logger="redlock")
    holder = holder_dlm.lock("log:fields", ttl=10.0)
    assert await _maybe(holder.acquire(blocking=False))
    token = holder.token
    assert not await _maybe(contender_dlm.lock("log:fields", ttl=10.0).acquire(blocking=False))
    await _maybe(holder.release())

    def records(event: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == event]

    [acquired] = records("redlock.acquired")[-1:]
    assert acquired.levelno == logging.DEBUG and acquired.name == "redlock._algorithm"
    fields = event_fields(acquired)
    assert set(fields) == {"resource", "token", "validity_ms", "granted", "nodes"}
    assert (fields["resource"], fields["token"], fields["granted"], fields["nodes"]) == (
        "log:fields", token, 3, 3)
    assert 0 < fields["validity_ms"] <= 10_000
    assert acquired.funcName == "_attempt"  # the library's function, not the log helper
    [failed] = records("redlock.quorum_failed")
    assert failed.levelno == logging.DEBUG
    fields = event_fields(failed)
    assert set(fields) == {"resource", "reason", "granted", "needed", "nodes", "unavailable",
                           "outcomes"}
    assert (fields["resource"], fields["granted"], fields["needed"], fields["nodes"],
            fields["unavailable"]) == ("log:fields", 0, 2, 3, False)
    assert fields["outcomes"].count("refused (held by another owner") == 3
    [released] = records("redlock.released")
    assert event_fields(released)["resource"] == "log:fields"


async def test_the_redlock_logger_controls_every_module(managers: tuple[Any, Any],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    dlm = managers[0]
    caplog.set_level(logging.DEBUG)  # the root logger lets everything through...
    logging.getLogger("redlock").setLevel(logging.WARNING)  # ...but redlock says no
    try:
        lock = dlm.lock("log:level", ttl=5.0)
        assert await _maybe(lock.acquire(blocking=False))
        await _maybe(lock.release())
    finally:
        logging.getLogger("redlock").setLevel(logging.NOTSET)
    assert not [r for r in caplog.records if r.name.startswith("redlock")]


async def test_a_structlog_application_gets_event_names_and_fields(
        managers: tuple[Any, Any]) -> None:
    structlog = pytest.importorskip("structlog")
    holder_dlm, contender_dlm = managers
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.JSONRenderer()],
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.ExtraAdder()]))
    top = logging.getLogger("redlock")
    top.addHandler(handler)
    top.setLevel(logging.DEBUG)
    try:
        holder = holder_dlm.lock("log:json", ttl=10.0)
        assert await _maybe(holder.acquire(blocking=False))
        assert not await _maybe(contender_dlm.lock("log:json").acquire(blocking=False))
        await _maybe(holder.release())
    finally:
        top.removeHandler(handler)
        top.setLevel(logging.NOTSET)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    failed = [line for line in lines if line["event"] == "redlock.quorum_failed"]
    assert len(failed) == 1
    assert failed[0]["level"] == "debug"
    assert failed[0]["resource"] == "log:json" and failed[0]["granted"] == 0
    assert failed[0]["needed"] == 2 and failed[0]["unavailable"] is False
    assert {line["event"] for line in lines} >= {"redlock.acquired", "redlock.released"}


def test_event_formatter_appends_the_fields() -> None:
    record = logging.LogRecord("redlock._algorithm", logging.WARNING, __file__, 1,
                               "redlock.lost", (), None)
    record.resource, record.token = "orders:42", 17
    text = EventFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert text == "WARNING redlock._algorithm: redlock.lost resource='orders:42' token=17"
    plain = logging.LogRecord("app", logging.INFO, __file__, 1, "hello", (), None)
    assert EventFormatter("%(message)s").format(plain) == "hello"


def test_capture_events_restores_the_logger_levels() -> None:
    top = logging.getLogger("redlock")
    before = top.level
    with capture_events() as events:
        logging.getLogger("redlock._algorithm").debug("redlock.x", extra={"a": 1})
    assert events == [{"event": "redlock.x", "log_level": "debug",
                       "logger": "redlock._algorithm", "a": 1}]
    assert top.level == before
    assert not [h for h in top.handlers if not isinstance(h, logging.NullHandler)]


def test_the_top_loggers_have_a_null_handler() -> None:
    import fencing  # noqa: F401  (its import installs its handler)

    for name in ("redlock", "fencing"):
        assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger(name).handlers)


# -- docs/events.md lists every event, with its level and fields ------------------------

LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARNING", "exception": "ERROR"}


def events_in_code() -> dict[str, tuple[str, frozenset[str]]]:
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for package in ("redlock", "fencing"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in LEVELS and node.args
                        and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)
                        and node.args[0].value.startswith(("redlock.", "fencing."))):
                    continue
                if path.parent.name == "testing":
                    continue
                event = node.args[0].value
                entry = (LEVELS[node.func.attr], frozenset(k.arg for k in node.keywords
                                                           if k.arg is not None))
                assert found.setdefault(event, entry) == entry, (
                    f"{event} is logged with different levels or fields in two places")
    return found


def events_in_docs() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in (ROOT / "docs" / "events.md").read_text().splitlines():
        match = re.match(r"\| `([a-z_.]+)` \| (\w+) \| ([^|]*) \|", line)
        if match:
            fields = frozenset(re.findall(r"`(\w+)`", match.group(3)))
            rows[match.group(1)] = (match.group(2), fields)
    return rows


def test_docs_list_every_event_with_its_level_and_fields() -> None:
    code, docs = events_in_code(), events_in_docs()
    assert len(code) >= 15
    assert code == docs


def test_no_event_field_clashes_with_a_log_record_attribute() -> None:
    for event, (_, fields) in events_in_code().items():
        assert not fields & RESERVED_FIELDS, event
