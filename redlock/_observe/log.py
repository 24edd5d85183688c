"""Logging: flat events through the standard library, silent unless the application configures
``logging`` (docs/events.md lists every event and how to get them as structured data).

Each event is one record on a logger under ``redlock``: the message is its sentence
(:mod:`redlock._observe.events`), the record attribute ``event`` its name and its fields are record
attributes too (``extra``). The top loggers carry a ``NullHandler``. Usage: ``log =
get_logger(__name__)``, then ``log.debug("redlock.x", a=1)``."""

from __future__ import annotations

import logging
from typing import Any

from redlock._observe.events import render

# What every LogRecord has already: an event field with one of these names would make
# logging raise ("Attempt to overwrite ... in LogRecord"), so fields must avoid them;
# and "event", the attribute that carries the event's name.
RESERVED_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "event"}

# A library's duty: never print unless the application configured logging (the
# fencing package does the same for "fencing").
logging.getLogger("redlock").addHandler(logging.NullHandler())


class EventLogger:
    """A stdlib logger that takes an event name and fields; disabled levels cost one
    cached ``isEnabledFor`` check. ``isEnabledFor`` is the stdlib logger's own: code on
    the lock's usual path asks it before it computes an event's fields."""

    __slots__ = ("_logger", "isEnabledFor")

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)
        self.isEnabledFor = self._logger.isEnabledFor

    @property
    def name(self) -> str:
        return self._logger.name

    def _emit(self, level: int, event: str, fields: dict[str, Any],
              exc_info: bool = False) -> None:
        # Only reached past the level check: a disabled event renders nothing. The
        # sentence goes in as the message with no arguments, so logging never applies
        # %-formatting to it and a "%" in a field value is printed as it is.
        message = render(event, fields)
        fields["event"] = event  # fields is this call's own **kwargs dict
        # stacklevel 3: the record names the library function that logged, not this one.
        self._logger.log(level, message, extra=fields, exc_info=exc_info, stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        if self._logger.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        if self._logger.isEnabledFor(logging.INFO):
            self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        if self._logger.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An ERROR event with the exception being handled (call it in an ``except``)."""
        if self._logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, event, fields, exc_info=True)


def get_logger(name: str) -> EventLogger:
    return EventLogger(name)


def event_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields an event carried (the record's attributes beyond the standard ones and
    its ``event`` name)."""
    return {key: value for key, value in vars(record).items() if key not in RESERVED_FIELDS}


class EventFormatter(logging.Formatter):
    """The standard format followed by the event's name and fields as ``key=value`` pairs, for
    applications that log to a terminal or a plain file (the demo and the CLI use it)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = event_fields(record)
        event = getattr(record, "event", None)
        if isinstance(event, str):
            fields = {"event": event, **fields}
        if not fields:
            return text
        pairs = " ".join(f"{key}={value!r}" for key, value in fields.items())
        head, sep, tail = text.partition("\n")  # a traceback stays below the line
        return f"{head} {pairs}{sep}{tail}"
