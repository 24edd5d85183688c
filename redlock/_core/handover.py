"""Hand-over: export a held acquisition, adopt it in another process (docs/design.md
§5.6: what moves, and the adopter's conservative deadline)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from redlock._core.algorithm import RedlockCore
from redlock._core.requests import Broadcast, Call, Flow
from redlock._core.settings import validate_resource
from redlock._core.state import LockState
from redlock._core.tokens import bucket
from redlock._scripts.lock import OWNED_PTTL
from redlock._scripts.replies import owned_outcome
from redlock.errors import LockLost, Outcome, QuorumUnavailable, describe

# A lock value: its call's 32 hex digits, then its attempt's 8 (docs/design.md §2.1);
# a hand-over exported by an earlier version carries the 32 alone.
_OWNER_RE = re.compile(r"^[0-9a-f]{32}(?:[0-9a-f]{8})?$")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Handover:
    """A held acquisition, exported to be adopted elsewhere (``dlm.adopt(handover)``).

    It carries the lock value (``owner``): whoever has it can extend and release the lock, so
    send it only where the lock may go (``repr()`` hides it). Serialise it with
    :meth:`to_json` / :meth:`from_json` (or :meth:`to_dict`, or pickle).

    ``validity`` is the seconds of validity the exporter had left at ``exported_at``
    (wall clock, ``time.time()``); the adopter subtracts the time since then."""

    resource: str
    token: int
    ttl: float
    validity: float
    exported_at: float
    namespace: str
    owner: str = field(repr=False)

    def __post_init__(self) -> None:
        validate_resource(self.resource)
        if not isinstance(self.owner, str) or not _OWNER_RE.match(self.owner):
            raise ValueError("owner must be the 40 hex digits of an exported acquisition")
        if isinstance(self.token, bool) or not isinstance(self.token, int) or self.token < 1:
            raise ValueError(f"token must be a positive int, got {self.token!r}")
        for name in ("ttl", "validity", "exported_at"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not isinstance(self.namespace, str) or not self.namespace:
            raise ValueError(f"namespace must be a non-empty str, got {self.namespace!r}")

    def age(self, now: float) -> float:
        """Seconds since the export, ``now`` being this host's wall clock (``time.time()``)
        (never negative)."""
        return max(0.0, now - self.exported_at)

    def to_dict(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Handover:
        if not isinstance(data, Mapping):
            raise TypeError(f"a hand-over is a mapping, not {type(data).__name__}")
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise ValueError(f"unknown hand-over format version {version!r}"
                             f" (this library reads {FORMAT_VERSION})")
        names = ("resource", "token", "ttl", "validity", "exported_at", "namespace", "owner")
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"hand-over lacks {', '.join(missing)}")
        return cls(**{name: data[name] for name in names})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Handover:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not a hand-over: {exc}") from None
        return cls.from_dict(data)


def as_handover(value: Handover | Mapping[str, Any] | str | bytes) -> Handover:
    if isinstance(value, Handover):
        return value
    if isinstance(value, str | bytes):
        return Handover.from_json(value)
    return Handover.from_dict(value)


def export_state(state: LockState, namespace: str, wall_clock: Callable[[], float]) -> Handover:
    """The hand-over value of a held acquisition (the caller marks it handed over)."""
    state.check()
    return Handover(resource=state.resource, token=state.token, ttl=state.ttl,
                    validity=state.validity(), exported_at=wall_clock(),
                    namespace=namespace, owner=state.value)


def adopt(core: RedlockCore, handover: Handover) -> Flow[LockState]:
    """Take over an exported acquisition: check it on the nodes and compute our deadline."""
    resource = handover.resource
    if handover.namespace != core.keys.namespace:
        raise ValueError(f"hand-over of {resource!r} is for namespace {handover.namespace!r},"
                         f" this manager uses {core.keys.namespace!r}")
    ttl = core.settings.check_ttl(handover.ttl, given=False)
    started = core.clock()
    age = handover.age(core.env.wall_clock())
    carried = handover.validity - age
    if carried <= 0:
        raise LockLost(f"hand-over of {resource!r} expired: exported with"
                       f" {handover.validity:.3f} s of validity, {age:.3f} s ago",
                       resource=resource)
    replies = yield Broadcast(
        tuple(Call(i, (handover.owner,), OWNED_PTTL, (core.keys.lock(resource),))
              for i in range(core.n)),
        min(core.timeout(), carried))
    outcomes = tuple(owned_outcome(core.addresses[i], reply) for i, reply in enumerate(replies))
    owned = sorted(((r.pttl_ms, i) for i, r in enumerate(outcomes)
                    if r.outcome is Outcome.GRANTED and r.pttl_ms is not None), reverse=True)
    # The key's time left on a quorum (the membership rule's, docs/design.md §13.2): the
    # PTTL of the last node of the longest-lived owning nodes that make one.
    rule, holding, quorum_pttl_ms = core.membership.rule, [], None
    for pttl_ms, node in owned:
        holding.append(node)
        if rule.met(holding):
            quorum_pttl_ms = pttl_ms
            break
    if quorum_pttl_ms is None:
        answered = [i for i, r in enumerate(outcomes) if r.outcome is not Outcome.ERROR]
        if not rule.met(answered):
            raise QuorumUnavailable(
                f"could not adopt {resource!r}: only {len(answered)} of {core.n} nodes"
                f" answered, need {rule.needed}; {describe(outcomes)}",
                resource=resource, outcomes=outcomes)
        raise LockLost(
            f"could not adopt {resource!r}: only {len(owned)} of {core.n} nodes still hold"
            " its key (it expired, was released, or is someone else's now); "
            f"{describe(outcomes)}", resource=resource, outcomes=outcomes)
    quorum_pttl = quorum_pttl_ms / 1000.0
    measured = quorum_pttl - core.settings.drift(quorum_pttl)
    deadline = started + min(carried, measured)
    if core.clock() >= deadline:
        raise LockLost(f"could not adopt {resource!r}: its validity ran out during the"
                       " hand-over", resource=resource, outcomes=outcomes)
    core.floors.raise_to((bucket(resource),), handover.token)
    return LockState(resource, handover.owner, ttl, handover.token, deadline, core.clock,
                     core.env.new_mutex())
