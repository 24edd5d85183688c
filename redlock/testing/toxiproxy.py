"""A real Toxiproxy server in front of real Redis nodes: network faults for tests.

    from redlock.testing import RedisNodes, ToxiproxyServer

    with RedisNodes(5) as nodes, ToxiproxyServer() as toxiproxy:
        proxies = toxiproxy.front(nodes)        # one proxy per node, on loopback
        dlm = Redlock(proxies.urls)             # the client talks through the proxies
        proxies[0].blackhole()                  # requests vanish; nothing is ever answered
        proxies[1].lose_replies()               # the node runs the command, no reply comes
        proxies[2].refuse()                     # connection refused (existing ones cut)
        proxies[3].set_upstream("127.0.0.1:7001")  # now in front of another server
        toxiproxy.heal()                        # every proxy enabled, every toxic removed

The server is the upstream Go binary (``go install
github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0``; ``bash scripts/setup.sh`` puts it
in ``.tools/bin``). It is driven through its HTTP API with the standard library rather
than toxiproxy-python: that client keeps the API address in class attributes (one
server per interpreter), sends requests without a timeout (a wedged server would hang
the test instead of failing it), and needs the ``future`` compatibility package."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from redlock.testing._leftovers import track, untrack
from redlock.testing.node import Node
from redlock.testing.redis_nodes import free_port

TOXIPROXY_VERSION = "v2.12.0"




class ToxiproxyError(RuntimeError):
    """The Toxiproxy server refused a request or could not be started."""


def find_toxiproxy_server(explicit: str | None = None) -> str:
    """Path of the toxiproxy server: explicit, $TOXIPROXY_SERVER, ``toxiproxy-server`` on
    PATH, or ``.tools/bin/toxiproxy-server`` of this checkout (scripts/setup.sh)."""
    candidates = [explicit, os.environ.get("TOXIPROXY_SERVER"), shutil.which("toxiproxy-server"),
                  str(Path(__file__).resolve().parents[2] / ".tools" / "bin" / "toxiproxy-server")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "toxiproxy-server not found: install Toxiproxy's server (a release binary from"
        " https://github.com/Shopify/toxiproxy/releases, or `go install"
        f" github.com/Shopify/toxiproxy/v2/cmd/server@{TOXIPROXY_VERSION}`, which builds it"
        " as `server`) and put it on PATH as toxiproxy-server, or set TOXIPROXY_SERVER to"
        " its path. In a clone of redlock-fenced, bash scripts/setup.sh builds it into"
        " .tools/bin.")


class Proxy:
    """One TCP proxy of the server, in front of one upstream ``host:port``."""

    def __init__(self, server: ToxiproxyServer, name: str, upstream: str, listen: str,
                 node: Node | None = None) -> None:
        self.server = server
        self.name = name
        self.upstream = upstream
        host, _, port = listen.rpartition(":")
        self.host = host
        self.port = int(port)
        self.node = node

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    # -- the whole proxy ---------------------------------------------------------------
    def refuse(self) -> None:
        """Disable the proxy: open connections are closed, new ones refused."""
        self.server.request("POST", f"/proxies/{self.name}", {"enabled": False})

    def enable(self) -> None:
        self.server.request("POST", f"/proxies/{self.name}", {"enabled": True})

    def set_upstream(self, upstream: str, node: Node | None = None) -> None:
        """Point the proxy at another server (``host:port``), e.g. a promoted replica
        after a failover, on the same listening port. Toxiproxy restarts the proxy for
        it: every open connection is closed (clients reconnect, to the new upstream);
        toxics stay. ``node``: the node now behind the proxy (``proxy.node``)."""
        self.server.request("PATCH", f"/proxies/{self.name}", {"upstream": upstream})
        self.upstream = upstream
        self.node = node

    def delete(self) -> None:
        """Remove the proxy from the server (its port and connections are closed)."""
        self.server.request("DELETE", f"/proxies/{self.name}")

    # -- toxics ---------------------------------------------------------------------------
    def add_toxic(self, kind: str, *, stream: str = "downstream", name: str | None = None,
                  toxicity: float = 1.0, **attributes: int | float) -> str:
        """Add a toxic (Toxiproxy's own names: latency, timeout, reset_peer, bandwidth,
        slow_close, limit_data, slicer); returns its name for ``remove_toxic``."""
        toxic_name = name or f"{kind}_{stream}"
        self.server.request("POST", f"/proxies/{self.name}/toxics", {
            "name": toxic_name, "type": kind, "stream": stream, "toxicity": toxicity,
            "attributes": attributes})
        return toxic_name

    def remove_toxic(self, name: str) -> None:
        self.server.request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[dict[str, Any]]:
        result = self.server.request("GET", f"/proxies/{self.name}/toxics")
        return list(result) if isinstance(result, list) else []

    def blackhole(self) -> None:
        """Nothing gets through in either direction and no connection is closed (the
        ``timeout`` toxic with timeout 0): the node looks hung from the client's side,
        and never sees the requests."""
        self.add_toxic("timeout", stream="upstream", timeout=0)
        self.add_toxic("timeout", stream="downstream", timeout=0)

    def lose_replies(self) -> None:
        """Requests reach the node and run; every reply is dropped (downstream-only
        ``timeout`` toxic, timeout 0): the node grants the lock, the client never hears."""
        self.add_toxic("timeout", stream="downstream", timeout=0)

    def latency(self, seconds: float, jitter: float = 0.0) -> None:
        """Delay every reply by ``seconds`` (+- ``jitter``)."""
        self.add_toxic("latency", stream="downstream", latency=round(seconds * 1000),
                       jitter=round(jitter * 1000))

    def reset_connections(self) -> None:
        """Every connection is reset (TCP RST) as soon as data arrives: requests fail at
        once with a connection error instead of timing out."""
        self.add_toxic("reset_peer", stream="upstream", timeout=0)

    def heal(self) -> None:
        """Remove every toxic of this proxy and enable it."""
        for toxic in self.toxics():
            self.remove_toxic(str(toxic["name"]))
        self.enable()

    def __repr__(self) -> str:
        return f"Proxy({self.name!r}, {self.host}:{self.port} -> {self.upstream})"


class Proxies(Sequence[Proxy]):
    """The proxies in front of a set of nodes, in the nodes' order."""

    def __init__(self, proxies: list[Proxy]) -> None:
        self._proxies = proxies

    @property
    def urls(self) -> list[str]:
        return [proxy.url for proxy in self._proxies]

    def heal(self) -> None:
        for proxy in self._proxies:
            proxy.heal()

    def __len__(self) -> int:
        return len(self._proxies)

    def __getitem__(self, index: int) -> Proxy:  # type: ignore[override]
        return self._proxies[index]

    def __iter__(self) -> Iterator[Proxy]:
        return iter(self._proxies)


class ToxiproxyServer:
    """A ``toxiproxy-server`` process with its API on a free loopback port."""

    def __init__(self, binary: str | None = None, host: str = "127.0.0.1",
                 request_timeout: float = 5.0) -> None:
        self.binary = find_toxiproxy_server(binary)
        self.host = host
        self.port = 0
        self.request_timeout = request_timeout
        self.start_timeout = 10.0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None
        self._log_fd: int | None = None  # the log, open while starting
        self._count = 0

    @property
    def api(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ToxiproxyServer:
        """Start the server on a free port and wait until its API answers (tried on
        three ports: a free port can be taken between the probe and the bind)."""
        if self._running():
            return self
        self._before_start()
        try:
            for _attempt in range(3):
                self.port = free_port(self.host)
                self._launch()
                track(self)
                if self._wait_ready():
                    return self
                self._kill()
        finally:
            self._after_start()
        tail = self.log_tail()
        self.close()
        raise ToxiproxyError(f"{self._what()} did not start: {tail}")

    # What a server of another kind (a container) does differently.

    def _what(self) -> str:
        return "toxiproxy-server"

    def _running(self) -> bool:
        return self._process is not None

    def _before_start(self) -> None:
        self._log_fd, log = tempfile.mkstemp(prefix="toxiproxy-", suffix=".log")
        self._log = Path(log)

    def _after_start(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def _launch(self) -> None:
        assert self._log_fd is not None
        with os.fdopen(os.dup(self._log_fd), "wb") as out:
            self._process = subprocess.Popen(
                [self.binary, "-host", self.host, "-port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "warn")})

    def _exited(self) -> bool:
        return self._process is None or self._process.poll() is not None

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._exited():
                return False
            with contextlib.suppress(OSError, ToxiproxyError):
                self.request("GET", "/version")
                return True
            time.sleep(0.05)
        return False

    def log_tail(self, lines: int = 5) -> str:
        if self._log is None or not self._log.exists():
            return ""
        return " | ".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One API call; raises ToxiproxyError on an HTTP error (with the server's text)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.api + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyError(f"{method} {path}: HTTP {exc.code} {detail}") from None
        return json.loads(payload) if payload.strip() else None

    def create_proxy(self, upstream: str, name: str | None = None,
                     node: Node | None = None) -> Proxy:
        """A proxy on a free loopback port in front of ``upstream`` (``host:port``)."""
        self._count += 1
        name = name or f"proxy{self._count}"
        info = self.request("POST", "/proxies", {
            "name": name, "upstream": upstream, "listen": f"{self.host}:0", "enabled": True})
        return Proxy(self, name, upstream, str(info["listen"]), node)

    def front(self, nodes: Sequence[Node]) -> Proxies:
        """One proxy in front of each node."""
        return Proxies([self.create_proxy(f"{node.host}:{node.port}", node=node)
                        for node in nodes])

    def heal(self) -> None:
        """Enable every proxy and remove every toxic (Toxiproxy's /reset)."""
        self.request("POST", "/reset")

    def _kill(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait(timeout=10)
        self._process = None

    def close(self) -> None:
        self._kill()
        untrack(self)
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.unlink()
            self._log = None

    def __enter__(self) -> ToxiproxyServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
