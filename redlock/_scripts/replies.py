"""Reading the nodes' replies: the one place that knows each script's reply shape and codes
(docs/design.md §2.2, §3, §4, §5). Replies come raw (bytes, ints, lists), or as a
:class:`NodeFailure` or ``NotAwaited``; a malformed reply is never raised, it is a failure of that
node. (The membership record's scripts have their readers in :mod:`redlock._scripts.record`.)"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeVar

from redlock._scripts import lock as scripts
from redlock._scripts import node as node_scripts
from redlock._scripts import shared
from redlock._scripts.record import Members, from_fields
from redlock.errors import NodeResult, Outcome

T = TypeVar("T")

# -- replies that are no answer ----------------------------------------------------------


class Pending:
    """The marker of a reply not read yet (None is a real reply)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = Pending()


class NotAwaited(Exception):
    """The request was decided without this node's reply (it is read in the background)."""


NOT_AWAITED = NotAwaited("the request was decided without this reply (read in the background)")
#: A final release whose connection was still opening (or not free) when its request
#: ended: it is sent once the connection is open (docs/design.md §2.4), so the node is
#: not counted as failed.
SENT_LATE = NotAwaited("sent once its connection is open (the request did not wait for it)")


# -- failures --------------------------------------------------------------------------


class FailureKind(enum.Enum):
    """Why a call got no reply of its script's: what retrying may or may not fix."""

    TIMEOUT = "timeout"  # no reply within the request's time
    UNREACHABLE = "unreachable"  # refused, reset, closed: no connection
    AUTHENTICATION = "authentication"  # wrong or missing password, unknown user
    PERMISSION = "permission"  # the ACL user may not run this
    READ_ONLY = "read only"  # a replica
    CLUSTER = "cluster"  # a Redis Cluster node (CROSSSLOT, MOVED)
    ERROR_REPLY = "error reply"  # the node answered with an error
    CLOSED = "closed"  # the manager was closed
    NOT_REPLICATED = "not replicated"  # fewer replicas than replica_acks have it (WAIT)
    OTHER = "other"


#: Failures that retrying cannot fix: an acquire in an outage that meets them stops (a
#: closed manager's at once, rather than after outage_timeout).
PERMANENT = frozenset({FailureKind.AUTHENTICATION, FailureKind.PERMISSION,
                       FailureKind.READ_ONLY, FailureKind.CLUSTER, FailureKind.CLOSED})

AUTHENTICATION_HINT = ("the node refused the credentials: give the user and password in the"
                       " URL (redis://USER:PASSWORD@host:port, or redis://:PASSWORD@... for"
                       " the default user) or to the client; a node with a password needs"
                       " one")
#: Why a cluster-mode server given as a standalone node answers CROSSSLOT or MOVED: a
#: standalone node's scripts take the resource's keys with the node's own, in other hash
#: slots (docs/design.md §11.4).
CLUSTER_MODE_HINT = ("the node runs in cluster mode: give it as a Redis Cluster, a URL"
                     " with ?cluster=yes or a RedisCluster client, so that each call goes"
                     " to the master of its hash slot (docs/operations.md, \"Redis"
                     " Cluster\")")


class NodeFailure(Exception):
    """A call that got no reply of its script's, in the library's own terms: ``kind``,
    and ``detail`` (the original error's type and text, for people)."""

    def __init__(self, kind: FailureKind, detail: str, *, unsent: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        # The call was never written to the node (its request ended while its
        # connection was still opening): it ran nowhere.
        self.unsent = unsent

    @property
    def permanent(self) -> bool:
        return self.kind in PERMANENT


def failure_detail(reply: object) -> str:
    """What went wrong with a call, for people."""
    if isinstance(reply, NodeFailure):
        return reply.detail
    if isinstance(reply, BaseException):
        return f"{type(reply).__name__}: {reply}"
    return f"unexpected reply {reply!r}"


def text(value: Any) -> str:
    """A reply's bytes as text (anything else as its ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def hash_fields(reply: object) -> dict[str, str]:
    """An HGETALL reply as read raw: a flat list under RESP2, a map under RESP3."""
    if isinstance(reply, dict):
        return {text(k): text(v) for k, v in reply.items()}
    if isinstance(reply, list | tuple):
        return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}
    return {}


def _not_read(node: str, reply: object) -> NodeResult | None:
    """The outcome of a reply that is no answer: not awaited, not read, or a failure."""
    if isinstance(reply, NotAwaited):
        return NodeResult(node, Outcome.NOT_AWAITED, str(reply))
    if isinstance(reply, BaseException):
        return NodeResult(node, Outcome.ERROR, failure_detail(reply))
    if reply is PENDING:
        # A reply nobody read is an error, never a refusal: it says nothing about our key
        # (reading it as "key gone" deleted healthy locks on a busy event loop).
        return NodeResult(node, Outcome.ERROR, "no reply was read from this node")
    return None


# -- the membership check of the granting scripts (docs/design.md §13.1) ----------------


def epoch_refusal(reply: object) -> Members | None:
    """The record a guarded script refused with (its epoch is above the client's, or the
    node is retired), or None if the reply is no such refusal."""
    if (isinstance(reply, list | tuple) and len(reply) == 5 and reply[0] == shared.STALE_EPOCH):
        return from_fields(*reply[1:])
    return None


def _refused_epoch(node: str, reply: object) -> NodeResult | None:
    record = epoch_refusal(reply)
    if record is None:
        return None
    why = ("removed from the cluster by a membership change" if record.retired else
           "the cluster's membership changed (adopted: the request is sent again under it)")
    return NodeResult(node, Outcome.ERROR, f"{why}: {record}")


# -- ACQUIRE, ACQUIRE_MANY ---------------------------------------------------------------


def acquire_outcome(node: str, reply: object, resources: int = 1) -> NodeResult:
    """ACQUIRE's reply (one resource) or ACQUIRE_MANY's (a set of ``resources``); a
    granting node's counters are :func:`acquire_counters` (``counter``: the largest)."""
    if (resources == 1 and type(reply) is list and len(reply) == 2  # the usual grant
            and reply[0] == scripts.ACQUIRE_GRANTED and type(reply[1]) is int):
        return NodeResult(node, Outcome.GRANTED, counter=reply[1])
    unanswered = _not_read(node, reply) or _refused_epoch(node, reply)
    if unanswered is not None:
        return unanswered
    if not isinstance(reply, list | tuple) or len(reply) < 2:
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    try:
        code, values = int(reply[0]), [int(v) for v in reply[1:]]
    except (TypeError, ValueError):  # a proxy or a foreign script answering: not ours
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    if code in (scripts.ACQUIRE_GRANTED, scripts.ACQUIRE_ALREADY_OURS):
        if len(values) != resources:
            return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
        return NodeResult(node, Outcome.GRANTED, counter=max(values))
    if len(values) != 1:
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    if code == scripts.ACQUIRE_REFUSED:
        held = "held by another owner" if resources == 1 else "a key is held by another owner"
        return NodeResult(node, Outcome.REFUSED, f"{held}, {values[0]} ms left", pttl_ms=values[0])
    if code == scripts.ACQUIRE_NOT_YOUR_TURN:
        waiters = "1 waiter is" if values[0] == 1 else f"{values[0]} waiters are"
        return NodeResult(node, Outcome.REFUSED, f"free, but {waiters} first in line")
    if code == scripts.ACQUIRE_AMNESIAC:
        return NodeResult(node, Outcome.AMNESIAC, "no node marker: new, or lost its data")
    if code == scripts.ACQUIRE_OTHER_FORMAT:
        return NodeResult(node, Outcome.INCOMPATIBLE,
                          other_format(values[0] if values[0] > 0 else None))
    return NodeResult(node, Outcome.ERROR, f"unexpected reply code {code}")


def acquire_counters(reply: object) -> list[int]:
    """A granting node's fence counters, one per resource (in the set's order)."""
    return [int(value) for value in reply[1:]]  # type: ignore[index]


def acquire_vote(reply: object) -> int | None:
    """An ACQUIRE / ACQUIRE_MANY reply as a vote for an early decision: granted (1), held
    by another or another's turn (0), or unknown (None: no answer yet, or a failure)."""
    if isinstance(reply, list | tuple) and reply:
        code = reply[0]
        if code in (scripts.ACQUIRE_GRANTED, scripts.ACQUIRE_ALREADY_OURS):
            return 1
        if code in (scripts.ACQUIRE_REFUSED, scripts.ACQUIRE_NOT_YOUR_TURN):
            return 0
    return None


def acquire_set_nothing(reply: object) -> bool:
    """An ACQUIRE / ACQUIRE_MANY reply that set nothing on its node (refused, no marker,
    or one of another format), or a call that never reached it (unsent): a failed
    attempt need not release there."""
    if isinstance(reply, NodeFailure):
        return reply.unsent
    return isinstance(reply, list | tuple) and bool(reply) and reply[0] in (
        scripts.ACQUIRE_REFUSED, scripts.ACQUIRE_NOT_YOUR_TURN, scripts.ACQUIRE_AMNESIAC,
        scripts.ACQUIRE_OTHER_FORMAT, shared.STALE_EPOCH)


# -- the value-checked scripts: EXTEND, WRITE_BACK, RELEASE ------------------------------


def acked(reply: object) -> bool:
    """The node did it (our key was there)."""
    return reply == 1 and not isinstance(reply, bool)


def key_gone(reply: object) -> bool:
    """The node answered that our key is not there (expired, taken, force-released)."""
    return reply == 0 and not isinstance(reply, bool)


def ack_outcome(node: str, reply: object, *, refused: str) -> NodeResult:
    """An value-checked script's reply: 1 = done, 0 = our key is not there. Only a 0 the
    node sent is a refusal: anything else (no reply read, a failure, a reply of another
    shape, a refusal of the client's epoch) is an error and says nothing about our key."""
    if type(reply) is int and reply == 1:  # the usual case first
        return NodeResult(node, Outcome.GRANTED)
    unanswered = _not_read(node, reply) or _refused_epoch(node, reply)
    if unanswered is not None:
        return unanswered
    if acked(reply):
        return NodeResult(node, Outcome.GRANTED)
    if key_gone(reply):
        return NodeResult(node, Outcome.REFUSED, refused)
    return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")


# -- OWNED_PTTL (hand-over) ---------------------------------------------------------------


def owned_outcome(node: str, reply: object) -> NodeResult:
    """GRANTED with the PTTL left when the node holds the acquisition's key."""
    unanswered = _not_read(node, reply)
    if unanswered is not None:
        return unanswered
    if isinstance(reply, int) and not isinstance(reply, bool) and reply > 0:
        return NodeResult(node, Outcome.GRANTED, pttl_ms=reply)
    return NodeResult(node, Outcome.REFUSED, "does not hold this acquisition's key")


# -- INSPECT, FORCE_RELEASE (operator tools) ----------------------------------------------


@dataclass(frozen=True)
class Inspected:
    """One node's INSPECT reply."""

    pttl_ms: int  # -2 free, -1 a key without expiry, else ms left
    fence: int  # the highest token the node can have given the resource
    marker: bool
    format: int | None  # the format the marker names (None: no marker, or none readable)
    repairing: bool
    holder: str  # a fingerprint of the lock value, '' when free
    episode: str  # the amnesia episode, '' when none
    now_ms: int  # the node's clock


def inspected(reply: object) -> Inspected | None:
    """INSPECT's reply, or None if it is not one."""
    if not isinstance(reply, list | tuple) or len(reply) != 7:
        return None
    try:
        found = int(reply[2])  # 1 this client's format, 0 no marker, else another (-1: ?)
        return Inspected(int(reply[0]), int(text(reply[1])), found != 0,
                         node_scripts.FORMAT if found == 1 else found if found > 0 else None,
                         reply[3] == 1, text(reply[4]), text(reply[5]), int(reply[6]))
    except (TypeError, ValueError):  # a proxy or a foreign script answering: not ours
        return None


class ReleaseStatus(str, enum.Enum):
    """What a forced release did on one node."""

    __str__ = str.__str__

    DELETED = "deleted"  # a lock key was there
    ABSENT = "absent"  # no lock key
    FAILED = "failed"  # no answer, or an error (the detail says which)


def force_released(reply: object) -> tuple[ReleaseStatus, str]:
    """FORCE_RELEASE's reply as (status, detail)."""
    if acked(reply):
        return ReleaseStatus.DELETED, ""
    if key_gone(reply):
        return ReleaseStatus.ABSENT, ""
    return ReleaseStatus.FAILED, failure_detail(reply)


# -- node identity, initialisation, episodes ----------------------------------------------


def marker_format(marker: object) -> int | None:
    """The node format a marker value names (its first word, ``format=<n>``,
    docs/design.md §4.1), or None when it names none."""
    word = text(marker).split(" ", 1)[0]
    number = word[len("format="):]
    if word.startswith("format=") and number.isdigit() and number.isascii():
        return int(number)
    return None


def ours(marker: object) -> bool:
    """A marker of this client's format (:data:`redlock._scripts.node.FORMAT`): a node
    this client may use."""
    return marker_format(marker) == node_scripts.FORMAT


def other_format(found: int | None) -> str:
    """Why a node whose marker names ``found`` (None: no format this client reads) is
    not used by this client: the detail of its ``INCOMPATIBLE`` outcome, for people."""
    if found is not None and found > node_scripts.FORMAT:
        return (f"initialised by a newer format {found} of redlock-fenced (this client reads"
                f" format {node_scripts.FORMAT})")
    return (f"initialised by another release of redlock-fenced: its node marker names no"
            f" format this client reads (format {node_scripts.FORMAT})")


def stamped_run(marker: object) -> str | None:
    """The server run id a marker value was stamped with (None: an unstamped marker)."""
    for word in text(marker).split():
        if word.startswith("run_id="):
            return word[len("run_id="):]
    return None


def identity(reply: object) -> tuple[str, bytes | None] | None:
    """(run id, marker value or None) from an IDENTIFY reply, or None if it failed."""
    if isinstance(reply, list | tuple) and len(reply) == 2 and reply[0]:
        marker = reply[1]
        return text(reply[0]), (None if marker is None else text(marker).encode())
    return None


def is_healthy(reply: object) -> bool:
    """An IDENTIFY reply of a node whose marker is of this client's format and was
    stamped by the server run that answers."""
    found = identity(reply)
    return (found is not None and found[1] is not None and ours(found[1])
            and stamped_run(found[1]) == found[0])


def foreign(reply: object) -> bool:
    """An IDENTIFY reply of a node whose marker is of another format than this client's
    (docs/design.md §4.1): this client must not use it."""
    found = identity(reply)
    return found is not None and found[1] is not None and not ours(found[1])


def restarted(reply: object) -> bool:
    """An IDENTIFY reply of a node whose marker was stamped by another known server run than the
    one answering: it restarted, or a replica was promoted in its place, and its grants do not
    count until it is judged (docs/design.md §4.4). A marker without a known run, or a server that
    will not say its run, is not a restart as far as anyone can tell."""
    found = identity(reply)
    if found is None or found[1] is None or found[0] == "unknown":
        return False
    stamped = stamped_run(found[1])
    return stamped not in (None, "unknown", found[0])


class Initialised(enum.Enum):
    """INIT_MARKER's reply."""

    WRITTEN = "written"
    EXISTS = "exists"  # another client initialised the node meanwhile
    EPISODE = "episode"  # the node lost data: only a repair may give its marker back
    UNANSWERED = "unanswered"


def _coded(reply: object, codes: dict[int, T], otherwise: T) -> T:
    """What an integer reply code means (``otherwise`` for anything else)."""
    return codes.get(reply, otherwise) if isinstance(reply, int) else otherwise


def initialised(reply: object) -> Initialised:
    return _coded(reply, {node_scripts.INIT_WRITTEN: Initialised.WRITTEN,
                          node_scripts.INIT_EXISTS: Initialised.EXISTS,
                          node_scripts.INIT_EPISODE: Initialised.EPISODE},
                  Initialised.UNANSWERED)


class RepairFinished(enum.Enum):
    """FINISH_REPAIR's reply."""

    WRITTEN = "written"  # the marker is back, the episode closed
    GUARD_GONE = "guard gone"  # the repair's claim vanished: the node lost data again
    TOO_YOUNG = "too young"  # its episode is younger than the rejoin delay (or another run's)
    FAILED = "failed"


def epoch_seeded(reply: object) -> int | str:
    """SEED_EPOCH's reply: the counter it seeded, or why not (for people)."""
    if not isinstance(reply, list | tuple) or len(reply) != 3:
        return f"epoch seeding interrupted: {failure_detail(reply)}"
    code, epoch, value = (int(item) for item in reply)
    if code == node_scripts.EPOCH_SEEDED:
        return value
    if code == node_scripts.EPOCH_NOT_ABOVE:
        return (f"its master's configEpoch {epoch} is not above {value}, the one its counter"
                " was last seeded under (a loss without failover): run CLUSTER FAILOVER on"
                " one of its replicas, or CLUSTER BUMPEPOCH on its master, then repair runs"
                " again (docs/design.md §11.4)")
    if code == node_scripts.EPOCH_OVERFLOW:
        return (f"its counter {value} already reached its master's epoch range ({epoch} *"
                " 2**40): tokens lost in the failover could be above it; run CLUSTER"
                " FAILOVER on one of its replicas for a higher epoch")
    return "the repair's claim is gone (the node restarted mid-repair)"


def repair_finished(reply: object) -> RepairFinished:
    return _coded(reply, {node_scripts.REPAIR_WRITTEN: RepairFinished.WRITTEN,
                          node_scripts.REPAIR_GUARD_GONE: RepairFinished.GUARD_GONE,
                          node_scripts.REPAIR_TOO_YOUNG: RepairFinished.TOO_YOUNG},
                  RepairFinished.FAILED)


def marker_exists(reply: object) -> bool | None:
    """An ``EXISTS marker`` probe: True, False, or None (no answer)."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return reply > 0
    return None


@dataclass(frozen=True)
class Episode:
    """OPEN_EPISODE's (or DEMOTE's) reply: the node has its marker again (``marked``:
    ``marker``, its value), or its amnesia episode began ``since_ms`` by its clock, which
    reads ``now_ms``, and it may rejoin from ``until_ms`` on (docs/design.md §4.3.1)."""

    marked: bool
    since_ms: int = 0
    now_ms: int = 0
    until_ms: int = 0
    marker: str = ""

    @property
    def left(self) -> float:
        """Seconds until it may rejoin, by the node's clock."""
        return max(0, self.until_ms - self.now_ms) / 1000.0


def episode(reply: object) -> Episode | None:
    """OPEN_EPISODE's reply, or None (unreachable: try again later)."""
    if not isinstance(reply, list | tuple) or not reply:
        return None
    try:
        if int(reply[0]) == 0:
            return Episode(marked=True, marker=text(reply[1]))
        return Episode(False, int(reply[1]), int(reply[2]), int(reply[3]))
    except (TypeError, ValueError, IndexError):
        return None


def demoted(reply: object) -> Episode | None:
    """DEMOTE's reply: the episode it began, or None (the marker changed meanwhile, or
    no answer)."""
    if not isinstance(reply, list | tuple) or len(reply) != 3:
        return None
    try:
        if int(reply[0]) != 1:
            return None
        return Episode(False, int(reply[1]), int(reply[1]), int(reply[2]))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Horizon:
    """What HORIZON says of a node (docs/design.md §4.3.1): whether it is healthy (its
    marker of this format, stamped by the run that answers), every lease it granted or
    extended runs out within ``leases`` seconds, and, in an amnesia episode of its own,
    it may rejoin in ``rejoins`` seconds (None: it is in none)."""

    healthy: bool
    leases: float
    rejoins: float | None


def horizon(reply: object) -> Horizon | None:
    """HORIZON's reply, or None (no answer)."""
    if not isinstance(reply, list | tuple) or len(reply) != 4 or not reply[0]:
        return None
    try:
        run_id, marker = text(reply[0]), reply[1]
        healthy = marker is not None and ours(marker) and stamped_run(marker) == run_id
        rejoins = int(reply[3])
        return Horizon(healthy, int(reply[2]) / 1000.0, None if rejoins < 0 else rejoins / 1000.0)
    except (TypeError, ValueError):
        return None
