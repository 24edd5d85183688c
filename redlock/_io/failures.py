"""redis-py's errors in the library's own terms, mapped once, at the I/O boundary:
everything above sees a :class:`~redlock._scripts.replies.NodeFailure` with a kind
(timeout, unreachable, authentication, permission, read-only, cluster, error reply,
closed) and the original error's type and text for people."""

from __future__ import annotations

from collections.abc import MutableSequence

import redis.exceptions

from redlock._scripts.replies import (
    AUTHENTICATION_HINT,
    CLUSTER_MODE_HINT,
    FailureKind,
    NodeFailure,
    NotAwaited,
)

# redis-py turns a cluster-mode node's CROSSSLOT/MOVED/ASK/CLUSTERDOWN replies into
# these (without the code in the message): the node is in cluster mode, not a lock node.
_CLUSTER_ERRORS = (redis.exceptions.ClusterCrossSlotError, redis.exceptions.MovedError,
                   redis.exceptions.AskError, redis.exceptions.ClusterDownError)
_CLUSTER_CODES = ("CROSSSLOT", "MOVED", "ASK ", "CLUSTERDOWN")
# What a node that wants a password answers a client that gave none, to a command of more
# than 10 arguments (our scripts' calls: not NOAUTH), before it closes the connection.
# redis-py 8 sends HELLO on connect and is refused there (an AuthenticationError);
# earlier ones connect with no handshake and meet this reply on the first call.
_UNAUTHENTICATED = "Protocol error: unauthenticated"


class NotSent(redis.exceptions.TimeoutError):
    """A call its request stopped waiting for before its connection was open (still
    opening, or waiting for a slot to open one), and that will not be sent later: it
    ran nowhere (a failed attempt need not release there, docs/design.md §2.3)."""


def kind_of(error: BaseException) -> FailureKind:
    """What kind of failure a redis-py (or socket, or asyncio) error is."""
    text = str(error)
    if isinstance(error, _CLUSTER_ERRORS) or text.startswith(_CLUSTER_CODES):
        return FailureKind.CLUSTER
    if isinstance(error, redis.exceptions.AuthenticationError) or text.startswith(
            ("WRONGPASS", "NOAUTH", _UNAUTHENTICATED)):
        return FailureKind.AUTHENTICATION
    if isinstance(error, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        return FailureKind.PERMISSION
    if isinstance(error, redis.exceptions.ReadOnlyError) or text.startswith("READONLY"):
        return FailureKind.READ_ONLY
    if isinstance(error, redis.exceptions.TimeoutError | TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(error, redis.exceptions.ConnectionError | ConnectionError | OSError):
        return (FailureKind.CLOSED if text == "the manager is closed"
                else FailureKind.UNREACHABLE)
    if isinstance(error, redis.exceptions.ResponseError):
        return FailureKind.ERROR_REPLY
    return FailureKind.OTHER


def as_failure(error: BaseException) -> NodeFailure:
    """``error`` as a node failure (one already is stays as it is)."""
    if isinstance(error, NodeFailure):
        return error
    kind = kind_of(error)
    detail = f"{type(error).__name__}: {error or type(error).__name__}"
    if kind is FailureKind.CLUSTER:
        detail += f" ({CLUSTER_MODE_HINT})"
    elif kind is FailureKind.AUTHENTICATION:  # the server's text ("HELLO must be called
        detail += f" ({AUTHENTICATION_HINT})"  # with the client already authenticated")
    failure = NodeFailure(kind, detail, unsent=isinstance(error, NotSent))
    failure.__cause__ = error
    return failure


def map_failures(replies: MutableSequence[object]) -> None:
    """Every error among ``replies`` as a node failure, in place (not-awaited markers
    stay what they are)."""
    for index, reply in enumerate(replies):
        if isinstance(reply, BaseException) and not isinstance(reply, NodeFailure | NotAwaited):
            replies[index] = as_failure(reply)
