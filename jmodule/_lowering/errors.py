"""Why a program cannot be traced: :class:`TracingError` and the messages that explain it.

A forward (or a ``jm.compile``'d function) that cannot be traced fails inside
JAX with a generic error (``TracerBoolConversionError`` and friends).
:func:`untraceable` turns it into a :class:`TracingError` that names the
module, shows the source line and says how to fix it. Used by
``model.compile()``, ``jm.compile`` and ``jm.jit`` (which re-exports these).
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Sequence
from typing import Any

import jax

from jmodule import _jax_internals as _jx

__all__ = [
    "DeletedArrayError",
    "JitError",
    "TracingError",
    "deleted_input",
    "locate",
    "untraceable",
    "untraceable_types",
]


class JitError(RuntimeError):
    """Base class of the errors ``jm.jit`` raises (``jm.jit.JitError``)."""


class TracingError(JitError):
    """A forward cannot be compiled: it needs concrete array values while tracing.

    The message names the module and source line and says how to fix it, and
    quotes the JAX error's first line; the JAX error itself is ``jax_error``
    (chained as ``__cause__`` too when ``JAX_TRACEBACK_FILTERING=off``: a
    cause prints first, before the explanation).
    """

    jax_error: BaseException | None = None


# ----------------------------------------------------------------------- untraceable forwards

_WHY_BOOL = (
    "Python control flow (if/while/and/or/assert) looked at an array value. A compiled "
    "forward is traced once with abstract arrays, so it cannot branch on their values."
)
_FIX_BOOL = (
    "compute both sides and select with jnp.where(cond, a, b), or branch with "
    "jax.lax.cond(pred, true_fn, false_fn, *operands); if the condition is a setting rather "
    "than data, pass it as a Python (non-array) argument or a module attribute: non-array "
    "arguments are static, and each new value compiles once."
)
_WHY_CONCRETE = (
    "The forward needs a concrete Python value of an array (.item(), float(x), int(x), a "
    "shape or index computed from array values). A compiled forward is traced once with "
    "abstract arrays, so array values are not known while tracing."
)
_FIX_CONCRETE = (
    "keep the value an array (use x instead of x.item() or float(x)); use jax.lax.cond or "
    "jnp.where instead of deciding in Python; if it must be a Python value, pass it as a "
    "non-array argument (static: each new value compiles once)."
)
_WHY_SHAPE = (
    "The forward computes an array whose shape depends on array values (boolean-mask "
    "indexing, jnp.nonzero/jnp.unique without size=, ...). XLA programs have static shapes."
)
_FIX_SHAPE = (
    "keep shapes fixed: jnp.where(mask, x, 0) instead of x[mask], or give a static size "
    "(jnp.nonzero(x, size=n, fill_value=...))."
)
_WHY_NUMPY = (
    "The forward converted an array to numpy (np.asarray, np.* functions on arrays). "
    "Numpy runs in Python on concrete values, which a traced forward does not have."
)
_FIX_NUMPY = "use the jax.numpy (jnp) function instead of the numpy one."
_WHY_SYMBOLIC = (
    "With dynamic_batch=True, dimension 0 of the inputs is symbolic, and this line makes "
    "a Python decision that depends on its value ({detail})."
)
_FIX_SYMBOLIC = (
    "avoid Python decisions on the batch size (reshape with -1 rather than a computed "
    "size, keep per-sample logic in jnp), or save with dynamic_batch=False."
)
_WHY_LEAK = (
    "A traced value was kept past the trace that made it and used later: it was assigned "
    "to a variable or object outside the function that computed it (a global, a closure "
    "variable, a list, an attribute of something that is not an argument). The usual case: "
    "a value computed inside the function given to jm.backward (an RNN's hidden state, the "
    "logits) and assigned out of it (nonlocal hidden; hidden = ...)."
)
_FIX_LEAK = (
    "hand it back instead of assigning it: from jm.backward, return (loss, aux) and call "
    "`loss, aux = jm.backward(fn, has_aux=True)`; from a compiled function, return it."
)
_WHY_OUTPUT = "The forward returned {what}, which is not an array."
_FIX_OUTPUT = (
    "return arrays only (any tuple/list/dict of arrays); keep Python values as module "
    "attributes, or return them as arrays (jnp.asarray)."
)

_TEMPLATE = "Cannot compile {where}: {why}\n{location}Fix: {fix}\n{eager}\n(JAX said: {jax})"


def _kinds() -> list[tuple[type, str, str]]:
    errors = jax.errors
    return [
        # the public base of the class jax.export's shape polymorphism raises
        (errors.InconclusiveDimensionOperation, _WHY_SYMBOLIC, _FIX_SYMBOLIC),
        (errors.TracerBoolConversionError, _WHY_BOOL, _FIX_BOOL),
        (errors.NonConcreteBooleanIndexError, _WHY_SHAPE, _FIX_SHAPE),
        (errors.TracerArrayConversionError, _WHY_NUMPY, _FIX_NUMPY),
        (errors.TracerIntegerConversionError, _WHY_CONCRETE, _FIX_CONCRETE),
        (errors.ConcretizationTypeError, _WHY_CONCRETE, _FIX_CONCRETE),
        (errors.UnexpectedTracerError, _WHY_LEAK, _FIX_LEAK),
    ]


def untraceable_types() -> tuple[type, ...]:
    """The JAX exceptions that mean "this forward cannot be traced"."""
    return tuple(kind for kind, _, _ in _kinds())


_INTERNAL = (
    os.sep + os.path.join("jax", ""),
    os.sep + os.path.join("jaxlib", ""),
    os.sep + os.path.join("numpy", ""),
    os.path.join("jmodule", "_lowering", ""),
    os.path.join("jmodule", "jit", ""),
    os.path.join("jmodule", "nn", "modules", "_call.py"),
    os.path.join("jmodule", "nn", "parameter.py"),
)


def _internal(filename: str) -> bool:
    return any(part in filename for part in _INTERNAL)


def locate(
    exc: BaseException, named_modules: Sequence[tuple[str, Any]], function: str | None = None
) -> tuple[str, str | None, int | None, str | None]:
    """Where ``exc`` was raised: (module description, ``"file", line n, in f``, line, source).

    The module is the innermost one of ``named_modules`` whose method is on the
    traceback; the line is the innermost frame outside JAX and jmodule's
    machinery.
    """
    paths = {id(m): (p, m) for p, m in named_modules}
    module_where = None
    frame_info: tuple[str, int, str] | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        filename = frame.f_code.co_filename
        if not _internal(filename):
            frame_info = (filename, tb.tb_lineno, frame.f_code.co_name)
            owner = frame.f_locals.get("self")
            if id(owner) in paths:
                module_where = paths[id(owner)]
        tb = tb.tb_next
    if module_where is None and function is not None:
        where = f"function {function!r}"
        module_where = None
    elif module_where is None and named_modules:
        module_where = named_modules[0]
        where = None
    else:
        where = None
    where = where or "the forward of the module"
    if module_where is not None:
        path, module = module_where
        name = type(module).__name__
        where = (
            f"the forward of '{path}' ({name})"
            if path
            else f"the forward of the root module ({name})"
        )
    if frame_info is None:
        return where, None, None, None
    filename, lineno, function = frame_info
    source = linecache.getline(filename, lineno).strip() or None
    return where, f'"{filename}", line {lineno}, in {function}', lineno, source


#: How to run it uncompiled, per route.
EAGER_SCRIPT = 'To run this module uncompiled instead, use jm.jit.script(model, fallback="eager").'
EAGER_COMPILE = "To run it uncompiled instead, call the model without model.compile()."
EAGER_FUNCTION = "To run it uncompiled instead, call the function without jm.compile."


def untraceable(
    exc: BaseException,
    named_modules: Sequence[tuple[str, Any]],
    eager: str = EAGER_SCRIPT,
    function: str | None = None,
) -> TracingError:
    """The :class:`TracingError` explaining JAX error ``exc``.

    Raise it ``from tracebacks.cause(exc)``: its ``jax_error`` is ``exc``.

    ``function``: the ``jm.compile``'d function's name, said when the line is
    not in a module's method.
    """
    why, fix = _WHY_CONCRETE, _FIX_CONCRETE
    for kind, kind_why, kind_fix in _kinds():
        if isinstance(exc, kind):
            why, fix = kind_why, kind_fix
            break
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    why = why.format(detail=first_line)
    where, place, lineno, source = locate(exc, named_modules, function)
    error = TracingError(
        _TEMPLATE.format(
            eager=eager,
            where=where,
            why=why,
            location=_location(place, lineno, source),
            fix=fix,
            jax=f"{type(exc).__name__}: {first_line}",
        )
    )
    error.jax_error = exc
    return error


def _location(place: str | None, lineno: int | None, source: str | None) -> str:
    if place is None:
        return ""
    text = f"  File {place}\n"
    if source:
        text += f"    {source}\n"
    return text


# ----------------------------------------------------------------------- deleted (donated) arrays


class DeletedArrayError(RuntimeError):
    """An array passed in was deleted, most often donated to a ``jm.compile``'d step."""


# Tracebacks name them where users import them from.
JitError.__module__ = TracingError.__module__ = "jmodule.jit"
DeletedArrayError.__module__ = "jmodule"


_DELETED = (
    "{what} was deleted (JAX said: {jax}). The usual cause is donation: a jm.compile'd step "
    "reuses the memory of the state it rewrites (parameters, buffers, .grad, optimizer "
    "state), so an array taken from the model before the step (w = model.fc.weight.data, "
    "an un-copied model.state_dict()) is deleted by the step. Copy it first (w.copy(), "
    "{{k: v.copy() for k, v in sd.items()}}), or compile with jm.compile(fn, donate=False)."
)


def deleted_input(exc: BaseException, args: tuple[tuple, dict]) -> DeletedArrayError | None:
    """The :class:`DeletedArrayError` for ``exc`` if it says an array was deleted.

    ``args``: the call's ``(args, kwargs)``, searched for the deleted array.
    """
    if isinstance(exc, DeletedArrayError) or not _jx.is_deleted_array_error(exc):
        return None
    what = "An array it used"
    positional, named = args
    for head, tree in [*enumerate(positional), *(named or {}).items()]:
        leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
        for path, leaf in leaves:
            is_deleted = getattr(leaf, "is_deleted", None)
            if is_deleted is not None and is_deleted():
                where = f"{head!r}{jax.tree_util.keystr(path)}"
                what = f"Argument {where} (shape {tuple(leaf.shape)}, {leaf.dtype})"
                return DeletedArrayError(_DELETED.format(what=what, jax=_first_line(exc)))
    return DeletedArrayError(_DELETED.format(what=what, jax=_first_line(exc)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
