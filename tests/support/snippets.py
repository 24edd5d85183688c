"""The documentation's code blocks, run as written (tests/test_snippets.py).

Every fenced block of a Markdown file is one of:

- a Python block (```` ```python ````): it runs. A file's Python blocks run in order in
  one namespace, as one session (a later block may use an earlier one's names), in a
  fresh interpreter with warnings as errors. A block may ``await`` at the top level (as
  in ``python -m asyncio``): it then runs in ``asyncio.run``. The namespace starts with
  the names a reader brings (:data:`GIVEN`), which the documents introduce where they
  first use them: ``urls``, the lock nodes' URLs, and ``data_url``, the Redis that holds
  the protected data;
- a Python block that cannot run as written (deliberately partial, needs a service the
  suite does not start): marked on the line right before its fence, with the reason,
  ``<!-- snippet: skip (why) -->``;
- any other block: a language other than Python on its fence (```` ```console ```` for
  shell sessions, ```` ```text ```` for output and trees, ```` ```json ````, ...). A fence
  without a language is refused, so no Python block escapes by forgetting its tag.

``python -m tests.support.snippets`` runs the blocks given as JSON on stdin (what
:func:`run_blocks` sends) and exits non-zero, naming the failing block's file and line,
when one raises.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PYTHON = frozenset({"python", "py", "python3"})
# The names every file's first block finds defined: what the reader brings.
GIVEN = ("urls", "data_url")

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^<!--\s*snippet:\s*(?P<what>\w+)\s*(?P<reason>.*?)\s*-->\s*$")


class SnippetError(ValueError):
    """A document's blocks break the rules above (not: a block that fails when run)."""


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    line: int  # of the first line of code (the fence's line + 1)
    language: str
    source: str
    skip: str | None  # the reason, when marked skip


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one Markdown file, with its marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        language = opening["info"].strip().split(" ")[0].lower()
        end = index + 1
        while end < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$",
                                                lines[end]):
            end += 1
        if end == len(lines):
            raise SnippetError(f"{name}:{index + 1}: the block opened here is never closed")
        where = f"{name}:{index + 1}"
        if not language:
            raise SnippetError(
                f"{where}: a fence without a language: say what the block is (```python runs"
                " it; ```console for shell sessions, ```text for output, ```json, ...)")
        marker = _marker(lines, index, where)
        if marker is not None and language not in PYTHON:
            raise SnippetError(f"{where}: a snippet marker before a ```{language} block: only"
                               " Python blocks run, the marker is not needed")
        body = "\n".join(line[indent:] if line[:indent].isspace() else line
                         for line in lines[index + 1:end])
        found.append(Block(name, index + 2, language, body, marker))
        index = end + 1
    return found


def _marker(lines: list[str], fence_index: int, where: str) -> str | None:
    """The skip reason from the line right before a fence, if marked."""
    if fence_index == 0:
        return None
    marker = _MARKER.match(lines[fence_index - 1].strip())
    if marker is None:
        if "snippet:" in lines[fence_index - 1]:
            raise SnippetError(f"{where}: unreadable snippet marker; write"
                               " <!-- snippet: skip (the reason) -->")
        return None
    if marker["what"] != "skip":
        raise SnippetError(f"{where}: unknown snippet marker {marker['what']!r}; the only"
                           " one is <!-- snippet: skip (the reason) -->")
    reason = marker["reason"].strip("() ")
    if not reason:
        raise SnippetError(f"{where}: a skip marker needs its reason:"
                           " <!-- snippet: skip (why it cannot run as written) -->")
    return reason


def runnable(found: list[Block]) -> list[Block]:
    return [b for b in found if b.language in PYTHON and b.skip is None]


def run_blocks(found: list[Block], given: dict[str, Any], timeout: float = 60.0
               ) -> subprocess.CompletedProcess[str]:
    """Run the blocks in a fresh interpreter (warnings are errors there); the result."""
    request = json.dumps({"given": given, "blocks": [asdict(b) for b in found]})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-W", "error", "-m", "tests.support.snippets"],
                          input=request, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env, check=False)


def _execute(block: Block, namespace: dict[str, Any]) -> None:
    # Padded so that a traceback names the Markdown file's own line numbers.
    source = "\n" * (block.line - 1) + block.source + "\n"
    code = compile(source, block.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                   dont_inherit=True)
    if code.co_flags & 0x80:  # CO_COROUTINE: the block awaits at the top level
        coroutine = eval(code, namespace)
        asyncio.run(coroutine)
    else:
        exec(code, namespace)


def main() -> int:
    request = json.load(sys.stdin)
    namespace: dict[str, Any] = {"__name__": "__snippets__", **request["given"]}
    for raw in request["blocks"]:
        block = Block(**raw)
        try:
            _execute(block, namespace)
        except BaseException:
            print(f"snippet at {block.path}:{block.line} failed:", file=sys.stderr)
            traceback.print_exc()
            return 1
        print(f"ok {block.path}:{block.line}", flush=True)
    _close(namespace)
    return 0


def _close(namespace: dict[str, Any]) -> None:
    """Close what the blocks left open (a reader's process would simply exit): the
    managers and redis-py clients, and the clients of fenced stores."""
    import redis

    from redlock import AsyncRedlock, Redlock

    for value in list(namespace.values()):
        client = getattr(value, "client", None)
        for item in (value, client):
            if isinstance(item, Redlock | redis.Redis):
                item.close()
            elif isinstance(item, AsyncRedlock):
                asyncio.run(item.close())


if __name__ == "__main__":
    warnings.simplefilter("error")
    sys.exit(main())
