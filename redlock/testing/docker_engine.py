"""The Docker engine side of the Docker backend (:mod:`redlock.testing.containers`):
which images, the labels every container gets, the engine client, and the clean-up of
containers whose creating process is gone (a killed run)."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

TESTING_LABEL = "org.redlock-fenced.testing"
OWNER_LABEL = "org.redlock-fenced.owner"

DEFAULT_REDIS_IMAGE = "redis:7"
DEFAULT_TOXIPROXY_IMAGE = "ghcr.io/shopify/toxiproxy:2.12.0"
REDIS_IMAGE_ENV = "REDLOCK_REDIS_IMAGE"
TOXIPROXY_IMAGE_ENV = "REDLOCK_TOXIPROXY_IMAGE"

_prepared = False


class DockerUnavailable(RuntimeError):
    """The Docker backend cannot be used here: testcontainers is not installed, or no
    Docker engine answers (the message says which)."""


def redis_image(explicit: str | None = None) -> str:
    """The Redis image: ``explicit``, else ``$REDLOCK_REDIS_IMAGE``, else ``redis:7``."""
    return explicit or os.environ.get(REDIS_IMAGE_ENV) or DEFAULT_REDIS_IMAGE


def toxiproxy_image(explicit: str | None = None) -> str:
    """The Toxiproxy image: ``explicit``, else ``$REDLOCK_TOXIPROXY_IMAGE``, else
    ``ghcr.io/shopify/toxiproxy:2.12.0``."""
    return explicit or os.environ.get(TOXIPROXY_IMAGE_ENV) or DEFAULT_TOXIPROXY_IMAGE


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def labels() -> dict[str, str]:
    """The labels of every container this module starts."""
    return {TESTING_LABEL: "1", OWNER_LABEL: _owner()}


def _owner_gone(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's container: not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _docker_client() -> Any:
    """A ``docker.DockerClient`` on the engine testcontainers uses (close it after use);
    :class:`DockerUnavailable` if testcontainers is missing or no engine answers."""
    try:
        from testcontainers.core.docker_client import DockerClient
    except ImportError as exc:
        raise DockerUnavailable(
            "the Docker backend needs testcontainers: pip install 'redlock-fenced[docker]'"
        ) from exc
    try:
        client = DockerClient().client
    except Exception as exc:  # docker.errors.DockerException: no socket, no context
        raise DockerUnavailable(f"no Docker engine found: {exc}") from exc
    try:
        client.ping()
    except Exception as exc:
        client.close()
        raise DockerUnavailable(f"no Docker engine answers at {client.api.base_url}: "
                                f"{exc}") from exc
    return client


def _our_containers(client: Any) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": TESTING_LABEL}))


def remove_orphans(client: Any = None) -> list[str]:
    """Remove the containers of ours whose creating process is gone (a killed run); the short ids
    removed. ``client``: a ``docker.DockerClient``, else one on the engine testcontainers uses."""
    own = client is None
    engine = _docker_client() if own else client
    try:
        removed = []
        for container in _our_containers(engine):
            if _owner_gone(container.labels.get(OWNER_LABEL, "")):
                with contextlib.suppress(Exception):  # removed meanwhile
                    container.remove(force=True, v=True)
                removed.append(container.id[:12])
        return removed
    finally:
        if own:
            engine.close()


def engine_leftovers(client: Any = None) -> list[str]:
    """Short ids of the containers of ours still on the engine, whoever started them
    (for tests that check the clean-up); empty if no engine answers."""
    try:
        engine = _docker_client() if client is None else client
    except DockerUnavailable:
        return []
    try:
        return [container.id[:12] for container in _our_containers(engine)]
    except Exception:
        return []
    finally:
        if client is None:
            engine.close()


def prepare() -> None:
    """Once per process, before the first container: testcontainers is there, an engine
    answers, and what killed runs left is removed (:class:`DockerUnavailable` if not)."""
    global _prepared
    if _prepared:
        return
    client = _docker_client()
    try:
        remove_orphans(client)
    finally:
        client.close()
    _prepared = True
