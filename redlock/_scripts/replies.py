"""Reading the nodes' replies: the one place that knows each script's reply shape and
codes (docs/design.md §2.2, §4); everything else sees what is returned here.

The nodes send raw replies (redis-py is asked not to decode): bytes, ints, lists, or the
exception a call raised. Parsers here never raise on a malformed reply: a reply that is
not what the script returns is a failure of that node, said as such.
"""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """A reply's bytes as text (anything else as its ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


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
    """An IDENTIFY reply of a node whose marker was stamped by the server run that
    answers."""
    found = identity(reply)
    return found is not None and found[1] is not None and stamped_run(found[1]) == found[0]


def restarted(reply: object) -> bool:
    """An IDENTIFY reply of a node whose marker was stamped by another known server run
    than the one answering: it restarted, or a replica was promoted in its place, and
    its grants do not count until it is judged (docs/design.md §4.4). A marker without a
    known run, or a server that will not say its run, is not a restart as far as anyone
    can tell."""
    found = identity(reply)
    if found is None or found[1] is None or found[0] == "unknown":
        return False
    stamped = stamped_run(found[1])
    return stamped not in (None, "unknown", found[0])
