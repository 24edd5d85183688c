"""Choose where the test servers run: local processes (the default) or containers.

    from redlock.testing.backends import start_nodes, start_toxiproxy

    nodes = start_nodes(5)                    # $REDLOCK_TEST_BACKEND, else "local"
    toxiproxy = start_toxiproxy(backend="docker")

``local``: real ``redis-server`` / ``toxiproxy-server`` processes on loopback
(:class:`~redlock.testing.RedisNodes`, :class:`~redlock.testing.ToxiproxyServer`).
``docker``: the same servers in containers through testcontainers
(:mod:`redlock.testing.containers`; imported only when asked for)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

from redlock.testing.redis_nodes import RedisNodes
from redlock.testing.toxiproxy import ToxiproxyServer

if TYPE_CHECKING:
    from redlock.testing.containers import ContainerRedisNodes

BACKENDS = ("local", "docker")
ENV_VAR = "REDLOCK_TEST_BACKEND"

AnyNodes = Union[RedisNodes, "ContainerRedisNodes"]


def backend_name(explicit: str | None = None) -> str:
    """``explicit``, else ``$REDLOCK_TEST_BACKEND``, else ``local``."""
    name = (explicit or os.environ.get(ENV_VAR) or "local").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown test backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return name


def start_nodes(count: int = 3, *, backend: str | None = None, appendonly: bool = False,
                password: str | None = None, extra_args: Sequence[str] = ()) -> AnyNodes:
    """``count`` independent Redis nodes on loopback, running and empty."""
    if backend_name(backend) == "docker":
        from redlock.testing.containers import ContainerRedisNodes

        return ContainerRedisNodes(count, appendonly=appendonly, password=password,
                                   extra_args=extra_args)
    return RedisNodes(count, appendonly=appendonly, password=password, extra_args=extra_args)


def start_toxiproxy(*, backend: str | None = None) -> ToxiproxyServer:
    """A started Toxiproxy server whose proxies listen on loopback."""
    if backend_name(backend) == "docker":
        from redlock.testing.containers import ContainerToxiproxy

        return ContainerToxiproxy().start()
    return ToxiproxyServer().start()
