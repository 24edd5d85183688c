"""FencedTable on a real SQLite file and a real PostgreSQL server (both per test)."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fencing import FencedTable, FencingError, RowNotFoundError, StaleTokenError
from fencing.sql import detect_dialect, quote_identifier
from redlock.testing.history import check
from tests.fencing.workload import Backend, WriteFunction, run_mixed, run_threads


def table_on(conn: Any, **options: Any) -> FencedTable:
    return FencedTable(conn, "cells", "name", **options)


def test_upsert_update_read_and_equal_tokens(backend: Backend) -> None:
    conn = backend.connect()
    try:
        table = table_on(conn)
        assert table.read("a") is None and table.highest("a") == 0
        table.upsert("a", 5, val=b"five", qty=1)
        assert table.read("a") == {"name": "a", "val": b"five", "qty": 1, "fence": 5}
        table.upsert("a", 5, val=b"five again")  # equal token: the same holder
        table.update("a", 5, qty=2)
        table.update("a", 6, val=b"six")
        assert table.read("a") == {"name": "a", "val": b"six", "qty": 2, "fence": 6}
        with pytest.raises(StaleTokenError) as caught:
            table.update("a", 5, val=b"stale")
        assert (caught.value.offered, caught.value.highest) == (5, 6)
        assert caught.value.resource == "cells['a']"
        with pytest.raises(StaleTokenError):
            table.upsert("a", 4, val=b"stale")
        assert table.read("a") == {"name": "a", "val": b"six", "qty": 2, "fence": 6}
        table.upsert("b", 0)  # no values: only the key and the fence
        assert table.highest("b") == 0
        assert table.highest("a") == 6
    finally:
        conn.close()


def test_update_of_a_missing_row(backend: Backend) -> None:
    conn = backend.connect()
    try:
        with pytest.raises(RowNotFoundError) as caught:
            table_on(conn).update("nope", 1, qty=1)
        assert isinstance(caught.value, LookupError) and caught.value.key == "nope"
        with pytest.raises(RowNotFoundError), table_on(conn).guard("nope", 1):
            pass
    finally:
        conn.close()


def test_guard_reads_after_raising_the_fence_and_writes(backend: Backend) -> None:
    conn = backend.connect()
    try:
        table = table_on(conn)
        table.upsert("stock", 3, qty=10)
        with table.guard("stock", 4) as row:
            assert row["qty"] == 10 and row["fence"] == 4  # the fence is raised already
            row.update(qty=row["qty"] - 1)
        assert table.read("stock") == {"name": "stock", "val": None, "qty": 9, "fence": 4}
        ran = False
        with pytest.raises(StaleTokenError), table.guard("stock", 3):
            ran = True
        assert not ran
        with pytest.raises(RuntimeError), table.guard("stock", 9) as row:
            row.update(qty=0)
            raise RuntimeError("the holder failed midway")
        # Rolled back: neither the write nor the raised fence stayed.
        assert table.read("stock") == {"name": "stock", "val": None, "qty": 9, "fence": 4}
    finally:
        conn.close()


@pytest.mark.parametrize("autocommit", [False, True], ids=["transaction", "autocommit"])
def test_stale_holder_is_blocked_once_the_guard_raised_the_fence(backend: Backend,
                                                                 autocommit: bool) -> None:
    """B (token 7) enters the guard and reads; A (token 5, the old holder) tries to
    write in between; A is rejected and B's read-modify-write stands."""
    options = ({"autocommit": True} if backend.name == "postgres" else
               {"isolation_level": None}) if autocommit else {}
    conn_a, conn_b = backend.connect(**options), backend.connect(**options)
    try:
        table_on(conn_b).upsert("stock", 5, qty=10)
        b_has_read = threading.Event()
        a_result: list[object] = []

        def holder_a() -> None:
            b_has_read.wait(10)
            try:
                table_on(conn_a).update("stock", 5, qty=100)
                a_result.append("accepted")
            except Exception as exc:
                a_result.append(exc)
            a_result.append(time.monotonic())

        thread = threading.Thread(target=holder_a)
        thread.start()
        with table_on(conn_b).guard("stock", 7) as row:
            seen = row["qty"]
            b_has_read.set()
            time.sleep(0.3)  # A's write arrives while B is between its read and write
            row.update(qty=seen - 1)
            b_done = time.monotonic()
        thread.join(30)
        verdict, a_done = a_result
        assert isinstance(verdict, StaleTokenError), verdict
        assert (verdict.offered, verdict.highest) == (5, 7)
        assert a_done >= b_done - 0.05  # A waited for B's transaction
        assert table_on(conn_a).read("stock") == {"name": "stock", "val": None, "qty": 9,
                                                  "fence": 7}
    finally:
        conn_a.close()
        conn_b.close()


def test_commit_false_runs_in_the_callers_transaction(backend: Backend) -> None:
    conn = backend.connect()
    try:
        table = table_on(conn, commit=False)
        table.upsert("a", 1, qty=1)
        conn.rollback()
        assert table_on(conn).read("a") is None
        table.upsert("a", 1, qty=1)
        with table.guard("a", 2) as row:
            row.update(qty=2)
        conn.commit()
        assert table_on(conn).read("a") == {"name": "a", "val": None, "qty": 2, "fence": 2}
    finally:
        conn.close()


def test_sqlite_without_implicit_transactions(tmp_path: Any) -> None:
    conn = sqlite3.connect(tmp_path / "db", isolation_level=None)
    try:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT, f BIGINT NOT NULL DEFAULT 0)")
        table = FencedTable(conn, "t", "k", "f")
        table.upsert(1, 3, v="x")
        with table.guard(1, 4) as row:
            assert conn.in_transaction
            row.update(v=row["v"] + "y")
        assert not conn.in_transaction
        assert table.read(1) == {"k": 1, "v": "xy", "f": 4}
        with pytest.raises(StaleTokenError):
            table.update(1, 3, v="stale")
        assert not conn.in_transaction
    finally:
        conn.close()


def test_schema_qualified_table_and_odd_column_names(backend: Backend) -> None:
    schema = "main" if backend.name == "sqlite" else "public"
    conn = backend.connect()
    try:
        conn.execute('CREATE TABLE "Odd" ("Key" TEXT PRIMARY KEY, "select" TEXT, '
                     '"Fence" BIGINT NOT NULL DEFAULT 0)')
        conn.commit()
        table = FencedTable(conn, f"{schema}.Odd", "Key", "Fence")
        table.upsert("k", 2, select="reserved words are quoted")
        table.upsert("k", 3, select="updated")
        with pytest.raises(StaleTokenError):
            table.upsert("k", 2, select="stale")
        assert table.read("k") == {"Key": "k", "select": "updated", "Fence": 3}
    finally:
        conn.execute('DROP TABLE "Odd"')
        conn.commit()
        conn.close()


def test_broken_tables_are_reported(backend: Backend) -> None:
    conn = backend.connect()
    try:
        conn.execute("CREATE TABLE nullable (k TEXT PRIMARY KEY, f BIGINT)")
        conn.execute("CREATE TABLE nonunique (k TEXT, f BIGINT NOT NULL DEFAULT 0)")
        conn.execute("INSERT INTO nullable (k) VALUES ('a')")
        conn.execute("INSERT INTO nonunique (k) VALUES ('a'), ('a')")
        conn.commit()
        with pytest.raises(FencingError, match="NULL"):
            FencedTable(conn, "nullable", "k", "f").update("a", 1)
        with pytest.raises(FencingError, match="unique"):
            FencedTable(conn, "nonunique", "k", "f").update("a", 1)
        assert FencedTable(conn, "nonunique", "k", "f").highest("a") == 0  # rolled back
    finally:
        conn.execute("DROP TABLE nullable")
        conn.execute("DROP TABLE nonunique")
        conn.commit()
        conn.close()


def test_input_validation(tmp_path: Any) -> None:
    conn = sqlite3.connect(tmp_path / "db")
    try:
        for table, key, fence in [("x; DROP TABLE t", "k", "f"), ("t", "k k", "f"),
                                  ("t", "k", 'f"'), ("a.b.c", "k", "f"), ("", "k", "f"),
                                  ("t", "1k", "f"), ("t", "k", "k"), ("t", "k", "x" * 64)]:
            with pytest.raises(ValueError):
                FencedTable(conn, table, key, fence)
        with pytest.raises(TypeError):
            FencedTable(conn, b"t", "k")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            FencedTable(conn, "t", "k", dialect="mysql")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="dialect"):
            FencedTable(object(), "t", "k")
        table = FencedTable(conn, "t", "k")
        for token, error in [(True, TypeError), (1.5, TypeError), ("1", TypeError),
                             (-1, ValueError), (2**63, ValueError)]:
            with pytest.raises(error):
                table.update("a", token, v=1)  # type: ignore[arg-type]
            with pytest.raises(error):
                table.upsert("a", token, v=1)  # type: ignore[arg-type]
            with pytest.raises(error), table.guard("a", token):  # type: ignore[arg-type]
                pass
        with pytest.raises(ValueError, match="fence column"):
            table.update("a", 1, fence=3)
        with pytest.raises(ValueError, match="key column"):
            table.upsert("a", 1, k="b")
        with pytest.raises(ValueError):
            table.update("a", 1, **{"v; --": 1})
    finally:
        conn.close()
    assert quote_identifier("s.t", dotted=True) == '"s"."t"'
    assert detect_dialect(sqlite3.connect(":memory:")) == "sqlite"


def test_every_lower_token_rejected_under_concurrency(backend: Backend) -> None:
    """6 writer threads and 2 writer processes, each with its own connection, random
    tokens on 3 rows for ~1.5 s; upserts and updates mixed."""
    rows = ["r1", "r2", "r3"]
    conn = backend.connect()
    table = table_on(conn)
    for row in rows:
        table.upsert(row, 0)

    def make_write() -> tuple[WriteFunction, Callable[[], None]]:
        own = backend.connect()
        mine = table_on(own)
        use_upsert = random.random() < 0.5

        def write(key: str, token: int, value: bytes) -> None:
            (mine.upsert if use_upsert else mine.update)(key, token, val=value)

        return write, own.close

    try:
        records = run_mixed(backend.name, backend.target, make_write, rows, threads=6,
                            processes=2, seconds=1.5, seed=random.randrange(1 << 30))
        finals = {}
        for row in rows:
            state = table.read(row)
            assert state is not None
            finals[row] = (None if state["val"] is None else bytes(state["val"]), state["fence"])
    finally:
        conn.close()
    stats = check(records, finals)
    print(stats.line(backend.name))
    stats.assert_clean()
    assert stats.accepted > 20 and stats.rejected > 20
    assert {r.writer.split("-")[0] for r in records} == {"thread", "process"}


def test_concurrent_first_writes_via_upsert(backend: Backend) -> None:
    """Rows that do not exist yet: concurrent INSERT ... ON CONFLICT with random tokens."""

    def make_write() -> tuple[WriteFunction, Callable[[], None]]:
        own = backend.connect()
        mine = table_on(own)
        return (lambda key, token, value: mine.upsert(key, token, val=value)), own.close

    keys = [f"new{i}" for i in range(20)]
    t0 = time.monotonic()
    records = run_threads(make_write, keys, 6, t0, t0 + 0.6, seed=random.randrange(1 << 30))
    conn = backend.connect()
    try:
        table = table_on(conn)
        finals = {}
        for key in keys:
            state = table.read(key)
            finals[key] = (None, 0) if state is None else (bytes(state["val"]), state["fence"])
    finally:
        conn.close()
    stats = check(records, finals)
    print(stats.line(f"{backend.name} first writes"))
    stats.assert_clean()
