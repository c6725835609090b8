"""PyTorch for the tests that compare with it, and the rule that says which tests those are.

The whole suite runs where PyTorch is installed (Python 3.11 here). A second environment
(Python 3.12 with the newest JAX, ``make test-312``) has no PyTorch and runs every test that
does not need it. A test needs PyTorch when it carries the ``torch`` marker: on the test, on
its class, or on its module (``pytestmark = pytest.mark.torch``).

Test modules that mix both kinds import ``torch`` from here: where PyTorch is missing it is a
stand-in whose attributes can be named at import time (``TF = torch.nn.functional``, a base
class, a default argument) but which raises as soon as a test uses it, saying to mark it.
Modules where every test needs PyTorch carry the module marker and are not imported at all
without it (``conftest.pytest_ignore_collect``).

``unmarked`` is the rule kept by ``test_torch_marker.py``: a test whose code reaches PyTorch
(directly, or through a module-level helper, fixture or parameter list that does) carries the
marker.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

# JMODULE_TEST_WITHOUT_TORCH=1 runs the suite as the environment without PyTorch does, even
# where PyTorch is installed (a quick check that the markers are right).
INSTALLED = importlib.util.find_spec("torch") is not None and os.environ.get(
    "JMODULE_TEST_WITHOUT_TORCH", ""
) in ("", "0")

# Modules whose import needs PyTorch, and so does any test that uses what they define
# (``from _torch import torch`` counts too; the rest of this module does not).
TORCH_MODULES = frozenset({"torch", "torchvision", "torch_ref", "layer_harness", "amp_cases"})


class _Missing:
    """Stands for ``torch`` (or ``torch.<path>``) where PyTorch is not installed."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._path}.{name}")

    def __mro_entries__(self, bases: tuple) -> tuple[type, ...]:
        return (_MissingBase,)

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise _missing(self._path)

    def __iter__(self):
        raise _missing(self._path)

    def __repr__(self) -> str:
        return f"<{self._path}: PyTorch is not installed>"


class _MissingBase:
    """The base of a class defined on ``torch.nn.Module`` where PyTorch is missing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise _missing(type(self).__name__)


def _missing(path: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"{path} needs PyTorch, which is not installed here: mark the test that uses it "
        "@pytest.mark.torch (tests/_torch.py says how the marker works)",
        name="torch",
    )


#: Third-party modules that import PyTorch themselves, given to tests as ``torch`` is
#: (``from _torch import safetensors_torch``): the module, or a stand-in without PyTorch.
ADAPTERS = {"einops_torch": "einops.layers.torch", "safetensors_torch": "safetensors.torch"}
#: The names of this module that reach PyTorch.
STANDINS = frozenset({"torch", *ADAPTERS})

if INSTALLED:
    import einops.layers.torch as einops_torch
    import safetensors.torch as safetensors_torch
    import torch
    import torch.nn.utils.rnn
    import torch.optim.swa_utils
    import torch.utils.checkpoint
else:
    torch = _Missing("torch")
    einops_torch = _Missing(ADAPTERS["einops_torch"])
    safetensors_torch = _Missing(ADAPTERS["safetensors_torch"])


def _is_torch_mark(node: ast.AST) -> bool:
    """``pytest.mark.torch``, or a list or tuple holding it."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_torch_mark(e) for e in node.elts)
    return ast.unparse(node) == "pytest.mark.torch"


def module_marked(tree: ast.Module) -> bool:
    """Whether the module says ``pytestmark = pytest.mark.torch`` (or a list holding it)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return _is_torch_mark(node.value)
    return False


def module_marked_file(path: Path) -> bool:
    """``module_marked`` of a file, read without importing it."""
    return module_marked(ast.parse(path.read_text(), str(path)))


def _names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


def _imports_torch(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Import) and any(
            a.name.split(".")[0] in TORCH_MODULES for a in n.names
        ):
            return True
        if isinstance(n, ast.ImportFrom) and _from_torch(n):
            return True
    return False


def _from_torch(node: ast.ImportFrom) -> bool:
    if node.module == "_torch":
        return any(a.name in STANDINS for a in node.names)
    return (node.module or "").split(".")[0] in TORCH_MODULES


def _torch_names(tree: ast.Module) -> set[str]:
    """Module-level names whose value reaches PyTorch."""
    names = set()
    defs: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in TORCH_MODULES:
                    names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if _from_torch(node):
                names.update(
                    a.asname or a.name
                    for a in node.names
                    if node.module != "_torch" or a.name in STANDINS
                )
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        defs[n.id] = node
    grew = True
    while grew:
        grew = False
        for name, node in defs.items():
            if name not in names and (_names(node) & names or _imports_torch(node)):
                names.add(name)
                grew = True
    return names


def unmarked(path: Path) -> list[str]:
    """The tests in ``path`` that reach PyTorch but carry no ``torch`` marker."""
    tree = ast.parse(path.read_text(), str(path))
    if module_marked(tree):
        return []
    torch_names = _torch_names(tree)

    def needs(fn: ast.AST) -> bool:
        return bool(_names(fn) & torch_names) or _imports_torch(fn)

    def marked(node: ast.AST) -> bool:
        return any(_is_torch_mark(d) for d in getattr(node, "decorator_list", ()))

    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if needs(node) and not marked(node):
                out.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test") and not marked(node):
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and m.name.startswith("test"):
                    if needs(m) and not marked(m):
                        out.append(f"{node.name}.{m.name}")
    return out
