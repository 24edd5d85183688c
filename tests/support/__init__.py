"""The repository's own test tooling: what our suite, scripts, examples and compose stack
need, and a user's suite does not. Not part of the package (the wheel carries
``redlock`` and ``fencing`` only; ``tests/`` is left out of the sdist too).

- :mod:`tests.support.dockerd`: a private Docker engine (``python -m tests.support.dockerd
  up|down``, what ``scripts/test`` runs) and a small Engine API client;
- :mod:`tests.support.images`: the Docker images built locally from this machine's
  binaries (no registry is reachable in CI), ``python -m tests.support.images``;
- :mod:`tests.support.postgres`: a throwaway PostgreSQL server (tests/fencing,
  examples/inventory_sql.py);
- :mod:`tests.support.faketime`: a redis-server whose clock runs fast or slow
  (libfaketime; the clock fault of tests/faults).

Run from the repository root (``python -m tests.support.<module>``), or inside the test
suite, where ``tests`` is importable as a package. What users' suites need (local
redis-server nodes, Toxiproxy, Sentinel, the Docker backend, the pytest plugin) is
:mod:`redlock.testing`, which imports nothing from here.
"""
