"""A command as it goes on the wire (RESP): each argument a bulk string, the command an
array of them. Pure: the call templates pack their command here once per name
(:class:`redlock._core.kinds.Template`), and the transports' packer without hiredis is
made of it (:mod:`redlock._io.resp`), so both write the same bytes as hiredis does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def encode(arg: Any) -> bytes:
    """One argument's bytes: strings as UTF-8, numbers as their decimal text."""
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, bool):  # as redis-py refuses them: an int is meant
        raise TypeError("a bool is not a Redis argument")
    if isinstance(arg, int | float):
        return repr(arg).encode()
    if isinstance(arg, memoryview):
        return arg.tobytes()
    raise TypeError(f"invalid Redis argument of type {type(arg).__name__}")


#: A bulk string's header for each short length (``HEADS[len(data)]``: no formatting).
HEADS = tuple(b"$%d\r\n" % size for size in range(256))


def bulk(arg: Any) -> bytes:
    """One argument as a RESP bulk string."""
    kind = type(arg)  # (the usual two first: a template fills in a few per request)
    data = arg.encode() if kind is str else b"%d" % arg if kind is int else encode(arg)
    return b"$%d\r\n%s\r\n" % (len(data), data)


def plain_pack(command: Sequence[Any]) -> bytes:
    """One command's RESP bytes, without hiredis."""
    return b"*%d\r\n" % len(command) + b"".join([bulk(arg) for arg in command])
