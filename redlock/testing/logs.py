"""Capture the library's log events in tests.

    from redlock.testing import capture_events

    with capture_events() as events:
        dlm.lock("r").acquire(blocking=False)
    assert [e for e in events if e["event"] == "redlock.quorum_failed"]

Each event is a dict: ``event`` (its name), ``log_level`` (``"debug"``, ``"info"``, ``"warning"``,
``"error"``), ``logger`` (``redlock._core.algorithm``, ...), ``message`` (the sentence a person
reads) and the event's fields; the shape of ``structlog.testing.capture_logs``, plus the message.
pytest's ``caplog`` works too: the records' message is the event's sentence, the name is their
``event`` attribute and the fields are record attributes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from redlock._observe.log import event_fields


class _EventList(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        # The library's records carry their event's name as an attribute (the message is
        # its sentence); a record logged otherwise is named by its message.
        event = getattr(record, "event", None)
        entry: dict[str, Any] = {"event": event if isinstance(event, str) else record.getMessage(),
                                 "log_level": record.levelname.lower(),
                                 "logger": record.name, "message": record.getMessage()}
        entry.update(event_fields(record))
        if record.exc_info:
            entry["exc_info"] = record.exc_info
        self.events.append(entry)  # list.append is atomic: watchdog threads may log


@contextlib.contextmanager
def capture_events(*names: str, level: int = logging.DEBUG) -> Iterator[list[dict[str, Any]]]:
    """Collect the events of the ``redlock`` and ``fencing`` loggers (or of ``names``)
    at ``level`` and above while the block runs; the loggers' levels are restored."""
    handler = _EventList()
    loggers = [logging.getLogger(name) for name in (names or ("redlock", "fencing"))]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
        logger.addHandler(handler)
    try:
        yield handler.events
    finally:
        for logger, previous in zip(loggers, saved, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(previous)
