"""The operator's tools over a manager, shared by :class:`redlock.admin.Admin` and
:class:`redlock.admin.AsyncAdmin` (docs/design.md §11.6): each tool a flow of the core that the
shells drive, and the naming of the nodes an operator gives (:func:`node_addresses`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from redlock._client.manager import ManagerBase
from redlock._core import inspect as _inspect
from redlock._core import membership
from redlock._core.amnesia.repair import RepairReport
from redlock._core.members import Members
from redlock._core.membership import MembersChange
from redlock._core.requests import Flow
from redlock._core.settings import validate_resource
from redlock._io.endpoint import Endpoint, from_client, from_url, type_name

M = TypeVar("M", bound=ManagerBase[Any, Any])

_MANAGERS = {False: "a Redlock", True: "an AsyncRedlock"}


class AdminBase(Generic[M]):
    """The tools' flows over one manager; the shells add the methods that block or await."""

    # Which manager flavour this admin drives (redlock.admin: Redlock or AsyncRedlock).
    _asynchronous: ClassVar[bool]

    def __init__(self, manager: M) -> None:
        if (not isinstance(manager, ManagerBase)
                or manager._backend_class.asynchronous != self._asynchronous):
            if isinstance(manager, ManagerBase):
                other = "Admin" if self._asynchronous else "AsyncAdmin"
                given = _MANAGERS[not self._asynchronous]
                raise TypeError(f"{type(self).__name__} takes {_MANAGERS[self._asynchronous]},"
                                f" not {given}: use {other}(dlm) for {given}")
            raise TypeError(f"{type(self).__name__} takes {_MANAGERS[self._asynchronous]},"
                            f" not {type(manager).__name__}")
        self._manager = manager

    @property
    def manager(self) -> M:
        """The manager whose nodes, namespace and timeouts the tools use (closing it is
        its owner's business: an admin holds nothing of its own)."""
        return self._manager

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._manager!r}>"

    # -- the flows the shells drive ------------------------------------------------

    def _inspect_flow(self, resource: str) -> Flow[_inspect.LockStatus]:
        return _inspect.inspect_lock(self._manager._core, validate_resource(resource))

    def _is_locked_flow(self, resource: str) -> Flow[bool]:
        return _inspect.is_locked(self._manager._core, validate_resource(resource))

    def _force_release_flow(self, resource: str) -> Flow[list[_inspect.ReleaseReport]]:
        resource = validate_resource(resource)
        manager = self._manager
        try:
            return (yield from _inspect.force_release(manager._core, resource))
        finally:  # this manager's local waiters: go (its room is rebuilt in a fork child)
            manager._room.turns.notify(manager._core.keys.channel(resource))

    def _repair_flow(self, force: bool) -> Flow[list[RepairReport]]:
        return self._manager._core.repair(force=force)

    def _initialise_flow(self, force: bool) -> Flow[list[RepairReport]]:
        return self._manager._core.initialise(force=force)

    def _members_flow(self) -> Flow[Members]:
        return membership.current_members(self._manager._core)

    def _change_members_flow(self, new: Iterable[Any], current: Iterable[Any] | None,
                             wait: float | None) -> Flow[MembersChange]:
        nodes = self._manager._endpoints
        addresses = self._manager.nodes
        new_addresses = node_addresses(new, nodes, addresses, "new")
        current_addresses = (None if current is None
                             else node_addresses(current, nodes, addresses, "current"))
        return membership.change_members(self._manager._core, new_addresses,
                                         current=current_addresses, wait=wait)


# -- naming nodes the way the manager was given them -------------------------------


def node_addresses(given: Iterable[Any], nodes: Sequence[Endpoint], addresses: Sequence[str],
                   what: str, *, mine: str = "this manager's nodes",
                   hint: str = "the manager must be configured with every node of the"
                               " current and the new set") -> tuple[str, ...]:
    """The manager's node addresses for ``given``: each given node is one of the manager's
    ``addresses`` (``dlm.nodes``), or a URL / client / ``host:port`` that points at the same Redis
    server as one of its ``nodes`` (``localhost`` and ``127.0.0.1`` alike, the database number,
    user and password aside: :attr:`Endpoint.server`). Anything else is a ``ValueError`` that names
    what was given (without its password) and the manager's nodes (``mine``, ``hint``: how a
    message calls them and what to do)."""
    if isinstance(given, str | bytes | bytearray) or not isinstance(given, Iterable):
        raise TypeError(f"{what} must be a collection of nodes (URLs, clients or addresses"
                        f" as dlm.nodes shows them), not {type(given).__name__}")
    servers = [node.server for node in nodes]
    found: dict[str, object] = {}
    for node in given:
        index = _index_of(node, addresses, servers)
        if index is None:
            raise ValueError(
                f"{what} names {_shown(node)}, which is not one of {mine}"
                f" ({', '.join(addresses)}): {hint}")
        address = addresses[index]
        if address in found:
            raise ValueError(f"{what} names node {address} twice ({_shown(found[address])}"
                             f" and {_shown(node)})")
        found[address] = node
    return tuple(found)


def _index_of(node: object, addresses: Sequence[str], servers: Sequence[str]) -> int | None:
    if isinstance(node, str) and node in addresses:
        return list(addresses).index(node)
    server = _endpoint(node)
    if server is not None and server.server in servers:
        return list(servers).index(server.server)
    return None


def _endpoint(node: object) -> Endpoint | None:
    """The node a URL, an address as ``dlm.nodes`` shows it or a client names; None when
    it names none."""
    try:
        if isinstance(node, str):
            if "://" not in node:  # an address as dlm.nodes shows it: host:port, unix:PATH
                node = (f"unix://{node[5:]}" if node.startswith("unix:") else f"redis://{node}")
            return from_url(node)
        return from_client(node)
    except (AttributeError, TypeError, ValueError):
        return None


def _shown(node: object) -> str:
    """A node as given, for a message: a URL without its password, a client's type."""
    if isinstance(node, str):
        return repr(re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", node))
    endpoint = _endpoint(node)
    if endpoint is not None:
        return f"{type_name(node)}({endpoint.address})"
    return repr(node)
