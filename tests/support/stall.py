"""A TCP forwarder in front of one node that stalls one connection, and only it.

Toxiproxy's toxics act on every connection through a proxy, the new ones included. The
hazard of docs/design.md §2.1 needs one connection whose bytes are late while the
client's other connections to the same node go through at once: what a lost packet
does to one TCP connection (its retransmission waits for the RTO) or a stalled
connection does. :meth:`StallingForwarder.stall_next` arms it: the first connection
that sends bytes after that has them (and what follows on it) held back, until
:meth:`StallingForwarder.resume` writes them to the node, in order. The node is a real
``redis-server``, and everything else passes through untouched.

Loopback only; every thread and socket ends with :meth:`StallingForwarder.close`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

_CHUNK = 65536
_JOIN_SECONDS = 5.0


class _Link:
    """One client connection and its connection to the node."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.held: list[bytes] | None = None  # bytes held back while stalled
        self.client_done = False  # the client closed its side (while stalled: later)

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class StallingForwarder:
    """Listens on 127.0.0.1 (``port``, ``url``) and forwards to ``target_port``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # (closing it does not wake accept(): it polls)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        self._mutex = threading.Lock()
        self._armed = False
        self._stalled: _Link | None = None
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._start(self._accept)

    # -- what a test does ------------------------------------------------------------

    def stall_next(self) -> None:
        """Hold back the bytes of the next connection that sends any, from then on."""
        with self._mutex:
            self._armed = True

    def stalled(self) -> bool:
        """Whether a connection's bytes are held back now."""
        with self._mutex:
            return self._stalled is not None and bool(self._stalled.held)

    def resume(self) -> None:
        """Write what was held back to the node, in order; the connection flows again
        (and is closed towards the node if its client closed it meanwhile)."""
        with self._mutex:
            link, self._stalled, self._armed = self._stalled, None, False
            if link is None:
                return
            held, link.held = link.held or [], None
            with contextlib.suppress(OSError):
                for data in held:
                    link.upstream.sendall(data)
                if link.client_done:
                    link.upstream.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            links, self._links = self._links, []
        for link in links:
            link.close()
        for thread in self._threads:
            thread.join(_JOIN_SECONDS)
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> StallingForwarder:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # -- the forwarding -------------------------------------------------------------

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True,  # type: ignore[arg-type]
                                  name="stalling-forwarder")
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self._target, timeout=5.0)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            link = _Link(client, upstream)
            with self._mutex:
                if self._closed:
                    link.close()
                    return
                self._links.append(link)
            self._start(self._to_node, link)
            self._start(self._to_client, link)

    def _to_node(self, link: _Link) -> None:
        while True:
            try:
                data = link.client.recv(_CHUNK)
            except OSError:
                data = b""
            with self._mutex:
                if self._armed and data and self._stalled is None:
                    self._armed, self._stalled, link.held = False, link, []
                if link.held is not None:  # stalled: kept for resume()
                    if data:
                        link.held.append(data)
                    else:
                        link.client_done = True
                        return
                    continue
            if not data:
                with contextlib.suppress(OSError):
                    link.upstream.shutdown(socket.SHUT_WR)
                return
            try:
                link.upstream.sendall(data)
            except OSError:
                return

    def _to_client(self, link: _Link) -> None:
        while True:
            try:
                data = link.upstream.recv(_CHUNK)
                if not data:
                    break
                link.client.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            link.client.shutdown(socket.SHUT_WR)
