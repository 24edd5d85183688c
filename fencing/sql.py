"""Fenced writes to your own SQL table (sqlite3 from the stdlib, or psycopg 3).

The table needs a unique key column and a fence column that holds the highest
token accepted for that row::

    CREATE TABLE inventory (
        sku   TEXT PRIMARY KEY,
        qty   INTEGER NOT NULL,
        fence BIGINT NOT NULL DEFAULT 0      -- NOT NULL: a NULL fence accepts no write
    );

    table = FencedTable(conn, "inventory", "sku")
    table.upsert("apple", token, qty=100)          # first write: INSERT ... ON CONFLICT
    table.update("apple", token, qty=99)           # UPDATE ... WHERE fence <= token
    with table.guard("apple", token) as row:       # read-modify-write
        row.update(qty=row["qty"] - 1)

The fence lives in the row it protects (one per row, like a version column): deleting
the row deletes it, and a later ``upsert`` inserts the row again with any token, so
delete rows only once a stale writer no longer matters (docs/design.md §7.5).

Every write is one conditional statement; its row count says whether the token was current (never
SELECT-then-UPDATE). ``guard`` first raises the stored fence to the token and only then reads, so
once it has read, no holder with a lower token can write that row any more: its UPDATE matches
nothing (or, in PostgreSQL, waits for the row lock and then matches nothing).

Transactions: with ``commit=True`` (the default) every call is its own transaction: it commits on
success and rolls back on any error, including a stale token (note that, as with ``conn.commit()``,
this also ends a transaction the caller had open). With ``commit=False`` the calls run inside
whatever transaction the caller manages, and the caller commits or rolls back.

Identifiers are validated (letters, digits, underscores; the table may be
``schema.table``) and always double-quoted, so they are case-sensitive: pass them
as stored (PostgreSQL folds unquoted names to lower case)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from fencing._validate import validate_token
from fencing.errors import FencingError, RowNotFoundError, StaleTokenError

Dialect = Literal["sqlite", "postgresql"]
DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgresql")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_ATTEMPTS = 3  # re-runs when a write matched nothing yet the row shows no higher fence


def quote_identifier(name: object, *, what: str = "identifier", dotted: bool = False) -> str:
    """Validate ``name`` and return it double-quoted (``schema.table`` if ``dotted``)."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    parts = name.split(".") if dotted else [name]
    if len(parts) > 2 or not all(_IDENTIFIER.match(part) for part in parts):
        shape = "name or schema.name" if dotted else "name"
        raise ValueError(
            f"{what} {name!r} is not a plain SQL {shape} (letters, digits and underscores, "
            f"not starting with a digit, at most 63 characters)")
    return ".".join(f'"{part}"' for part in parts)


def detect_dialect(conn: object) -> Dialect:
    """``sqlite`` for sqlite3 connections, ``postgresql`` for psycopg (3, or 2)."""
    module = type(conn).__module__.split(".")[0]
    if module == "sqlite3":
        return "sqlite"
    if module in ("psycopg", "psycopg2"):
        return "postgresql"
    raise ValueError(
        f"cannot tell the SQL dialect of a {type(conn).__module__}.{type(conn).__name__} "
        f"connection: pass dialect= one of {DIALECTS}")


class FencedTable:
    """Fenced writes to rows of ``table``, keyed by ``key_column``.

    Args:
        conn: a DB-API connection (``sqlite3.Connection`` or ``psycopg.Connection``).
            Use one FencedTable per connection, and one connection per thread.
        table: the table (``name`` or ``schema.name``).
        key_column: a column with a unique constraint (the upsert conflicts on it).
        fence_column: the ``BIGINT NOT NULL DEFAULT 0`` column holding the token.
        dialect: ``"sqlite"`` or ``"postgresql"``; detected from ``conn`` when None.
        commit: True: each call commits (or rolls back) its own transaction.
            False: the caller's transaction; the caller commits."""

    def __init__(self, conn: Any, table: str, key_column: str, fence_column: str = "fence",
                 *, dialect: Dialect | None = None, commit: bool = True) -> None:
        if dialect is None:
            dialect = detect_dialect(conn)
        elif dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
        self.conn = conn
        self.dialect: Dialect = dialect
        self.commit = bool(commit)
        self.table = table
        self._table = quote_identifier(table, what="table", dotted=True)
        self._row_ref = self._table.split(".")[-1]  # how the upsert's WHERE names the row
        self.key_column = key_column
        self._key = quote_identifier(key_column, what="key_column")
        self.fence_column = fence_column
        self._fence = quote_identifier(fence_column, what="fence_column")
        if self._key == self._fence:
            raise ValueError("key_column and fence_column must differ")

    # -- SQL text -------------------------------------------------------------

    def _param(self, name: str) -> str:
        return f":{name}" if self.dialect == "sqlite" else f"%({name})s"

    def _columns(self, values: Mapping[str, object]) -> list[tuple[str, str]]:
        """(quoted column, parameter name) for each value; key and fence are not values."""
        out = []
        for index, name in enumerate(values):
            column = quote_identifier(name, what="column")
            if column in (self._key, self._fence):
                raise ValueError(
                    f"{name!r} is the {'key' if column == self._key else 'fence'} column: "
                    f"it is set by the fenced write itself, not passed as a value")
            out.append((column, f"v{index}"))
        return out

    def _statement(self, key: object, token: int, values: Mapping[str, object]
                   ) -> tuple[list[tuple[str, str]], dict[str, object]]:
        columns = self._columns(values)
        params: dict[str, object] = {"key": key, "token": token}
        for (_, param), value in zip(columns, values.values(), strict=True):
            params[param] = value
        return columns, params

    def _update_sql(self, columns: list[tuple[str, str]]) -> str:
        sets = [f"{column} = {self._param(param)}" for column, param in columns]
        sets.append(f"{self._fence} = {self._param('token')}")
        return (f"UPDATE {self._table} SET {', '.join(sets)} "
                f"WHERE {self._key} = {self._param('key')} "
                f"AND {self._fence} <= {self._param('token')}")

    def _upsert_sql(self, columns: list[tuple[str, str]]) -> str:
        names = [self._key, *(column for column, _ in columns), self._fence]
        params = [self._param("key"), *(self._param(p) for _, p in columns), self._param("token")]
        sets = [f"{column} = excluded.{column}" for column, _ in columns]
        sets.append(f"{self._fence} = excluded.{self._fence}")
        return (f"INSERT INTO {self._table} ({', '.join(names)}) VALUES ({', '.join(params)}) "
                f"ON CONFLICT ({self._key}) DO UPDATE SET {', '.join(sets)} "
                f"WHERE {self._row_ref}.{self._fence} <= excluded.{self._fence}")

    # -- transactions ---------------------------------------------------------

    def _begin(self, cursor: Any, write: bool) -> bool:
        """Open a transaction when we own it and none is open; True if we sent BEGIN."""
        if not self.commit or not write:
            return False  # a lone SELECT needs no explicit transaction (nor a write lock)
        if self.dialect == "sqlite":
            if not self.conn.in_transaction:
                # IMMEDIATE: take the write lock now, not at the first write.
                cursor.execute("BEGIN IMMEDIATE")
                return True
            return False
        if getattr(self.conn, "autocommit", False):
            cursor.execute("BEGIN")
            return True
        return False  # psycopg opens one implicitly with the first statement

    def _end(self, cursor: Any, began: bool, ok: bool) -> None:
        if not self.commit:
            return
        if began:
            cursor.execute("COMMIT" if ok else "ROLLBACK")
        elif ok:
            self.conn.commit()
        else:
            self.conn.rollback()

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[Any]:
        cursor = self.conn.cursor()
        try:
            began = self._begin(cursor, write)
            try:
                yield cursor
            except BaseException:
                self._end(cursor, began, ok=False)
                raise
            self._end(cursor, began, ok=True)
        finally:
            cursor.close()

    # -- helpers --------------------------------------------------------------

    def _name(self, key: object) -> str:
        return f"{self.table}[{key!r}]"

    def _fence_of(self, cursor: Any, key: object) -> tuple[bool, int | None]:
        """(row exists, its fence) read in the current transaction."""
        cursor.execute(f"SELECT {self._fence} FROM {self._table} "
                       f"WHERE {self._key} = {self._param('key')}", {"key": key})
        row = cursor.fetchone()
        if row is None:
            return False, None
        return True, None if row[0] is None else int(row[0])

    def _fenced(self, cursor: Any, sql: str, params: dict[str, object], key: object,
                token: int, *, insert: bool) -> None:
        """Run a conditional write; its row count must be 1, else say why."""
        for _ in range(_ATTEMPTS):
            cursor.execute(sql, params)
            if cursor.rowcount == 1:
                return
            if cursor.rowcount > 1:
                raise FencingError(
                    f"{self._name(key)}: {cursor.rowcount} rows matched; the key column "
                    f"{self.key_column!r} must be unique")
            exists, fence = self._fence_of(cursor, key)
            if not exists and not insert:
                raise RowNotFoundError(self.table, key)
            if exists and fence is None:
                raise FencingError(
                    f"{self._name(key)}: the fence column {self.fence_column!r} is NULL, "
                    f"which accepts no write; declare it NOT NULL DEFAULT 0")
            if fence is not None and fence > token:
                raise StaleTokenError(self._name(key), token, fence)
            # Matched nothing, yet no higher fence now: the row changed under us
            # (deleted, re-inserted). Try again.
        raise FencingError(f"{self._name(key)}: the fenced write kept matching no row")

    # -- public API -----------------------------------------------------------

    def update(self, key: object, token: int, /, **values: object) -> None:
        """``UPDATE ... SET values, fence = token WHERE key = key AND fence <= token``.

        Raises :class:`StaleTokenError` when the row has a higher fence,
        :class:`RowNotFoundError` when there is no such row."""
        token = validate_token(token)
        columns, params = self._statement(key, token, values)
        with self._transaction() as cursor:
            self._fenced(cursor, self._update_sql(columns), params, key, token, insert=False)

    def upsert(self, key: object, token: int, /, **values: object) -> None:
        """Insert the row, or update it if its fence <= token (first writes).

        ``INSERT ... ON CONFLICT (key) DO UPDATE SET ... WHERE table.fence <= excluded.fence``."""
        token = validate_token(token)
        columns, params = self._statement(key, token, values)
        with self._transaction() as cursor:
            self._fenced(cursor, self._upsert_sql(columns), params, key, token, insert=True)

    def read(self, key: object) -> dict[str, Any] | None:
        """The row as a dict (fence included), or None."""
        with self._transaction(write=False) as cursor:
            return self._read(cursor, key)

    def _read(self, cursor: Any, key: object) -> dict[str, Any] | None:
        cursor.execute(f"SELECT * FROM {self._table} WHERE {self._key} = {self._param('key')}",
                       {"key": key})
        row = cursor.fetchone()
        if row is None:
            return None
        return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}

    def highest(self, key: object) -> int:
        """The row's fence: the highest token accepted for it (0 when there is no row)."""
        with self._transaction(write=False) as cursor:
            _, fence = self._fence_of(cursor, key)
        return fence or 0

    @contextmanager
    def guard(self, key: object, token: int) -> Iterator[Guard]:
        """Read-modify-write under a token: raise the fence, then read, then write.

        On entry the row's fence is raised to ``token`` (StaleTokenError if it is higher,
        RowNotFoundError if there is no row), *then* the row is read, in the same transaction. The
        body reads ``guard.row`` / ``guard["col"]`` and calls ``guard.update(col=...)``. Leaving
        the block commits (``commit=True``); an exception rolls back and propagates."""
        token = validate_token(token)
        raise_fence = (f"UPDATE {self._table} SET {self._fence} = {self._param('token')} "
                       f"WHERE {self._key} = {self._param('key')} "
                       f"AND {self._fence} <= {self._param('token')}")
        with self._transaction() as cursor:
            self._fenced(cursor, raise_fence, {"key": key, "token": token}, key, token,
                         insert=False)
            row = self._read(cursor, key)
            if row is None:  # pragma: no cover - the fenced UPDATE just matched it
                raise RowNotFoundError(self.table, key)
            yield Guard(self, cursor, key, token, row)


class Guard:
    """The row inside :meth:`FencedTable.guard`: read it, then write with the same token."""

    def __init__(self, table: FencedTable, cursor: Any, key: object, token: int,
                 row: dict[str, Any]) -> None:
        self._table = table
        self._cursor = cursor
        self.key = key
        self.token = token
        self.row = row

    def __getitem__(self, column: str) -> Any:
        return self.row[column]

    def update(self, **values: object) -> None:
        """Fenced UPDATE of this row with the guard's token (in the guard's transaction)."""
        table = self._table
        columns, params = table._statement(self.key, self.token, values)
        table._fenced(self._cursor, table._update_sql(columns), params, self.key, self.token,
                      insert=False)
        self.row.update(values)
