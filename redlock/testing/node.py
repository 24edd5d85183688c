"""What every test backend's Redis node and node set offer (local processes or
containers): the surface the fixtures, Toxiproxy and the fault helpers rely on."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Generic, Protocol, TypeVar, runtime_checkable

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


N = TypeVar("N", bound=Node)


class NodeSet(Sequence[N], Generic[N]):
    """N nodes made by ``make(index)`` and started one by one (all closed again if one
    fails to start): the shared part of :class:`~redlock.testing.RedisNodes` and the
    container backend's node set."""

    def __init__(self, make: Callable[[int], N], count: int) -> None:
        self.nodes: list[N] = []
        try:
            for index in range(count):
                node = make(index)
                self.nodes.append(node)
                node.start()
        except BaseException:
            self.close()
            raise

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def clients(self, **kwargs: object) -> list[redis.Redis]:
        return [node.client(**kwargs) for node in self.nodes]

    def reset(self) -> None:
        """Bring every node back to running and empty (fixtures call this between tests)."""
        for node in self.nodes:
            node.resume()
            if not node.running:
                node.start()
            with node.client() as client:
                client.flushall()

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> N:  # type: ignore[override]
        return self.nodes[index]

    def __iter__(self) -> Iterator[N]:
        return iter(self.nodes)

    def close(self) -> None:
        for node in self.nodes:
            node.resume()
            node.close()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


S = TypeVar("S", bound=NodeSet)  # type: ignore[type-arg]
