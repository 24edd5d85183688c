"""The operator's tools: look at a lock on every node, evict a holder, repair nodes that
lost their data, initialise a cluster, change its nodes online.

    from redlock import Redlock
    from redlock.admin import Admin

    with Redlock(urls) as dlm:
        admin = Admin(dlm)                     # AsyncAdmin(AsyncRedlock(...)): coroutines
        admin.inspect("orders:42")             # LockStatus: every node's view
        admin.is_locked("orders:42")           # does anyone hold it? (lock.locked(): do I?)
        admin.force_release("orders:42")       # delete it whoever holds it (fence kept)
        admin.repair()                         # list[RepairReport]; initialise() too
        admin.members()                        # Members: epoch, members, joining
        admin.change_members(new_urls)         # MembersChange (docs/operations.md)

An admin borrows its manager: the manager's nodes, namespace, timeouts and connections (the
``redlock`` command is built on these). Applications hold locks through the manager; what only
operators do lives here, with the reports it returns. docs/operations.md tells the whole story,
docs/design.md §10 why it is a module of its own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from redlock._client.admin import AdminBase
from redlock._core.amnesia.repair import RepairReport, RepairStatus
from redlock._core.inspect import LockStatus, NodeLockStatus, ReleaseReport
from redlock._core.members import Members
from redlock._core.membership import MembersChange
from redlock._scripts.replies import ReleaseStatus
from redlock.aio import AsyncRedlock
from redlock.client import Redlock

__all__ = ["Admin", "AsyncAdmin", "LockStatus", "Members", "MembersChange", "NodeLockStatus",
           "ReleaseReport", "ReleaseStatus", "RepairReport", "RepairStatus"]


class Admin(AdminBase[Redlock]):
    """The operator's tools over a :class:`redlock.Redlock`: ``Admin(dlm)``. Each call
    uses the manager's nodes, namespace and timeouts, and blocks."""

    _asynchronous = False

    def inspect(self, resource: str) -> LockStatus:
        """Every node's view of ``resource``: held or not, PTTL left, fence counter,
        marker, repair and amnesia state (never the holder's secret lock value). One
        parallel round of read-only scripts; unreachable nodes are reported, not raised."""
        return self._manager._drive(self._inspect_flow(resource))

    def is_locked(self, resource: str) -> bool:
        """Whether *anyone* holds ``resource`` (one holder's key on a quorum of nodes),
        asked of the nodes. Not to be confused with a handle's ``locked()``, which says
        whether *the caller* holds it, without I/O. Raises :class:`QuorumUnavailable`
        when the nodes that did not answer could change the answer."""
        return self._manager._drive(self._is_locked_flow(resource))

    def force_release(self, resource: str) -> list[ReleaseReport]:
        """Delete ``resource``'s lock key on every node, whoever holds it.

        The holder is not told: it keeps working until its next ``extend()`` or
        ``check()`` fails, so protect the resource with fencing (the next holder's token
        is larger, fence counters are kept). Logs ``redlock.force_released``."""
        return self._manager._drive(self._force_release_flow(resource))

    def repair(self, *, force: bool = False) -> list[RepairReport]:
        """Look at every node now: judge restarted ones, and re-seed those that lost their
        data once their rejoin time has come (every lease they may have granted before
        the loss has expired then, by the node's own clock: docs/design.md §4.3.1); the
        manager also does this in the background by itself.

        ``force=True`` skips the wait: only when you know every lock held before the
        node lost its data has expired."""
        return self._manager._drive(self._repair_flow(force))

    def initialise(self, *, force: bool = False) -> list[RepairReport]:
        """Give every node without its node marker one (every node must answer).

        Without ``force``: a new cluster, or the rest of an interrupted initialisation (nodes that
        never held anything); nodes that lost data are refused (``failed``). With ``force``, the
        way out of a majority that lost its data: those too, their fence counters seeded from the
        nodes that kept theirs. Only once every lock held before has expired (``repair()`` says
        when); tokens may then restart below earlier ones, which the fenced stores reject until
        they catch up (docs/design.md §4.8)."""
        return self._manager._drive(self._initialise_flow(force))

    def members(self) -> Members:
        """The cluster's membership as the nodes hold it (docs/design.md §13): the
        configuration of the highest epoch (``joining`` set during a change), or epoch 0
        and the manager's nodes for a cluster that never changed. Raises
        :class:`MembershipError` when too few nodes answer to be sure."""
        return self._manager._drive(self._members_flow())

    def change_members(self, new: Iterable[Any], *, current: Iterable[Any] | None = None,
                       wait: float | None = None) -> MembersChange:
        """Make ``new`` the cluster's members, online, without two holders (docs/design.md §13.3,
        docs/operations.md): a joint configuration first, the new nodes seeded (they serve at
        once), a wait until every lock granted before has expired, then the new configuration.

        The manager must be configured with every node of the current and the new set. ``new`` and
        ``current`` name its nodes the way it was given them (URLs or clients) or as ``dlm.nodes``
        shows them (``host:port``); a node that is not one of the manager's is a ``ValueError``
        naming it. ``current``: the members now, needed only for a cluster that never changed (by
        default its nodes that have their marker). ``wait``: the longest a lock granted before the
        change may live (default the manager's ``max_ttl`` and its drift; never less than any
        client's ``max_ttl``). Blocks for about ``wait``. Run it again with the same ``new`` to
        complete a change that stopped. Raises ``ValueError`` for a bad set,
        :class:`MembershipError` when the change cannot proceed (nothing is ever undone: what was
        written is safe)."""
        return self._manager._drive(self._change_members_flow(new, current, wait))


class AsyncAdmin(AdminBase[AsyncRedlock]):
    """The asyncio twin of :class:`Admin`: ``AsyncAdmin(dlm)`` over a
    :class:`redlock.AsyncRedlock`; the same methods, as coroutines."""

    _asynchronous = True

    async def inspect(self, resource: str) -> LockStatus:
        """See :meth:`Admin.inspect`."""
        return await self._manager._drive(self._inspect_flow(resource))

    async def is_locked(self, resource: str) -> bool:
        """See :meth:`Admin.is_locked` (anyone holds it; ``lock.locked()``: I do)."""
        return await self._manager._drive(self._is_locked_flow(resource))

    async def force_release(self, resource: str) -> list[ReleaseReport]:
        """See :meth:`Admin.force_release`."""
        return await self._manager._drive(self._force_release_flow(resource))

    async def repair(self, *, force: bool = False) -> list[RepairReport]:
        """See :meth:`Admin.repair`."""
        return await self._manager._drive(self._repair_flow(force))

    async def initialise(self, *, force: bool = False) -> list[RepairReport]:
        """See :meth:`Admin.initialise`."""
        return await self._manager._drive(self._initialise_flow(force))

    async def members(self) -> Members:
        """See :meth:`Admin.members`."""
        return await self._manager._drive(self._members_flow())

    async def change_members(self, new: Iterable[Any], *, current: Iterable[Any] | None = None,
                             wait: float | None = None) -> MembersChange:
        """See :meth:`Admin.change_members` (the task waits about ``wait``)."""
        return await self._manager._drive(self._change_members_flow(new, current, wait))
