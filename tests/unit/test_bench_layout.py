"""The benchmarks' package as its layout promises (docs/layout.md): read from the sources' imports
(every one, inside functions too), the runtime package imports nothing from it, no benchmark
imports another, nothing under shared/ imports a benchmark, no import circle; and no module of
the runtime package, the benchmarks included, over 300 lines or function over 50."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import ROOT
from hvdtrain.bench import registry

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

BENCH = ROOT / "hvdtrain" / "bench"
RUNTIME = ROOT / "hvdtrain"


def module_name(path: Path, root: Path, package: str) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join([package, *parts[:-1]] if parts[-1] == "__init__" else [package, *parts])


def modules(root: Path, package: str) -> dict[str, Path]:
    return {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}


def imported(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere in it (``from P import M``
    counts as P.M where that is a module, as P where M is a name in P)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known}
    return found


def graph(root: Path, package: str) -> dict[str, set[str]]:
    found = modules(root, package)
    return {name: imported(path, set(found)) - {name} for name, path in found.items()}


def circle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle of ``edges`` (module: the modules it imports), or []."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []
    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_the_circle_check_finds_a_circle():
    # Control: the check is sharp on a made-up graph with a circle three modules long.
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_benchmarks_import_graph_has_no_circle_and_no_arrow_up(tmp_path):
    edges = graph(BENCH, "hvdtrain.bench")
    assert len(edges) > 20 and circle(edges) == [], circle(edges)
    benchmarks = {f"hvdtrain.bench.{m}" for m in registry.MODULES}
    assert benchmarks <= set(edges)
    for bench in benchmarks:   # every benchmark is a leaf
        assert not edges[bench] & benchmarks, (bench, edges[bench] & benchmarks)
    shared = {m for m in edges if m.startswith("hvdtrain.bench.shared")}
    for module in shared:      # shared/ is below the benchmarks and the registry
        assert not edges[module] & (benchmarks | {"hvdtrain.bench.registry"}), module
    # Controls: the scan sees `from P import M` as P.M, and imports inside functions (as
    # scaling once imported tax, to dodge the circle scaling -> tax -> scaling).
    assert "hvdtrain.bench.shared.plain_job" in edges["hvdtrain.bench.scaling"]
    inside = tmp_path / "inside.py"
    inside.write_text("def main():\n    from hvdtrain.bench import tax\n")
    assert imported(inside, set(edges)) == {"hvdtrain.bench.tax"}


def test_the_runtime_package_imports_nothing_from_the_benchmarks():
    bench = set(modules(BENCH, "hvdtrain.bench"))
    for name, path in modules(RUNTIME, "hvdtrain").items():
        assert name in bench or not imported(path, bench), name
    # The one way in: `hvdtrain bench` loads the package by name when it runs.
    assert 'f"hvdtrain.bench.{name}"' in (RUNTIME / "commands" / "bench.py").read_text()


def too_long(source: str) -> list[str]:
    """What breaks the size rule in a module's ``source``: over 300 lines, or a function over
    50."""
    found = [f"{len(source.splitlines())} lines"] if len(source.splitlines()) > 300 else []
    return found + [f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
                    for node in ast.walk(ast.parse(source))
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.end_lineno - node.lineno >= 50]


def test_no_module_over_300_lines_or_function_over_50():
    # The runtime package, its benchmarks included.
    assert {str(p): too_long(p.read_text()) for p in sorted(RUNTIME.rglob("*.py"))
            if too_long(p.read_text())} == {}
    # Control: a function of 51 lines and a module of 301 are caught, 50 and 300 are not.
    body = "def f():\n" + "    x = 1\n" * 50
    assert too_long(body) == ["f: 51 lines"] and too_long(body[:-10]) == []
    assert too_long("x = 1\n" * 301) == ["301 lines"] and too_long("x = 1\n" * 300) == []
