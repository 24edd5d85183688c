"""gunicorn ``--preload``: a manager built at import time in the master, inherited by
every worker (``tests/apps/proc_wsgi_app.py``).

Real gunicorn (3 workers, ``--worker-class sync`` and ``gevent``; gevent monkey-patches
threads and sockets in each worker, after the manager was built unpatched in the
master), three real redis-server nodes, one of them 20 ms away (a Toxiproxy latency on
its replies: a node in another zone, so quorums are decided before its replies arrive
and those are read in the background, as in most real deployments), a separate
redis-server holding the counter, and an HTTP client load of concurrent threads: 32
clients doing 8 locked GET-then-SET counter increments each, while 4 requests hold an
auto-extended lock (ttl 1 s) for 2.5 s.

What must hold:

- every request answers, in time (15 s: a healthy one takes a few ms, a hold 2.5 s);
- the counter is exact (256), every increment saw a distinct value, and the tokens
  increase with the values (the lock serialised the read-modify-writes);
- no ``LockLost``: the auto-extended locks are renewed inside the workers;
- the workers shut down cleanly on SIGTERM: each logs its exit, the master exits 0
  before its graceful timeout (nobody had to be killed), no process is left behind.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass

import gunicorn.config  # type: ignore[import-untyped]
import pytest

from redlock.testing import RedisNodes, ToxiproxyServer, find_toxiproxy_server, free_port
from tests.apps.proc_support import PYTHON, REPO_ROOT, AppProcess, alive, child_env, wait_until

WORKERS = 3
CLIENTS = 32
INCREMENTS = 8  # per client
HOLDERS = 4
REQUEST_TIMEOUT = 15.0  # s; beyond this a request counts as hung
GRACEFUL = 8  # s, gunicorn --graceful-timeout
FAR_LATENCY = 0.02  # s added to the replies of the third node (through Toxiproxy)


@dataclass
class Answer:
    kind: str  # "incr" or "hold"
    status: int | None  # None: no answer (timeout, connection error)
    body: str
    seconds: float


def request(port: int, path: str, kind: str) -> Answer:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return Answer(kind, response.status, response.read().decode(errors="replace"),
                      time.monotonic() - started)
    except (OSError, http.client.HTTPException) as error:
        return Answer(kind, None, f"{type(error).__name__}: {error}",
                      time.monotonic() - started)
    finally:
        connection.close()


def gunicorn_command(worker_class: str, port: int) -> list[str]:
    command = [PYTHON, "-m", "gunicorn", "--preload", "--workers", str(WORKERS),
               "--worker-class", worker_class, "--bind", f"127.0.0.1:{port}",
               "--timeout", "20", "--graceful-timeout", str(GRACEFUL),
               "--log-level", "info", "--config", "python:tests.apps.proc_gunicorn_conf"]
    if any(s.name == "control_socket_disable" for s in gunicorn.config.KNOWN_SETTINGS):
        command.append("--no-control-socket")  # else gunicorn 27 makes ~/.gunicorn/*.ctl
    return [*command, "tests.apps.proc_wsgi_app:app"]


def load(port: int) -> tuple[list[Answer], int]:
    """The concurrent load: HOLDERS long holds and CLIENTS x INCREMENTS increments.
    Once a request went unanswered the clients stop sending (the server hangs: more
    requests would only wait out their timeouts); returns the answers and how many
    requests were never sent."""
    answers: list[Answer] = []
    start = threading.Barrier(CLIENTS + HOLDERS, timeout=30.0)
    hung = threading.Event()
    unsent = 0

    def client() -> None:
        nonlocal unsent
        start.wait()
        for sent in range(INCREMENTS):
            if hung.is_set():
                unsent += INCREMENTS - sent
                return
            answer = request(port, "/incr", "incr")
            answers.append(answer)
            if answer.status is None:
                hung.set()

    def holder(n: int) -> None:
        start.wait()
        answer = request(port, f"/hold?n={n}", "hold")
        answers.append(answer)
        if answer.status is None:
            hung.set()

    threads = [threading.Thread(target=holder, args=(n,), name=f"proc-holder-{n}")
               for n in range(HOLDERS)]
    threads += [threading.Thread(target=client, name=f"proc-client-{i}") for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60.0  # a hang costs at most two request timeouts
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not [t.name for t in threads if t.is_alive()], "client threads did not finish"
    return answers, unsent


@pytest.mark.parametrize("worker_class", ["sync", "gevent"])
def test_gunicorn_preload_workers_use_the_import_time_manager(worker_class: str) -> None:
    """gunicorn --preload with ``worker_class`` workers: exact counter under concurrent
    locked increments, auto-extended holds not lost, no hung request, clean shutdown."""
    try:
        find_toxiproxy_server()
    except FileNotFoundError as missing:  # as tests/faults does: CI must run it
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; CI must run this test")
        pytest.skip(str(missing))
    problems: list[str] = []
    with RedisNodes(3) as nodes, RedisNodes(1) as counter_node, \
            ToxiproxyServer() as toxiproxy:
        far = toxiproxy.front([nodes[2]])[0]  # one node in another zone: 20 ms away
        far.latency(FAR_LATENCY)
        urls = [nodes[0].url, nodes[1].url, far.url]
        port = free_port()
        env = child_env(PROC_WSGI_NODES=",".join(urls),
                        PROC_WSGI_COUNTER=counter_node[0].url)
        with AppProcess(gunicorn_command(worker_class, port), env=env, cwd=REPO_ROOT) as server:
            try:
                booted = wait_until(
                    lambda: server.stderr.count("Booting worker with pid") >= WORKERS
                    and request(port, "/pid", "pid").status == 200, 30.0, 0.1)
                assert booted, f"gunicorn did not come up:\n{server.stderr}"
                workers = sorted(set(re.findall(r"Booting worker with pid: (\d+)",
                                                server.stderr)))
                server.tree()  # remembered: killed in close() should anything be left
                answers, unsent = load(port)
                with counter_node[0].client() as counter:
                    count = int(counter.get("wsgi:count") or 0)
                if any(a.status is None for a in answers):  # where do the workers hang?
                    for pid in workers:  # one at a time: their dumps do not interleave
                        os.kill(int(pid), signal.SIGUSR2)  # proc_gunicorn_conf: stacks
                        time.sleep(0.3)
            finally:
                stopped_at = time.monotonic()
                server.signal(signal.SIGTERM)
                code = server.wait(GRACEFUL + 10)
                shutdown = time.monotonic() - stopped_at
                tree = server._seen_tree
                leftovers = [pid for pid in tree if alive(pid)]
            log = server.stderr

    unanswered = [a for a in answers if a.status is None]
    if unanswered:
        shown = [(a.kind, a.body, round(a.seconds, 1)) for a in unanswered][:4]
        problems.append(f"{len(unanswered)} of {len(answers)} requests hung or failed "
                        f"without an answer (then {unsent} were not sent): {shown}")
    lost = [a for a in answers if a.status == 409]
    if lost:
        problems.append(f"{len(lost)} auto-extended holds were lost (LockLost): "
                        f"{[a.body[:200] for a in lost]}")
    failed = [a for a in answers if a.status not in (None, 200, 409)]
    if failed:
        problems.append(f"{len(failed)} requests failed: "
                        f"{[(a.kind, a.status, a.body[:300]) for a in failed][:4]}")
    holds = [json.loads(a.body) for a in answers if a.kind == "hold" and a.status == 200]
    short = [h for h in holds if h["checks"] < 10]
    if short:
        problems.append(f"holds checked fewer than 10 times: {short}")
    incrs = [json.loads(a.body) for a in answers if a.kind == "incr" and a.status == 200]
    expected = CLIENTS * INCREMENTS
    if count != len(incrs) or (count != expected and not unanswered):
        problems.append(f"counter is {count} after {len(incrs)} successful increments of "
                        f"{expected} requested")
    values = sorted(i["value"] for i in incrs)
    if values != list(range(1, len(incrs) + 1)):
        repeats = len(values) - len(set(values))
        problems.append(f"increments did not see distinct consecutive values ({repeats} "
                        "repeated): two requests were in the critical section at once")
    tokens = [i["token"] for i in sorted(incrs, key=lambda i: i["value"])]
    if any(b <= a for a, b in itertools.pairwise(tokens)):
        problems.append("tokens do not increase with the counter's values")
    if code != 0:
        problems.append(f"the gunicorn master exited with {code} after SIGTERM")
    if shutdown >= GRACEFUL:
        problems.append(f"shutdown took {shutdown:.1f} s, past the {GRACEFUL} s graceful "
                        "timeout: a worker had to be killed")
    exited = set(re.findall(r"Worker exiting \(pid: (\d+)\)", log))
    if set(workers) - exited:
        problems.append(f"workers that never logged their exit: {sorted(set(workers) - exited)}")
    for marker in ("Traceback", "WORKER TIMEOUT", "was sent SIGKILL", "Exception in worker"):
        if marker in log:
            problems.append(f"gunicorn's log shows {marker!r}")
    if leftovers:
        problems.append(f"processes left after the master exited: {leftovers}")
    pids = sorted({i["pid"] for i in incrs})
    took = max((a.seconds for a in answers), default=0.0)
    assert not problems, (f"{worker_class} workers {workers}, increments served by {pids}, "
                          f"slowest request {took:.1f} s, shutdown {shutdown:.1f} s\n"
                          + "\n".join(problems) + "\ngunicorn log (tail):\n" + log[-8000:])
