"""RESP, the nodes' protocol: commands packed, replies parsed from the socket's bytes
(docs/design.md §2.4).

Replies are parsed with :func:`Reader`: hiredis's reader where hiredis is installed (its public
``Reader``), else :class:`PlainReader`, a small RESP2 parser in Python. An error reply is an
instance of :data:`ReplyError`, returned, not raised: it is that call's result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redlock._scripts.command import plain_pack

__all__ = ["HAVE_HIREDIS", "InvalidReply", "PlainReader", "Reader", "ReplyError", "pack",
           "pack_one", "plain_pack"]

_hiredis: Any
try:
    import hiredis as _hiredis

    if not hasattr(_hiredis.Reader(), "has_data"):  # pragma: no cover - hiredis < 1.0
        _hiredis = None
except ImportError:  # pragma: no cover - without hiredis installed
    _hiredis = None

HAVE_HIREDIS = _hiredis is not None


pack_one: Callable[[Sequence[Any]], bytes] = (
    _hiredis.pack_command if _hiredis is not None else plain_pack)


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """The wire bytes of ``commands``, in order (strings as UTF-8)."""
    if len(commands) == 1:
        return pack_one(commands[0])
    return b"".join([pack_one(command) for command in commands])


class _Incomplete(Exception):
    pass


class InvalidReply(Exception):
    """Bytes that are no RESP reply: the stream cannot be trusted."""


class PlainReader:
    """RESP2 and RESP3 replies from a byte stream, in Python (hiredis's ``Reader``
    interface: ``feed``, ``gets`` returning False while no whole reply is buffered,
    ``has_data``). Error replies are returned as :class:`ReplyError`."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def has_data(self) -> bool:
        return self._pos < len(self._buf)

    def gets(self) -> object:
        try:
            reply, pos = self._parse(self._pos)
        except _Incomplete:
            return False
        self._pos = pos
        return reply

    def _line(self, pos: int) -> tuple[bytes, int]:
        end = self._buf.find(b"\r\n", pos)
        if end < 0:
            raise _Incomplete
        return bytes(self._buf[pos:end]), end + 2

    def _bulk(self, line: bytes, pos: int) -> tuple[bytes | None, int]:
        size = int(line)
        if size < 0:
            return None, pos
        if len(self._buf) < pos + size + 2:
            raise _Incomplete
        return bytes(self._buf[pos:pos + size]), pos + size + 2

    def _many(self, count: int, pos: int) -> tuple[list[object], int]:
        items = []
        for _ in range(count):
            item, pos = self._parse(pos)
            items.append(item)
        return items, pos

    def _parse(self, pos: int) -> tuple[object, int]:
        if pos >= len(self._buf):
            raise _Incomplete
        kind = bytes(self._buf[pos:pos + 1])
        line, pos = self._line(pos + 1)
        if kind == b"+":
            return line, pos
        if kind == b":":
            return int(line), pos
        if kind == b"$":
            return self._bulk(line, pos)
        if kind in (b"*", b">", b"~"):
            count = int(line)
            return (None, pos) if count < 0 else self._many(count, pos)
        if kind == b"-":
            return ReplyError(line.decode(errors="replace")), pos
        if kind == b"_":
            return None, pos
        if kind == b"#":
            return line == b"t", pos
        if kind == b",":
            return float(line), pos
        if kind == b"(":
            return int(line), pos
        if kind == b"%":
            flat, pos = self._many(2 * int(line), pos)
            return dict(zip(flat[::2], flat[1::2], strict=True)), pos
        if kind in (b"=", b"!"):
            data, pos = self._bulk(line, pos)
            if kind == b"!":
                return ReplyError((data or b"").decode(errors="replace")), pos
            return (data or b"")[4:], pos  # verbatim: past "txt:"
        raise InvalidReply(f"Protocol error, got {bytes(kind)!r} as reply type byte")


class _PlainReplyError(Exception):
    """An error reply (hiredis's ``ReplyError`` where hiredis is installed)."""


ReplyError: type[Exception] = (_hiredis.ReplyError if _hiredis is not None else _PlainReplyError)


def Reader() -> Any:
    """A new reply parser: hiredis's where installed, else :class:`PlainReader`. Both raise on
    bytes that are no reply (hiredis's ``ProtocolError``, our :class:`InvalidReply`)."""
    return _hiredis.Reader() if _hiredis is not None else PlainReader()
