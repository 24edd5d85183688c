"""Plumbing shared by the examples: command-line options, local nodes, quiet logging,
and helper processes that start together with the threads of the main process."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import structlog


def quiet_logging() -> None:
    """The application (an example), not the library, decides what gets logged."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


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


class Helpers:
    """Helper processes running ``script --child ARGS...``: each prints "ready",
    waits for "go" on stdin, then prints one JSON object per line."""

    def __init__(self, script: str, args_per_process: Sequence[Sequence[str]]) -> None:
        self.processes = [
            subprocess.Popen([sys.executable, script, "--child", *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for args in args_per_process
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
            process.stdin.flush()

    def results(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for process in self.processes:
            stdout, _ = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"helper process exited with {process.returncode}")
            out += [json.loads(line) for line in stdout.splitlines() if line.strip()]
        return out

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()


def child_handshake() -> None:
    """The child side of :class:`Helpers`: say ready, wait for go."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the parent")


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class Clock:
    """Milliseconds since the start, for the story lines."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> str:
        return f"{(time.monotonic() - self.t0) * 1000:7.0f} ms"


def verdict(ok: bool, what: str) -> int:
    print(f"{'OK' if ok else 'FAILED'}: {what}")
    return 0 if ok else 1
