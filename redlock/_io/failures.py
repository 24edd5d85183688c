"""What goes wrong with a node, in the library's own terms, mapped once at the I/O boundary:
everything above sees a :class:`~redlock._scripts.replies.NodeFailure` with a kind and the
error's type and text; an error *reply* is classified by the code it starts with."""

from __future__ import annotations

import asyncio
from collections.abc import MutableSequence

from redlock._io.resp import ReplyError
from redlock._scripts.replies import (
    AUTHENTICATION_HINT,
    CLUSTER_MODE_HINT,
    FailureKind,
    NodeFailure,
    NotAwaited,
)


class NodeError(Exception):
    """An I/O failure with one node."""


class Unreachable(NodeError, ConnectionError):
    """The node could not be reached, or the connection broke (refused, reset, closed)."""


class NoReply(NodeError, TimeoutError):
    """The node did not answer in time."""


class LoginRefused(NodeError):
    """The node refused the handshake (AUTH, SELECT, CLIENT SETNAME): its reply says why."""


class ProtocolError(NodeError):
    """The node's bytes were no reply this client can read: the stream cannot be trusted."""


class NotReplicated(NodeError):
    """A grant, commit or renewal the node made that fewer of its replicas than
    ``replica_acks`` acknowledged in time (WAIT, docs/design.md §11.3): not counted."""


class NotSent(NoReply):
    """A call its request stopped waiting for before its connection was open (still
    opening, or waiting for a slot to open one), and that will not be sent later: it
    ran nowhere (a failed attempt need not release there, docs/design.md §2.3)."""


class Redirected(NotSent):
    """A cluster node's call its hash slot's master did not run (MOVED, ASK, TRYAGAIN)
    and that could not be sent on within the request's deadline, or was sent on too
    often (routing, docs/design.md §11.4): it ran nowhere, and a later request may
    find the slot's master."""


CLOSED = "the manager is closed"

# A cluster-mode server given as a standalone node: its calls' keys are in other hash
# slots. (A cluster node's redirects not followed are Redirected; CLUSTERDOWN, a cluster
# without a quorum of masters or a hash slot unserved, passes like an outage.)
_CLUSTER_CODES = ("CROSSSLOT", "MOVED", "ASK ", "TRYAGAIN")
# What a node that wants a password answers a client that gave none: NOAUTH, or, to a command of
# more than 10 arguments (our scripts' calls), a protocol error before it closes the connection.
_AUTHENTICATION_CODES = ("WRONGPASS", "NOAUTH", "ERR Protocol error: unauthenticated",
                         "ERR invalid password", "ERR AUTH", "ERR Client sent AUTH")


def kind_of(error: BaseException) -> FailureKind:
    """What kind of failure an error (or an error reply) is."""
    text = str(error)
    if isinstance(error, Redirected) or text.startswith("CLUSTERDOWN"):
        return FailureKind.UNREACHABLE
    if text.startswith(_CLUSTER_CODES):
        return FailureKind.CLUSTER
    if text.startswith(_AUTHENTICATION_CODES):
        return FailureKind.AUTHENTICATION
    if text.startswith("NOPERM"):
        return FailureKind.PERMISSION
    if text.startswith("READONLY"):
        return FailureKind.READ_ONLY
    if isinstance(error, NotReplicated):
        return FailureKind.NOT_REPLICATED
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(error, ConnectionError | OSError | ProtocolError):
        return FailureKind.CLOSED if text == CLOSED else FailureKind.UNREACHABLE
    if isinstance(error, ReplyError | LoginRefused):
        return FailureKind.ERROR_REPLY
    return FailureKind.OTHER


def as_failure(error: BaseException) -> NodeFailure:
    """``error`` as a node failure (one already is stays as it is)."""
    if isinstance(error, NodeFailure):
        return error
    kind = kind_of(error)
    name = "ReplyError" if isinstance(error, ReplyError) else type(error).__name__
    detail = f"{name}: {error or name}"
    if kind is FailureKind.CLUSTER:
        detail += f" ({CLUSTER_MODE_HINT})"
    elif kind is FailureKind.AUTHENTICATION:
        detail += f" ({AUTHENTICATION_HINT})"
    failure = NodeFailure(kind, detail, unsent=isinstance(error, NotSent))
    failure.__cause__ = error
    return failure


def map_failures(replies: MutableSequence[object]) -> None:
    """Every error among ``replies`` as a node failure, in place (not-awaited markers
    stay what they are)."""
    for index, reply in enumerate(replies):
        if isinstance(reply, BaseException) and not isinstance(reply, NodeFailure | NotAwaited):
            replies[index] = as_failure(reply)


def answered(exc: BaseException) -> bool:
    """Whether a failure came from the node (or its host: refused, reset, closed) rather
    than from waiting for it (a timeout): a node that fails fast is not silent, and
    waiting for it costs nothing (a killed node's connections fail at once)."""
    return not isinstance(exc, TimeoutError | asyncio.TimeoutError)
