"""gunicorn settings hooks for tests/apps/test_gunicorn.py (``--config
python:tests.apps.proc_gunicorn_conf``): each worker dumps its threads' stacks to
stderr on SIGUSR2, so a hung worker can say where it hangs before it is stopped.

(Registered after the worker's own signal setup, which resets SIGUSR2 to its default.)
"""

from __future__ import annotations

import faulthandler
import signal
from typing import Any


def post_worker_init(worker: Any) -> None:
    faulthandler.register(signal.SIGUSR2, all_threads=True)
