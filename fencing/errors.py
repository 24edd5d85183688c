"""Exceptions raised by :mod:`fencing`.

The tree::

    FencingError                 root: catch this to catch everything below
    ├── StaleTokenError          the resource already accepted a higher token:
    │                            the writer's lock was lost (paused past its TTL,
    │                            partitioned, ...) and a newer holder exists
    └── RowNotFoundError         (SQL) the fenced row does not exist; also a LookupError

Bad arguments raise the built-in ``TypeError`` / ``ValueError`` at the call site.
Database errors (sqlite3 / psycopg) and Redis errors propagate unchanged."""

from __future__ import annotations


class FencingError(Exception):
    """Root of every error this package raises on purpose."""


class StaleTokenError(FencingError):
    """A write carried a token lower than the highest one the resource has accepted.

    Attributes:
        resource: what was written (a Redis resource name, or ``table[key]`` for SQL).
        offered: the token the writer presented.
        highest: the highest token the resource had accepted when it refused."""

    def __init__(self, resource: str, offered: int, highest: int) -> None:
        # args are the fields, plain JSON: pickle and the JSON serializers that rebuild
        # an exception as type(*args) (Celery's default) both give it back whole.
        super().__init__(resource, offered, highest)
        self.resource = resource
        self.offered = offered
        self.highest = highest

    def __str__(self) -> str:
        return (f"stale fencing token for {self.resource!r}: offered {self.offered}, but the"
                f" resource already accepted {self.highest}; this writer's lock was lost to a"
                " newer holder and the write was rejected")


class RowNotFoundError(FencingError, LookupError):
    """A fenced UPDATE or guard found no row with that key (use ``upsert`` for first writes)."""

    def __init__(self, table: str, key: object) -> None:
        super().__init__(table, key)  # the fields (see StaleTokenError)
        self.table = table
        self.key = key

    def __str__(self) -> str:
        return (f"no row with key {self.key!r} in {self.table}: nothing to fence (create it"
                " with upsert())")
