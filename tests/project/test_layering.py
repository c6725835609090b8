"""Layering of the package: no import cycles between jmodule's modules, no builtin rebound.

Every import statement counts, those inside functions and under ``if
TYPE_CHECKING:`` included: a function-level import hides a cycle from Python
at import time, not from a reader or a refactoring. Importing ``a.b.c`` also
runs ``a/__init__.py`` and ``a/b/__init__.py``, so a module outside
``jmodule.nn`` that imports ``jmodule.nn.parameter`` depends on everything
``jmodule/nn/__init__.py`` imports; the graph has those edges too.
"""

from __future__ import annotations

import ast
import builtins
import itertools
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import pytest
from _paths import PACKAGE

import jmodule as jm

# Cycles that the rebuild of the core (issue 13) removes in parallel, in files this
# layering work leaves to it. Each entry is one import, (importer, imported module),
# that closes a cycle; the graph is checked without them. Delete an entry when its
# import goes: test_allow_lists_hold_only_what_is_still_needed fails on one that
# no longer closes a cycle.
# Imports allowed to close a cycle (none: every layer imports only those below it).
ALLOWED_IMPORTS: set[tuple[str, str]] = set()

# Module-level names that rebind a Python builtin (none). Public names that are
# builtins are served by a module ``__getattr__`` instead (``jm.bool``,
# ``jm.compile``, ``jm.jit.ops.set``).
ALLOWED_SHADOWING: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    """One import statement's dependency on one module of the package."""

    importer: str
    target: str  # the module the statement names
    line: int
    in_function: bool

    def where(self) -> str:
        path = MODULES[self.importer].relative_to(PACKAGE.parent)
        return f"{path}:{self.line}" + (", in a function" if self.in_function else "")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _packages_of(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _existing(name: str) -> str:
    """The module that ``name`` (a module, or an attribute of one) lives in."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(name: str) -> list[Import]:
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, *([child.module] if child.module else [])])
                targets = [f"{base}.{a.name}" for a in child.names]
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "import_module"
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                targets = [child.args[0].value]
            for target in targets:
                if target.split(".")[0] == "jmodule":
                    found.append(Import(name, _existing(target), child.lineno, in_function))
            visit(
                child,
                in_function
                or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
            )

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


IMPORTS = [imp for name in MODULES for imp in _imports(name)]


def _graph(allowed: set[tuple[str, str]]) -> dict[str, dict[str, list[Import]]]:
    """module -> {module its imports run -> the imports that run it}, without ``allowed``."""
    graph: dict[str, dict[str, list[Import]]] = {name: {} for name in MODULES}
    for imp in IMPORTS:
        if (imp.importer, imp.target) in allowed:
            continue
        # The target and the packages above it that are not the importer's own
        # (those are already running when the importer runs).
        for runs in {imp.target} | (_packages_of(imp.target) - _packages_of(imp.importer)):
            if runs != imp.importer:
                graph[imp.importer].setdefault(runs, []).append(imp)
    return graph


def _components(graph: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(graph[succ])))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def _path(
    graph: dict[str, dict[str, list[Import]]],
    start: str,
    goals: set[str],
    within: set[str] | None = None,
) -> list[str]:
    """A shortest path ``[start, ..., goal]`` of one edge or more (``[]`` if none).

    ``goals`` may hold ``start`` itself (then the path is a cycle); ``within``
    limits the modules the path may pass through.
    """
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for succ in graph[node]:
            if within is not None and succ not in within:
                continue
            if succ in goals:
                path = [succ, node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return path[::-1]
            if succ not in previous and succ != start:
                previous[succ] = node
                queue.append(succ)
    return []


def _show(graph: dict[str, dict[str, list[Import]]], path: list[str]) -> str:
    lines = [f"    {path[0]}"]
    for a, b in itertools.pairwise(path):
        imp = graph[a][b][0]
        via = "" if imp.target == b else f" (importing {imp.target} runs {b})"
        lines.append(f"      -> {b}{via}   [{imp.where()}]")
    return "\n".join(lines)


def _cycle_problems(allowed: set[tuple[str, str]]) -> list[str]:
    graph = _graph(allowed)
    problems = []
    for component in _components(graph):
        cycle = _path(graph, component[0], {component[0]}, set(component))
        problems.append(
            f"import cycle among {len(component)} modules ({', '.join(component)}); one cycle:\n"
            + _show(graph, cycle)
        )
    return problems


def _lowering_problems(allowed: set[tuple[str, str]]) -> list[str]:
    graph = _graph(allowed)
    nn = {name for name in MODULES if name == "jmodule.nn" or name.startswith("jmodule.nn.")}
    problems = []
    for name in MODULES:
        if name.startswith("jmodule._lowering"):
            path = _path(graph, name, nn)
            if path:
                problems.append(f"{name} reaches jmodule.nn:\n" + _show(graph, path))
    return problems


def _shadowing() -> list[tuple[str, str, int]]:
    """``(module, builtin name, line)`` for each module-level binding of a builtin's name."""
    names = {n for n in dir(builtins) if not n.startswith("__")}
    found = []
    for module, path in MODULES.items():
        body = list(ast.parse(path.read_text(), str(path)).body)
        while body:
            node = body.pop()
            targets: list[ast.AST] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound = [node.name]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound = [(a.asname or a.name).split(".")[0] for a in node.names]
            else:
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)):
                    targets = [node.target]
                elif isinstance(node, ast.With):
                    targets = [i.optional_vars for i in node.items if i.optional_vars]
                bound = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            # Statements whose bodies run at module level bind there too.
            for field in ("body", "orelse", "finalbody", "handlers"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    body.extend(getattr(node, field, []))
            found += [(module, n, node.lineno) for n in bound if n in names]
    return sorted(found)


def test_no_import_cycles_between_modules():
    problems = _cycle_problems(ALLOWED_IMPORTS)
    assert not problems, "\n\n".join(problems)


def test_lowering_imports_nothing_from_nn():
    problems = _lowering_problems(ALLOWED_IMPORTS)
    assert not problems, "\n\n".join(problems)


@pytest.mark.slow
def test_allow_lists_hold_only_what_is_still_needed():
    imports = {(imp.importer, imp.target) for imp in IMPORTS}
    for entry in sorted(ALLOWED_IMPORTS):
        assert entry in imports, f"{entry[0]} no longer imports {entry[1]}: delete {entry}"
        rest = ALLOWED_IMPORTS - {entry}
        assert _cycle_problems(rest) or _lowering_problems(rest), (
            f"the import {entry} closes no cycle any more: delete it from ALLOWED_IMPORTS"
        )
    shadowing = {(module, name) for module, name, _ in _shadowing()}
    for entry in sorted(ALLOWED_SHADOWING):
        assert entry in shadowing, f"{entry} binds no builtin any more: delete it"


def test_the_graph_sees_function_level_and_package_imports():
    """The checks above are only as good as the graph: it must see what hides cycles."""
    graph = _graph(set())
    assert "jmodule._display" in graph["jmodule.nn.modules.module"]  # inside a method
    assert graph["jmodule.nn.modules.module"]["jmodule._display"][0].in_function
    # optim/optimizer.py imports jmodule.nn.parameter, which runs jmodule/nn/__init__.py.
    assert "jmodule.nn" in graph["jmodule.optim.optimizer"]
    # ... but a module inside jmodule.nn does not re-run its own package.
    assert "jmodule.nn" not in graph["jmodule.nn.modules.linear"]
    assert _components({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {}}) == [
        ["a", "b", "c"]
    ]


@pytest.mark.slow
def test_no_module_level_name_shadows_a_builtin():
    found = [
        f"{MODULES[m].relative_to(PACKAGE.parent)}:{line}: {name}"
        for m, name, line in _shadowing()
        if (m, name) not in ALLOWED_SHADOWING
    ]
    assert not found, "module-level names that rebind a builtin:\n" + "\n".join(found)


def test_builtin_named_public_names_still_reach_users():
    from jmodule import bool as jm_bool
    from jmodule import compile as jm_compile
    from jmodule.jit import ops

    assert jm.bool is jm_bool is jnp.bool_
    assert jm.compile is jm_compile and callable(jm_compile)
    assert {"bool", "compile"} <= set(dir(jm))
    assert ops.set is ops.set_state
    assert not ops.is_dtype_name("set")
