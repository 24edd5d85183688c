"""Fork after using the lock family: a sync application holds a semaphore permit, a read
lock and an election's leadership (renewed), with the wake-up machinery running, then
forks children that use the inherited manager and leave the parent's ``with`` blocks
(``tests/apps/proc_family_fork_app.py``, run as a subprocess so that its forks copy an
application, not pytest).

What must hold: no child hangs or fails; the children take the free permit in turn (one
at a time, tokens rising), share the parent's read (a token no lower than its read's)
and are refused a write; they see the parent lead its term and cannot win a campaign;
leaving the parent's ``with`` blocks in a child releases nothing of the parent's:
afterwards a quorum still shows its permit, its read and its leadership, its handles
pass ``check()``, and its own release then frees all three.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from redlock.testing import RedisNodes
from tests.apps.proc_support import APPS_DIR, PYTHON, AppProcess

pytestmark = pytest.mark.timeout(120)

APP = APPS_DIR / "proc_family_fork_app.py"
CHILDREN = 4  # proc_family_fork_app.CHILDREN


def _children(outdir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(outdir.glob("child*.json"))]


def test_children_use_the_family_of_the_parents_manager(tmp_path: Path) -> None:
    outdir = tmp_path / "children"
    outdir.mkdir()
    with RedisNodes(3) as nodes, AppProcess([PYTHON, str(APP), str(outdir),
                                            *nodes.urls]) as app:
        line = app.expect("REPORT ", timeout=90.0)
        code = app.wait(10.0)
    report = json.loads(line[len("REPORT "):])
    children = _children(outdir)
    exits = [json.loads(p.read_text()) for p in outdir.glob("exit*.json")]
    parent = report["parent"]
    figures = f"report {report}\nchildren {children}\nexits {exits}\nstderr {app.stderr[-2000:]}"

    problems = list(report["errors"])
    if code != 0:
        problems.append(f"the application exited with {code}")
    if sorted(report["children"].values(), key=str) != [0] * CHILDREN:
        problems.append(f"children's exit codes: {report['children']}")
    if exits:
        problems.append(f"leaving the parent's with blocks failed in a child: {exits}")
    if len(children) != CHILDREN:
        problems.append(f"{len(children)} of {CHILDREN} children reported")
    if not report["third_refused"]:
        problems.append("a third permit of two was granted before the fork")
    permits = sorted((c["permit"] for c in children if "permit" in c),
                     key=lambda p: p["start"])
    for child in children:
        problems += [f"child {child['index']}: {e}" for e in child["errors"]]
        if child.get("permit", {}).get("slot") == parent["slot"]:
            problems.append(f"child {child['index']} got the parent's slot {parent['slot']}")
        # No write is granted (each child's is refused), so none committed a token after
        # the parent's read: a child's read sees at least the parent's token; more only if
        # a refused write was granted on a node the parent's read did not hold then (a
        # quorum holds it, §12.3), which raised that node's counter.
        if not isinstance(child.get("read_token"), int) or (
                child["read_token"] < parent["read_token"]):
            problems.append(f"child {child['index']} read with token"
                            f" {child.get('read_token')}, below the parent's read's"
                            f" {parent['read_token']}")
        if child.get("write_refused") is not True:
            problems.append(f"child {child['index']} was granted a write while the parent"
                            " read")
        if child.get("leader") != ["parent", parent["term"]]:
            problems.append(f"child {child['index']} saw leader {child.get('leader')}")
        if child.get("campaign_won") is not False:
            problems.append(f"child {child['index']} campaign: {child.get('campaign_won')}")
    for a, b in itertools.pairwise(permits):
        if b["start"] < a["end"]:
            problems.append(f"two children held the free permit at once: {a} and {b}")
        if b["token"] <= a["token"]:
            problems.append(f"permit tokens do not rise: {a['token']} then {b['token']}")
    if report.get("permits_held_after") != 1:
        problems.append(f"after the children: {report.get('permits_held_after')} permits"
                        " held, the parent's one expected")
    if report.get("readers_after") != 1:
        problems.append(f"after the children: {report.get('readers_after')} readers")
    if report.get("leader_after") != ["parent", parent["term"]]:
        problems.append(f"after the children the leader is {report.get('leader_after')}")
    if report.get("after_release") != {"permits": 0, "readers": 0, "leader": False}:
        problems.append(f"after the parent's release: {report.get('after_release')}")
    assert not problems, "\n".join(problems) + "\n" + figures
