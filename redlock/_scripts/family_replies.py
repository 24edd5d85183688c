"""Reading the lock family's replies (docs/design.md §12), as :mod:`redlock._scripts.replies`
reads the lock's: SEM_ACQUIRE's outcome and slot, and the read-only views of LEADER,
SEM_INSPECT and RW_INSPECT. Nothing else reads these scripts' replies."""

from __future__ import annotations

from redlock._scripts import family
from redlock._scripts import lock as scripts
from redlock._scripts.replies import NodeFailure, acquire_outcome, text
from redlock.errors import NodeResult, Outcome

# -- SEM_ACQUIRE (§12.2) -------------------------------------------------------------------


def permit_outcome(node: str, reply: object, permits: int) -> NodeResult:
    """SEM_ACQUIRE's reply: ACQUIRE's codes with the slot granted as a third element,
    or ``{-2, K}`` when a client configured with more permits uses the name."""
    if isinstance(reply, list | tuple) and len(reply) == 2 and reply[0] == (
            family.SEM_MORE_PERMITS):
        return NodeResult(node, Outcome.ERROR,
                          f"a permit above this semaphore's {permits} is held on this node:"
                          " a client configured with more permits uses the name (every"
                          " client must pass the same permits=)")
    if isinstance(reply, list | tuple) and len(reply) == 3:
        reply = reply[:2]  # the slot: granted_slot()
    return acquire_outcome(node, reply, 1)


def granted_slot(reply: object) -> int | None:
    """The slot a SEM_ACQUIRE reply granted (or found already ours), else None."""
    if (isinstance(reply, list | tuple) and len(reply) == 3
            and reply[0] in (scripts.ACQUIRE_GRANTED, scripts.ACQUIRE_ALREADY_OURS)):
        return int(reply[2])
    return None


# -- the views: LEADER, SEM_INSPECT, RW_INSPECT (§12.1-§12.3) --------------------------------

#: A grant as a view sees it on one node: ms left and the holder's fingerprint.
Seen = tuple[int, str]


def _answer(reply: object) -> list[object] | None:
    if isinstance(reply, BaseException | NodeFailure) or not isinstance(reply, list | tuple):
        return None
    return list(reply)


def leader_seen(reply: object) -> tuple[Seen, str] | None:
    """LEADER's reply: the leader key's (PTTL, holder) and the term record, or None when
    the node did not answer, has no marker (or one of another format, docs/design.md
    §4.1), or nobody holds the key."""
    answer = _answer(reply)
    if answer is None or len(answer) != 4:
        return None
    pttl, holder, record, node_format = answer
    if int(node_format) != 1 or int(pttl) <= 0 or not text(holder):  # type: ignore[call-overload]
        return None
    return (int(pttl), text(holder)), text(record)  # type: ignore[call-overload]


def term_record(record: str, holder: str) -> tuple[int, str] | None:
    """A term record ``<term> <holder> <identity>`` if it is ``holder``'s: (term, identity)."""
    parts = record.split(" ", 2)
    if len(parts) == 3 and parts[1] == holder and parts[0].isdigit():
        return int(parts[0]), parts[2]
    return None


def slots_seen(reply: object, permits: int) -> list[Seen | None] | None:
    """SEM_INSPECT's reply: per slot, (PTTL, holder) when held; None if no answer."""
    answer = _answer(reply)
    if answer is None:
        return None
    out: list[Seen | None] = []
    for slot in range(min(permits, len(answer) // 2)):
        pttl, holder = int(answer[2 * slot]), text(answer[2 * slot + 1])  # type: ignore[call-overload]
        out.append((pttl, holder) if holder and pttl > 0 else None)
    return out


def readers_writer_seen(reply: object) -> tuple[Seen | None, list[Seen]] | None:
    """RW_INSPECT's reply: the writer's (PTTL, holder) if any, and each live reader's
    (ms left, id); None if no answer."""
    answer = _answer(reply)
    if answer is None or len(answer) < 2:
        return None
    pttl, holder = int(answer[0]), text(answer[1])  # type: ignore[call-overload]
    readers = [(int(answer[i + 1]), text(answer[i]))  # type: ignore[call-overload]
               for i in range(2, len(answer) - 1, 2)]
    return ((pttl, holder) if holder and pttl > 0 else None), readers
