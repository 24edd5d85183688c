"""The `redlock` command (also `python -m redlock`): parsing, the commands and their exit
codes in :mod:`redlock.cli.commands`, what they print in :mod:`redlock.cli.render`, what
`redlock nodes` reads from each node in :mod:`redlock.cli.node_report`."""

from redlock.cli.commands import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_CONFIRMED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    entry_point,
    main,
)

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NOT_CONFIRMED", "EXIT_OK", "EXIT_PARTIAL",
           "EXIT_USAGE", "entry_point", "main"]
