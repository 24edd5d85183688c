"""What an operator reads: the library's warnings as ``logging.basicConfig()`` prints them.

The application (``tests/apps/proc_log_app.py``) runs as a subprocess with the most
common logging setup there is, ``logging.basicConfig()`` (level WARNING, format
``LEVEL:logger:message``, stderr), so the test sees exactly the printed text. A plain
handler prints the record's message only, not its ``extra`` fields: whatever the
operator needs must be in the message.

For each WARNING (or worse) line the message must name the node concerned (its
``host:port``), and say more than the bare event name (what happened, what to do). Only
that is checked of the wording. And a node that stays down while 32 threads lock and
release must not flood the log: a handful of lines per node per outage, with a count
of what was aggregated, instead of one line per release.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import pytest

from redlock.testing import RedisNodes
from tests.apps.proc_support import APPS_DIR, PYTHON, AppProcess

APP = str(APPS_DIR / "proc_log_app.py")
LEVEL_LINE = re.compile(r"^(WARNING|ERROR|CRITICAL):([\w.]+):(.*)$")
EVENT = re.compile(r"\bredlock\.[a-z_]+\b")
ACL_PASSWORD = "s3cret-lockpw"  # must never be printed
OUTAGE = 6.0  # s a node of five stays down under load
LINES_PER_OUTAGE = 5


@dataclass(frozen=True)
class Printed:
    level: str
    logger: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}:{self.logger}:{self.message}"


def printed_warnings(stderr: str) -> list[Printed]:
    """The WARNING, ERROR and CRITICAL lines basicConfig printed."""
    found = []
    for line in stderr.splitlines():
        match = LEVEL_LINE.match(line)
        if match:
            found.append(Printed(*match.groups()))
    return found


def says_more_than_its_name(message: str, address: str) -> bool:
    """Beyond the event name and the address, at least three words of explanation."""
    rest = EVENT.sub(" ", message.replace(address, " "))
    return len(re.findall(r"[A-Za-z]{2,}", rest)) >= 3


def unreadable(lines: list[Printed], addresses: list[str]) -> list[str]:
    """Lines that name none of ``addresses``, or say nothing beyond the event name."""
    bad = []
    for line in lines:
        named = [a for a in addresses if a in line.message]
        if not named:
            bad.append(f"names no node ({' or '.join(addresses)}): {line}")
        elif not says_more_than_its_name(line.message, named[0]):
            bad.append(f"says nothing beyond the event and the node: {line}")
    return bad


def run_to_end(app: AppProcess, timeout: float) -> int | None:
    code = app.wait(timeout)
    app.close()
    return code


def test_unreachable_node_is_named_in_every_warning() -> None:
    """A node of three is killed while the application locks (auto-extended locks,
    releases): every warning printed must name that node's ``host:port`` and explain
    itself; at least one warning must be printed (an operator must learn of it)."""
    with RedisNodes(3) as nodes:
        dead = f"{nodes[1].host}:{nodes[1].port}"
        with AppProcess([PYTHON, APP, "unreachable", *nodes.urls], stdin=True) as app:
            app.expect("ready", 30.0)
            nodes[1].kill()
            app.send("go")
            app.expect("done", 60.0)
            code = run_to_end(app, 15.0)
        stderr = app.stderr
    assert code == 0, f"the application failed ({code}):\n{stderr}"
    lines = printed_warnings(stderr)
    problems = unreadable(lines, [dead])
    if not lines:
        problems.append("nothing was printed about the unreachable node")
    assert not problems, (f"{len(lines)} warning lines; node {dead} was killed\n"
                          + "\n".join(problems[:8]) + "\nstderr (head):\n" + stderr[:2000])


def test_acl_user_without_info_is_told_which_node_and_why() -> None:
    """The lock user may not run INFO (``ACL SETUSER lockuser ... -info`` on every
    node): every warning must name the node it is about and explain itself, each of
    the three nodes must be named, and the user's password must never be printed."""
    with RedisNodes(3) as nodes:
        urls = []
        for node in nodes:
            with node.client() as admin:
                admin.execute_command("ACL", "SETUSER", "lockuser", "on", f">{ACL_PASSWORD}",
                                      "~*", "&*", "+@all", "-info")
            urls.append(f"redis://lockuser:{ACL_PASSWORD}@{node.host}:{node.port}")
        addresses = [f"{node.host}:{node.port}" for node in nodes]
        with AppProcess([PYTHON, APP, "acl", *urls]) as app:
            app.expect("done", 60.0)
            code = run_to_end(app, 15.0)
        stderr = app.stderr
    assert code == 0, f"the application failed ({code}):\n{stderr}"
    lines = printed_warnings(stderr)
    problems = unreadable(lines, addresses)
    unnamed = [a for a in addresses if not any(a in line.message for line in lines)]
    if unnamed:
        problems.append(f"nodes never named in a warning: {unnamed}")
    if ACL_PASSWORD in stderr:
        problems.append("the lock user's password was printed")
    assert not problems, (f"{len(lines)} warning lines\n" + "\n".join(problems[:8])
                          + "\nstderr (head):\n" + stderr[:2000])


@pytest.mark.slow
def test_node_outage_under_load_is_aggregated() -> None:
    """One node of five (durable: AOF, fsync always) is killed for 6 s while 32 threads
    lock and release as fast as they can, then restarted with its data. Every warning
    must name a node and explain itself; at most a handful of lines (5) may be printed
    for the outage, not one per release, and as many at most for any other node; one of
    the outage's must carry a count of what was aggregated; and the application must
    have kept working through it (hundreds of locks meanwhile).

    A live node may be named too: on a loaded machine (CI; every node fsyncs every
    write) a live node's reply to a release can come after the release's timeout, and
    the release that missed it is rightly told, in a line of its own (a clean-clone CI
    run printed one such line about each of two live nodes, before the outage's)."""
    with RedisNodes(5, appendonly=True) as nodes:
        addresses = [f"{node.host}:{node.port}" for node in nodes]
        dead = addresses[2]
        with AppProcess([PYTHON, APP, "outage", *nodes.urls], stdin=True) as app:
            app.expect("ready", 30.0)
            nodes[2].kill()
            killed_at = time.monotonic()
            app.send("mark")
            before = int(app.expect("mark ", 10.0).split()[1])
            time.sleep(max(0.0, killed_at + OUTAGE - time.monotonic()))
            app.send("mark")
            during = int(app.expect("mark ", 10.0).split()[1]) - before
            nodes[2].restart(keep_data=True)
            time.sleep(2.0)
            app.send("stop")
            done = json.loads(app.expect("done ", 60.0)[len("done "):])
            code = run_to_end(app, 15.0)
        stderr = app.stderr
    assert code == 0, f"the application failed ({code}):\n{stderr[-3000:]}"
    assert not done["hung"], f"application threads hung: {done['hung']}"
    assert during >= 100, (f"only {during} locks were taken during the outage: the load "
                           "did not run, so the test proves nothing")
    lines = printed_warnings(stderr)
    problems = []
    about_node = [line for line in lines if dead in line.message]
    if not about_node:
        problems.append(f"no line names the node that was down ({dead})")
    if len(about_node) > LINES_PER_OUTAGE:
        problems.append(f"{len(about_node)} lines name {dead} for one outage of {OUTAGE:.0f} s "
                        f"(at most {LINES_PER_OUTAGE})")
    for address in addresses:
        about = [line for line in lines if address in line.message]
        if address != dead and len(about) > LINES_PER_OUTAGE:
            events = sorted({m.group(0) for line in about for m in EVENT.finditer(line.message)})
            problems.append(f"{len(about)} warning lines name {address} ({events}), a node "
                            f"that stayed up, while {during} locks were taken: repeated "
                            "events must be aggregated")
    counted = [line for line in about_node
               if any(int(n) >= 2 for n in re.findall(r"\d+", line.message.replace(dead, " ")))]
    if about_node and not counted:
        problems.append("no line about the outage says how many events it stands for")
    problems += unreadable(lines, addresses)[:3]
    assert not problems, (f"{len(lines)} warning lines; {during} locks during the outage; "
                          f"errors {done['errors']} {done['examples']}\n" + "\n".join(problems)
                          + "\nstderr (head):\n" + stderr[:1500])
