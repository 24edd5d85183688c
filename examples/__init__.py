"""Runnable examples of redlock + fencing; see examples/README.md."""
