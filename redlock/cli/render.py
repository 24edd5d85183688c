"""What the ``redlock`` command line prints (docs/operations.md has the shapes).

Tables for people (drawn with ``rich`` when it is installed, aligned plain columns
otherwise), ``--json`` documents for scripts, and node problems in words an operator
acts on, one line each on stderr. :mod:`redlock.cli.commands` decides what to do and which exit
code it ends with; everything here only renders."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from redlock._scripts.node import FORMAT
from redlock.admin import (
    LockStatus,
    Members,
    MembersChange,
    ReleaseReport,
    ReleaseStatus,
    RepairReport,
    RepairStatus,
)
from redlock.cli.node_report import NodeReport

PROG = "redlock"


def say(text: str = "") -> None:
    print(text, file=sys.stdout, flush=True)


def complain(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def rich_available() -> bool:
    return importlib.util.find_spec("rich") is not None


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table for people: rich's when installed, else aligned plain columns."""
    if rich_available():
        from rich.box import SIMPLE_HEAD
        from rich.console import Console
        from rich.table import Table

        table = Table(box=SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*row)
        # Not a terminal (a pipe, a file): no colours, and no wrapping at 80 columns.
        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200,
                          highlight=False)
        console.print(table)
        return
    widths = [max(len(str(cell)) for cell in column) for column in zip(columns, *rows,
                                                                             strict=True)]
    lines = [columns, ["-" * width for width in widths], *rows]
    for line in lines:
        say("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True))
            .rstrip())


def print_json(data: object) -> None:
    say(json.dumps(data, indent=2))


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


# -- node problems ---------------------------------------------------------------------


def node_problem(detail: str) -> str:
    """A node's error in words an operator acts on (the raw text when unrecognised)."""
    text = detail.lower()
    if "connection refused" in text:
        return "connection refused (is redis-server running on that port?)"
    if any(s in text for s in ("authentication", "invalid username-password", "wrongpass",
                               "noauth", "invalid password")):
        return "authentication failed: check the user and password in the URL"
    if "timeout" in text or "timed out" in text or "no reply within" in text:
        return "no answer within the timeout (--timeout): down, overloaded or firewalled"
    if any(s in text for s in ("name or service not known", "nodename nor servname",
                               "temporary failure in name resolution", "no address associated")):
        return "unknown host name"
    if "noperm" in text:
        return f"permission denied for this user: {detail}"
    return detail


def report_unreachable(errors: Sequence[tuple[str, str | None]]) -> None:
    for node, error in errors:
        if error is not None:
            complain(f"node {node} unreachable: {node_problem(error)}")


# -- status: one lock --------------------------------------------------------------------


def _seconds(pttl_ms: int | None) -> str:
    if pttl_ms is None:
        return "?"
    if pttl_ms == -1:
        return "no expiry"
    return f"{pttl_ms / 1000:.1f} s" if pttl_ms else "-"


def _node_state(node: Any, cluster_marked: bool) -> str:
    if not node.reachable:
        return f"unreachable: {node_problem(node.error or '')}"
    states = []
    if not node.marker:  # alone: lost its data; everywhere: a cluster never used yet
        states.append("no marker" if cluster_marked else "new cluster")
    if node.marker and node.format != FORMAT:
        states.append("another format: not used by this client (upgrade it)")
    if node.repairing:
        states.append("repair in progress")
    if node.benched:
        states.append(f"benched, rejoins in {node.rejoins_in_s:.0f} s")
    return ", ".join(states) or "ok"


def lock_summary(status: LockStatus, namespaces: Sequence[str] = ()) -> str:
    """The sentence under the table (and ``summary`` in the JSON); ``namespaces``: those
    the nodes hold markers of, looked up when none is this one's."""
    resource = repr(status.resource)
    holders = Counter(n.holder for n in status.nodes if n.held and n.holder)
    if status.locked:
        holder, count = holders.most_common(1)[0]
        left = min(n.pttl_ms or 0 for n in status.nodes if n.holder == holder)
        return (f"{resource} is locked: holder {holder} on {count} of {len(status.nodes)}"
                f" nodes (quorum {status.quorum}), at least {_seconds(left)} left")
    if status.locked is None:
        silent = len(status.nodes) - status.reachable
        return f"cannot tell whether {resource} is locked: {silent} node(s) did not answer"
    stray = sum(holders.values())
    if stray:
        return (f"{resource} is not locked (keys on {stray} node(s), short of a quorum: an"
                " acquire in progress or one that failed; they expire by their TTL)")
    key = _KEY_NAME.fullmatch(status.resource)
    if key:
        return (f"{resource} is not locked: that is a key's name, not a resource's; try"
                f" `redlock status {key['name']} --namespace {key['namespace']}`")
    if not any(n.marker for n in status.nodes):
        if namespaces:
            listed = ", ".join(repr(ns) for ns in namespaces)
            return (f"{resource} is not locked, and no node has this namespace's marker: the"
                    f" nodes hold the namespace(s) {listed}; try --namespace {namespaces[0]}")
        return (f"{resource} is not locked, and no node has this namespace's marker: a new"
                " cluster (the first acquire writes the markers), or the wrong --namespace")
    fences = [n.fence for n in status.nodes if n.reachable]
    if fences and all(fence == 0 for fence in fences):
        return (f"{resource} is not locked, and never was in this namespace (its fence"
                " counter is 0 on every node): check the name, and --namespace")
    return f"{resource} is not locked"


# A lock's key name as the nodes show it: ``<namespace>:{<resource>}:<kind>``.
_KEY_NAME = re.compile(r"(?P<namespace>[A-Za-z0-9_.:-]+):\{(?P<name>.+)\}"
                       r":(lock|fence|line|line-deadlines|released)")


def show_status(status: LockStatus, as_json: bool, namespaces: Sequence[str] = ()) -> None:
    """``redlock status``: every node's view of one lock, then whether it is locked. The
    JSON has what the table shows: each node's ``holder`` and ``state`` (an unreachable
    node's problem in the words of stderr), and the ``summary`` sentence."""
    cluster_marked = any(m.marker for m in status.nodes)
    if as_json:
        shape = status.as_dict()
        for node, row in zip(status.nodes, shape["nodes"], strict=True):
            row["state"] = _node_state(node, cluster_marked)
        shape["summary"] = lock_summary(status, namespaces)
        print_json(shape)
        return
    print_table(["node", "held", "holder", "ttl left", "fence", "marker", "state"],
                [[n.node, _yes_no(n.held), n.holder or "-", _seconds(n.pttl_ms),
                  "?" if n.fence is None else str(n.fence), _yes_no(n.marker),
                  _node_state(n, cluster_marked)]
                 for n in status.nodes])
    say(lock_summary(status, namespaces))


def family_summary(name: str, kind: str, view: Any) -> str:
    """One sentence on an election, a semaphore or a read-write lock (docs/design.md
    §12), as a quorum of nodes says it."""
    if kind == "election":
        if view is None:
            return (f"{name!r} has no leader: nobody holds the election on a quorum (vacant,"
                    " or an election under way)")
        return (f"{name!r} is led by {view.identity!r}, term {view.token}, at least"
                f" {view.time_left:.1f} s left unless renewed")
    if kind == "semaphore":
        return f"{name!r}: {view.held} of {view.permits} permits held"
    writer = ("no writer" if view.writer is None
              else f"writer {view.writer.holder} ({view.writer.time_left:.1f} s left)")
    return f"{name!r}: {writer}, {len(view.readers)} reader(s)"


def show_family(name: str, kind: str, view: Any, as_json: bool) -> None:
    """``redlock status --kind election|semaphore|rwlock``."""
    if as_json:
        data: dict[str, Any] = {"name": name, "kind": kind}
        if kind == "election":
            data["leader"] = None if view is None else {
                "identity": view.identity, "term": view.token, "time_left_s": view.time_left}
        elif kind == "semaphore":
            data["permits"] = view.permits
            data["slots"] = [None if s is None else {"holder": s.holder,
                                                     "time_left_s": s.time_left}
                             for s in view.slots]
        else:
            data["writer"] = None if view.writer is None else {
                "holder": view.writer.holder, "time_left_s": view.writer.time_left}
            data["readers"] = [{"holder": r.holder, "time_left_s": r.time_left}
                               for r in view.readers]
        print_json(data)
        return
    if kind == "semaphore":
        print_table(["slot", "holder", "time left"],
                    [[str(i), "-" if s is None else s.holder,
                      "-" if s is None else f"{s.time_left:.1f} s"]
                     for i, s in enumerate(view.slots)])
    elif kind == "rwlock" and (view.writer or view.readers):
        holders = ([("write", view.writer)] if view.writer is not None else []) + [
            ("read", r) for r in view.readers]
        print_table(["mode", "holder", "time left"],
                    [[mode, h.holder, f"{h.time_left:.1f} s"] for mode, h in holders])
    say(family_summary(name, kind, view))


# -- nodes -------------------------------------------------------------------------------


def _persistence(report: NodeReport) -> str:
    if report.appendonly:
        return f"aof {report.appendfsync or '?'}"
    if report.save:
        return f"rdb ({report.save})"
    return "none" if report.save == "" else "?"


def _memory(report: NodeReport) -> str:
    if report.maxmemory_policy is None:
        return "?"
    if not report.maxmemory:
        return f"{report.maxmemory_policy} (no limit)"
    return f"{report.maxmemory_policy} ({report.maxmemory} bytes)"


def _name(report: NodeReport) -> str:
    """A node's name; a cluster's shard as the cluster given, then its master."""
    return report.node if report.shard_of is None else f"{report.shard_of}>{report.node}"


def _marker(report: NodeReport) -> str:
    if report.hash_slots is not None:  # a cluster's shard: its hash slots marked
        return f"{report.slots_marked}/{report.hash_slots} slots"
    if report.marker and report.format != FORMAT:
        return "?" if report.format is None else f"format {report.format}"
    return _yes_no(report.marker)


def _role(report: NodeReport) -> str:
    """The node's role, and its online replicas with the largest lag (replica_acks)."""
    if not report.replicas:
        return report.role or "-"
    lag = "" if report.replica_lag_s is None else f", lag {report.replica_lag_s} s"
    plural = "s" if report.replicas > 1 else ""
    return f"{report.role} ({report.replicas} replica{plural}{lag})"


def show_nodes(reports: Sequence[NodeReport], as_json: bool) -> None:
    """``redlock nodes``: one row per node (an unreachable one says no, and why on
    stderr), then the warnings and notes."""
    if as_json:  # (a cluster node's shards are one node)
        nodes = len({report.shard_of or report.node for report in reports})
        print_json({"quorum": nodes // 2 + 1,
                    "nodes": [report.as_dict() for report in reports]})
        return
    rows = [[_name(r), "yes", "-" if r.rtt_ms is None else f"{r.rtt_ms:.2f} ms",
             _marker(r), "-" if r.fence_counter is None else str(r.fence_counter),
             (r.run_id or "-")[:12], _role(r), r.version or "-",
             _persistence(r), _memory(r), str(len(r.warnings))]
            if r.reachable else [_name(r), "no", *["-"] * 9]
            for r in reports]
    if rows:
        print_table(["node", "reachable", "rtt", "marker", "fence", "run id", "role", "version",
                     "persistence", "maxmemory policy", "warnings"], rows)
    for report in reports:
        for warning in report.warnings:
            say(f"warning: {report.node}: {warning}")
        for note in report.notes:
            say(f"note: {report.node}: {note}")


# -- the operator's steps ----------------------------------------------------------------


def show_release(resource: str, reports: Sequence[ReleaseReport], as_json: bool) -> None:
    """``redlock release --force``: what the forced release did on each node."""
    if as_json:
        print_json({"resource": resource, "nodes": [
            {"node": r.node, "status": r.status, "detail": r.detail} for r in reports]})
        return
    print_table(["node", "result"], [[r.node, r.status] for r in reports])
    deleted = sum(1 for r in reports if r.status is ReleaseStatus.DELETED)
    say(f"force-released {resource!r}: key deleted on {deleted} of {len(reports)}"
        " nodes; fence counters kept (the next holder's token is larger)")


def show_repair(reports: Sequence[RepairReport], as_json: bool) -> None:
    """``redlock repair`` / ``initialise``: each node's status, failures on stderr."""
    for report in reports:
        if report.status is RepairStatus.FAILED:
            complain(f"node {report.node}: {node_problem(report.detail)}")
    if as_json:
        print_json({"nodes": [{"node": r.node, "status": r.status, "detail": r.detail}
                              for r in reports]})
    else:
        print_table(["node", "status", "detail"],
                    [[r.node, r.status, r.detail or "-"] for r in reports])


def show_members(found: Members, as_json: bool) -> None:
    """``redlock members``: the configuration the nodes hold."""
    if as_json:
        print_json({"epoch": found.epoch, "members": list(found.members),
                    "joining": None if found.joining is None else list(found.joining)})
    else:
        say(str(found))


def show_change(change: MembersChange, as_json: bool) -> None:
    """``redlock members --change``: what the change did; unreached nodes on stderr."""
    for node in change.unreached:
        complain(f"node {node}: did not take its final membership record (safe; run the"
                 " change again once it answers)")
    if as_json:
        print_json({"epoch": change.epoch, "members": list(change.members),
                    "previous": list(change.previous), "seeded": list(change.seeded),
                    "retired": list(change.retired), "unreached": list(change.unreached),
                    "waited_s": change.waited})
    else:
        say(f"epoch {change.epoch}: members {', '.join(change.members)} (were"
            f" {', '.join(change.previous)}); seeded {', '.join(change.seeded) or 'none'};"
            f" retired {', '.join(change.retired) or 'none'}; waited {change.waited:g} s")
