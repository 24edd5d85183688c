"""The pytest plugin on the Docker backend: the same user suite as
tests/plugin/test_plugin.py runs on testcontainers' Redis containers and a Toxiproxy
container, with the same outcomes, and leaves no container behind."""

from __future__ import annotations

import pytest

# Imported here, not first inside an inner run: pytester restores sys.modules after each
# inline run, and a requests/http.cookiejar imported there would be half-forgotten by
# the next run ("You can only merge into CookieJar").
import testcontainers.community.redis  # noqa: F401
from docker_support import ROOT

from redlock.testing.containers import engine_leftovers
from tests.support.dockerd import EngineAPI

pytestmark = pytest.mark.docker

EXAMPLE = ROOT / "tests" / "plugin" / "example_suite.py"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_example_suite_on_the_docker_backend(pytester: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch,
                                             docker_engine: EngineAPI, how: str) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_example=EXAMPLE.read_text(), test_backend="""
        from redlock.testing.containers import ContainerRedisNodes, ContainerToxiproxy

        def test_runs_in_containers(redlock_cluster, redlock_pool):
            assert isinstance(redlock_cluster.nodes, ContainerRedisNodes)
            assert isinstance(redlock_pool.toxiproxy(), ContainerToxiproxy)
    """)
    if how == "option":
        args = ["--redlock-backend=docker"]
    else:
        monkeypatch.setenv("REDLOCK_TEST_BACKEND", "docker")
        args = []
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=12, failed=1)
    result.stdout.fnmatch_lines(["*_ test_fails_on_purpose_without_a_quorum _*",
                                 "E * redlock.errors.QuorumUnavailable: *0 of 3 nodes granted*"])
    assert engine_leftovers() == []
