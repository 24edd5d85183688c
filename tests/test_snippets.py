"""Every Python block of README.md and docs/*.md runs as written, against real local
redis-server nodes (tests/support/snippets.py has the rules: one session per file, in
order, ``urls`` and ``data_url`` given, ``<!-- snippet: skip (why) -->`` for a block that
cannot run). A document whose block raises, or warns, fails here with the block's file
and line. The README's pytest-plugin block, which only defines a test, also runs as one."""

from __future__ import annotations

from pathlib import Path

import pytest

from redlock.testing import RedisNodes
from tests.support.snippets import ROOT, Block, SnippetError, blocks, run_blocks, runnable

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _given(locks: RedisNodes, data: RedisNodes) -> dict[str, object]:
    return {"urls": list(locks.urls), "data_url": data.urls[0]}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_documents_blocks_run_as_written(document: Path, nodes3: RedisNodes,
                                             nodes1: RedisNodes) -> None:
    found = blocks(document)  # SnippetError: a fence without a language, a bad marker
    to_run = runnable(found)
    if not to_run:
        pytest.skip(f"no Python block in {document.name}")
    result = run_blocks(to_run, _given(nodes3, nodes1))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == "", result.stderr  # nothing printed on stderr: no warning
    assert sum(line.startswith("ok ") for line in result.stdout.splitlines()) == len(to_run)


# -- the runner itself: a broken block fails, the rules are enforced --------------------


def _document(tmp_path: Path, text: str) -> list[Block]:
    path = tmp_path / "doc.md"
    path.write_text(text, encoding="utf-8")
    return blocks(path)


def test_a_block_that_raises_fails_with_its_file_and_line(tmp_path: Path) -> None:
    found = _document(tmp_path, "# Doc\n\n```python\nx = 1\n```\n\ntext\n\n```python\n"
                                "assert x == 1\nundefined_name\n```\n")
    result = run_blocks(runnable(found), {"urls": [], "data_url": ""})
    assert result.returncode == 1
    assert f"snippet at {found[1].path}:10 failed" in result.stderr
    assert "NameError: name 'undefined_name' is not defined" in result.stderr
    assert "line 11" in result.stderr  # the Markdown file's own line


def test_a_block_that_warns_fails(tmp_path: Path) -> None:
    found = _document(tmp_path, "```python\nimport warnings\nwarnings.warn('careful')\n```\n")
    result = run_blocks(runnable(found), {})
    assert result.returncode == 1 and "UserWarning: careful" in result.stderr


def test_top_level_await_runs_in_an_event_loop(tmp_path: Path) -> None:
    found = _document(tmp_path, "```python\nimport asyncio\nawait asyncio.sleep(0)\n"
                                "ran = True\n```\n\n```python\nassert ran\n```\n")
    result = run_blocks(runnable(found), {})
    assert result.returncode == 0, result.stderr


def test_marked_blocks_are_skipped_with_their_reason(tmp_path: Path) -> None:
    found = _document(tmp_path, "<!-- snippet: skip (a fragment) -->\n```python\n"
                                "raise SystemExit(3)\n```\n\n```console\n$ ls\n```\n")
    assert [(b.language, b.skip) for b in found] == [("python", "a fragment"),
                                                     ("console", None)]
    assert runnable(found) == []


@pytest.mark.parametrize(("text", "said"), [
    ("```\nprint(1)\n```\n", "a fence without a language"),
    ("<!-- snippet: skip -->\n```python\npass\n```\n", "needs its reason"),
    ("<!-- snippet: run later -->\n```python\npass\n```\n", "unknown snippet marker"),
    ("<!-- snippet: skip (x) -->\n```json\n{}\n```\n", "only Python blocks run"),
    ("```python\npass\n", "never closed"),
])
def test_rules_are_enforced(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(SnippetError, match=said):
        _document(tmp_path, text)


def test_the_readme_plugin_snippet_passes_as_a_users_test(pytester: pytest.Pytester) -> None:
    # The block above only defines the test function; here it runs, as in a user's suite.
    (block,) = [b for b in runnable(blocks(ROOT / "README.md"))
                if "@pytest.mark.redlock_cluster" in b.source]
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_readme=block.source)
    result = pytester.runpytest("-p", "no:cacheprovider", "--redlock-backend=local")
    result.assert_outcomes(passed=1)
