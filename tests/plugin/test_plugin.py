"""The pytest plugin (entry point ``pytest11``), on the local backend: its fixtures in a
user's suite (run with pytester), its options, and what it does not do to our own
suite (no shadowed fixture, no foreign option, nothing imported or started unused)."""

from __future__ import annotations

import json
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
                     "redlock_client", "redlock_async_client", "redlock_fenced_store",
                     "redlock_history", "redlock_redis_cluster",
                     "redlock_redis_cluster_of_module"}
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


# Never imported by loading the plugin, nor in a session that uses none of its fixtures:
# the Docker backend and its libraries, the database driver, the harness's servers, and
# the repository's own tooling (tests/support, not in the package; their old names).
HEAVY_PACKAGES = ("testcontainers", "docker", "psycopg")
HEAVY_MODULES = ("redlock.testing.containers", "redlock.testing.backends",
                 "redlock.testing.redis_nodes", "redlock.testing.toxiproxy",
                 "redlock.testing.sentinel", "redlock.testing.logs",
                 "redlock.testing.dockerd", "redlock.testing.images",
                 "redlock.testing.postgres", "redlock.testing.faketime")


def test_loading_it_imports_nothing_beyond_its_package() -> None:
    """What pytest does in every session of a user who installed the package: the
    plugin module adds itself and ``redlock.testing`` (whose names load lazily) to
    ``import redlock``, nothing else."""
    code = (
        "import json, sys\n"
        "import pytest\n"
        "import redlock\n"
        "before = set(sys.modules)\n"
        "import redlock.testing.pytest_plugin\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    added, everything = (json.loads(line) for line in result.stdout.splitlines())
    assert added == ["redlock.testing", "redlock.testing.pytest_plugin"]
    heavy = [m for m in everything if m.split(".")[0] in (*HEAVY_PACKAGES, "pytest_asyncio")
             or m in HEAVY_MODULES or m.startswith("tests.support")]
    assert heavy == []


def test_an_unused_plugin_starts_no_server(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_plain=f"""
        import sys

        def test_plain():
            loaded = [m for m in sys.modules if m.split(".")[0] in {HEAVY_PACKAGES!r}
                      or m in {HEAVY_MODULES!r} or m.startswith("tests.support")]
            assert loaded == []
            from redlock.testing import _leftovers
            assert not list(_leftovers._LIVE)  # nothing was started
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_example_suite_on_the_local_backend(pytester: pytest.Pytester) -> None:
    result = run_example(pytester, "--redlock-backend=local")
    result.assert_outcomes(passed=11, failed=1)
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
