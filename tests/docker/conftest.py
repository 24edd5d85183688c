"""Fixtures of the Docker tests: an engine, the local images, and the timings that the
run's summary prints.

The engine is the one at ``$DOCKER_HOST`` when it answers (``scripts/test`` starts our
private dockerd and sets it), else a private dockerd started here and stopped at the
end of the session. Where none can start, the tests skip with the reason, and fail
under CI (``$CI`` set): CI must run them.

No registry is reachable here: the Docker backend of ``redlock.testing`` (whose defaults
are the public ``redis:7`` and Toxiproxy images) is pointed at the images built locally
(tests/support/images.py) through ``$REDLOCK_REDIS_IMAGE`` / ``$REDLOCK_TOXIPROXY_IMAGE``,
and testcontainers' reaper (Ryuk, another image to pull) is turned off: the clean-up is
the backend's own, then the engine's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from docker_support import ROOT, TIMINGS, missing

from redlock.testing.containers import REDIS_IMAGE_ENV, TOXIPROXY_IMAGE_ENV, remove_orphans
from tests.support.dockerd import EngineAPI, EngineUnavailable, PrivateDockerd, docker_host
from tests.support.images import REDIS_IMAGE, TOXIPROXY_IMAGE, ensure_images

_DURATIONS: dict[str, float] = {}


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[EngineAPI]:
    """A Docker engine that answers, with the local images built and chosen."""
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    os.environ.setdefault(REDIS_IMAGE_ENV, REDIS_IMAGE)
    os.environ.setdefault(TOXIPROXY_IMAGE_ENV, TOXIPROXY_IMAGE)
    private: PrivateDockerd | None = None
    if os.environ.get("DOCKER_HOST"):
        try:
            api = EngineAPI.from_host()
        except EngineUnavailable as exc:
            missing(str(exc))
        if not api.ping():
            missing(f"no Docker engine answers at DOCKER_HOST={os.environ['DOCKER_HOST']}")
        TIMINGS["engine"] = f"given ({os.environ['DOCKER_HOST']})"
    else:
        private = PrivateDockerd()
        reason = private.unavailable_reason()
        if reason:
            missing(f"no Docker engine: {reason}")
        started = time.monotonic()
        try:
            private.start()
        except EngineUnavailable as exc:
            missing(f"the private dockerd did not start: {exc}")
        TIMINGS["engine"] = f"private dockerd started in {time.monotonic() - started:.1f} s"
        api = private.api()
    started = time.monotonic()
    results = ensure_images(api, app_checkout=ROOT)
    TIMINGS["images"] = (f"{time.monotonic() - started:.1f} s: " + ", ".join(
        f"{r.image} {'built' if r.built else 'cached'} ({r.seconds:.1f} s)" for r in results))
    try:
        if private is not None:
            with docker_host(private.host):
                yield api
        else:
            yield api
    finally:
        if private is not None:
            private.stop()
        else:
            remove_orphans()


@pytest.fixture(autouse=True)
def _engine_for_every_docker_test(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("docker"):
        request.getfixturevalue("docker_engine")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "docker" in report.keywords:
        _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _DURATIONS and not TIMINGS:
        return
    terminalreporter.section("docker")
    for name, text in TIMINGS.items():
        terminalreporter.write_line(f"{name}: {text}")
    if _DURATIONS:
        terminalreporter.write_line(f"docker tests: {len(_DURATIONS)} in "
                                    f"{sum(_DURATIONS.values()):.1f} s (setup and teardown "
                                    f"included)")
