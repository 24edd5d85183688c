"""The membership record a node keeps (``ns:node:members``, docs/design.md §13.1): its
shape as the scripts store it. :mod:`redlock._scripts.replies` reads it from the
replies; :mod:`redlock._core.members` makes a quorum rule of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redlock._scripts import node as node_scripts

#: Separates addresses in a record's fields (addresses never contain a line break).
SEPARATOR = "\n"


@dataclass(frozen=True)
class Members:
    """A configuration: ``members`` (stable), or ``members`` (the old set) and ``joining`` (the new
    set) during a change; ``retired``: the node that stored it was removed by a change."""

    epoch: int
    members: tuple[str, ...]
    joining: tuple[str, ...] | None = None
    retired: bool = False

    @property
    def joint(self) -> bool:
        return self.joining is not None

    @property
    def sets(self) -> tuple[tuple[str, ...], ...]:
        """The sets of which a majority is needed."""
        return (self.members,) if self.joining is None else (self.members, self.joining)

    @property
    def target(self) -> tuple[str, ...]:
        """The members once the change (if any) is complete."""
        return self.members if self.joining is None else self.joining

    def fields(self) -> tuple[str, str, str, str]:
        """The record's fields as the scripts store them: epoch, members, joining,
        retired ('' for none)."""
        return (str(self.epoch), SEPARATOR.join(self.members),
                "" if self.joining is None else SEPARATOR.join(self.joining),
                "1" if self.retired else "")

    def same_configuration(self, other: Members) -> bool:
        return (self.epoch, self.members, self.joining) == (
            other.epoch, other.members, other.joining)

    def __str__(self) -> str:
        shown = ", ".join(self.members)
        if self.joining is not None:
            shown = f"joint: old [{shown}] and new [{', '.join(self.joining)}]"
        else:
            shown = f"[{shown}]"
        return f"epoch {self.epoch} {shown}" + (" (this node retired)" if self.retired else "")


def stable(addresses: Sequence[str], epoch: int = 0) -> Members:
    return Members(epoch, tuple(addresses))


def from_fields(epoch: object, members: object, joining: object,
                retired: object) -> Members | None:
    """A record from its stored fields (bytes or text; None or '' where absent), or
    None if there is none or it is not one of ours."""
    def text(value: object) -> str:
        if value is None or value is False:
            return ""
        return value.decode() if isinstance(value, bytes) else str(value)

    try:
        number = int(text(epoch) or "0")
    except ValueError:
        return None
    listed = tuple(a for a in text(members).split(SEPARATOR) if a)
    if number <= 0 or not listed:
        return None
    new = tuple(a for a in text(joining).split(SEPARATOR) if a)
    return Members(number, listed, new or None, text(retired) == "1")


#: What :func:`members_record` returns for a node that did not answer.
UNANSWERED: Any = object()


def members_written(reply: object) -> tuple[bool, Members | None]:
    """WRITE_MEMBERS' reply: (written, the record found instead); (False, None) when the
    node did not answer."""
    if isinstance(reply, list | tuple) and reply:
        if reply[0] == node_scripts.MEMBERS_WRITTEN:
            return True, None
        if reply[0] == node_scripts.MEMBERS_NEWER and len(reply) == 5:
            return False, from_fields(*reply[1:])
    return False, None


def members_record(reply: object) -> Members | Any | None:
    """An ``HMGET ns:node:members epoch members joining retired`` reply: the record, None
    when there is none, :data:`UNANSWERED` when the node did not answer."""
    if isinstance(reply, list | tuple) and len(reply) == 4:
        return from_fields(*reply)
    return UNANSWERED
