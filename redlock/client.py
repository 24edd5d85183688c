"""The synchronous client: a thin I/O shell over :mod:`redlock.core`.

It only sends, waits and sleeps. Parallel means parallel on one thread: a
request's commands are written to every node first (scatter), then the replies
are read against one shared deadline (gather), so N nodes cost one round trip
and one node timeout at most, not N.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis
import structlog
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from redlock import scripts
from redlock.core import (
    Broadcast,
    Call,
    LockState,
    Protocol,
    RedlockCore,
    RepairReport,
    Replies,
    Request,
    Settings,
    T,
    run_to_completion,
)
from redlock.handle import LockHandleBase
from redlock.lines import LocalLines, Ticket
from redlock.nodes import address_of, check_node_list, pool_overrides

logger = structlog.get_logger(__name__)

OnLost = Callable[["Lock"], object]

# Set only in a watchdog thread while it runs on_lost (threading.local: per thread).
_acting = threading.local()

_PARKED_PER_NODE = 16


def _command(call: Call, *, evalsha: bool) -> tuple[Any, ...]:
    if call.script is None:
        return call.args
    head = ("EVALSHA", call.script.sha) if evalsha else ("EVAL", call.script.source)
    return (*head, len(call.keys), *call.keys, *call.args)


@dataclass(frozen=True)
class _Parked:
    """A connection whose acquire script got no reply in time.

    The node may still run that script later (a hung node works through its socket
    when it comes back, a lost reply means it already did). The connection is kept,
    not closed, so that the release for the same owner is written *behind* it on the
    same socket: the node then runs our release after our acquire, in order. A release
    on a new connection would wait for a handshake the hung node never answers.
    """

    conn: Any
    lock_key: str
    owner: object


class _Nodes:
    """One connection pool per node, and scatter/gather over raw connections."""

    def __init__(self, nodes: Sequence[str | redis.Redis], node_timeout: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        self.pools: list[redis.ConnectionPool] = []
        for node in check_node_list(nodes, redis.Redis, "redis.Redis"):
            if isinstance(node, str):
                pool = redis.ConnectionPool.from_url(node, **overrides)
            else:  # the caller's client: same settings, our own bounded pool
                source = node.connection_pool
                pool = redis.ConnectionPool(
                    connection_class=source.connection_class,
                    **{**source.connection_kwargs, **overrides})
            self.pools.append(pool)
        self.addresses = [address_of(pool.connection_kwargs) for pool in self.pools]
        self._parked: list[list[_Parked]] = [[] for _ in self.pools]
        self._parked_mutex = threading.Lock()

    def broadcast(self, request: Broadcast) -> list[object]:
        if any(self._parked):
            self._trail_releases(request)
        deadline = time.monotonic() + request.timeout
        replies: list[object] = [None] * len(request.calls)
        pending: list[tuple[int, Call, Any]] = []
        try:
            # Scatter. A node with an idle open connection costs a write; a node that
            # needs a new connection (first use, or after a timeout closed it) may take
            # up to a node timeout to connect and handshake (a hung node accepts TCP but
            # never answers AUTH / CLIENT SETINFO). Those connect in parallel, so k hung
            # nodes cost one node timeout, not k.
            slow: list[tuple[int, Call]] = []
            for index, call in enumerate(request.calls):
                if self._has_idle_connection(self.pools[call.node]):
                    self._connect_and_send(index, call, replies, pending)
                else:
                    slow.append((index, call))
            if len(slow) == 1:
                self._connect_and_send(*slow[0], replies, pending)
            elif slow:
                self._connect_in_parallel(slow, replies, pending)
            while pending:  # gather against one deadline
                index, call, conn = pending[0]
                replies[index], parked = self._read(conn, call, deadline)
                pending.pop(0)
                if not parked:
                    self.pools[call.node].release(conn)
        finally:
            for _, call, conn in pending:  # interrupted: these replies will never be read
                if not self._park(call, conn):
                    self._discard(call.node, conn)
        return replies

    def _park(self, call: Call, conn: Any) -> bool:
        """Keep the connection of an unanswered acquire (see _Parked); False if not one."""
        if call.script is not scripts.ACQUIRE or getattr(conn, "_sock", None) is None:
            return False
        evicted = None
        with self._parked_mutex:
            parked = self._parked[call.node]
            parked.append(_Parked(conn, call.keys[0], call.args[0]))
            if len(parked) > _PARKED_PER_NODE:
                evicted = parked.pop(0)
        if evicted is not None:
            self._discard(call.node, evicted.conn)
        return True

    def _trail_releases(self, request: Broadcast) -> None:
        """Write each release behind the unanswered acquires of the same owner, then
        close those connections (the FIN follows the release; the node runs both)."""
        for call in request.calls:
            if call.script is not scripts.RELEASE:
                continue
            key = (call.keys[0], call.args[0])
            with self._parked_mutex:
                parked = self._parked[call.node]
                mine = [p for p in parked if (p.lock_key, p.owner) == key]
                if not mine:
                    continue
                self._parked[call.node] = [p for p in parked if p not in mine]
            for item in mine:
                with contextlib.suppress(Exception):  # the normal release still runs
                    item.conn.send_command(*_command(call, evalsha=False), check_health=False)
                self._discard(call.node, item.conn)

    def _discard(self, node: int, conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.disconnect()
        with contextlib.suppress(Exception):
            self.pools[node].release(conn)

    @staticmethod
    def _has_idle_connection(pool: redis.ConnectionPool) -> bool:
        """True when the pool can hand out an already open connection (no connect)."""
        idle = getattr(pool, "_available_connections", None)
        try:
            newest = idle[-1] if idle else None  # the one get_connection() pops next
        except IndexError:  # another thread took it meanwhile
            return False
        return getattr(newest, "_sock", None) is not None

    def _connect_and_send(self, index: int, call: Call, replies: list[object],
                          pending: list[tuple[int, Call, Any]]) -> None:
        pool = self.pools[call.node]
        conn = None
        try:
            conn = pool.get_connection()
            conn.send_command(*_command(call, evalsha=True))
            pending.append((index, call, conn))
        except Exception as exc:
            replies[index] = exc
            if conn is not None:
                conn.disconnect()
                pool.release(conn)

    def _connect_in_parallel(self, calls: list[tuple[int, Call]], replies: list[object],
                             pending: list[tuple[int, Call, Any]]) -> None:
        """One short-lived thread per new connection; each is bounded by the socket
        timeouts. If the caller is interrupted meanwhile, late connections are closed
        by their own thread instead of leaking."""
        mutex = threading.Lock()
        abandoned = False

        def work(index: int, call: Call) -> None:
            mine: list[tuple[int, Call, Any]] = []
            self._connect_and_send(index, call, replies, mine)
            with mutex:
                if not abandoned:
                    pending.extend(mine)
                    return
            for _, _, conn in mine:
                conn.disconnect()
                self.pools[call.node].release(conn)

        threads = [threading.Thread(target=work, args=item, name="redlock-connect",
                                    daemon=True) for item in calls]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            with mutex:
                abandoned = True

    def _read(self, conn: Any, call: Call, deadline: float) -> tuple[object, bool]:
        """The reply (or the error) and whether the connection was parked."""
        try:
            try:
                return conn.read_response(timeout=max(deadline - time.monotonic(), 0.0005),
                                          disconnect_on_error=False), False
            except NoScriptError:  # first use on this node (or SCRIPT FLUSH): send the body
                conn.send_command(*_command(call, evalsha=False))
                return conn.read_response(timeout=max(deadline - time.monotonic(), 0.0005),
                                          disconnect_on_error=False), False
        except redis.TimeoutError as exc:
            if self._park(call, conn):
                return exc, True
            conn.disconnect()  # a late reply must never be read as the next command's
            return exc, False
        except Exception as exc:
            conn.disconnect()
            return exc, False

    def close(self) -> None:
        with self._parked_mutex:
            parked = [(node, item) for node, items in enumerate(self._parked)
                      for item in items]
            self._parked = [[] for _ in self.pools]
        for node, item in parked:
            self._discard(node, item.conn)
        for pool in self.pools:
            pool.disconnect()


# The sync shell's lines: threads wait on threading events and locks.
_SyncLines = LocalLines[threading.Event, threading.Lock]
_SyncTicket = Ticket[threading.Event]


class Redlock:
    """A distributed lock manager over N independent Redis masters.

    Args:
        nodes: URLs (``redis://host:port``, ``rediss://user:pass@host:port``) or
            ``redis.Redis`` clients, one per independent master. An odd N is best.
        namespace: key prefix; keys are ``{namespace}:{{resource}}:lock`` / ``:fence``.
        node_timeout: seconds each node may take to answer one request (connect
            included). Keep it small relative to the TTL: 5-50 ms for a 10 s TTL.
        drift_factor: clock-drift allowance as a fraction of the TTL (plus 2 ms).
        retry_delay_min, retry_delay_max: bounds of the jittered exponential backoff
            between attempts (a release by a handle of this manager wakes a waiter early).
        max_ttl: the largest TTL accepted, and how long an amnesiac node stays out
            before it is re-seeded and rejoins (every old lock has expired by then).
        clock: a monotonic clock in seconds (injectable for tests).
        sleep: how to wait between attempts (injectable for tests).
    """

    def __init__(
        self,
        nodes: Sequence[str | redis.Redis],
        *,
        namespace: str = "redlock",
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay_min: float = 0.005,
        retry_delay_max: float = 0.25,
        max_ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        settings = Settings(namespace=namespace, node_timeout=node_timeout,
                            drift_factor=drift_factor, retry_delay_min=retry_delay_min,
                            retry_delay_max=retry_delay_max, max_ttl=max_ttl)
        self._nodes = _Nodes(nodes, settings.node_timeout)
        try:
            self._core = RedlockCore(self._nodes.addresses, settings, clock)
        except BaseException:
            self._nodes.close()
            raise
        self._sleep = sleep
        self._lines: _SyncLines = LocalLines(threading.Event, threading.Lock)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' addresses, in the order given."""
        return self._core.addresses

    @property
    def quorum(self) -> int:
        return self._core.quorum

    def lock(
        self,
        resource: str,
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        auto_extend: bool = False,
        on_lost: OnLost | None = None,
        reentrant: bool = False,
    ) -> Lock:
        """A lock handle for ``resource``; nothing is sent until it is acquired."""
        return Lock(self, resource, ttl, blocking=blocking, timeout=timeout,
                    auto_extend=auto_extend, on_lost=on_lost, reentrant=reentrant)

    def repair(self, *, force: bool = False) -> list[RepairReport]:
        """Find nodes that lost their data and re-seed those whose rejoin delay passed.

        ``force=True`` skips the delay: only when you know every lock held before the
        node lost its data has expired (one max_ttl has passed).
        """
        return self._run(self._core.repair(force=force))

    def close(self) -> None:
        """Close the connections this manager opened (the caller's clients stay open)."""
        self._nodes.close()

    def __enter__(self) -> Redlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _execute(self, request: Request, sleep: Callable[[float], object] | None = None,
                 ticket: _SyncTicket | None = None) -> Replies:
        if isinstance(request, Broadcast):
            key = request.one_at_a_time
            if key is None:
                return self._nodes.broadcast(request)
            ticket = ticket or Ticket()
            line, handoff, until = self._lines.start_attempt(key, ticket)
            try:
                if handoff is not None:
                    handoff.wait(max(0.0, until - time.monotonic()))
                line.turn.acquire()
            except BaseException:
                self._lines.exit(key, line)
                raise
            try:
                return self._nodes.broadcast(request)
            finally:
                line.turn.release()
                self._lines.end_attempt(key, line, ticket)
        if (sleep is None and ticket is not None and request.wake_channel is not None
                and self._sleep is time.sleep):
            line, wake = self._lines.start_wait(request.wake_channel, ticket)
            try:
                wake.wait(request.seconds)
            finally:
                self._lines.exit(request.wake_channel, line)
        else:  # an injected sleep (tests) is honoured as given
            (sleep or self._sleep)(request.seconds)
        return ()

    def _run(self, protocol: Protocol[T]) -> T:
        return run_to_completion(protocol, self._execute)

    def _run_in_line(self, protocol: Protocol[T]) -> T:
        """_run for acquire: its attempts and waits keep one place in the local line."""
        ticket: _SyncTicket = Ticket()
        try:
            return run_to_completion(
                protocol, lambda request: self._execute(request, ticket=ticket))
        finally:
            self._lines.leave(ticket)


class Lock(LockHandleBase):
    """One resource's lock handle. Safe to share across threads: each thread that
    acquires through it gets its own acquisition (own owner value and token).

    Use as a context manager, or call :meth:`acquire` / :meth:`release`. While held,
    :attr:`token` is the fencing token to pass to the protected resource.
    """

    def __init__(self, redlock: Redlock, resource: str, ttl: float = 10.0, *,
                 blocking: bool = True, timeout: float | None = None, auto_extend: bool = False,
                 on_lost: OnLost | None = None, reentrant: bool = False) -> None:
        super().__init__(redlock._core, resource, ttl, blocking=blocking, timeout=timeout,
                         auto_extend=auto_extend, reentrant=reentrant)
        self._redlock = redlock
        self.on_lost = on_lost
        self._watchdog_stops: dict[LockState, threading.Event] = {}

    def _owner_key(self) -> Hashable:
        acting_for: Hashable | None = getattr(_acting, "owner", None)
        if acting_for is not None:  # inside on_lost: the handle shows the lost acquisition
            return acting_for
        return threading.get_ident()

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Acquire on a quorum; True when held.

        ``blocking=False`` makes exactly one attempt. Blocking waits up to ``timeout``
        seconds (None: this handle's timeout, which may be None: no deadline). Returns
        False when others hold the lock; raises :class:`QuorumUnavailable` when too few
        nodes answer at all (an outage is not contention).
        """
        owner = self._owner_key()
        blocking, timeout = self._options(blocking, timeout)
        if self._prepare_acquire(owner) is not None:
            return True
        result = self._redlock._run_in_line(self._core.acquire(
            self.resource, self.ttl, blocking=blocking, timeout=timeout))
        state = self._finish_acquire(result, owner)
        if state is None:
            return False
        if self.auto_extend:
            self._start_watchdog(state, owner)
        return True

    def release(self) -> None:
        """Release on every node. Idempotent; a re-entered lock is released at depth 0."""
        state = self._prepare_release(self._owner_key())
        if state is None:
            return
        stop = self._watchdog_stops.pop(state, None)
        if stop is not None:
            stop.set()
        try:
            self._redlock._run(self._core.release(state))
        finally:
            self._redlock._lines.notify(self._core.keys.channel(self.resource))

    def extend(self, ttl: float | None = None) -> None:
        """Reset the TTL on a quorum; raises :class:`LockLost` when that fails in time."""
        state = self._held()
        self._redlock._run(self._core.extend_or_lose(
            state, self.ttl if ttl is None else self._core.check_ttl(ttl)))

    def _start_watchdog(self, state: LockState, owner: Hashable) -> None:
        stop = self._watchdog_stops[state] = threading.Event()

        def execute(request: Request) -> Replies:
            return self._redlock._execute(request, stop.wait)  # a release wakes it at once

        def run() -> None:
            try:
                lost = run_to_completion(self._core.watchdog(state), execute)
            except Exception:
                # The watchdog itself failed: the holder must not go on believing.
                logger.exception("redlock.watchdog_crashed", resource=self.resource)
                lost = state.mark_lost("the auto-extend watchdog crashed")
            self._watchdog_stops.pop(state, None)
            if lost and self.on_lost is not None:
                # The callback runs in this watchdog thread, not in the owner's: let the
                # handle's token/lost/check() answer for the owner's acquisition in here.
                _acting.owner = owner
                try:
                    self.on_lost(self)
                except Exception:
                    logger.exception("redlock.on_lost_failed", resource=self.resource)
                finally:
                    _acting.owner = None

        threading.Thread(target=run, name=f"redlock-watchdog:{self.resource}",
                         daemon=True).start()

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._entered_failure()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
