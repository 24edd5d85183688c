"""What a pip user gets: one version, the metadata, the README's first commands, and
harness messages that do not assume a clone of the repository (the wheel itself, built
and installed into a clean virtualenv: tests/test_wheel.py)."""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

import pytest

import redlock
from redlock.testing import find_redis_server, find_toxiproxy_server
from tests.support import faketime
from tests.support.postgres import PostgresNotFound, find_postgres_bin

ROOT = Path(__file__).resolve().parent.parent


def test_one_version_everywhere() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", redlock.__version__)
    assert importlib.metadata.version("redlock-fenced") == redlock.__version__
    first_release = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert first_release is not None and first_release.group(1) == redlock.__version__


def test_metadata() -> None:
    meta = importlib.metadata.metadata("redlock-fenced")
    assert meta["License-Expression"] == "MIT"
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert any(c.startswith("Programming Language :: Python :: 3.1")
               for c in meta.get_all("Classifier") or [])
    assert meta.get_all("Project-URL")
    requires = meta.get_all("Requires-Dist") or []
    assert not any(r.startswith("structlog") and "extra" not in r for r in requires)
    postgres = [r for r in requires if 'extra == "postgres"' in r]
    assert postgres and all(r.startswith("psycopg>=") for r in postgres)  # not [binary]
    entry = importlib.metadata.entry_points(group="console_scripts", name="redlock")
    assert [e.value for e in entry] == ["redlock.cli:entry_point"]


def test_readme_starts_with_the_two_commands_and_an_install_that_works() -> None:
    readme = (ROOT / "README.md").read_text()
    language, *first_block = readme.split("```")[1].strip().splitlines()
    assert language == "console"
    assert first_block == ["$ bash scripts/demo", "$ bash scripts/test"]  # .ci/run parses it
    # Not on PyPI yet: the install line a reader meets first must work from the clone.
    first_install = readme[readme.index("pip install"):].split("`")[0]
    assert first_install.startswith("pip install /path/to/redlock-fenced")
    assert "not published on PyPI yet" in readme


def test_sdist_leaves_the_test_suite_out() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "prune tests" in manifest


@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where none of the servers is installed."""
    for name in ("REDIS_SERVER", "TOXIPROXY_SERVER", "PG_BIN", "REDLOCK_FAKETIME_LIB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "access", lambda *_args, **_kw: False)
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.mark.usefixtures("nothing_installed")
def test_missing_servers_are_explained_to_pip_users_too() -> None:
    with pytest.raises(FileNotFoundError) as redis_missing:
        find_redis_server()
    with pytest.raises(FileNotFoundError) as toxiproxy_missing:
        find_toxiproxy_server()
    messages = {"redis": str(redis_missing.value), "toxiproxy": str(toxiproxy_missing.value)}
    assert "apt-get install redis-server" in messages["redis"]
    assert "REDIS_SERVER" in messages["redis"]
    assert "github.com/Shopify/toxiproxy/releases" in messages["toxiproxy"]
    assert "TOXIPROXY_SERVER" in messages["toxiproxy"]
    for message in messages.values():  # the repository's script is an aside, not the way
        assert message.index("scripts/setup.sh") > message.index("install")
        assert "In a clone of redlock-fenced" in message


# PostgreSQL and libfaketime are the repository's own test tooling (tests/support, not in
# the wheel); their messages still say how to install them by hand, then the script.


@pytest.mark.usefixtures("nothing_installed")
def test_missing_postgresql_is_explained() -> None:
    with pytest.raises(PostgresNotFound) as missing:
        find_postgres_bin()
    message = str(missing.value)
    assert "apt-get install postgresql" in message
    assert "PG_BIN" in message
    assert message.index("scripts/setup.sh") > message.index("install")


def test_missing_libfaketime_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faketime, "_FOUND", None)  # the lookup's per-process cache
    monkeypatch.setattr(faketime, "_FAILURE", None)
    monkeypatch.setattr(faketime, "find_faketime_lib", lambda: None)
    with pytest.raises(faketime.FaketimeUnavailable) as missing:
        faketime.find_faketime_redis()
    assert "apt-get install libfaketime" in str(missing.value)
    assert faketime.FAKETIME_LIB_ENV in str(missing.value)
