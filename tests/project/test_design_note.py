"""The core's design note (``jmodule/_lowering/README.md``) names what exists.

Every name the note writes in backticks is resolved against the code: a
``module.name`` or ``Class.attribute`` must be found there, a bare name must
be defined somewhere in ``jmodule``, a record written ``Name(a, b, ...)`` must
have exactly those fields (a call ``fn(a, b=...)`` those parameters), every
path must exist, and the note's file table must list every file of
``_lowering``. So renaming or removing something the note explains fails here
until the note says what is true.
"""

import ast
import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path

import jax
import pytest

import jmodule

PACKAGE = Path(jmodule.__file__).parent
ROOT = PACKAGE.parent
NOTE = PACKAGE / "_lowering" / "README.md"

#: Names the note uses in examples of user code (and Python's words), not names of the
#: code base.
EXAMPLES = {
    "Net", "model", "self", "w", "x", "mylib", "SCALE", "f", "CONFIG", "cfg", "loss", "fn",
    "opt", "p", "is", "if", "print", "float", "BatchNorm",
}  # fmt: skip

#: Short names the note uses for modules outside ``_lowering``.
MODULES = {
    "jm": "jmodule",
    "jmodule": "jmodule",
    "threading": "threading",
    "jax": "jax",
    "lax": "jax.lax",
    "jnp": "jax.numpy",
    "_tensor": "jmodule._tensor",
    "autograd": "jmodule.autograd",
    "parameter": "jmodule.nn.parameter",
    "optimizer": "jmodule.optim.optimizer",
    "_fusion": "jmodule.nn.modules._fusion",
    "_compilation_cache": "jmodule._compilation_cache",
    "_pooling": "jmodule.nn.functional._pooling",
    "_conv_lowering": "jmodule.nn.functional._conv_lowering",
}

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"^~?{_IDENT}(\.{_IDENT})*(\(\))?$")
_CALL = re.compile(rf"^({_IDENT}(?:\.{_IDENT})*)\((.+)\)$")
_PATH = re.compile(r"^[\w./-]+\.(py|md|json)$")


def _spans() -> list[str]:
    text = NOTE.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def _defined() -> set[str]:
    """Every name ``jmodule``'s source defines or sets: functions, classes, assigned names
    and attributes, parameters, and identifier-like string keys (``__dict__["_value"]``)."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(_IDENT, node.value):
                    names.add(node.value)
    return names


DEFINED = _defined()


def _lowering_module(name: str):
    if (PACKAGE / "_lowering" / f"{name}.py").exists():
        return importlib.import_module(f"jmodule._lowering.{name}")
    return None


def _source_names(obj) -> set[str]:
    """Names assigned in ``obj``'s source (instance attributes ``self.x = ...``, fields)."""
    try:
        tree = ast.parse(inspect.getsource(obj).strip() if inspect.isclass(obj) else "")
    except (OSError, TypeError, SyntaxError):
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def _resolve(dotted: str):
    """The object ``dotted`` names, or raise LookupError saying which part is missing."""
    first, *rest = dotted.split(".")
    if first in MODULES:
        obj = importlib.import_module(MODULES[first])
    elif _lowering_module(first) is not None:
        obj = _lowering_module(first)
    else:
        owners = [
            m
            for m in map(_lowering_module, [p.stem for p in (PACKAGE / "_lowering").glob("*.py")])
            if m is not None and hasattr(m, first)
        ]
        if owners:
            obj = getattr(owners[0], first)
        elif hasattr(jmodule.nn, first) or hasattr(jmodule.optim, first):
            obj = getattr(jmodule.nn, first, None) or getattr(jmodule.optim, first)
        elif hasattr(jmodule.nn.Module, first):
            obj = getattr(jmodule.nn.Module, first)
        elif hasattr(jax, first):
            obj = getattr(jax, first)
        elif first in DEFINED:
            if rest:
                raise LookupError(f"{dotted}: '{first}' is not an object the note can look into")
            return None
        else:
            raise LookupError(f"{dotted}: '{first}' is defined nowhere in jmodule")
    for part in rest:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif inspect.isclass(obj) and part in _source_names(obj):
            return None  # an instance attribute, set in the class's code
        elif hasattr(obj, "__path__") and importlib.util.find_spec(f"{obj.__name__}.{part}"):
            obj = importlib.import_module(f"{obj.__name__}.{part}")
        else:
            raise LookupError(f"{dotted}: '{part}' not found on {obj!r}")
    return obj


def _fields(obj) -> tuple[str, ...] | None:
    if hasattr(obj, "_fields"):
        return tuple(obj._fields)
    if dataclasses.is_dataclass(obj):
        return tuple(f.name for f in dataclasses.fields(obj))
    return None


def _check_call(name: str, inside: str) -> None:
    """A record written with its fields must list exactly its fields; a call's keyword
    arguments must be parameters (positional ones are the note's example values)."""
    obj = _resolve(name)
    args = [a.strip() for a in inside.split(",")]
    fields = _fields(obj)
    if fields is not None and all(re.fullmatch(_IDENT, a) for a in args):
        assert tuple(args) == fields, f"the note writes {name}({inside}); its fields: {fields}"
        return
    keywords = [a.split("=")[0].strip() for a in args if "=" in a]
    if keywords and callable(obj):
        params = inspect.signature(obj).parameters
        missing = [k for k in keywords if k not in params]
        assert not missing, f"the note writes {name}({inside}); its parameters: {list(params)}"


def test_every_name_the_note_cites_exists():
    problems = []
    for span in _spans():
        span = span.strip()
        try:
            if _PATH.match(span):
                bases = (ROOT, PACKAGE, PACKAGE / "_lowering")
                found = any((base / span).exists() for base in bases)
                if not found and "/" not in span:  # a file named alone: anywhere in the package
                    found = any(PACKAGE.rglob(span))
                if not found:
                    problems.append(f"path {span} does not exist")
                continue
            call = _CALL.match(span)
            if call and call.group(1).split(".")[0] not in EXAMPLES:
                _check_call(call.group(1), call.group(2))
                continue
            if _DOTTED.match(span):
                name = span.lstrip("~").removesuffix("()")
                if name.split(".")[0] not in EXAMPLES:
                    _resolve(name)
        except (LookupError, AssertionError) as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


def test_the_file_table_lists_every_file_of_lowering():
    text = NOTE.read_text()
    table = set(re.findall(r"^\| `(\w+\.py)` \|", text, flags=re.M))
    files = {p.name for p in (PACKAGE / "_lowering").glob("*.py") if p.name != "__init__.py"}
    assert table == files


@pytest.mark.parametrize(
    "span, problem",
    [
        ("`FastPath(jitted, donated, kept, nones)`", "fields"),
        ("`state.no_such_function`", "not found"),
        ("`program._no_such_record`", "not found"),
        ("`tree_slots(root, with_rng=True)`", "parameters"),
        ("`nn/modules/_no_such_file.py`", "does not exist"),
    ],
)
def test_the_check_catches_a_note_that_drifted(monkeypatch, tmp_path, span, problem):
    note = tmp_path / "README.md"
    note.write_text(NOTE.read_text() + f"\n\nDrift: {span}.\n")
    monkeypatch.setattr(sys.modules[__name__], "NOTE", note)
    with pytest.raises(AssertionError, match=problem):
        test_every_name_the_note_cites_exists()


def test_nothing_cites_the_team_documents_outside_the_repository():
    """API.md, DESIGN.md and STYLE.md are the team's, not the repository's: code, tests,
    notes and benchmarks say what they mean instead of pointing a reader at a file that a
    clone does not have (the CHANGELOG, a history, may name what was true then)."""
    files = [ROOT / "README.md"] + [
        f
        for folder in ("jmodule", "tests", "benchmarks", "examples", "notebooks")
        for f in sorted((ROOT / folder).rglob("*"))
        if f.suffix in (".py", ".md", ".ipynb", ".toml") and f != Path(__file__).resolve()
    ]
    assert len(files) > 100, files
    cited = [
        str(f.relative_to(ROOT))
        for f in files
        if re.search(r"\b(API|DESIGN|STYLE)\.md\b", f.read_text(errors="replace"))
    ]
    assert cited == []
