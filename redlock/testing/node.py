"""What every test backend's Redis node and node set offer (local processes or
containers): the surface the fixtures, Toxiproxy and the fault helpers rely on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import redis


@runtime_checkable
class Node(Protocol):
    """One Redis server on loopback that a test can hang, kill and bring back."""

    host: str
    port: int
    paused: bool

    @property
    def url(self) -> str: ...

    @property
    def running(self) -> bool: ...

    def client(self, **kwargs: object) -> redis.Redis: ...

    def start(self) -> Node: ...

    def pause(self) -> None:
        """The server stops answering; its sockets stay open (a hung node)."""

    def resume(self) -> None: ...

    def kill(self) -> None:
        """Killed at once (no shutdown, no final save)."""

    def restart(self, *, keep_data: bool = True) -> Node:
        """Killed and started again on the same port, with or without its files."""

    def close(self) -> None: ...


class Nodes(Protocol):
    """N independent nodes, stopped together by ``close()``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Node: ...

    def __iter__(self) -> Iterator[Node]: ...

    @property
    def urls(self) -> list[str]: ...

    def clients(self, **kwargs: object) -> list[redis.Redis]: ...

    def reset(self) -> None:
        """Every node running, resumed and empty."""

    def close(self) -> None: ...
