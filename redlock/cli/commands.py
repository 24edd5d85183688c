"""The ``redlock`` command line (also ``python -m redlock``): look at locks and nodes,
and the operator's tools. docs/operations.md has the whole story.

    redlock status RESOURCE --nodes URL [URL ...]   every node's view of one lock
    redlock nodes --nodes URL [URL ...]             reachability, round trip, marker, role,
                                                    persistence, memory policy, warnings
    redlock release RESOURCE --force --nodes ...    delete the lock whoever holds it
    redlock repair --nodes ... [--force]            nodes that lost their data: report, re-seed
    redlock initialise --nodes ... [--force]        mark a new or partially initialised cluster
    redlock members --nodes ...                     the cluster's membership (epoch, members)
    redlock members --nodes ... --change URL ...    make URL ... the members, online (§13)
    redlock demo [--count 3 | --nodes URL ...]      workers contending on local redis-servers
                                                    (or on the nodes given)

``--nodes`` may come from ``$REDLOCK_NODES`` (URLs separated by spaces or commas). Tables for
people (drawn with ``rich`` when it is installed: ``pip install "redlock-fenced[cli]"``),
``--json`` for scripts. Problems with nodes (bad URL, connection refused, wrong password, timeout)
are one line each on stderr, never a traceback. This module parses, runs the commands and picks the
exit codes; what they print is rendered by :mod:`redlock.cli.render`."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from redlock import EventFormatter, __version__
from redlock._client.admin import node_addresses
from redlock._core.settings import DEFAULT_MAX_TTL, Keys
from redlock._io.endpoint import from_url
from redlock.admin import Admin, ReleaseStatus, RepairReport, RepairStatus
from redlock.cli.node_report import namespaces_on, read_nodes
from redlock.cli.render import (
    PROG,
    complain,
    lock_summary,
    report_unreachable,
    say,
    show_change,
    show_family,
    show_members,
    show_nodes,
    show_release,
    show_repair,
    show_status,
)
from redlock.client import Redlock
from redlock.errors import RedlockError

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


# -- nodes ---------------------------------------------------------------------------------


def _masked(url: str) -> str:
    """A URL without its password, for messages."""
    return re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", url)


def node_urls(args: argparse.Namespace) -> list[str]:
    urls = list(args.nodes or [])
    if not urls:
        urls = [u for u in re.split(r"[\s,]+", os.environ.get("REDLOCK_NODES", "")) if u]
    if not urls:
        raise CliError("no nodes given: pass --nodes URL [URL ...] or set REDLOCK_NODES",
                       EXIT_USAGE)
    for url in urls:
        try:
            from_url(url)
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


def cmd_status(args: argparse.Namespace) -> int:
    if args.kind != "lock":
        return _family_status(args)
    with open_manager(args) as dlm:
        status = Admin(dlm).inspect(args.resource)
    report_unreachable([(n.node, n.error) for n in status.nodes])
    namespaces: list[str] = []
    if status.reachable and not any(n.marker for n in status.nodes):
        # No key of this namespace at all: name the namespaces the nodes do hold.
        urls = [url for url, node in zip(node_urls(args), status.nodes, strict=True)
                if node.reachable]
        namespaces = [ns for ns in namespaces_on(urls, args.timeout) if ns != args.namespace]
    show_status(status, args.json, namespaces)
    return reachability_code(status.reachable, len(status.nodes))


def _family_status(args: argparse.Namespace) -> int:
    """``status --kind election|semaphore|rwlock``: who leads, who holds each permit,
    the writer and the readers (docs/design.md §12), as a quorum of nodes says."""
    with open_manager(args) as dlm:
        if args.kind == "election":
            show_family(args.resource, "election", dlm.election(args.resource).leader(), args.json)
        elif args.kind == "semaphore":
            show_family(args.resource, "semaphore",
                        dlm.semaphore(args.resource, permits=args.permits).status(), args.json)
        else:
            show_family(args.resource, "rwlock", dlm.rwlock(args.resource).status(), args.json)
    return EXIT_OK


def cmd_nodes(args: argparse.Namespace) -> int:
    with open_manager(args) as dlm:  # checks the URLs and names the nodes
        addresses = dlm.nodes
    reports = read_nodes(node_urls(args), addresses, Keys(args.namespace), args.timeout)
    report_unreachable([(r.node, r.error) for r in reports])
    show_nodes(reports, args.json)
    code = reachability_code(sum(1 for r in reports if r.reachable), len(reports))
    if code == EXIT_OK and any(r.warnings for r in reports):
        return EXIT_PARTIAL
    return code


def cmd_release(args: argparse.Namespace) -> int:
    with open_manager(args) as dlm:
        admin = Admin(dlm)
        status = admin.inspect(args.resource)
        if not args.json:
            say(lock_summary(status))
        confirm(args, f"force-release {args.resource!r}",
                f"Delete the lock on {args.resource!r} on all {len(dlm.nodes)} nodes, whoever"
                " holds it? Its holder is not told and may still be working.")
        reports = admin.force_release(args.resource)
    failed = [r.status is ReleaseStatus.FAILED for r in reports]
    report_unreachable([(r.node, r.detail if down else None)
                        for r, down in zip(reports, failed, strict=True)])
    show_release(args.resource, reports, args.json)
    return reachability_code(failed.count(False), len(reports))


def _repair_reports(args: argparse.Namespace, reports: Sequence[RepairReport]) -> int:
    show_repair(reports, args.json)
    statuses = {r.status for r in reports}
    if RepairStatus.FAILED in statuses:
        return EXIT_FAILED
    return EXIT_PARTIAL if RepairStatus.WAITING in statuses else EXIT_OK


# What forcing each admin step means, asked before it is done: (what, question).
_FORCED = {
    "repair": ("force a repair",
               "Re-seed and readmit every node without its marker now? Safe only once every"
               " lock held before those nodes lost their data has expired (the time"
               " 'waiting' shows)."),
    "initialise": ("force the initialisation",
                   "Write node markers on the nodes that lack one, although some nodes"
                   " already have one? Safe only once every lock held before the nodes"
                   " lost their data has expired (`redlock repair` shows when); tokens may"
                   " then restart below earlier ones, which fenced stores refuse."),
}


def _admin_step(args: argparse.Namespace, step: str) -> int:
    """``redlock repair`` / ``redlock initialise``: the admin's step of that name."""
    with open_manager(args) as dlm:
        if args.force:
            confirm(args, *_FORCED[step])
        admin = Admin(dlm)
        run = admin.repair if step == "repair" else admin.initialise
        reports = run(force=args.force)
    return _repair_reports(args, reports)


def cmd_repair(args: argparse.Namespace) -> int:
    return _admin_step(args, "repair")


def cmd_initialise(args: argparse.Namespace) -> int:
    return _admin_step(args, "initialise")


def _named(args: argparse.Namespace, dlm: Redlock, given: Sequence[str],
           option: str) -> tuple[str, ...]:
    """The nodes given to ``option`` (URLs as --nodes takes them, or addresses as
    `redlock members` shows them) as the manager's addresses, checked before asking."""
    try:
        return node_addresses(given, [from_url(url) for url in node_urls(args)], dlm.nodes,
                              option, mine="--nodes",
                              hint="give every node of the current and the new set to"
                                   " --nodes")
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def cmd_members(args: argparse.Namespace) -> int:
    """Show the membership; with --change, change it (docs/operations.md)."""
    with open_manager(args) as dlm:
        admin = Admin(dlm)
        if args.change is None:
            show_members(admin.members(), args.json)
            return EXIT_OK
        new = _named(args, dlm, args.change, "--change")
        current = (None if args.current is None else _named(args, dlm, args.current, "--current"))
        confirm(args, "change the members",
                f"Make {', '.join(new)} the cluster's members? Acquires need a majority of"
                f" the old and of the new set for about {args.wait:g} s; give clients the new"
                " list only once the change has written its joint record (docs/operations.md,"
                " \"Adding and removing nodes\").")
        try:
            change = admin.change_members(new, current=current, wait=args.wait)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    show_change(change, args.json)
    return EXIT_PARTIAL if change.unreached else EXIT_OK


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
    status.add_argument("--kind", choices=("lock", "election", "semaphore", "rwlock"),
                        default="lock",
                        help="what RESOURCE names: a lock (the default), an election (its"
                             " leader and term), a semaphore (the holder of each permit)"
                             " or a read-write lock (its writer and readers)")
    status.add_argument("--permits", type=int, default=1, metavar="K",
                        help="with --kind semaphore: its number of permits (default 1)")
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
                         "mark a new or partially initialised cluster (node markers)", confirmable)
    initialise.add_argument("--force", action="store_true",
                            help="also when some nodes have markers (asks; --yes)")
    members = command("members", cmd_members,
                      "the cluster's membership (epoch, members); with --change, add and"
                      " remove nodes online (asks; --yes)", confirmable)
    members.add_argument("--change", nargs="+", metavar="URL",
                         help="the new members (each one of --nodes, which must list every"
                              " node of the current and the new set)")
    members.add_argument("--current", nargs="+", metavar="URL",
                         help="the members now, for a cluster that never changed (default:"
                              " the nodes of --nodes that have their marker)")
    members.add_argument("--wait", type=_positive_seconds, default=DEFAULT_MAX_TTL,
                         metavar="SECONDS",
                         help="the largest max_ttl of any client: locks granted before the"
                              f" change live at most this long (default: {DEFAULT_MAX_TTL:g})")
    commands.add_parser("demo", help="workers contending for one lock on local redis-server"
                                     " nodes, or on --nodes URL ... (redlock demo --help)",
                        add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:
        from redlock import demo

        return demo.main(args_list[1:], prog=f"{PROG} demo")
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
