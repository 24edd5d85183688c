"""The shape of the package, kept by tests (docs/design.md §10): the layer contracts of
pyproject.toml hold, no module imports itself back through others (type-only imports
count: they are what a reader follows too), and the top level stays a handful of
modules. Modules are split by concept, not by a line count (docs/design.md §10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("redlock", "fencing")
MAX_TOP_LEVEL_MODULES = 12


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module
    (Tarjan, iterative: a recursion per module would be deep on a long chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, sorted(graph.find_modules_directly_imported_by(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            if targets:
                target = targets.pop()
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target,
                                 sorted(graph.find_modules_directly_imported_by(target))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.d", imported="a.b")
    assert import_cycles(graph) == [["a.b", "a.c"]]


def test_no_import_cycles() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    assert import_cycles(graph) == []


def test_layer_contracts_hold() -> None:
    """import-linter's contracts of pyproject.toml: the layers, a core free of I/O, the
    fenced stores and the lock client independent of each other."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    # This checkout's packages, whichever one the environment installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_are_found(package: str) -> None:
    assert list((ROOT / package).rglob("*.py")), f"no modules under {package}/"


def test_the_top_level_is_a_handful_of_modules() -> None:
    top_level = sorted(path.name for path in (ROOT / "redlock").glob("*.py"))
    assert "__init__.py" in top_level
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level
