"""The renewer: a manager's auto-extended locks renewed from a process of its own
(docs/design.md §5.2: neither a thread nor a task of a busy holder is sure to run; a process is
scheduled by the kernel). This is the holder's side: :class:`Renewer` offers the handles what
:class:`~redlock._core.renewals.Renewals` offers and leases each acquisition to the renewer
process (:mod:`redlock._client.renewer_process`); :class:`Deadlines` is the memory both map (each
side's latest renewal, read by ``check()`` without any thread running); :class:`Link` carries
length-prefixed pickles over a socket pair."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from redlock import _fork
from redlock._core.renewals import Renewals
from redlock._core.settings import Settings
from redlock._core.state import LockState, Status
from redlock._io.endpoint import Endpoint
from redlock._observe.log import get_logger

logger = get_logger("redlock.locks")

#: How many acquisitions one renewer can hold at once (16 bytes each; pages are backed
#: by memory only once used).
SLOTS = 1 << 20
# The loggers whose records the renewer forwards (at the levels the holder enables).
LOGGERS = ("redlock.locks", "redlock.nodes")
# The process's first lines: the holder's import path, then the renewer's own module.
_BOOT = (
    "import pickle,socket,struct,sys\n"
    "s=socket.socket(fileno=int(sys.argv[1]))\n"
    # (A socket made under gevent's monkey-patching comes non-blocking.)
    "s.setblocking(True)\n"
    "def r(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=s.recv(n-len(b))\n"
    "  if not c: raise SystemExit(0)\n"
    "  b+=c\n"
    " return b\n"
    "sys.path[:]=pickle.loads(r(struct.unpack('!I',r(4))[0]))\n"
    "from redlock._client.renewer_process import main\n"
    "main(s,int(sys.argv[2]))\n")
_HEADER = struct.Struct("!I")
# The holder's message thread wakes this often to find acquisitions nobody holds.
_ABANDONED_CHECK = 1.0


def process_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time (clock ticks since boot) from
    ``/proc/<pid>/stat``; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read()
    except OSError:
        return None
    fields = text[text.rindex(b")") + 2:].split()  # (the name may hold spaces)
    return fields[0].decode(), int(fields[19])


def unavailable(clock: Callable[[], float]) -> str | None:
    """Why a renewer cannot run here (None: it can); docs/design.md §5.2."""
    if clock is not time.monotonic:
        return ("the manager has a test's clock (redlock.testing.manager; the renewer keeps"
                " time.monotonic)")
    if process_stat(os.getpid()) is None or not hasattr(os, "memfd_create"):
        return "this system has no /proc/<pid>/stat (a frozen holder could not be told)"
    executable = os.path.basename(sys.executable or "").lower()
    if getattr(sys, "frozen", False) or not executable.startswith(("python", "pypy")):
        return f"no Python interpreter to start (sys.executable is {sys.executable!r})"
    return None


# A memoryview of doubles (typeshed types a memoryview's items as ints).
Doubles = Any


class Deadlines:
    """The memory both processes map (``memfd``): doubles, two per slot from slot 1 on: ``[2 s]``
    the renewer's latest deadline for the acquisition in slot ``s`` (0: none yet; -1: it lost it),
    ``[2 s + 1]`` the holder's. ``[0]`` is 1 once the renewer runs. Each is written by one process
    only, as one aligned 8-byte store: a reader sees the old value or the new one, never a mix."""

    def __init__(self, fd: int, slots: int) -> None:
        self._map = mmap.mmap(fd, (slots + 1) * 16)
        self.view: Doubles = memoryview(self._map).cast("d")

    @classmethod
    def create(cls, slots: int = SLOTS) -> tuple[Deadlines, int]:
        """New zeroed memory and its file descriptor (for the process; then closed)."""
        fd = os.memfd_create("redlock-renewals")
        try:
            os.ftruncate(fd, (slots + 1) * 16)
            return cls(fd, slots), fd
        except BaseException:
            os.close(fd)
            raise

    @property
    def running(self) -> bool:
        return bool(self.view[0])


class Lease:
    """One acquisition's two deadlines (:class:`redlock._core.state.Lease`), as one side
    sees them: ``mine`` is the one this process writes, ``theirs`` the other's."""

    __slots__ = ("mine", "renewals", "renewer", "theirs", "view")

    def __init__(self, view: Doubles, slot: int, *, renewer: bool) -> None:
        self.view = view
        self.renewer = renewer
        self.renewals = 2 * slot  # the renewer's deadline, or -1 once it lost it
        self.mine, self.theirs = ((2 * slot, 2 * slot + 1) if renewer
                                  else (2 * slot + 1, 2 * slot))

    def read(self, own: float) -> float:
        view = self.view
        if view[self.renewals] < 0:
            return 0.0
        theirs: float = view[self.theirs]
        return own if own >= theirs else theirs

    def write(self, deadline: float) -> None:
        self.view[self.mine] = deadline

    def lose(self) -> None:
        if self.renewer:
            self.view[self.renewals] = -1.0


def readable(sock: socket.socket, timeout: float | None) -> bool:
    """Whether ``sock`` has something to read (or was closed) within ``timeout`` s."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))


class Link:
    """Messages both ways over a socket: each a pickle after its length."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self._sending = threading.Lock()

    def send(self, message: object) -> None:
        self.send_all([message])

    def send_all(self, messages: list[object]) -> None:
        """Write ``messages`` in one go."""
        frames: list[bytes] = []
        for message in messages:
            data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
            frames += (_HEADER.pack(len(data)), data)
        with self._sending:
            self.sock.sendall(b"".join(frames))

    def receive(self, timeout: float | None) -> list[Any] | None:
        """The messages that came within ``timeout`` seconds ([] if none); None once the
        other end closed."""
        if not self._messages_ready() and readable(self.sock, timeout):
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError, TimeoutError):
                chunk = None  # (nothing after all)
            except OSError:
                return None
            if chunk is not None:
                if not chunk:
                    return None
                self._buffer += chunk
        return self._take()

    def _messages_ready(self) -> bool:
        buffer = self._buffer
        return len(buffer) >= 4 and len(buffer) >= 4 + _HEADER.unpack_from(buffer)[0]

    def _take(self) -> list[Any]:
        messages = []
        buffer = self._buffer
        while len(buffer) >= 4:
            size = _HEADER.unpack_from(buffer)[0]
            if len(buffer) < 4 + size:
                break
            messages.append(pickle.loads(bytes(buffer[4:4 + size])))
            del buffer[:4 + size]
        return messages


class _Entry:
    """One acquisition handed to the renewer: its slot, and its handles (weakly)."""

    __slots__ = ("abandoned", "handles", "slot", "state")

    def __init__(self, state: LockState, slot: int) -> None:
        self.state = state
        self.slot = slot
        self.handles: weakref.WeakSet[Any] = weakref.WeakSet()
        self.abandoned = False


class _Process:
    """One running renewer: its process, link, memory and free slots."""

    def __init__(self, popen: subprocess.Popen[bytes], link: Link, deadlines: Deadlines) -> None:
        self.popen = popen
        self.link = link
        self.deadlines = deadlines
        self.free: list[int] = []  # slots the renewer let go of
        self.unused = 1  # slots from here on were never used (slot 0 is the header)
        self.levels: dict[str, int] = {}
        self.observing: bool | None = None

    def slot(self) -> int:
        if self.free:
            return self.free.pop()
        if self.unused > SLOTS:
            raise RuntimeError(f"more than {SLOTS} auto-extended locks held at once")
        self.unused += 1
        return self.unused - 1


class Renewer:
    """The holder's side of the renewer (docs/design.md §5.2): what the handles ask of the
    renewals, carried out by a process started by the first ``add``. Until it runs, a *bridge*
    (``bridge(elsewhere, lost)``: the renewal loop in this process) renews each acquisition
    until the renewer has renewed it once.

    ``nodes``: the nodes' endpoints; ``adopt(members)`` takes a membership record the renewals
    learnt; ``lost(state, handles)`` is told of each acquisition the renewer lost (where
    :meth:`_tell` puts it); ``observe(state, outcome, started_ns)`` of each renewal's outcome
    while ``observing()`` says so."""

    def __init__(self, nodes: list[Endpoint], settings: Settings,
                 lost: Callable[[LockState, list[Any]], None],
                 observe: Callable[[LockState, str, int], None],
                 observing: Callable[[], bool],
                 bridge: Callable[[Callable[[LockState], bool], Callable[[LockState], None]],
                                  Renewals],
                 adopt: Callable[[Any], object]) -> None:
        self._nodes = nodes
        self._settings = settings
        self._lost = lost
        self._observe = observe
        self._observing = observing
        self._new_bridge = bridge
        self._adopt = adopt
        self._bridge: Renewals | None = None
        self._mutex = threading.Lock()
        self._process: _Process | None = None
        self._entries: dict[int, _Entry] = {}  # by lease id, until the renewer let go
        self._ids: dict[LockState, int] = {}  # the acquisitions renewed now
        # Taken back for an explicit extend, with their handles (see withdraw()).
        self._withdrawn: dict[LockState, list[Any]] = {}
        self._next_id = 0
        self._closed = False
        self.runner: threading.Thread | None = None  # the message thread (close() joins)

    def __len__(self) -> int:
        return len(self._ids)

    # -- what the handles ask -----------------------------------------------------

    def add(self, state: LockState, handle: Any) -> None:
        """Renew ``state`` for ``handle`` (weakly held) until released or lost."""
        state.auto_extended = True  # (its release or export then calls remove)
        with self._mutex:
            lease_id = self._ids.get(state)
            if lease_id is not None:
                self._entries[lease_id].handles.add(handle)
                return
            if self._closed:
                return  # close() marks what it renewed lost; nothing new is started
            self._lease_to_renewer(state, [handle])

    def _lease_to_renewer(self, state: LockState, handles: list[Any]) -> None:
        """Give ``state`` to the renewer in a slot of its own (under the mutex: the
        renewer reads messages in the order they were decided); until it runs, the
        bridge renews ``state`` too."""
        process = self._process or self._start()
        slot = process.slot()
        view = process.deadlines.view
        view[2 * slot] = 0.0
        view[2 * slot + 1] = state.deadline
        entry = _Entry(state, slot)
        entry.handles.update(handles)
        lease_id = self._next_id = self._next_id + 1
        self._entries[lease_id] = entry
        self._ids[state] = lease_id
        state.lease = Lease(view, slot, renewer=False)
        hold = ("hold", lease_id, slot, state.resource, state.value, state.ttl, state.token,
                state.tokens, state.kind, state.deadline)
        settings = self._settings_message(process)
        self._send(process, [hold] if settings is None else [settings, hold])
        if not process.deadlines.running:
            bridge = self._bridge
            if bridge is None:
                bridge = self._bridge = self._new_bridge(self._renewed_by_renewer,
                                                         self._lost_by_bridge)
            for handle in handles:
                bridge.add(state, handle)

    def _renewed_by_renewer(self, state: LockState) -> bool:
        """Whether the renewer renewed ``state`` already (the bridge lets it go then)."""
        lease = state.lease
        return not isinstance(lease, Lease) or lease.view[lease.renewals] != 0.0

    def _lost_by_bridge(self, state: LockState) -> None:
        """The bridge lost ``state`` (and tells its handles): the renewer lets it go."""
        with self._mutex:
            self._drop(state)

    def remove(self, state: LockState) -> None:
        """Released or handed over: no more renewals (its slot is freed once the renewer
        says it let go)."""
        bridge = self._bridge
        if bridge is not None:
            bridge.remove(state)
        if state not in self._ids:  # (every release asks; nearly none is renewed)
            return
        with self._mutex:
            self._drop(state)

    def withdraw(self, state: LockState) -> float | None:
        """An explicit extend() of ``state`` begins: the renewer lets it go (a round of its
        still in flight may land after the extend's: its TTL is returned, see
        :meth:`Holding.extend_many`); :meth:`rescheduled` hands it over again."""
        bridge = self._bridge
        if bridge is not None:
            bridge.remove(state)
        with self._mutex:
            entry = self._drop(state)
            if entry is None:
                return None
            self._withdrawn[state] = list(entry.handles)
            return state.ttl

    def rescheduled(self, state: LockState) -> None:
        """The explicit extend is over: ``state`` is handed to the renewer anew, in a new
        slot, with its new validity and TTL (if it is still held)."""
        with self._mutex:
            handles = self._withdrawn.pop(state, None)
            if handles is not None and not self._closed and state.status == Status.HELD:
                self._lease_to_renewer(state, handles)

    def _drop(self, state: LockState) -> _Entry | None:
        """``state`` is renewed no more (under the mutex): it keeps the deadline it has now."""
        lease_id = self._ids.pop(state, None)
        if lease_id is None:
            return None
        self._detach(state)
        if self._process is not None:
            self._send(self._process, [("drop", lease_id)])
        return self._entries[lease_id]

    def stop(self) -> None:
        """The manager is closing: the renewer ends, and every acquisition it renewed is
        marked lost (its keys expire with their TTL; ``on_lost`` is not called: the
        application closed the manager itself). ``runner`` ends once the process has."""
        with self._mutex:
            self._closed = True
            states = list(self._ids)
            self._ids.clear()
            for state in states:
                self._detach(state)
            process = self._process
            if process is not None:
                self._send(process, [("close",)])
        if self._bridge is not None:
            self._bridge.stop()
        for state in states:
            state.mark_lost("its manager was closed before it was released: nobody renews"
                            " it any more (its keys expire with their TTL)")

    # -- the process ---------------------------------------------------------------

    def _start(self) -> _Process:
        ours, theirs = socket.socketpair()
        try:
            deadlines, fd = Deadlines.create()
            try:
                popen = subprocess.Popen(
                    [sys.executable, "-I", "-c", _BOOT, str(theirs.fileno()), str(fd)],
                    pass_fds=(theirs.fileno(), fd), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    start_new_session=True)
            finally:
                os.close(fd)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(self._settings.connect_timeout)  # bounds a send to a hung renewer
        process = self._process = _Process(popen, Link(ours), deadlines)
        _children.add(process)
        stat = process_stat(os.getpid())
        assert stat is not None
        self._send(process, [list(sys.path), {
            "holder": (os.getpid(), stat[1]), "nodes": self._nodes,
            "settings": self._settings}])
        self.runner = threading.Thread(target=self._messages, args=(process,),
                                       name="redlock-renewer", daemon=True)
        self.runner.start()
        return process

    def _send(self, process: _Process, messages: list[object]) -> None:
        """Write to the renewer; one that cannot take them within ``connect_timeout``
        (stopped, hung) is ended: its locks are told lost by the message thread."""
        try:
            process.link.send_all(messages)
        except OSError:
            with contextlib.suppress(OSError):
                process.popen.kill()

    def _settings_message(self, process: _Process) -> object | None:
        """The levels the holder logs at and whether telemetry records: sent with an
        acquisition when they changed, so the renewer forwards only what is wanted."""
        levels = {name: logging.getLogger(name).getEffectiveLevel() for name in LOGGERS}
        observing = self._observing()
        if levels == process.levels and observing == process.observing:
            return None
        process.levels, process.observing = levels, observing
        return ("levels", levels, observing)

    @staticmethod
    def _detach(state: LockState) -> None:
        """``state`` keeps the deadline it has now (the renewer's renewals no longer count)."""
        if state.lease is not None:
            state._deadline = state.deadline
            state.lease = None

    # -- the message thread ---------------------------------------------------------

    def _messages(self, process: _Process) -> None:
        """Read what the renewer tells (losses, freed slots, log records, outcomes) until
        it ends; every second, hand it the acquisitions nobody holds any more."""
        try:
            while True:
                messages = process.link.receive(_ABANDONED_CHECK)
                if messages is None:
                    return
                for message in messages:
                    self._told(process, message)
                self._find_abandoned(process)
        except Exception:  # a bug here: the holders must not go on believing
            logger.exception("redlock.renewals_crashed", locks=len(self._ids))
            with contextlib.suppress(OSError):
                process.popen.kill()
        finally:
            self._ended(process)

    def _told(self, process: _Process, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "log":
            _, name, level, fields = message
            target = logging.getLogger(name)
            if target.isEnabledFor(level):
                target.handle(logging.makeLogRecord(fields))
        elif kind == "members":  # the renewals learnt a membership change (§13.1)
            self._adopt(message[1])
        elif kind == "observe":
            _, lease_id, outcome, started_ns = message
            entry = self._entries.get(lease_id)
            if entry is not None:
                self._observe(entry.state, outcome, started_ns)
        elif kind in ("lost", "freed"):
            lease_id = message[1]
            with self._mutex:
                entry = self._entries.pop(lease_id, None)
                if entry is None:
                    return
                process.free.append(entry.slot)  # the renewer writes it no more
                state = entry.state
                mine = self._ids.get(state) == lease_id
                if mine:
                    del self._ids[state]
                    self._detach(state)
            if kind == "lost" and mine:
                _, _, reason, outcomes = message
                if state.mark_lost(reason, outcomes):
                    self._tell(self._lost, state, list(entry.handles))
            elif mine:  # abandoned, and released by the renewer
                state.mark_released()

    def _find_abandoned(self, process: _Process) -> None:
        """Acquisitions whose handles were all garbage-collected without a release: the
        renewer releases them instead of renewing them for ever (``redlock.abandoned``)."""
        with self._mutex:
            for lease_id in list(self._ids.values()):
                entry = self._entries[lease_id]
                if not entry.abandoned and not entry.handles:
                    entry.abandoned = True
                    self._send(process, [("abandon", lease_id)])

    def _ended(self, process: _Process) -> None:
        """The process exited. Unless the manager closed it, every acquisition it renewed
        is lost: nobody renews it now (the next auto-extended lock starts another)."""
        with contextlib.suppress(OSError):
            process.link.sock.close()
        try:
            code = process.popen.wait(self._settings.connect_timeout)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            code = process.popen.wait()
        # What it wrote before its main() took over (an interpreter that could not import
        # the library, say): the last line says why.
        why = ""
        stderr = process.popen.stderr
        if stderr is not None:
            with contextlib.suppress(OSError), stderr:
                lines = stderr.read(1 << 16).decode(errors="replace").strip().splitlines()
                why = lines[-1] if lines else ""
        _children.discard(process)
        with self._mutex:
            if self._process is process:
                self._process = None
            dead = [] if self._closed else [
                (state, self._entries[lease_id]) for state, lease_id in self._ids.items()]
            for state, _ in dead:
                del self._ids[state]
                self._detach(state)
            self._entries.clear()
        if dead:
            logger.warning("redlock.renewer_died", locks=len(dead), exit_code=code,
                           error=why or "nothing said")
        for state, entry in dead:
            if self._bridge is not None:
                self._bridge.remove(state)
            if state.mark_lost(f"the renewer process exited (exit code {code}) while it"
                               " renewed it: nobody renews it any more"):
                self._tell(self._lost, state, list(entry.handles))

    def _tell(self, function: Callable[..., None], *args: Any) -> None:
        """Run ``function`` where the flavour tells the holders (here: at once, in this
        thread; the asyncio client's: on its event loop)."""
        function(*args)


# The renewers of this process: a forked child closes its copies of their sockets at
# once, so that the parent's renewer sees the parent's exit, not the child's (§5.7).
_children: set[_Process] = set()


def _close_in_child() -> None:
    for process in list(_children):
        with contextlib.suppress(OSError):
            os.close(process.link.sock.detach())
        _fork.keep_forever(process)
    _children.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
