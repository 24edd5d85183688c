"""What OpenTelemetry costs our sync client per acquire+release (N=3, uncontended).

    .venv/bin/python benchmarks/otel_cost.py [--rounds 5] [--cycles 2000]

Each setup runs in its own subprocess (global OpenTelemetry providers can be set once
per process), rounds interleaved, against one shared RedisNodes(3):

* absent:       the OpenTelemetry API cannot be imported (the ``otel`` extra not installed)
* no-provider:  the API installed, no provider set (OpenTelemetry's no-op defaults)
* sdk-memory:   the SDK's TracerProvider (in-memory exporter, simple processor) and
                MeterProvider (in-memory reader) set as the global providers: every
                acquire and release recorded
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETUPS = ("absent", "no-provider", "sdk-memory")


def child(setup: str, urls: list[str], cycles: int) -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        cache_logger_on_first_use=True)
    if setup == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    elif setup == "sdk-memory":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))

    import _measure
    from _peers import TTL_S, checked

    from redlock import Redlock

    with Redlock(urls) as dlm:
        assert (dlm._telemetry is None) == (setup == "absent")
        result = _measure.uncontended(lambda r: dlm.lock(r, ttl=TTL_S),
                                      checked(lambda h: h.acquire(), "redlock-fenced"),
                                      lambda h, _c: h.release(), f"bench:otel:{setup}",
                                      cycles=cycles, warmup=200)
    print(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--child", nargs=2, metavar=("SETUP", "URLS_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]), args.cycles)
        return 0

    from _environment import loadavg_text

    from redlock.testing import RedisNodes

    results: dict[str, list[dict[str, float]]] = {s: [] for s in SETUPS}
    with RedisNodes(3) as nodes:
        for round_no in range(args.rounds):
            order = SETUPS[round_no % 3:] + SETUPS[:round_no % 3]
            for setup in order:
                done = subprocess.run(
                    [sys.executable, __file__, "--cycles", str(args.cycles),
                     "--child", setup, json.dumps(nodes.urls)],
                    capture_output=True, text=True, check=True, cwd=str(HERE))
                results[setup].append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = statistics.median(r["p50_us"] for r in results["absent"])
    print(f"ours sync N=3, uncontended acquire+release, {args.cycles} cycles x {args.rounds}"
          f" rounds; loadavg {loadavg_text()}")
    for setup in SETUPS:
        p50 = [r["p50_us"] for r in results[setup]]
        med = statistics.median(p50)
        print(f"  {setup:12s} p50 {med:6.0f} us [{min(p50):.0f}-{max(p50):.0f}]  "
              f"{med - base:+5.0f} us ({(med - base) / base:+.0%}) vs absent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
