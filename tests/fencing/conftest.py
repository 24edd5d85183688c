"""Fixtures for the fencing tests. The Redis node comes from tests/conftest.py
(``nodes1``); a PostgreSQL server is started here once per session, and each SQL
test gets a fresh table on SQLite (a real file) and on PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fencing.workload import Backend
from tests.support.postgres import PostgresServer, postgres_available


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    if not postgres_available():
        message = ("PostgreSQL server binaries not found (bash scripts/setup.sh installs "
                   "them, or set PG_BIN)")
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run the PostgreSQL tests")
        pytest.skip(message)
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A database with an empty ``cells(name PRIMARY KEY, val, fence)`` table."""
    if request.param == "sqlite":
        path = str(tmp_path / "fenced.sqlite3")
        setup = sqlite3.connect(path)
        setup.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
        setup.close()

        def connect_sqlite(**options: Any) -> sqlite3.Connection:
            # Tests hand connections to helper threads (one thread at a time uses each).
            return sqlite3.connect(path, timeout=30.0, check_same_thread=False, **options)

        db = Backend("sqlite", path, connect_sqlite, "BLOB")
    else:
        import psycopg

        server: PostgresServer = request.getfixturevalue("postgres")

        def connect_pg(**options: Any) -> psycopg.Connection[Any]:
            return psycopg.connect(server.dsn, **options)

        db = Backend("postgres", server.dsn, connect_pg, "BYTEA")
        db.execute("DROP TABLE IF EXISTS cells")
    db.execute(f"CREATE TABLE cells (name TEXT PRIMARY KEY, val {db.blob}, "
               f"qty INTEGER NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)")
    yield db
    if db.name == "postgres":
        db.execute("DROP TABLE IF EXISTS cells")
