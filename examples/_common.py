"""The harness shared by the examples: everything around the library calls.

Nothing here is needed to use the library. It starts local redis-server nodes (or takes
``--urls``), opens the clients, runs the examples' actors as threads, helper processes
or event loops, and prints the story and the verdict. Each example keeps at its top the
part worth copying (the lock and the fenced store), and below it only what its scenario
needs beyond this module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis
import redis.asyncio

from fencing import AsyncRedisFencedStore, RedisFencedStore
from redlock import AsyncRedlock, EventFormatter, Redlock

T = TypeVar("T")
R = TypeVar("R")

# -- command line and nodes ---------------------------------------------------------------


def quiet_logging() -> None:
    """The application (an example), not the library, decides what gets logged: warnings
    and errors on stderr, with each event's fields."""
    logging.basicConfig(level=logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(EventFormatter("%(levelname)s %(name)s: %(message)s"))


def parser(doc: str | None, *, store: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc)
    p.add_argument("--urls", nargs="+", metavar="URL",
                   help="Redis lock nodes to use (default: start 3 local redis-server nodes)")
    if store:
        p.add_argument("--store-url", metavar="URL",
                       help="Redis node holding the fenced data (default: a 4th local node, "
                            "or the first of --urls)")
    return p


@contextlib.contextmanager
def redis_nodes(urls: Sequence[str] | None, store_url: str | None, count: int = 3,
                *, store: bool = True) -> Iterator[tuple[list[str], str]]:
    """(lock node URLs, store URL): the given ones, or local redis-server processes
    (``count`` lock nodes, plus one for the fenced data when ``store``)."""
    if urls:
        yield list(urls), store_url or urls[0]
        return
    from redlock.testing import RedisNodes

    with RedisNodes(count + (1 if store else 0)) as nodes:
        lock_urls = nodes.urls[:count]
        data = store_url or (nodes.urls[count] if store else "")
        print(f"started {count} local redis-server lock nodes ({', '.join(lock_urls)})"
              + (f" and a data store ({data})" if store else ""))
        yield lock_urls, data


Run = Callable[[argparse.Namespace, list[str], str], int]
Child = Callable[[list[str], list[str]], None]


def main(doc: str | None, run: Run, *,
         options: Callable[[argparse.ArgumentParser], None] | None = None,
         check: Callable[[argparse.Namespace], str | None] | None = None,
         child: Child | None = None, store: bool = True,
         argv: list[str] | None = None) -> int:
    """An example's command line: ``run(args, lock_urls, store_url)`` on the nodes given
    or started; or, as ``--child VALUE... -- LOCK_URL...``, a helper process that runs
    ``child(values, lock_urls)`` once its parent says go (see :class:`Helpers`)."""
    argv = sys.argv[1:] if argv is None else argv
    quiet_logging()
    if child is not None and argv[:1] == ["--child"]:
        split = argv.index("--")
        child_handshake()
        child(argv[1:split], argv[split + 1:])
        return 0
    p = parser(doc, store=store)
    if options is not None:
        options(p)
    args = p.parse_args(argv)
    problem = check(args) if check is not None else None
    if problem:
        p.error(problem)
    with redis_nodes(args.urls, getattr(args, "store_url", None), store=store) as (
            lock_urls, store_url):
        return run(args, lock_urls, store_url)


# -- clients ------------------------------------------------------------------------------


@contextlib.contextmanager
def fenced_store(store_url: str) -> Iterator[RedisFencedStore]:
    """A fenced store on its own client, closed afterwards (``store.client`` is it)."""
    client = redis.Redis.from_url(store_url)
    try:
        yield RedisFencedStore(client)
    finally:
        client.close()


@contextlib.contextmanager
def clients(lock_urls: list[str], store_url: str) -> Iterator[tuple[Redlock, RedisFencedStore]]:
    """One lock manager and one fenced store, shared by the threads of a process."""
    with Redlock(lock_urls) as dlm, fenced_store(store_url) as store:
        yield dlm, store


@contextlib.asynccontextmanager
async def async_clients(lock_urls: list[str], store_url: str
                        ) -> AsyncIterator[tuple[AsyncRedlock, AsyncRedisFencedStore]]:
    """The asyncio twin of :func:`clients`, for the tasks of one event loop."""
    client = redis.asyncio.Redis.from_url(store_url)
    try:
        async with AsyncRedlock(lock_urls) as dlm:
            yield dlm, AsyncRedisFencedStore(client)
    finally:
        await client.aclose()


# -- databases for the SQL example -----------------------------------------------------------

Connect = Callable[[], Any]  # opens a new DB-API connection (sqlite3 or psycopg 3)


@contextlib.contextmanager
def sqlite_database() -> Iterator[Connect]:
    """A throwaway SQLite database file (WAL mode, so that readers do not block)."""
    with tempfile.TemporaryDirectory(prefix="inventory-") as tmp:
        path = Path(tmp) / "shop.sqlite3"
        sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").connection.close()
        yield lambda: sqlite3.connect(path, timeout=30.0)


@contextlib.contextmanager
def postgres_database(dsn: str | None) -> Iterator[Connect | None]:
    """The given PostgreSQL database, or a throwaway server; None (with a note) when
    neither is available."""
    import psycopg

    if dsn:
        yield lambda: psycopg.connect(dsn)
        return
    try:  # the repository's test tooling (tests/support): examples run from a clone
        from tests.support.postgres import PostgresServer, postgres_available
    except ModuleNotFoundError:  # run by path (python examples/x.py): the clone's root
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.support.postgres import PostgresServer, postgres_available

    if not postgres_available():
        print("PostgreSQL: skipped, server binaries not found (bash scripts/setup.sh "
              "installs them)")
        yield None
        return
    with PostgresServer() as server:
        print(f"started a throwaway PostgreSQL server on {server.host}:{server.port}")
        yield lambda: psycopg.connect(server.dsn)


# -- actors: threads, event loops, helper processes -----------------------------------------


def in_threads(fn: Callable[[T], R], items: Iterable[T]) -> list[R | Exception]:
    """``fn(item)`` on one thread per item, all started at once; the results in the
    items' order (an exception a call raised stands in for its result)."""
    items = list(items)
    results: list[R | Exception] = [RuntimeError("did not finish")] * len(items)

    def call(index: int, item: T) -> None:
        try:
            results[index] = fn(item)
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=call, args=(i, item)) for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def event_loops(mains: Sequence[Callable[[], Coroutine[Any, Any, R]]]) -> list[R | Exception]:
    """Each coroutine function on its own event loop in its own thread, as separate
    application instances would run (one instance's stalled loop does not stall the
    others)."""
    return in_threads(lambda start: asyncio.run(start()), mains)


class Helpers:
    """Helper processes running ``script --child VALUE... -- LOCK_URL...``: each prints
    "ready", waits for "go" on stdin, then prints one JSON object per line."""

    def __init__(self, script: str, lock_urls: Sequence[str],
                 values_per_process: Sequence[Sequence[str]]) -> None:
        self.processes = [
            subprocess.Popen([sys.executable, script, "--child", *values, "--", *lock_urls],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for values in values_per_process
        ]
        try:
            for process in self.processes:
                assert process.stdout is not None
                line = process.stdout.readline().strip()
                if line != "ready":
                    raise RuntimeError(f"helper process did not start (said {line!r})")
        except BaseException:
            self.close()
            raise

    def go(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.close()

    def next_event(self, index: int = 0) -> dict[str, Any]:
        """The next JSON line of helper ``index`` (blocks until it prints one)."""
        stdout = self.processes[index].stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"helper process {index} ended without saying more")
        event: dict[str, Any] = json.loads(line)
        return event

    def pid(self, index: int = 0) -> int:
        return self.processes[index].pid

    def signal(self, signum: signal.Signals, index: int = 0) -> None:
        self.processes[index].send_signal(signum)

    def results(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Every line the helpers print until they exit (killed after ``timeout``)."""
        out: list[dict[str, Any]] = []
        for process in self.processes:
            assert process.stdout is not None
            timer = threading.Timer(timeout, process.kill)
            timer.start()
            try:
                text = process.stdout.read()
                process.wait()
            finally:
                timer.cancel()
            if process.returncode != 0:
                raise RuntimeError(f"helper process exited with {process.returncode}")
            out += [json.loads(line) for line in text.splitlines() if line.strip()]
        return out

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)  # a stopped process cannot die
                process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


def child_handshake() -> None:
    """The child side of :class:`Helpers`: say ready, wait for go."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the parent")


def emit(**fields: Any) -> None:
    """A helper's result line, read by :meth:`Helpers.results` in the parent."""
    print(json.dumps(fields), flush=True)


# -- the story ----------------------------------------------------------------------------


class Clock:
    """Milliseconds since the start, for the story lines."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> str:
        return f"{(time.monotonic() - self.t0) * 1000:7.0f} ms"


def text(value: bytes | str | None) -> str | None:
    """A Redis reply as text (the examples' clients return bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def verdict(ok: bool, what: str) -> int:
    print(f"{'OK' if ok else 'FAILED'}: {what}")
    return 0 if ok else 1
