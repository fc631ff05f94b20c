"""Imports point down only, and no two modules import each other (docs/architecture.md, "Layers").

Every ``import`` and ``from ... import`` of the package is read with :mod:`ast`, at module level and
inside functions alike (``if TYPE_CHECKING:`` blocks included: a type is a dependency too).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest_qaccuracy

PACKAGE = "pytest_qaccuracy"
ROOT = Path(pytest_qaccuracy.__file__).parent

#: Layer of each top-level module or sub-package, bottom (0) to top. A module may import its own
#: layer and the layers below it; within a layer, packages must not import each other both ways.
LAYERS: dict[str, int] = {
    # files and records, graphs and pairs, metric formulas, errors, atomic file writing
    "errors": 0,
    "defaults": 0,
    "atomic": 0,
    "numbers": 0,
    "plain": 0,
    "task_names": 0,
    "tolerances": 0,
    "outcomes": 0,
    "presets": 0,
    "data": 0,
    "model": 0,
    "metrics": 0,
    # running a model: onnxruntime, the emulated integer backend
    "runtime": 1,
    "backend": 1,
    "ort_session": 1,
    # analyses over runs; assertions are checks over arrays built on the metrics
    "analysis": 2,
    "assertions": 2,
    # tables, files, the HTML report
    "report": 3,
    # entry points: the pytest plugin, the command line and its sub-commands, the lazy public API
    "plugin": 4,
    "commands": 4,
    "cli": 4,
    "": 4,
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name (without the package prefix) -> (file, is a package)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        found[".".join(parts)] = (path, package)
    return found


MODULES = _modules()


def _qualified(name: str) -> str | None:
    """``pytest_qaccuracy.x.y`` -> ``x.y`` (the package itself -> ``""``); None outside the package."""
    if name == PACKAGE:
        return ""
    return name[len(PACKAGE) + 1 :] if name.startswith(PACKAGE + ".") else None


def _imports(module: str) -> Iterator[tuple[str, int, str]]:
    """(imported module, line, source text) for each import of ``module`` inside the package."""
    path, package = MODULES[module]
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = [PACKAGE, *module.split(".")] if module else [PACKAGE]
                base = here if package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            # ``from a import b`` imports the module ``a.b`` when there is one, else a name of ``a``
            targets = [
                f"{origin}.{a.name}" if _qualified(f"{origin}.{a.name}") in MODULES else origin for a in node.names
            ]
        else:
            continue
        text = ast.get_source_segment(source, node) or ""
        for target in targets:
            name = _qualified(target)
            if name is not None and name != module:
                yield name, node.lineno, " ".join(text.split())


def _top(module: str) -> str:
    return module.split(".")[0]


EDGES = [(m, target, line, text) for m in MODULES for target, line, text in _imports(m)]


def test_every_module_has_a_layer() -> None:
    assert {_top(m) for m in MODULES} <= set(LAYERS), "add the new top-level module to LAYERS"


def test_imports_point_down() -> None:
    upward = [
        f"{PACKAGE}/{MODULES[m][0].relative_to(ROOT)}:{line}: `{text}` imports {target} "
        f"(layer {LAYERS[_top(target)]} over {_top(m)}'s {LAYERS[_top(m)]})"
        for m, target, line, text in EDGES
        if LAYERS[_top(target)] > LAYERS[_top(m)]
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(set(upward)))


def test_no_cycle_between_packages() -> None:
    where: dict[tuple[str, str], str] = {}
    for m, target, line, text in EDGES:
        if _top(m) != _top(target):
            where.setdefault((_top(m), _top(target)), f"{m}:{line} `{text}`")
    both = sorted(f"{a} <-> {b}: {where[a, b]} and {where[b, a]}" for a, b in where if (b, a) in where and a < b)
    assert not both, "packages that import each other:\n" + "\n".join(both)


def _cycles(edges: list[tuple[str, str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for m, target in edges:
        graph[m].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted({m for edge in edges for m in edge}):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_cycles_are_found() -> None:
    """The detector on a made-up graph: a 3-cycle and a 2-cycle, joined by a one-way edge."""
    edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("e", "f")]
    assert sorted(_cycles(edges), key=sorted) == [frozenset("abc"), frozenset("de")]
    assert _cycles([("a", "b"), ("b", "c"), ("a", "c")]) == []


def test_no_module_cycle() -> None:
    cycles = _cycles([(m, target) for m, target, _, _ in EDGES])
    lines = [f"{m}:{line} `{text}`" for c in cycles for m, target, line, text in EDGES if m in c and target in c]
    assert not cycles, "modules that import each other:\n" + "\n".join(sorted(set(lines)))
