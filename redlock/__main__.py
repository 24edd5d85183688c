"""``python -m redlock``: the command line (see :mod:`redlock.cli`)."""

from redlock.cli import entry_point

if __name__ == "__main__":
    entry_point()
