"""Code guards: what a compiled program read from Python that no version tracks.

A trace bakes into the XLA program the code it ran (``forward``, hooks,
helper functions) and the plain Python values it read from module globals
(``SCALE = 2.0``). None of them is state: changing them bumps no version.
Notebook users change them all day (re-run a cell that redefines a helper,
assign ``Net.forward = ...``, set ``SCALE = 3.0``), so each trace records
:class:`Guards`, and every call checks them before it runs the program: a
change drops the program and traces again, with the reason logged and in
``jm.compile_stats``. This is what ``torch.compile``'s guards do, found
statically here rather than by bytecode interpretation.

What a trace records (:func:`collect`), starting from the functions it runs:
the ``jm.compile``'d function and, for every module of the tree whose class
is user code, ``forward`` and the user-code methods its code names, and the
module's hook functions. For each such function (recursively through the
user-code functions it names):

* its code object (``fn.__code__``: what ``%autoreload`` replaces in place);
* every global name its code (nested lambdas and comprehensions included)
  loads: plain values (numbers, strings, None, tuples of them) compared by
  value, other objects (functions, classes, arrays, modules instances) by
  identity. Imported Python modules (``jnp``, ``F``) are not guarded;
* the contents of its closure cells, the same way;
* ``forward`` (and the methods its code names) looked up on the module's
  user classes and on the instance, so ``Net.forward = f`` and
  ``model.forward = f`` are seen.

Not seen (documented in the README's "Coming from PyTorch" section, "Compiled
programs follow the Python they ran"): values inside mutable
containers and objects (``CONFIG["scale"] = 3``, ``cfg.scale = 3``,
``arr[0] = 1`` on a NumPy global), attributes of imported modules
(``mylib.SCALE``), and code outside user files (the standard library and
site-packages, jmodule itself), which is taken not to change while a
process runs.

The check is a few dictionary lookups per call (one per guarded name), with
no process-wide state: guards belong to the program's structure key.
"""

from __future__ import annotations

import dis
import os
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

__all__ = ["Guards", "collect", "hook_functions", "is_user_code"]

_MISSING = object()


# Where code that does not change during a run lives: the standard library,
# site-packages, and jmodule itself. Everything else (scripts, notebooks,
# a project's own source tree) is user code, and guarded.
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    dirs.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # jmodule
    roots = set()
    for d in filter(None, dirs):  # both spellings: code objects keep the path they were loaded by
        roots |= {os.path.join(os.path.abspath(d), ""), os.path.join(os.path.realpath(d), "")}
    return tuple(sorted(roots))


_LIBRARY_ROOTS = _library_roots()
_PLAIN = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis))


def is_user_code(code: types.CodeType) -> bool:
    """Whether ``code`` comes from a user's file (not the standard library,
    site-packages or jmodule).
    """
    name = code.co_filename
    if name.startswith("<frozen"):
        return False
    return not name.startswith(_LIBRARY_ROOTS)


def _is_plain(v: Any) -> bool:
    if type(v) in _PLAIN:
        return True
    if type(v) in (tuple, frozenset):
        return all(_is_plain(x) for x in v)
    return False


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _names(code: types.CodeType) -> tuple[set[str], set[str]]:
    """``(globals, attributes)`` the code (and the code nested in it) loads."""
    loaded: set[str] = set()
    attrs: set[str] = set()
    for c in _codes(code):
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                name = ins.argval
                if isinstance(name, str):
                    loaded.add(name.removeprefix("NULL + ").removesuffix(" + NULL"))
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                if isinstance(ins.argval, str):
                    attrs.add(ins.argval)
    return loaded, attrs


def _function(obj: Any) -> types.FunctionType | None:
    """The plain function behind ``obj`` (a function, method, static/class method, property)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    elif isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, types.MethodType):
        obj = obj.__func__
    return obj if isinstance(obj, types.FunctionType) else None


def _describe(v: Any) -> str:
    if _is_plain(v):
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."
    if v is _MISSING:
        return "<unset>"
    return f"<{type(v).__name__}>"


class Guard(NamedTuple):
    """One value a trace read from Python, and how to read it again.

    ``kind`` is "item" (a namespace's ``obj[name]``), "attr" (``getattr(obj, name)``:
    class attributes, ``__code__``, closure cells), or "same" / "same_attr" (the same,
    but it must be that very object: arrays, whose ``==`` is elementwise). Items and
    attributes must compare equal to ``expected`` (identity first, so an unchanged
    object costs no comparison). ``what`` names it for the recompile reason.
    """

    kind: str
    obj: Any
    name: str
    expected: Any
    what: str


class Guards:
    """What one trace read from Python (:class:`Guard` s): checked by every call
    (:meth:`changed`)."""

    __slots__ = ("guards", "ok", "reason")

    def __init__(self, guards: Sequence[Guard]):
        self.guards = tuple(guards)
        #: True while nothing changed (may raise if a name was deleted): one
        #: generated expression, so a call pays no loop over the guards.
        self.ok = _compile_check(self.guards)
        #: Why the program is stale, once a check found it so (it stays stale).
        self.reason: str | None = None

    def __len__(self) -> int:
        return len(self.guards)

    def changed(self) -> str | None:
        """Why the traced program no longer matches the Python it ran, or None."""
        if self.reason is None:
            try:
                if self.ok():
                    return None
            except Exception:  # a name deleted, a cell emptied, an __eq__ that raised
                pass
            return self._stale()
        return self.reason

    def _stale(self) -> str:
        """The reason (computed once, on the slow path)."""
        for g in self.guards:
            name, expected, what = g.name, g.expected, g.what
            try:
                now = getattr(g.obj, name) if g.kind in ("attr", "same_attr") else g.obj[name]
            except Exception:
                now = _MISSING
            if g.kind in ("same", "same_attr"):
                differs = now is not expected
            else:
                try:
                    differs = bool(now != expected)
                except Exception:
                    differs = True
            if not differs:
                continue
            if name == "__code__":
                self.reason = f"the code of {what} changed"
            elif _function(now) is not None and _function(expected) is not None:
                self.reason = f"{what} was redefined"
            else:
                self.reason = f"{what} changed ({_describe(expected)} -> {_describe(now)})"
            return self.reason
        self.reason = "the Python the program ran changed"
        return self.reason


def _compile_check(guards: Sequence[Guard]) -> Callable[[], bool]:
    """``() -> bool``: whether every guard still holds, as one ``and`` of comparisons.

    Identity is tested first, so an unchanged object costs no ``==``. The
    objects are bound as default arguments (fast locals); names are literals.
    """
    terms, params, bound = [], [], {}
    for i, g in enumerate(guards):
        bound[f"o{i}"], bound[f"e{i}"] = g.obj, g.expected
        params.append(f"o{i}=o{i}, e{i}=e{i}")
        read = f"o{i}.{g.name}" if g.kind in ("attr", "same_attr") else f"o{i}[{g.name!r}]"
        if g.kind in ("same", "same_attr"):
            terms.append(f"{read} is e{i}")
        else:
            terms.append(f"((v := {read}) is e{i} or v == e{i})")
    source = f"def ok({', '.join(params)}):\n    return {' and '.join(terms) or 'True'}\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<jmodule guards>", "exec"), dict(bound), namespace)
    return namespace["ok"]


def _compares(v: Any) -> bool:
    """Whether ``==`` on ``v`` answers True or False (not arrays, whose ``==`` is elementwise)."""
    return not (hasattr(v, "__array__") or hasattr(v, "__jax_array__") or hasattr(v, "shape"))


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


def _user_classes(cls: type) -> list[type]:
    """``cls`` and its bases that are user code, most derived first (stops at the library)."""
    out = []
    for c in cls.__mro__:
        if c is object:
            break
        module = sys.modules.get(c.__module__)
        file = getattr(module, "__file__", None) if module is not None else None
        if c.__module__ == "__main__" or file is None or not file.startswith(_LIBRARY_ROOTS):
            out.append(c)
        else:
            break
    return out


def collect(
    source: Callable | None,
    modules: Sequence[tuple[str, Any]],
    hooks: Callable[[Any], Iterable[Any]] | None = None,
) -> Guards | None:
    """The guards of a trace that ran ``source`` over ``modules`` (None: nothing to guard).

    Args:
        source: the ``jm.compile``'d function (None for ``model.compile()``).
        modules: ``(name, module)`` of every module the program binds.
        hooks: gives the hook functions registered on a module.
    """
    found: list[Guard] = []
    seen_fns: set[int] = set()
    seen_names: set[tuple[int, str]] = set()
    todo: list[tuple[types.FunctionType, str]] = []
    attrs: set[str] = set()
    classes: list[type] = []

    def guard(d: Any, name: str, v: Any, what: str, kind: str = "item") -> None:
        if (id(d), name) in seen_names:
            return
        seen_names.add((id(d), name))
        if isinstance(v, types.ModuleType):
            return
        if kind == "item" and not _compares(v):
            kind = "same"
        found.append(Guard(kind, d, name, v, what))
        fn = _function(v)
        if fn is not None:
            add(fn, what)

    def add(fn: types.FunctionType, what: str) -> None:
        if id(fn) in seen_fns or not is_user_code(fn.__code__):
            return
        seen_fns.add(id(fn))
        todo.append((fn, what))

    fn = _function(source) if source is not None else None
    if fn is None and source is not None:
        fn = _function(type(source).__dict__.get("__call__"))
    if fn is not None:
        add(fn, f"function {fn.__qualname__!r}")
    seen_types: set[type] = set()
    for path, m in modules:
        cls = type(m)
        if cls not in seen_types:
            seen_types.add(cls)
            user = _user_classes(cls)
            classes += [c for c in user if c not in classes]
            if user:  # forward as the instance's class resolves it (``Net.forward = f`` is seen)
                guard(cls, "forward", cls.forward, f"{cls.__qualname__}.forward", "attr")
        if "forward" in m.__dict__:  # an instance-level forward
            where = f"the forward of module {path!r}" if path else "the model's forward"
            guard(m.__dict__, "forward", m.__dict__["forward"], where)
        if hooks is not None:
            for h in hooks(m):
                f = _function(h)
                if f is not None:
                    add(f, f"hook {f.__qualname__!r}")
    done_attrs: set[str] = set()
    while todo or attrs - done_attrs:
        while todo:
            fn, what = todo.pop()
            found.append(Guard("attr", fn, "__code__", fn.__code__, what))
            loaded, named = _names(fn.__code__)
            attrs |= named
            g = fn.__globals__
            for name in sorted(loaded):
                v = g.get(name, _MISSING)
                if v is not _MISSING:
                    guard(g, name, v, f"global {name!r}")
            if fn.__closure__:
                for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                    v = _cell_value(cell)
                    if v is _MISSING or isinstance(v, types.ModuleType):
                        continue
                    where = f"closure variable {name!r} of {fn.__qualname__!r}"
                    kind = "attr" if _compares(v) else "same_attr"
                    found.append(Guard(kind, cell, "cell_contents", v, where))
                    f = _function(v)
                    if f is not None:
                        add(f, f"function {f.__qualname__!r}")
        for name in sorted(attrs - done_attrs):
            done_attrs.add(name)
            for c in classes:
                if _function(c.__dict__.get(name)) is not None:
                    guard(c, name, getattr(c, name), f"{c.__qualname__}.{name}", "attr")
    if not found:
        return None
    return Guards(found)


def hook_functions(module: Any) -> Iterable[Any]:
    """The hook functions registered on ``module`` (its ``_*hooks`` dictionaries)."""
    for name, table in module.__dict__.items():
        if name.endswith("hooks") and isinstance(table, dict) and "state_dict" not in name:
            yield from table.values()
