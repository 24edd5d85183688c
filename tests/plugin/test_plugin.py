"""The pytest plugin (entry point ``pytest11``), on the local backend: its fixtures in a
user's suite (run with pytester), its options, and what it does not do to our own
suite (no shadowed fixture, no foreign option, nothing imported or started unused)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import redlock.testing.pytest_plugin as plugin

EXAMPLE = Path(__file__).with_name("example_suite.py")
OUR_FIXTURES = {"nodes1", "nodes3", "nodes5", "fresh_nodes", "_pool1", "_pool3", "_pool5",
                "toxiproxy", "proxied5", "_proxies5", "fake", "postgres", "backend"}
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


def run_example(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeini(INI)
    pytester.makepyfile(test_example=EXAMPLE.read_text())
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def plugin_fixture_names(pytester: pytest.Pytester) -> set[str]:
    pytester.makeini(INI)
    result = pytester.runpytest("--fixtures", "-p", "no:cacheprovider")
    names = set()
    for line in result.outlines:
        match = re.match(r"^(\w+)( \[\w+ scope\])? -- .*redlock/testing/", line)
        if match:
            names.add(match.group(1))
    return names


def test_registered_through_the_entry_point(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("redlock") is plugin
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="pytest11") if e.name == "redlock"]
    assert entry.value == "redlock.testing.pytest_plugin"


def test_fixtures_are_all_prefixed_and_shadow_none_of_ours(pytester: pytest.Pytester) -> None:
    names = plugin_fixture_names(pytester)
    assert names == {"redlock_backend", "redlock_pool", "redlock_cluster", "redlock_faults",
                     "redlock_client", "redlock_async_client", "redlock_fenced_store"}
    assert not names & OUR_FIXTURES


def test_our_own_fixtures_still_come_from_our_conftest(request: pytest.FixtureRequest) -> None:
    for name in ("nodes1", "nodes3", "nodes5", "fresh_nodes"):
        definitions = request._fixturemanager.getfixturedefs(name, request.node)
        assert definitions, name
        assert all(Path(d.func.__code__.co_filename).name == "conftest.py"
                   for d in definitions), name


def test_only_its_own_options(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    result = pytester.runpytest("--help", "-p", "no:cacheprovider")
    lines = result.stdout.str().splitlines()
    start = lines.index("redlock-fenced test clusters:")
    options = []
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break
        match = re.match(r"^\s+(--[\w-]+)", line)
        if match:
            options.append(match.group(1))
    assert options == ["--redlock-backend", "--redlock-nodes"]


def test_importing_it_imports_no_docker_and_starts_nothing() -> None:
    code = (
        "import sys\n"
        "import redlock.testing.pytest_plugin\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('testcontainers', 'docker')"
        " or m in ('redlock.testing.containers', 'redlock.testing.dockerd',"
        " 'redlock.testing.images')]\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_an_unused_plugin_starts_no_server(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_plain="""
        import sys

        def test_plain():
            from redlock.testing import _leftovers
            assert not list(_leftovers._LIVE)  # nothing was started
            assert "testcontainers" not in sys.modules
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_example_suite_on_the_local_backend(pytester: pytest.Pytester) -> None:
    result = run_example(pytester, "--redlock-backend=local")
    result.assert_outcomes(passed=10, failed=1)
    result.stdout.fnmatch_lines(["*_ test_fails_on_purpose_without_a_quorum _*",
                                 "E * redlock.errors.QuorumUnavailable: *0 of 3 nodes granted*"])


def test_node_count_from_the_option_and_the_marker(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_sizes="""
        import pytest

        def test_default(redlock_cluster):
            assert len(redlock_cluster) == 1

        @pytest.mark.redlock_cluster(nodes=2)
        def test_marked(redlock_cluster):
            assert len(redlock_cluster) == 2
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--redlock-nodes=1")
    result.assert_outcomes(passed=2)


def test_unknown_backend_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI + "redlock_backend = kubernetes\n")
    pytester.makepyfile(test_one="def test_one(redlock_cluster):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown test backend 'kubernetes'*"])
