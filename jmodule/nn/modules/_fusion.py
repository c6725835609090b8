"""Eager calls of library modules as one compiled program each.

A module tree made only of jmodule's own layers, with no hook anywhere in it,
runs the same Python on every call: nothing in it prints, branches on values
or differs from call to call except through its state and mode, which a
compiled program carries (``model.compile()``'s machinery: parameters,
buffers and the random key in and out). So when such a module is called
eagerly (outside ``jm.compile``, inside or outside an eager ``jm.backward``),
it runs as one cached program instead of one program per operation: a
``nn.Sequential`` of library layers is one XLA program forward and, inside
``jm.backward``, one more backward (``_lowering/tape.py``). User code is never
fused: a module of a user class runs its ``forward`` in Python on every
call, and the library modules it calls are fused one by one.

Which modules fuse: those with submodules or buffers, or whose class says so
(``_jm_fuse = True``: it draws random numbers); a leaf that calls one
functional layer is already one program. A tree with a forward or backward
hook (its own, a child's, or a global one), a class from outside jmodule or
one that opts out (``_jm_fuse = False``: its forward runs user code) is not
fused. A module whose forward cannot be traced (it reads values on the host)
is run eagerly from then on; the decision is kept until its tree changes.
"""

from __future__ import annotations

import weakref
from typing import Any

from jmodule._lowering import errors as _errors
from jmodule._lowering import hooks as _hooks
from jmodule._lowering import state, structure
from jmodule._lowering import tape as _tape

_HOOKS = _hooks._VERSION

#: What :func:`call` returns when the module is not fused (run it eagerly).
NOT_FUSED = object()

#: Per library class, the program its fused calls share: keyed by structure, shapes and
#: dtypes, so a new model like an earlier one (a notebook cell run again, a model per
#: thread) compiles nothing (a cache of programs keyed by what they compute).
_PROGRAMS: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()


def _library(cls: type) -> bool:
    return cls.__module__.startswith("jmodule.") and getattr(cls, "_jm_fuse", None) is not False


def _fusable(module: Any) -> bool:
    """Whether ``module``'s tree is only library modules without hooks (walks the tree)."""
    if any(_hooks.global_hook_key()):
        return False
    desc = structure.describe(module)
    for _, m in desc.named_modules:
        if not _library(type(m)) or m.__dict__.get("_compiled") is not None:
            return False
        d = m.__dict__
        if (
            d["_forward_pre_hooks"]
            or d["_forward_hooks"]
            or d["_backward_pre_hooks"]
            or d["_backward_hooks"]
        ):
            return False
    return True


def wanted(module: Any) -> bool:
    """Whether ``module``'s class is one that fuses (cheap: a class and a dict lookup)."""
    cls = type(module)
    fuse = getattr(cls, "_jm_fuse", None)
    if fuse is not None:
        return fuse and cls.__module__.startswith("jmodule.")
    d = module.__dict__
    return bool(d["_modules"] or d["_buffers"]) and cls.__module__.startswith("jmodule.")


def call(module: Any, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` as one compiled program, or :data:`NOT_FUSED`."""
    local = state.local
    if local.bound or local.parametrize_cache is not None or not _tape.eager():
        return NOT_FUSED  # inside a compiled trace (or a parametrization cache): inline
    d = module.__dict__
    seen = d.get("_jm_fusable")
    version = d.get("_jm_version", 0)
    if seen is None or seen[0] != version or seen[1] != _HOOKS.value:
        seen = d["_jm_fusable"] = (version, _HOOKS.value, _fusable(module))
    if not seen[2]:
        return NOT_FUSED
    fused = d.get("_jm_fused")
    if fused is None:
        from jmodule._lowering.compiled import CompiledForward, forward_program

        cls = type(module)
        program = _PROGRAMS.get(cls)
        if program is None:
            program = _PROGRAMS.setdefault(cls, forward_program(module, {}))
        fused = d["_jm_fused"] = CompiledForward(module, {}, {}, program=program)
    try:
        return fused(args, kwargs)
    except (*_errors.untraceable_types(), _errors.TracingError):
        # It reads values on the host (or cannot be traced otherwise): eager from now on.
        d["_jm_fusable"] = (version, _HOOKS.value, False)
        return NOT_FUSED
