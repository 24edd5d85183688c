"""The renewer process (docs/design.md §5.2): a manager's renewal loop
(:mod:`redlock._core.renewals`) in a process of its own, over a copy of each acquisition the holder
leases it and a sync transport of its own. It writes each deadline into the shared memory, tells
the holder of losses, forwards log records, renews nothing while the holder is stopped, and exits
once it is gone. It ignores SIGINT and SIGTERM (sent to the whole group): the holder decides."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import threading
import time
from typing import Any

from redlock._client import environment
from redlock._client.executors import SyncExecutor
from redlock._client.renewer import SLOTS, Deadlines, Lease, Link, process_stat
from redlock._client.waiting_room import WaitingRoom
from redlock._core.algorithm import RedlockCore
from redlock._core.renewals import Renewals
from redlock._core.requests import Flow
from redlock._core.settings import Keys, Settings
from redlock._core.state import LockState
from redlock._io.endpoint import clusters, labels
from redlock._io.sync_transport import SyncTransport
from redlock._observe.log import event_fields

# How often the holder is looked at while nothing else happens.
_WATCH = 0.1
# Log records and telemetry outcomes waiting for a holder that does not read (starved):
# beyond this many, such messages are dropped (losses and freed slots never are).
_BACKLOG = 1 << 16
# The outbox writes at most this many messages at once, then rests this long.
_BATCH = 512
_REST = 0.01


class _Holder:
    """The holder process, as ``/proc`` shows it (by pid and start time)."""

    def __init__(self, pid: int, start: int) -> None:
        self.pid = pid
        self.start = start

    def state(self) -> str:
        """``running``, ``stopped`` (SIGSTOP, a debugger) or ``gone``."""
        stat = process_stat(self.pid)
        if stat is None or stat[1] != self.start or stat[0] in "ZXx":
            return "gone"
        return "stopped" if stat[0] in "Tt" else "running"


class _Outbox:
    """Messages to the holder, written by a thread of their own: the renewals never wait
    for a holder that reads late. It writes what has gathered in one go, then rests
    (_REST): a thread that takes and drops the interpreter's lock at every message would
    starve this process's own renewal loop, as the holder's threads are starved."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._dropped = 0
        threading.Thread(target=self._write, name="redlock-renewer-out", daemon=True).start()

    def put(self, message: object, *, droppable: bool = False) -> None:
        if droppable and self._queue.qsize() > _BACKLOG:
            self._dropped += 1
            return
        self._queue.put(message)

    def _write(self) -> None:
        while True:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < _BATCH:
                    batch.append(self._queue.get_nowait())
            try:
                self._link.send_all(batch)
            except OSError:
                return  # the holder is gone: the main thread sees it too
            time.sleep(_REST)

    def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until what was put is written."""
        until = time.monotonic() + timeout
        while not self._queue.empty() and time.monotonic() < until:
            time.sleep(0.01)


class _Forward(logging.Handler):
    """The library's log records, to the holder (which emits them on its loggers)."""

    def __init__(self, outbox: _Outbox) -> None:
        super().__init__()
        self._outbox = outbox

    def emit(self, record: logging.LogRecord) -> None:
        fields = dict(vars(record))
        if record.exc_info:
            fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
        fields["exc_info"] = None
        fields["args"] = None
        fields["msg"] = record.getMessage()
        for key, value in event_fields(record).items():  # what may not cross: as text
            if not isinstance(value, str | int | float | bool | type(None) | tuple | list):
                fields[key] = repr(value)
        self._outbox.put(("log", record.name, record.levelno, fields), droppable=True)


class _Holding:
    """Stands for an acquisition's handles in the holder: dropped when the holder says
    they are all gone, so that the loop releases it (``redlock.abandoned``)."""

    __slots__ = ("__weakref__",)


class _Renewer:
    """The leases handed over, the loop that renews them, and what the holder is told."""

    def __init__(self, link: Link, deadlines: Deadlines, config: dict[str, Any]) -> None:
        self.link = link
        self.deadlines = deadlines
        self.holder = _Holder(*config["holder"])
        self.outbox = _Outbox(link)
        self.observing = False
        self.epoch = 0  # the membership epoch the holder was told of (§13.1)
        settings: Settings = config["settings"]
        endpoints = config["nodes"]
        transport = self.transport = SyncTransport(
            endpoints, labels(endpoints), settings.connect_timeout,
            Keys(settings.namespace).identify_command())
        core = self.core = RedlockCore(transport.addresses, settings, environment.real(),
                                       clusters(endpoints))
        self.closing = threading.Event()
        room = WaitingRoom(core, threading.Event, threading.Lock, lambda _: None, self.closing)
        self.executor = SyncExecutor(transport, room, core, lambda: None, None)
        self.mutex = threading.Lock()
        self.leases: dict[int, tuple[LockState, int, object]] = {}  # id: state, slot, holding
        self.ids: dict[LockState, int] = {}
        self.renewals = Renewals(core, threading.Event, self._start_loop, self._lost,
                                 self._observe, closing=self.closing,
                                 holder_running=self._holder_running, abandoned=self._abandoned)
        library = logging.getLogger("redlock")
        library.addHandler(_Forward(self.outbox))
        library.propagate = False
        deadlines.view[0] = 1.0  # running: the holder's bridge hands over no more

    def _start_loop(self, flow: Flow[None]) -> threading.Thread:
        thread = threading.Thread(target=self.executor.drive, args=(flow,),
                                  name="redlock-renewals", daemon=True)
        thread.start()
        return thread

    def _holder_running(self) -> bool:
        return self.holder.state() == "running"

    # -- what the holder says --------------------------------------------------------

    def told(self, message: tuple[Any, ...]) -> bool:
        """Act on one message; False once the holder said close."""
        kind = message[0]
        if kind == "hold":
            _, lease_id, slot, resource, value, ttl, token, tokens, lock_kind, deadline = message
            if slot >= SLOTS:
                return True
            state = LockState(resource, value, ttl, token, deadline, self.core.clock,
                              self.core.env.new_mutex(), tokens=tokens, kind=lock_kind)
            # Its deadline: the later of ours and the holder's (a bridge renewing it until
            # this process has, or the acquire's own), 0 once we lost it.
            state.lease = Lease(self.deadlines.view, slot, renewer=True)
            holding = _Holding()  # the holder's handles, as the loop sees them (abandon)
            with self.mutex:
                self.leases[lease_id] = (state, slot, holding)
                self.ids[state] = lease_id
            self.renewals.add(state, holding)
        elif kind == "drop":
            with self.mutex:
                lease = self.leases.pop(message[1], None)
                if lease is None:
                    return True  # lost already (and told)
                del self.ids[lease[0]]
            lease[0].mark_released()
            self.renewals.remove(lease[0])
            self.outbox.put(("freed", message[1]))
        elif kind == "abandon":
            with self.mutex:
                lease = self.leases.get(message[1])
                if lease is not None:  # the loop releases it when it is next due
                    self.leases[message[1]] = (lease[0], lease[1], None)
        elif kind == "levels":
            _, levels, self.observing = message
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
        elif kind == "close":
            return False
        return True

    # -- what the loop tells ---------------------------------------------------------

    def _observe(self, state: LockState, outcome: str, started_ns: int) -> None:
        members = self.core.membership.rule.members
        if members.epoch != self.epoch:  # learnt from the nodes: the holder counts so too
            self.epoch = members.epoch
            self.outbox.put(("members", members))
        if self.observing:
            lease_id = self.ids.get(state)
            if lease_id is not None:
                self.outbox.put(("observe", lease_id, outcome, started_ns), droppable=True)

    def _lost(self, state: LockState, _handles: list[Any]) -> None:
        """Lost (its deadline reads -1 in the holder since it was marked so)."""
        with self.mutex:
            lease_id = self.ids.pop(state, None)
            if lease_id is None:
                return
            del self.leases[lease_id]
        state.lease = None  # (its slot is the holder's to reuse once it reads this)
        self.outbox.put(("lost", lease_id, state.lost_reason, state.lost_outcomes))

    def _abandoned(self, state: LockState) -> None:
        """Released by the loop: nobody held it any more (the holder asked)."""
        with self.mutex:
            lease_id = self.ids.pop(state, None)
            if lease_id is None:
                return
            del self.leases[lease_id]
        self.outbox.put(("freed", lease_id))

    def close(self) -> None:
        self.closing.set()
        self.renewals.stop()


def main(sock: socket.socket, memory: int) -> None:
    """The process's whole life: read the configuration, renew what the holder hands
    over, until the holder says close or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # From here on what goes wrong is told through the link; the pipe the holder reads
    # at the end (for an interpreter that could not get this far) must never fill up.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    link = Link(sock)
    deadlines = Deadlines(memory, SLOTS)
    os.close(memory)
    config: dict[str, Any] | None = None
    renewer: _Renewer | None = None
    code = 0
    try:
        while True:
            messages = link.receive(_WATCH)
            if messages is None:
                return  # the holder closed its end: it exited, or was killed
            for message in messages:
                if config is None:
                    config = message
                    renewer = _Renewer(link, deadlines, message)
                elif renewer is not None and not renewer.told(message):
                    return
            if renewer is not None and renewer.holder.state() == "gone":
                return
    except Exception:  # a bug: told (the holder marks its locks lost), then the exit
        code = 1
        if renewer is not None:
            logging.getLogger("redlock.locks").exception(
                "the renewer crashed", extra={"event": "redlock.renewals_crashed",
                                              "locks": len(renewer.ids)})
            renewer.outbox.flush(1.0)
    finally:
        if renewer is not None:
            renewer.close()
        # Nothing is released: the keys lapse with their TTL (docs/design.md §5.2). The
        # sockets close with the process; no thread of it may keep it alive.
        os._exit(code)


if __name__ == "__main__":  # pragma: no cover (started by redlock._client.renewer)
    raise SystemExit("started by redlock._client.renewer, not by hand")
