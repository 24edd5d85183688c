"""One behaviour test, both clients: the harness of the ``flavour`` fixture.

A behaviour test is an ``async def`` test that takes ``flavour`` (parametrised:
``sync`` runs it on :class:`redlock.Redlock`, ``async`` on :class:`redlock.AsyncRedlock`)
and talks to locks through *actors*::

    async def test_x(flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
        dlm = flavour.manager(nodes3)            # closed after the test
        lock = me.on(dlm.lock("r", ttl=5.0))     # the handle, as this actor sees it
        assert await lock.acquire(blocking=False)
        assert await lock.token() >= 1
        async with flavour.actor().holding(dlm.lock("s")) as held:   # a with-block
            ...

An acquisition belongs to the thread (sync) or asyncio task (async) that made it:
``token``, ``release()`` and friends from another owner raise NotHeld. An actor is one
such owner: a thread of its own for the sync client, a task of its own for the asyncio
one. Everything an actor runs has a hang guard: a call that does not come back within
its limit fails the test instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio

from redlock import AsyncLock, AsyncRedlock, Lock, LockNotAcquired, Redlock
from redlock.admin import Admin, AsyncAdmin
from redlock.testing import RedisNode, RedisNodes

# Far above any figure a test expects: a hang, not a slow shared machine, trips it.
HANG_LIMIT = 30.0
# A healthy node on a busy shared machine must not look dead: larger than the default
# 50 ms. Tests about time bounds pass their own node_timeout.
NODE_TIMEOUT = 0.25
RETRY_DELAY_MAX = 0.05  # waiters poll often: tests that contend finish sooner

Manager = Redlock | AsyncRedlock
Handle = Lock | AsyncLock


def admin(dlm: Manager) -> Admin | AsyncAdmin:
    """The operator's tools over ``dlm`` (:mod:`redlock.admin`), of its flavour: call
    them through :func:`resolve` for one line for both."""
    return AsyncAdmin(dlm) if isinstance(dlm, AsyncRedlock) else Admin(dlm)


async def resolve(value: Any) -> Any:
    """``value``, awaited if it is awaitable: one line for sync and async results."""
    return await value if inspect.isawaitable(value) else value


async def eventually(predicate: Callable[[], object], timeout: float,
                     step: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return bool(predicate())


def run_threads(target: Callable[[int], object], count: int,
                timeout: float) -> list[threading.Thread]:
    """``count`` threads running ``target(0)`` ... ``target(count - 1)``, all started,
    then each joined (waiting up to ``timeout`` seconds for it); the threads."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return threads


class Stopwatch:
    """Seconds since it was made (monotonic): ``took = Stopwatch(); ...; took()``."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.started


class Actor:
    """One lock owner: runs calls in its own thread (sync) or task (async), in order.

    ``call(fn, *args)`` runs ``fn(*args)`` as this owner and awaits its result if that is
    awaitable (so ``lock.acquire`` works for both clients), within the hang limit.
    """

    def __init__(self, is_async: bool, name: str, limit: float = HANG_LIMIT) -> None:
        self.is_async = is_async
        self.name = name
        self.limit = limit
        self._thread_jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._task_jobs: asyncio.Queue[Any] | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the owner's own thread or task ---------------------------------------

    def _serve_thread(self) -> None:
        while True:
            job = self._thread_jobs.get()
            if job is None:
                return
            loop, future, fn = job
            try:
                outcome: tuple[bool, Any] = (True, fn())
            except BaseException as exc:
                outcome = (False, exc)
            loop.call_soon_threadsafe(_settle, future, outcome)

    async def _serve_task(self) -> None:
        assert self._task_jobs is not None
        while True:
            future, fn = await self._task_jobs.get()
            try:
                outcome: tuple[bool, Any] = (True, await resolve(fn()))
            except BaseException as exc:
                _settle(future, (False, exc))
                if isinstance(exc, asyncio.CancelledError):
                    raise  # the actor itself was cancelled (a hang, or teardown)
            else:
                _settle(future, outcome)

    def _submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self.is_async:
            if self._task is None:
                self._task_jobs = asyncio.Queue()
                self._task = loop.create_task(self._serve_task(), name=self.name)
            assert self._task_jobs is not None
            self._task_jobs.put_nowait((future, fn))
        else:
            if self._thread is None:
                # A daemon: a thread stuck in a hung call must not keep pytest alive.
                self._thread = threading.Thread(target=self._serve_thread, name=self.name,
                                                daemon=True)
                self._thread.start()
            self._thread_jobs.put((loop, future, fn))
        return future

    async def call(self, fn: Callable[..., Any], *args: Any, limit: float | None = None,
                   **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` run (and awaited) by this owner; its result or raise."""
        future = self._submit(lambda: fn(*args, **kwargs))
        seconds = self.limit if limit is None else limit
        try:
            return await asyncio.wait_for(asyncio.shield(future), seconds)
        except asyncio.TimeoutError:
            if not future.done():
                if self._task is not None:
                    self._task.cancel()
                    self._task = None
                pytest.fail(f"{self.name} hung: no answer within {seconds} s")
            raise  # the call itself raised a TimeoutError

    async def call_all(self, *steps: Callable[[], Any], limit: float | None = None) -> list[Any]:
        """Several calls back to back as this owner, their results: each step starts as
        soon as the previous one returned (for the asyncio client, in the same turn of
        the event loop), without a round trip to the test in between."""
        if self.is_async:
            async def chain() -> list[Any]:
                return [await resolve(step()) for step in steps]

            return list(await self.call(chain, limit=limit))
        return list(await self.call(lambda: [step() for step in steps], limit=limit))

    async def close(self) -> None:
        if self._thread is not None:
            self._thread_jobs.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 5.0)
            self._thread = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- locks as this owner sees them ----------------------------------------

    def on(self, lock: Handle) -> Held:
        return Held(self, lock)

    async def cycle(self, lock: Handle) -> int:
        """Enter ``lock``'s with-block, read the token, leave: the token it had."""
        async with self.holding(lock) as held:
            return int(await held.token())

    @contextlib.asynccontextmanager
    async def holding(self, lock: Handle, *, limit: float | None = None
                      ) -> AsyncIterator[Held]:
        """``with lock`` / ``async with lock`` entered and left by this owner; the block
        runs in the test, with what the lock's enter returned as this owner's view."""
        if hasattr(lock, "__aenter__"):  # an asyncio handle, of any kind
            enter: Callable[[], Any] = lock.__aenter__
            leave: Callable[..., Any] = lock.__aexit__
        else:
            enter, leave = lock.__enter__, lock.__exit__
        entered = await self.call(enter, limit=limit)
        try:
            yield Held(self, entered)
        except BaseException as exc:
            if not await self.call(leave, type(exc), exc, exc.__traceback__):
                raise
        else:
            await self.call(leave, None, None, None)


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():  # the waiter gave up (hang guard)
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class Held:
    """A lock handle as one actor sees it: every call runs as that owner, and returns
    what the handle returned (or raises what it raised)."""

    def __init__(self, actor: Actor, lock: Handle) -> None:
        self.actor = actor
        self.handle = lock

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None, *,
                      limit: float | None = None) -> Any:
        return await self.actor.call(self.handle.acquire, blocking, timeout, limit=limit)

    async def release(self) -> None:
        await self.actor.call(self.handle.release)

    async def extend(self, ttl: float | None = None) -> None:
        await self.actor.call(self.handle.extend, ttl)

    async def check(self) -> None:
        await self.actor.call(self.handle.check)

    async def token(self) -> Any:
        return await self.actor.call(lambda: self.handle.token)

    async def validity(self) -> Any:
        return await self.actor.call(lambda: self.handle.validity)

    async def lost(self) -> Any:
        return await self.actor.call(lambda: self.handle.lost)

    async def locked(self) -> Any:
        return await self.actor.call(self.handle.locked)

    @property
    def last_failure(self) -> LockNotAcquired | None:
        return self.handle.last_failure  # per handle, not per owner


class Flavour:
    """One client flavour (``sync`` or ``async``): managers, actors and redis-py clients
    of that flavour; all closed after the test."""

    def __init__(self, kind: str) -> None:
        assert kind in ("sync", "async")
        self.kind = kind
        self.is_async = kind == "async"
        self.manager_class: type[Redlock] | type[AsyncRedlock] = (
            AsyncRedlock if self.is_async else Redlock)
        self.lock_class: type[Lock] | type[AsyncLock] = AsyncLock if self.is_async else Lock
        self._managers: list[Manager] = []
        self._actors: list[Actor] = []
        self._clients: list[redis.Redis | redis.asyncio.Redis] = []

    def manager(self, nodes: RedisNodes | Sequence[Any], **options: Any) -> Any:
        """A Redlock or AsyncRedlock on ``nodes`` (a RedisNodes, or URLs and clients);
        node_timeout and retry_delay_max default to values safe on a busy machine."""
        options.setdefault("node_timeout", NODE_TIMEOUT)
        options.setdefault("retry_delay_max", RETRY_DELAY_MAX)
        return self.bare_manager(nodes, **options)

    def bare_manager(self, nodes: RedisNodes | Sequence[Any] | Any, **options: Any) -> Any:
        """Like :meth:`manager`, with the library's own defaults (and any argument)."""
        given: Any = nodes.urls if isinstance(nodes, RedisNodes) else nodes  # bad ones too
        dlm = self.manager_class(given, **options)
        self._managers.append(dlm)
        return dlm

    def actor(self, name: str | None = None, *, limit: float = HANG_LIMIT) -> Actor:
        """A new owner (its own thread or task)."""
        actor = Actor(self.is_async, name or f"actor-{len(self._actors)}", limit)
        self._actors.append(actor)
        return actor

    def redis_client(self, node: RedisNode, **options: Any) -> Any:
        """A redis.Redis (sync) or redis.asyncio.Redis (async) client of ``node``."""
        cls = redis.asyncio.Redis if self.is_async else redis.Redis
        client = cls(host=node.host, port=node.port, **options)
        self._clients.append(client)
        return client

    def callback(self, fn: Callable[[Any], object]) -> Callable[[Any], Any]:
        """``fn`` as an on_lost callback of this flavour: for the asyncio client a
        coroutine function (which must be awaited for ``fn`` to run at all)."""
        if not self.is_async:
            return fn

        async def coroutine(handle: Any) -> None:
            await asyncio.sleep(0)
            fn(handle)

        return coroutine

    async def close(self) -> None:
        for actor in self._actors:
            await actor.close()
        for dlm in self._managers:
            await resolve(dlm.close())
        for client in self._clients:
            if isinstance(client, redis.asyncio.Redis):
                await client.aclose()
            else:
                client.close()
