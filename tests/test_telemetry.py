"""OpenTelemetry (docs/design.md §11.5), with the real SDK: its in-memory span exporter and
in-memory metric reader, on real nodes, both clients. And the no-cost paths: no provider
configured (protocols run unwrapped), and the API not installed at all."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from redlock import AsyncRedlock, LockLost, QuorumUnavailable, Redlock
from redlock.testing import RedisNodes
from tests.internals import RECHECK_S, Telemetry, observe

NODE_TIMEOUT = 0.25


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    @property
    def providers(self) -> dict[str, Any]:
        return {"tracer_provider": self.tracer_provider, "meter_provider": self.meter_provider}

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found = []
        for resource_metrics in data.resource_metrics if data else []:
            for scope in resource_metrics.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        found.extend(item.data.data_points)
        return found

    def total(self, metric: str, **attributes: str) -> float:
        return sum(p.value for p in self.points(metric)
                   if all(p.attributes.get(k) == v for k, v in attributes.items()))


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(spans, reader, tracer_provider, meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def initialised(nodes3: RedisNodes) -> RedisNodes:
    """Nodes already marked (a new cluster's first acquire takes an extra round)."""
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as setup, setup.lock("ot:setup"):
        pass
    return nodes3


@pytest.fixture
def dlm(initialised: RedisNodes, otel: Otel) -> Iterator[Redlock]:
    nodes3 = initialised
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT, **otel.providers) as manager:
        yield manager


@pytest.fixture
async def adlm(initialised: RedisNodes, otel: Otel) -> AsyncIterator[AsyncRedlock]:
    nodes3 = initialised
    async with AsyncRedlock(nodes3.urls, node_timeout=NODE_TIMEOUT,
                            **otel.providers) as manager:
        yield manager


def test_spans_and_metrics_of_one_lock(dlm: Redlock, otel: Otel) -> None:
    with dlm.lock("ot:a", ttl=5.0) as held:
        held.extend()
        token = held.token  # the nodes' counter: the initialising acquire took one
    (acquire,) = otel.finished("redlock.acquire")
    attributes = dict(acquire.attributes or {})
    # Early quorum: the third node's vote counts only if it came in with the others.
    assert attributes.pop("redlock.votes_granted") in (2, 3)
    assert attributes == {
        "redlock.resource": "ot:a", "redlock.namespace": "redlock", "redlock.nodes": 3,
        "redlock.quorum": 2, "redlock.kind": "lock", "redlock.attempts": 1,
        "redlock.token": token, "redlock.outcome": "acquired"}
    assert acquire.status.status_code is StatusCode.UNSET
    (extend,) = otel.finished("redlock.extend")
    assert extend.attributes and extend.attributes["redlock.outcome"] == "extended"
    assert extend.attributes["redlock.token"] == token
    (release,) = otel.finished("redlock.release")
    assert release.attributes and release.attributes["redlock.outcome"] == "released"
    (duration,) = otel.points("redlock.acquire.duration")
    assert duration.count == 1 and duration.sum > 0
    assert dict(duration.attributes) == {"redlock.namespace": "redlock",
                                         "redlock.outcome": "acquired"}
    (wait,) = otel.points("redlock.acquire.wait")
    assert wait.count == 1 and wait.sum == 0  # uncontended: no waiting
    assert otel.total("redlock.acquire.quorum_failures") == 0


def test_contention_shows_attempts_waits_and_quorum_failures(
        dlm: Redlock, otel: Otel, nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as holder_dlm, \
            holder_dlm.lock("ot:b", ttl=10.0):
        assert not dlm.lock("ot:b", ttl=5.0, timeout=0.3).acquire()
    (span,) = otel.finished("redlock.acquire")
    attributes = dict(span.attributes or {})
    assert attributes["redlock.outcome"] == "not_acquired"
    assert attributes["redlock.votes_granted"] == 0
    attempts = attributes["redlock.attempts"]
    assert isinstance(attempts, int) and attempts > 1
    assert "redlock.token" not in attributes
    assert otel.total("redlock.acquire.quorum_failures") == attempts
    (wait,) = otel.points("redlock.acquire.wait")
    assert wait.sum > 0.1  # most of the 0.3 s were spent backing off
    (duration,) = otel.points("redlock.acquire.duration")
    assert duration.attributes["redlock.outcome"] == "not_acquired"


def test_an_outage_is_an_error_span(dlm: Redlock, otel: Otel, nodes3: RedisNodes) -> None:
    with dlm.lock("ot:init"):
        pass  # initialise the new cluster with all three up
    nodes3[0].stop()
    nodes3[1].stop()
    with pytest.raises(QuorumUnavailable):
        dlm.lock("ot:c", ttl=5.0).acquire(blocking=False)
    span = otel.finished("redlock.acquire")[-1]
    assert span.attributes and span.attributes["redlock.outcome"] == "unavailable"
    assert span.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in span.events)


def test_lost_locks_are_counted_from_extend_and_from_the_watchdog(
        dlm: Redlock, otel: Otel, nodes3: RedisNodes) -> None:
    held = dlm.lock("ot:d", ttl=10.0)
    assert held.acquire()
    _delete_everywhere(nodes3, "ot:d")
    with pytest.raises(LockLost):
        held.extend()
    assert otel.finished("redlock.extend")[-1].attributes["redlock.outcome"] == "lost"  # type: ignore[index]
    assert otel.total("redlock.locks.lost") == 1
    with pytest.raises(LockLost):
        held.release()  # reports the loss again: not a second lost lock
    assert otel.total("redlock.locks.lost") == 1

    lost = threading.Event()
    watched = dlm.lock("ot:e", ttl=0.9, auto_extend=True, on_lost=lambda _: lost.set())
    assert watched.acquire()
    deadline = time.monotonic() + 10
    while not _auto_extends(otel) and time.monotonic() < deadline:
        time.sleep(0.05)
    renewal = _auto_extends(otel)[0]
    assert renewal.attributes and renewal.attributes["redlock.outcome"] == "extended"
    assert renewal.attributes["redlock.resource"] == "ot:e"
    _delete_everywhere(nodes3, "ot:e")
    assert lost.wait(10)
    deadline = time.monotonic() + 10
    while otel.total("redlock.locks.lost") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert otel.total("redlock.locks.lost") == 2
    assert _auto_extends(otel)[-1].status.status_code is StatusCode.ERROR


def test_amnesia_events_are_counted(dlm: Redlock, otel: Otel, nodes3: RedisNodes) -> None:
    with dlm.lock("ot:f"):
        pass
    nodes3[2].restart(keep_data=False)  # back empty: no marker
    with dlm.lock("ot:f", timeout=5.0):
        pass
    with dlm.lock("ot:f", timeout=5.0):
        pass  # seen again: not a new event
    assert otel.total("redlock.nodes.amnesia", **{"redlock.amnesia.kind": "node"}) == 1


def test_a_set_of_resources(dlm: Redlock, otel: Otel) -> None:
    with dlm.lock_many(["ot:m2", "ot:m1"]) as held:
        token = held.tokens["ot:m1"]
    (span,) = otel.finished("redlock.acquire")
    assert span.attributes and list(span.attributes["redlock.resource"]) == ["ot:m1", "ot:m2"]  # type: ignore[arg-type]
    assert list(span.attributes["redlock.tokens"]) == [token, token]  # type: ignore[arg-type]
    assert len(otel.finished("redlock.release")) == 1


async def test_asyncio_client_records_the_same(adlm: AsyncRedlock, otel: Otel) -> None:
    async with adlm.lock("ot:g", ttl=5.0) as held:
        await held.extend()

    async def contender() -> bool:
        return await adlm.lock("ot:g", ttl=5.0, timeout=0.2).acquire()

    async with adlm.lock("ot:g", ttl=5.0):
        assert not await asyncio.create_task(contender())
    acquires = otel.finished("redlock.acquire")
    outcomes = sorted(str((s.attributes or {})["redlock.outcome"]) for s in acquires)
    assert outcomes == ["acquired", "acquired", "not_acquired"]
    tokens = [(s.attributes or {}).get("redlock.token") for s in acquires]
    first, second = sorted(t for t in tokens if isinstance(t, int))
    assert second == first + 1
    assert len(otel.finished("redlock.extend")) == 1
    assert len(otel.finished("redlock.release")) == 2
    assert otel.total("redlock.acquire.quorum_failures") >= 1


def test_nothing_is_wrapped_without_a_provider(nodes3: RedisNodes) -> None:
    # This process never sets global providers: they are OpenTelemetry's defaults.
    with Redlock(nodes3.urls) as dlm:
        assert dlm._telemetry is not None
        assert dlm._telemetry.instruments() is None
        flow = dlm.lock("ot:h")._acquire_flow(None, None)
        watches = []

        def make_flow(watch: object) -> object:
            watches.append(watch)
            return flow

        assert observe(dlm._telemetry, "acquire", make_flow, None) is flow  # unwrapped
        assert watches == [None]  # the core is told of no attempts: nothing records
        flow.close()
    telemetry = Telemetry.create("redlock", 3, 2)
    assert telemetry is not None and telemetry.instruments() is None


def test_the_global_providers_are_used_when_set(nodes3: RedisNodes) -> None:
    # Global providers can be set once per process: a child process of its own. The
    # manager is made before they are set (an application that configures late).
    code = textwrap.dedent(f"""
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter)
        import time
        from redlock import Redlock

        dlm = Redlock({nodes3.urls!r})
        with dlm.lock("ot:global"):  # before any provider: nothing recorded
            pass
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        time.sleep({RECHECK_S!r} + 0.1)  # a provider set later is used from the next check
        with dlm.lock("ot:global"):
            pass
        dlm.close()
        print("RESULT", sorted(s.name for s in spans.get_finished_spans()))
        names = [m.name for rm in reader.get_metrics_data().resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics]
        print("RESULT", "redlock.acquire.duration" in names)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert _results(done.stdout) == ["['redlock.acquire', 'redlock.release']", "True"]


def test_without_the_opentelemetry_api(nodes3: RedisNodes) -> None:
    code = textwrap.dedent(f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from redlock import Redlock
        with Redlock({nodes3.urls!r}) as dlm:
            assert dlm._telemetry is None
            with dlm.lock("ot:none") as held:
                print("RESULT", held.token)
        try:
            Redlock({nodes3.urls!r}, tracer_provider=object())
        except RuntimeError as exc:
            print("RESULT", "refused:", "otel" in str(exc))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert _results(done.stdout) == ["1", "refused: True"]


def _results(stdout: str) -> list[str]:
    """The child's result lines (whatever else it printed, logs included)."""
    return [line.removeprefix("RESULT ") for line in stdout.splitlines()
            if line.startswith("RESULT ")]


def _delete_everywhere(nodes: RedisNodes, resource: str) -> None:
    for node in nodes:
        with node.client() as client:
            client.delete(f"redlock:{{{resource}}}:lock")


def _auto_extends(otel: Otel) -> list[ReadableSpan]:
    return [s for s in otel.finished("redlock.extend")
            if (s.attributes or {}).get("redlock.auto_extend")]
