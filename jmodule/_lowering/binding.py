"""Binding: run ordinary module code over traced state.

A *slot* is a ``(dict, key)`` pair that holds one piece of state: a
Parameter's value (``(param.__dict__, "_value")``), a buffer
(``(module._buffers, name)``), a generator's key. Binding puts the given
(usually traced) values into the slots, runs Python code, reads back what the
code assigned, and restores the slots, so the objects are unchanged after the
trace. This is MLX's ``model.update(params); return fn(...)`` made reversible.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax

Slot = tuple[dict, str]

#: One lock serialises every read-call-write of compiled state, so concurrent
#: callers never lose an update (and tracing never races a fast-path read).
LOCK = threading.RLock()


class _Epoch:
    """A counter bumped by every structural change anywhere (cheap to compare)."""

    value = 0


EPOCH = _Epoch()


def bump() -> None:
    """Record a structural change (module tree, hooks, mode, requires_grad, ...)."""
    EPOCH.value += 1


class GradWatch:
    """Which ``.grad`` slots a trace reads before writing (see ``Parameter.grad``)."""

    __slots__ = ("reads", "watched", "written")

    def __init__(self, watched: dict[int, int]):
        self.watched = watched  # id(param.__dict__) -> slot index
        self.reads: set[int] = set()
        self.written: set[int] = set()


#: The innermost active :class:`GradWatch`, or None (then ``.grad`` is a plain attribute).
GRAD_WATCH: list[GradWatch | None] = [None]

#: Active gradient computations (``jm.backward``/``jm.grad``), innermost last.
#: ``Module.__call__`` reports itself to the innermost one while it is non-empty.
GRAD_STACK: list = []


class TracerLeakError(RuntimeError):
    """A traced value would have escaped into a module outside its state."""


_local = threading.local()


def _stack() -> list[set[int]]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def tracing() -> bool:
    """True while jmodule is tracing a compiled program in this thread."""
    return bool(getattr(_local, "stack", None))


def is_bound(container: dict) -> bool:
    """True when ``container`` holds slots bound by an active jmodule trace."""
    cid = id(container)
    return any(cid in bound for bound in getattr(_local, "stack", ()))


def _new_tracer(value: Any, allowed: set[int]) -> bool:
    """True when ``value`` is, or directly holds, a tracer not in ``allowed``."""
    if isinstance(value, jax.core.Tracer):
        return id(value) not in allowed
    if isinstance(value, (list, tuple)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return False
    return any(isinstance(v, jax.core.Tracer) and id(v) not in allowed for v in items)


def _snapshot(module: Any) -> tuple:
    d = module.__dict__
    # Containers held in attributes are copied too, so an append or item
    # assignment made during a failed trace can be undone in place.
    contents = {
        id(v): (v, list(v) if isinstance(v, list) else dict(v))
        for v in d.values()
        if type(v) in (list, dict)
    }
    return dict(d), dict(d["_parameters"]), dict(d["_buffers"]), dict(d["_modules"]), contents


def _restore(module: Any, snap: tuple) -> None:
    d = module.__dict__
    state, *_, contents = snap
    for live, saved in zip((d["_parameters"], d["_buffers"], d["_modules"]), snap[1:4]):
        live.clear()
        live.update(saved)
    for container, saved in contents.values():
        if isinstance(container, list):
            container[:] = saved
        else:
            container.clear()
            container.update(saved)
    d.clear()
    d.update(state)


def find_leak(named_modules: Sequence[tuple[str, Any]], allowed: set[int]) -> str | None:
    """Describe the first traced value left in a module after a trace, if any.

    Tracers in ``allowed`` (those an enclosing trace had put there) are fine.
    """
    for path, m in named_modules:
        where = f"'{path}' ({type(m).__name__})" if path else f"the root ({type(m).__name__})"
        for name, value in m.__dict__.items():
            if _new_tracer(value, allowed):
                return f"attribute '{name}' of {where}"
        for name, p in m._parameters.items():
            if p is not None and _new_tracer(p.__dict__["_value"], allowed):
                return f"parameter '{name}' of {where}"
        for name, b in m._buffers.items():
            if _new_tracer(b, allowed):
                return f"buffer '{name}' of {where}"
    return None


LEAK_HELP = (
    "A compiled forward stored a traced value in {what}. Inside compiled code only "
    "registered buffers (self.register_buffer(...)) and parameters carry values from one "
    "call to the next; anything else must be returned. The module was left unchanged."
)


@contextlib.contextmanager
def bound(
    slots: Sequence[Slot],
    values: Sequence[Any],
    named_modules: Sequence[tuple[str, Any]] = (),
) -> Iterator[None]:
    """Put ``values`` into ``slots`` for the duration of the block.

    On exit the slots get their old values back. When the block raises, the
    listed modules are restored to their state before the block. When it
    succeeds but left a traced value anywhere in those modules, they are
    restored and :class:`TracerLeakError` is raised.
    """
    olds = [c[k] for c, k in slots]
    snaps = [_snapshot(m) for _, m in named_modules]
    for (c, k), v in zip(slots, values):
        c[k] = v
    stack = _stack()
    stack.append({id(c) for c, _ in slots})
    ok = False
    try:
        yield
        ok = True
    finally:
        stack.pop()
        for (c, k), v in zip(slots, olds):
            c[k] = v
        leak = None
        if ok:
            allowed = {id(v) for v in olds}
            for snap in snaps:
                allowed.update(id(v) for v in snap[0].values())
                for _, saved in snap[4].values():
                    allowed.update(
                        id(x) for x in (saved.values() if type(saved) is dict else saved)
                    )
            leak = find_leak(named_modules, allowed)
        if not ok or leak:
            for (_, m), snap in zip(named_modules, snaps):
                _restore(m, snap)
    if leak:
        raise TracerLeakError(LEAK_HELP.format(what=leak))
