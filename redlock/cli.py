"""The ``redlock`` command line (also ``python -m redlock``): look at locks and nodes,
and the operator's tools. docs/operations.md has the whole story.

    redlock status RESOURCE --nodes URL [URL ...]   every node's view of one lock
    redlock nodes --nodes URL [URL ...]             reachability, round trip, marker, role,
                                                    persistence, memory policy, warnings
    redlock release RESOURCE --force --nodes ...    delete the lock whoever holds it
    redlock repair --nodes ... [--force]            nodes that lost their data: report, re-seed
    redlock initialise --nodes ... [--force]        mark a new or partially initialised cluster
    redlock demo [--nodes 3 ...]                    workers contending on local redis-servers

``--nodes`` may come from ``$REDLOCK_NODES`` (URLs separated by spaces or commas).
Tables for people (drawn with ``rich`` when it is installed: ``pip install
"redlock-fenced[cli]"``), ``--json`` for scripts. Problems with nodes (bad URL,
connection refused, wrong password, timeout) are one line each on stderr, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from redis.connection import parse_url

from redlock import __version__
from redlock._inspect import LockStatus
from redlock._log import EventFormatter
from redlock._node_report import NodeReport, read_nodes
from redlock._rules import Keys
from redlock.client import Redlock
from redlock.errors import RedlockError

PROG = "redlock"

EXIT_OK = 0  # done; every node answered
EXIT_FAILED = 1  # not done, or the answer cannot be trusted (fewer than a quorum answered)
EXIT_USAGE = 2  # bad arguments or node URLs (argparse uses 2 as well)
EXIT_PARTIAL = 3  # done, but some nodes did not answer, or `nodes` found unsafe settings
EXIT_NOT_CONFIRMED = 4  # a forced step was not confirmed: nothing was changed
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done, every node answered
  {EXIT_FAILED}    failed, or fewer than a quorum of nodes answered (the answer cannot be trusted)
  {EXIT_USAGE}    bad arguments or node URLs
  {EXIT_PARTIAL}    done, but some nodes did not answer (or: `nodes` found unsafe settings,
       `repair` has nodes still waiting)
  {EXIT_NOT_CONFIRMED}    a --force step was not confirmed (no terminal and no --yes, or "no")
  {EXIT_INTERRUPTED}  interrupted"""

DEFAULT_TIMEOUT = 2.0


class CliError(Exception):
    """Ends the command with one line on stderr and an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- output --------------------------------------------------------------------------------


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


# -- nodes and errors ----------------------------------------------------------------------


def _masked(url: str) -> str:
    """A URL without its password, for messages."""
    return re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", url)


def node_problem(detail: str) -> str:
    """A node's error in words an operator acts on (the raw text when unrecognised)."""
    text = detail.lower()
    if "connection refused" in text:
        return "connection refused (is redis-server running on that port?)"
    if any(s in text for s in ("authentication", "invalid username-password", "wrongpass",
                               "noauth", "invalid password")):
        return "authentication failed: check the user and password in the URL"
    if "timeout" in text or "timed out" in text:
        return "no answer within the timeout (--timeout): down, overloaded or firewalled"
    if any(s in text for s in ("name or service not known", "nodename nor servname",
                               "temporary failure in name resolution", "no address associated")):
        return "unknown host name"
    if "noperm" in text:
        return f"permission denied for this user: {detail}"
    return detail


def node_urls(args: argparse.Namespace) -> list[str]:
    urls = list(args.nodes or [])
    if not urls:
        urls = [u for u in re.split(r"[\s,]+", os.environ.get("REDLOCK_NODES", "")) if u]
    if not urls:
        raise CliError("no nodes given: pass --nodes URL [URL ...] or set REDLOCK_NODES",
                       EXIT_USAGE)
    for url in urls:
        try:
            parse_url(url)
        except ValueError as exc:
            raise CliError(f"bad node URL {_masked(url)!r}: {exc}", EXIT_USAGE) from None
    return urls


def open_manager(args: argparse.Namespace) -> Redlock:
    urls = node_urls(args)
    try:
        return Redlock(urls, namespace=args.namespace, node_timeout=args.timeout)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def reachability_code(answered: int, total: int) -> int:
    quorum = total // 2 + 1
    if answered < quorum:
        return EXIT_FAILED
    return EXIT_OK if answered == total else EXIT_PARTIAL


def report_unreachable(errors: Sequence[tuple[str, str | None]]) -> None:
    for node, error in errors:
        if error is not None:
            complain(f"node {node} unreachable: {node_problem(error)}")


# -- confirmation ----------------------------------------------------------------------


def confirm(args: argparse.Namespace, what: str, question: str) -> None:
    """Go on only after an explicit yes: --yes, or 'y' typed at a terminal."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CliError(f"refusing to {what} without confirmation: stdin is not a terminal"
                       " (pass --yes to confirm from a script)", EXIT_NOT_CONFIRMED)
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CliError(f"not confirmed: did not {what}", EXIT_NOT_CONFIRMED)


# -- commands --------------------------------------------------------------------------


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
    if node.repairing:
        states.append("repair in progress")
    if node.benched:
        states.append(f"benched, rejoins in {node.rejoins_in_s:.0f} s")
    return ", ".join(states) or "ok"


def lock_summary(status: LockStatus) -> str:
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
    if not any(n.marker for n in status.nodes):
        return (f"{resource} is not locked (a new cluster: the first acquire writes the node"
                " markers)")
    return f"{resource} is not locked"


def cmd_status(args: argparse.Namespace) -> int:
    with open_manager(args) as dlm:
        status = dlm.inspect(args.resource)
    report_unreachable([(n.node, n.error) for n in status.nodes])
    if args.json:
        print_json(status.as_dict())
    elif status.reachable:
        print_table(["node", "held", "holder", "ttl left", "fence", "marker", "state"],
                    [[n.node, _yes_no(n.held), n.holder or "-", _seconds(n.pttl_ms),
                      "?" if n.fence is None else str(n.fence), _yes_no(n.marker),
                      _node_state(n, any(m.marker for m in status.nodes))]
                     for n in status.nodes])
        say(lock_summary(status))
    return reachability_code(status.reachable, len(status.nodes))


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


def cmd_nodes(args: argparse.Namespace) -> int:
    with open_manager(args) as dlm:  # checks the URLs and names the nodes
        addresses = dlm.nodes
    reports = read_nodes(node_urls(args), addresses, Keys(args.namespace), args.timeout)
    report_unreachable([(r.node, r.error) for r in reports])
    if args.json:
        print_json({"quorum": len(reports) // 2 + 1,
                    "nodes": [report.as_dict() for report in reports]})
    else:
        rows = [[r.node, "yes" if r.reachable else "no",
                 "-" if r.rtt_ms is None else f"{r.rtt_ms:.2f} ms",
                 _yes_no(r.marker), (r.run_id or "-")[:12], r.role or "-", r.version or "-",
                 _persistence(r), _memory(r), str(len(r.warnings))]
                for r in reports if r.reachable]
        if rows:
            print_table(["node", "reachable", "rtt", "marker", "run id", "role", "version",
                         "persistence", "maxmemory policy", "warnings"], rows)
        for report in reports:
            for warning in report.warnings:
                say(f"warning: {report.node}: {warning}")
            for note in report.notes:
                say(f"note: {report.node}: {note}")
    code = reachability_code(sum(1 for r in reports if r.reachable), len(reports))
    if code == EXIT_OK and any(r.warnings for r in reports):
        return EXIT_PARTIAL
    return code


def cmd_release(args: argparse.Namespace) -> int:
    with open_manager(args) as dlm:
        status = dlm.inspect(args.resource)
        if not args.json:
            say(lock_summary(status))
        confirm(args, f"force-release {args.resource!r}",
                f"Delete the lock on {args.resource!r} on all {len(dlm.nodes)} nodes, whoever"
                " holds it? Its holder is not told and may still be working.")
        reports = dlm.force_release(args.resource)
    report_unreachable([(r.node, r.detail if r.status == "failed" else None) for r in reports])
    if args.json:
        print_json({"resource": args.resource, "nodes": [
            {"node": r.node, "status": r.status, "detail": r.detail} for r in reports]})
    else:
        print_table(["node", "result"], [[r.node, r.status] for r in reports])
        deleted = sum(1 for r in reports if r.status == "deleted")
        say(f"force-released {args.resource!r}: key deleted on {deleted} of {len(reports)}"
            " nodes; fence counters kept (the next holder's token is larger)")
    return reachability_code(sum(1 for r in reports if r.status != "failed"), len(reports))


def _repair_reports(args: argparse.Namespace, reports: Sequence[Any]) -> int:
    for report in reports:
        if report.status == "failed":
            complain(f"node {report.node}: {node_problem(report.detail)}")
    if args.json:
        print_json({"nodes": [{"node": r.node, "status": r.status, "detail": r.detail}
                              for r in reports]})
    else:
        print_table(["node", "status", "detail"],
                    [[r.node, r.status, r.detail or "-"] for r in reports])
    statuses = {r.status for r in reports}
    if "failed" in statuses:
        return EXIT_FAILED
    return EXIT_PARTIAL if "waiting" in statuses else EXIT_OK


def cmd_repair(args: argparse.Namespace) -> int:
    with open_manager(args) as dlm:
        if args.force:
            confirm(args, "force a repair",
                    "Re-seed and readmit every node without its marker now? Safe only once"
                    " every lock held before those nodes lost their data has expired"
                    " (one max_ttl after the loss).")
        reports = dlm.repair(force=args.force)
    return _repair_reports(args, reports)


def cmd_initialise(args: argparse.Namespace) -> int:
    with open_manager(args) as dlm:
        if args.force:
            confirm(args, "force the initialisation",
                    "Write node markers on the nodes that lack one, although some nodes"
                    " already have one? Safe only once every lock has expired (one max_ttl"
                    " after the nodes lost their data).")
        reports = dlm.initialise(force=args.force)
    return _repair_reports(args, reports)


# -- the parser ------------------------------------------------------------------------


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line (argparse prints the usage first, which is noise for a typo).
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--nodes", nargs="+", metavar="URL",
                        help="the Redis nodes, e.g. redis://10.0.0.1:6379"
                             " rediss://user:pass@host:6380 (default: $REDLOCK_NODES)")
    common.add_argument("--namespace", default="redlock",
                        help="key prefix the applications use (default: redlock)")
    common.add_argument("--timeout", type=_positive_seconds, default=DEFAULT_TIMEOUT,
                        metavar="SECONDS",
                        help=f"per-node answer time (default: {DEFAULT_TIMEOUT:g})")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="show the library's log events on stderr")
    common.add_argument("--traceback", action="store_true",
                        help="on an unexpected error, show the Python traceback")
    confirmable = _Parser(add_help=False)
    confirmable.add_argument("--yes", action="store_true",
                             help="confirm a --force step without asking (for scripts)")

    parser = _Parser(prog=PROG, description="Look at redlock-fenced locks and their Redis"
                     " nodes, and the operator's tools. Each command takes --nodes URL ...;"
                     " see `redlock COMMAND --help`.",
                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"redlock-fenced {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=_Parser)

    def command(name: str, handler: Callable[[argparse.Namespace], int], summary: str,
                *parents: _Parser) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary, epilog=EXIT_CODES,
                                  parents=[common, *parents],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(handler=handler)
        return sub

    status = command("status", cmd_status,
                     "every node's view of one lock: held, holder fingerprint, time left,"
                     " fence counter, node marker")
    status.add_argument("resource", metavar="RESOURCE")
    command("nodes", cmd_nodes,
            "the nodes: reachable, round trip, marker, run id, role, persistence,"
            " maxmemory policy, and what is unsafe for locks")
    release = command("release", cmd_release,
                      "delete a lock on every node whoever holds it (operators only;"
                      " fence counters are kept)", confirmable)
    release.add_argument("resource", metavar="RESOURCE")
    release.add_argument("--force", action="store_true", required=True,
                         help="required: this evicts the holder without telling it")
    repair = command("repair", cmd_repair,
                     "nodes that lost their data (no marker): report them; with --force,"
                     " re-seed their fence counters and readmit them now", confirmable)
    repair.add_argument("--force", action="store_true",
                        help="skip the rejoin delay (asks for confirmation; --yes)")
    initialise = command("initialise", cmd_initialise,
                         "mark a new or partially initialised cluster (node markers)",
                         confirmable)
    initialise.add_argument("--force", action="store_true",
                            help="also when some nodes have markers (asks; --yes)")
    commands.add_parser("demo", help="workers contending for one lock on local redis-server"
                                     " nodes (redlock demo --help)", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:
        from redlock import demo

        return demo.main(args_list[1:])
    args = build_parser().parse_args(args_list)
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(EventFormatter("%(levelname)s %(name)s: %(message)s"))
        logging.getLogger("redlock").addHandler(handler)
        logging.getLogger("redlock").setLevel(logging.DEBUG)
    try:
        code: int = args.handler(args)
        return code
    except CliError as exc:
        complain(str(exc))
        return exc.code
    except KeyboardInterrupt:
        complain("interrupted")
        return EXIT_INTERRUPTED
    except RedlockError as exc:
        complain(str(exc))
        return EXIT_FAILED
    except Exception as exc:
        if args.traceback:
            raise
        complain(f"unexpected error: {type(exc).__name__}: {exc} (--traceback shows where)")
        return EXIT_FAILED


def entry_point() -> NoReturn:
    """The console script and ``python -m redlock``."""
    sys.exit(main())
