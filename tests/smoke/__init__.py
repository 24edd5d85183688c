"""The public API's smoke test: run by the main suite, and by scripts/matrix on every
combination of Python, redis-py, hiredis and Redis server (copied out of the repository
so that it imports the installed package, with nothing of tests/ but itself)."""
