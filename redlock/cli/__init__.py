"""The `redlock` command (also `python -m redlock`): see :mod:`redlock.cli.commands`."""

from redlock.cli.commands import entry_point, main

__all__ = ["entry_point", "main"]
