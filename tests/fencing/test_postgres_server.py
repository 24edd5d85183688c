"""tests.support.postgres: a real throwaway PostgreSQL server, cleaned up on close."""

from __future__ import annotations

import os
import pwd

import psycopg
import pytest

from tests.support.postgres import PostgresServer, find_postgres_bin


def test_server_starts_answers_and_leaves_nothing_behind(postgres: PostgresServer) -> None:
    # (the session server proves the binaries exist; this one is private to the test)
    with PostgresServer() as server:
        assert server.running and server.base_dir is not None
        base_dir, pid = server.base_dir, server.process.pid if server.process else 0
        with psycopg.connect(server.dsn) as conn:
            row = conn.execute("SELECT current_user, inet_server_addr()::text, "
                               "inet_server_port()").fetchone()
        assert row == ("postgres", "127.0.0.1/32", server.port)
        assert server.url == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as the postgres user
            assert os.stat(f"/proc/{pid}").st_uid == pwd.getpwnam("postgres").pw_uid
        assert (base_dir / "data" / "PG_VERSION").exists()
    assert not server.running and server.base_dir is None
    assert not base_dir.exists()
    assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped
    server.close()  # idempotent


def test_binaries_are_found(postgres: PostgresServer) -> None:
    assert (find_postgres_bin() / "initdb").exists()
    assert find_postgres_bin("/nonexistent") == find_postgres_bin()  # falls back


def test_a_server_that_cannot_start_reports_why(postgres: PostgresServer) -> None:
    with pytest.raises(RuntimeError, match="postgres exited"), \
            PostgresServer(port=postgres.port):  # the port is taken
        pass


def test_a_missing_os_user_is_reported_and_nothing_is_left(postgres: PostgresServer) -> None:
    server = PostgresServer(os_user="no-such-user-here")
    with pytest.raises(RuntimeError, match="no OS user"):
        server.start()
    assert server.base_dir is None and not server.running
