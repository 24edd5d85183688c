"""OpenTelemetry traces and metrics, optional (docs/design.md §11.5 lists the spans, their
attributes and the metrics).

Only the OpenTelemetry *API* is used (the ``otel`` extra). Nothing is recorded, and the flows run
unwrapped, without the API, or when no provider was given and the global ones are still the no-op
defaults: then the cost is one clock read per operation against :attr:`Telemetry.quiet_until` (the
providers are looked up again once a second). When recording, an operation's flow is wrapped in an
observer that forwards every request and reply unchanged and watches them go by."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from redlock._core.requests import Backoff, Flow
from redlock._core.state import AttemptResult
from redlock.errors import ClusterAmnesiaError, LockLost, NotHeld, Outcome, QuorumUnavailable

AttemptWatch = Callable[[AttemptResult], None]

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # the otel extra is not installed: no telemetry, no cost
    otel_metrics = None  # type: ignore[assignment]
    otel_trace = None  # type: ignore[assignment]

T = TypeVar("T")

_INSTRUMENTATION = "redlock"


RECHECK_S = 1.0  # how often a manager without providers looks for global ones


@dataclass
class _Instruments:
    tracer: Any
    duration: Any
    wait: Any
    quorum_failures: Any
    lost: Any
    amnesia: Any


def _is_noop_tracer_provider(provider: object) -> bool:
    assert otel_trace is not None
    return isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider)


def _is_noop_meter_provider(provider: object) -> bool:
    assert otel_metrics is not None
    # The API's global default is a private proxy class; match it by name.
    return (isinstance(provider, otel_metrics.NoOpMeterProvider)
            or type(provider).__name__ == "_ProxyMeterProvider")


# The metrics: (_Instruments field, name, unit, description); "s": a histogram of
# seconds, otherwise a counter.
_METRICS = (
    ("duration", "redlock.acquire.duration", "s", "time from acquire() to its outcome"),
    ("wait", "redlock.acquire.wait", "s", "time an acquire spent waiting between attempts"),
    ("quorum_failures", "redlock.acquire.quorum_failures", "{attempt}",
     "acquire attempts in which fewer than a quorum of nodes granted"),
    ("lost", "redlock.locks.lost", "{lock}", "held locks lost (extend or auto-extend failed)"),
    ("amnesia", "redlock.nodes.amnesia", "{event}",
     "nodes newly seen without their marker, and majority losses"),
)


class Telemetry:
    """One manager's view of OpenTelemetry: whether to record, and the instruments."""

    def __init__(self, namespace: str, nodes: int, quorum: int,
                 tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self.namespace = namespace
        self.nodes = nodes
        self.quorum = quorum
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._explicit = tracer_provider is not None or meter_provider is not None
        self._cached: tuple[object, object, _Instruments] | None = None
        # Until when (time.monotonic) nothing records and no provider is looked for (an
        # attribute: read on every call); -inf with providers given or found.
        self.quiet_until = float("-inf")

    @classmethod
    def create(cls, namespace: str, nodes: int, quorum: int, tracer_provider: Any = None,
               meter_provider: Any = None) -> Telemetry | None:
        """None when the OpenTelemetry API is not installed (then providers are refused)."""
        if otel_trace is None:
            if tracer_provider is not None or meter_provider is not None:
                raise RuntimeError("tracer_provider/meter_provider need the OpenTelemetry"
                                   " API: pip install 'redlock-fenced[otel]'")
            return None
        return cls(namespace, nodes, quorum, tracer_provider, meter_provider)

    def instruments(self) -> _Instruments | None:
        """The instruments to record with now, or None (nothing configured: no cost)."""
        assert otel_trace is not None and otel_metrics is not None
        if time.monotonic() < self.quiet_until:
            return None
        tracer_provider = self._tracer_provider or otel_trace.get_tracer_provider()
        meter_provider = self._meter_provider or otel_metrics.get_meter_provider()
        if not self._explicit and _is_noop_tracer_provider(tracer_provider) \
                and _is_noop_meter_provider(meter_provider):
            # Asking the API means environment lookups: without providers, ask again only
            # once per RECHECK_S. A provider set later is used from then on.
            self.quiet_until = time.monotonic() + RECHECK_S
            return None
        cached = self._cached
        if cached is not None and cached[0] is tracer_provider and cached[1] is meter_provider:
            return cached[2]
        tracer = tracer_provider.get_tracer(_INSTRUMENTATION)
        meter = meter_provider.get_meter(_INSTRUMENTATION)
        made = _Instruments(tracer=tracer, **{
            field: (meter.create_histogram if unit == "s" else meter.create_counter)(
                name, unit=unit, description=description)
            for field, name, unit, description in _METRICS})
        self._cached = (tracer_provider, meter_provider, made)
        return made


def observe(telemetry: Telemetry | None, op: str,
            make_flow: Callable[[AttemptWatch | None], Flow[T]], handle: Any,
            amnesia_health: Any = None) -> Flow[T]:
    """The operation's flow (``make_flow(watch)``) as it is when nothing records; else
    wrapped in an observer, which the core tells of each acquire attempt (``watch``:
    events from the core, not wire replies read again)."""
    if telemetry is None:
        return make_flow(None)
    instruments = telemetry.instruments()
    if instruments is None:
        return make_flow(None)
    observer = _Observer(telemetry, instruments, op, handle, amnesia_health)
    return observer.run(make_flow(observer.attempted))


class _Observer:
    def __init__(self, telemetry: Telemetry, instruments: _Instruments, op: str, handle: Any,
                 amnesia_health: Any = None) -> None:
        self.t = telemetry
        self.i = instruments
        self.op = op
        self.handle = handle
        self.health = amnesia_health
        self.attempts = 0
        self.votes: int | None = None
        self.quorum_failures = 0
        self.waited = 0.0

    def _base_attributes(self) -> dict[str, Any]:
        resources = getattr(self.handle, "resources", None)
        kind = getattr(self.handle, "_kind", None)  # election, semaphore, rwlock (§12)
        return {"redlock.resource": list(resources) if resources else self.handle.resource,
                "redlock.namespace": self.t.namespace, "redlock.nodes": self.t.nodes,
                "redlock.quorum": self.t.quorum,
                "redlock.kind": "lock" if kind is None else kind.name}

    def run(self, flow: Flow[T]) -> Flow[T]:
        span = self.i.tracer.start_span(f"redlock.{self.op}", attributes=self._base_attributes())
        started = time.perf_counter()
        amnesiac_before = self._amnesiac()
        try:
            result = yield from self._forward(flow)
        except BaseException as exc:
            self._finish(span, started, amnesiac_before, None, exc)
            raise
        self._finish(span, started, amnesiac_before, result, None)
        return result

    def _amnesiac(self) -> set[int]:
        if self.health is None:
            return set()
        return set(self.health.benched())

    def attempted(self, result: AttemptResult) -> None:
        """The core ended an acquire attempt: count it, its votes, a quorum failure (a
        new cluster's first round, every node without a marker, is none)."""
        self.attempts += 1
        self.votes = sum(1 for r in result.outcomes if r.outcome is Outcome.GRANTED)
        if self.votes < self.t.quorum and not all(
                r.outcome is Outcome.AMNESIAC for r in result.outcomes):
            self.quorum_failures += 1

    def _forward(self, flow: Flow[T]) -> Flow[T]:
        """Forward requests and replies unchanged, timing the waits between attempts."""
        try:
            request = next(flow)
            while True:
                sent = time.perf_counter()
                try:
                    reply = yield request
                except GeneratorExit:
                    flow.close()
                    raise
                except BaseException as exc:
                    request = flow.throw(exc)
                    continue
                if isinstance(request, Backoff):
                    self.waited += time.perf_counter() - sent
                request = flow.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _finish(self, span: Any, started: float, amnesiac_before: set[int], result: object,
                error: BaseException | None) -> None:
        elapsed = time.perf_counter() - started
        outcome = self._outcome(result, error)
        attributes: dict[str, Any] = {"redlock.outcome": outcome}
        if self.op == "acquire":
            attributes["redlock.attempts"] = self.attempts
            if self.votes is not None:
                attributes["redlock.votes_granted"] = self.votes
        if outcome in ("acquired", "extended"):
            attributes.update(self._tokens())
        span.set_attributes(attributes)
        if error is not None and outcome not in ("not_acquired",):
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
        metric_attributes = {"redlock.namespace": self.t.namespace, "redlock.outcome": outcome}
        if self.op == "acquire":
            self.i.duration.record(elapsed, metric_attributes)
            self.i.wait.record(self.waited, metric_attributes)
            if self.quorum_failures:
                self.i.quorum_failures.add(self.quorum_failures,
                                           {"redlock.namespace": self.t.namespace})
            new = self._amnesiac() - amnesiac_before
            if new:
                self.i.amnesia.add(len(new), {"redlock.namespace": self.t.namespace,
                                              "redlock.amnesia.kind": "node"})
            if isinstance(error, ClusterAmnesiaError):
                self.i.amnesia.add(1, {"redlock.namespace": self.t.namespace,
                                       "redlock.amnesia.kind": "majority"})
        if outcome == "lost" and self.op == "extend":
            # Counted where the lock is lost (the extend that failed), not again by a
            # later release or extend that reports it.
            self.i.lost.add(1, {"redlock.namespace": self.t.namespace})

    def _outcome(self, result: object, error: BaseException | None) -> str:
        if error is None:
            if self.op == "acquire":
                return "acquired" if result else "not_acquired"
            return {"extend": "extended", "release": "released"}.get(self.op, "done")
        if isinstance(error, QuorumUnavailable):
            return "unavailable"
        if isinstance(error, ClusterAmnesiaError):
            return "amnesia"
        if isinstance(error, LockLost):
            return "lost"
        if isinstance(error, NotHeld):
            return "not_held"
        return "error"

    def _tokens(self) -> dict[str, Any]:
        try:
            if hasattr(self.handle, "tokens"):
                return {"redlock.tokens": list(self.handle.tokens.values())}
            return {"redlock.token": self.handle.token}
        except Exception:  # lost in between: the outcome says enough
            return {}


def record_renewal(telemetry: Telemetry | None, state: Any, outcome: str, started_ns: int) -> None:
    """One auto-extend renewal of ``state`` by the manager's renewal loop: a
    ``redlock.extend`` span (``redlock.auto_extend=true``) from the round's start;
    ``outcome`` is ``extended``, ``failed`` (it will retry) or ``lost`` (counted)."""
    if telemetry is None:
        return
    instruments = telemetry.instruments()
    if instruments is None:
        return
    resources = state.resources
    attributes: dict[str, Any] = {
        "redlock.resource": list(resources) if len(resources) > 1 else resources[0],
        "redlock.namespace": telemetry.namespace, "redlock.nodes": telemetry.nodes,
        "redlock.quorum": telemetry.quorum, "redlock.auto_extend": True,
        "redlock.outcome": outcome}
    if outcome == "extended":
        if len(resources) > 1:
            attributes["redlock.tokens"] = list(state.tokens.values())
        else:
            attributes["redlock.token"] = state.token
    span = instruments.tracer.start_span("redlock.extend", attributes=attributes,
                                         start_time=started_ns)
    if outcome != "extended":
        span.set_status(Status(StatusCode.ERROR, "renewal not acked by a quorum in time"))
    span.end()
    if outcome == "lost":
        instruments.lost.add(1, {"redlock.namespace": telemetry.namespace})
