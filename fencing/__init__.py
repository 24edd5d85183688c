"""Resource-side verifiers for fencing tokens.

A lock alone does not protect data once its holder pauses past the TTL (a GC pause,
SIGSTOP, a slow network): the holder still believes it holds the lock and writes.
The resource must refuse that stale writer. Every store here keeps the highest
token it has accepted per resource, *in the same store as the data*, and checks and
writes in one atomic step:

* a token lower than the highest accepted one is rejected
  (:class:`StaleTokenError`, nothing changes);
* an equal token is accepted (the same holder writing again);
* a higher token is accepted and becomes the new highest.

Stores:

* :class:`RedisFencedStore` / :class:`AsyncRedisFencedStore`: values in Redis, one
  Lua script per write::

      store = RedisFencedStore(redis.Redis(...))
      with dlm.lock("orders:42", ttl=10.0) as held:
          store.write("orders:42", held.token, b"paid")      # StaleTokenError if stale

  The token lives in the resource's own hash, next to its value; with ``ttl=`` both
  expire together (after which any token is accepted: see the class).

* :class:`FencedTable`: your own SQL table (sqlite3 or psycopg 3) with a fence
  column; ``update``/``upsert`` are single conditional statements and ``guard`` is
  the read-modify-write form (raise the fence first, then read).

What fencing cannot protect: side effects that cannot check a token (sending an
e-mail, calling an external API that has no idea of tokens, writing a local file).
A stale holder can still perform those; make them idempotent or move them behind a
fenced write (e.g. write an "outbox" row with the token, and send from there).

Errors: see :mod:`fencing.errors` for the tree."""

import logging

from fencing._validate import MAX_STORED_TOKEN, MAX_STORED_TTL
from fencing.errors import FencingError, RowNotFoundError, StaleTokenError
from fencing.redis_store import AsyncRedisFencedStore, RedisFencedStore
from fencing.sql import FencedTable, Guard

__all__ = ["MAX_STORED_TOKEN", "MAX_STORED_TTL", "AsyncRedisFencedStore", "FencedTable",
           "FencingError", "Guard", "RedisFencedStore", "RowNotFoundError", "StaleTokenError"]

# Rejections are raised, not logged, so nothing logs under "fencing" today; like
# "redlock", the logger stays silent unless the application configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())
