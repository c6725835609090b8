"""Binding: run ordinary module code over traced state.

Binding puts the given (usually traced) values into slots (see
``state.py``), runs Python code, reads back what the code assigned, and
restores the slots, so the objects are unchanged after the trace. This is
MLX's ``model.update(params); return fn(...)`` made reversible. Which
containers are bound is recorded for this thread only (``state.local``).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from jmodule._lowering import state
from jmodule._lowering.state import Slot


class GradWatch:
    """What a trace does with gradients: which ``.grad`` slots it reads before
    writing (see ``Parameter.grad``), and whether it runs a ``jm.backward``."""

    __slots__ = ("backward", "reads", "watched", "written")

    def __init__(self, watched: dict[int, int]):
        self.watched = watched  # id(param.__dict__) -> slot index
        self.reads: set[int] = set()
        self.written: set[int] = set()
        #: A ``jm.backward`` ran in the trace (``recorder.note_backward``).
        self.backward = False


class TracerLeakError(RuntimeError):
    """A traced value would have escaped into a module outside its state."""


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


class Snapshot:
    """A module's attributes, registries and parameter values, to check or restore it."""

    __slots__ = ("attrs", "buffers", "contents", "module", "modules", "parameters", "values")

    def __init__(self, module: Any):
        d = module.__dict__
        self.module = module
        self.attrs = dict(d)
        self.parameters = dict(d["_parameters"])
        self.buffers = dict(d["_buffers"])
        self.modules = dict(d["_modules"])
        self.values = [state.raw(p) for p in self.parameters.values() if p is not None]
        # Containers held in attributes are copied too, so an append or item
        # assignment made during a failed trace can be undone in place.
        self.contents = {
            id(v): (v, list(v) if isinstance(v, list) else dict(v))
            for v in d.values()
            if type(v) in (list, dict)
        }

    def known(self, into: set[int]) -> None:
        """Add the ids of every value held when the snapshot was taken to ``into``."""
        into.update(id(v) for v in self.attrs.values())
        into.update(id(v) for v in self.buffers.values())
        into.update(id(v) for v in self.values)
        for _, saved in self.contents.values():
            into.update(id(x) for x in (saved.values() if type(saved) is dict else saved))

    def restore(self) -> None:
        d = self.module.__dict__
        for live, saved in (
            (d["_parameters"], self.parameters),
            (d["_buffers"], self.buffers),
            (d["_modules"], self.modules),
        ):
            live.clear()
            live.update(saved)
        for container, saved in self.contents.values():
            if isinstance(container, list):
                container[:] = saved
            else:
                container.clear()
                container.update(saved)
        d.clear()
        d.update(self.attrs)


_REGISTRIES = frozenset({"_parameters", "_buffers", "_modules"})
#: Types of attribute values that never hold a tracer (most of a module's attributes).
_PLAIN = frozenset({bool, int, float, str, type(None)})
#: Containers ``_new_tracer`` looks into (an empty one holds none: the hook registries).
_CONTAINERS = frozenset({dict, OrderedDict, list, tuple})


def find_leak(named_modules: Sequence[tuple[str | None, Any]], allowed: set[int]) -> str | None:
    """Describe the first traced value left in a module after a trace, if any.

    Tracers in ``allowed`` (those an enclosing trace had put there) are fine.
    """
    for path, m in named_modules:
        for name, v in m.__dict__.items():
            t = type(v)
            if t in _PLAIN or (t in _CONTAINERS and not v) or name in _REGISTRIES:
                continue
            if _new_tracer(v, allowed):
                return f"attribute '{name}' of {_where(path, m)}"
        # State in containers an enclosing trace has bound is that trace's to check.
        for name, p in m._parameters.items():
            if p is not None and not state.is_bound(p.__dict__):
                v = state.raw(p)
                if type(v) is state.StackedValue:  # a block of a stacked value it was given
                    v = None if id(v) in allowed else v.stack
                if _new_tracer(v, allowed):
                    return f"parameter '{name}' of {_where(path, m)}"
        if not state.is_bound(m._buffers):
            for name, b in m._buffers.items():
                if _new_tracer(b, allowed):
                    return f"buffer '{name}' of {_where(path, m)}"
    return None


def _where(path: str | None, m: Any) -> str:
    """How a leak message names module ``m`` at ``path``."""
    cls = type(m).__name__
    if path is None:  # a module called by a differentiated closure
        return f"a {cls} called in the closure"
    return f"'{path}' ({cls})" if path else f"the root ({cls})"


LEAK_HELP = (
    "A compiled forward stored a traced value in {what}. Inside compiled code only "
    "registered buffers (self.register_buffer(...)) and parameters carry values from one "
    "call to the next; anything else must be returned. The module was left unchanged."
)


NEW_BUFFER_HELP = (
    "Buffer '{name}' of {cls} was first registered inside a compiled call (model.compile(), "
    "jm.compile) with a traced value: a compiled program carries the buffers the module had "
    "when the call began. Register it in __init__, as None if its value is only known in "
    "forward (self.register_buffer('{name}', None)): forward can then set it (self.{name} = "
    "... or register_buffer again), the program traces once more and the buffer keeps the "
    "value. The module was left unchanged."
)


def _new_buffer(snapshots: Sequence[Snapshot], allowed: set[int]) -> str | None:
    """The error for a buffer a trace registered with a tracer under a new name, if any."""
    for snap in snapshots:
        buffers = snap.module.__dict__["_buffers"]
        if state.is_bound(buffers):
            continue  # an enclosing trace's to check
        for name, b in buffers.items():
            if name not in snap.buffers and _new_tracer(b, allowed):
                return NEW_BUFFER_HELP.format(name=name, cls=type(snap.module).__name__)
    return None


def check_and_restore(
    snapshots: Sequence[Snapshot],
    named_modules: Sequence[tuple[str | None, Any]],
    ok: bool,
    allowed: set[int],
    compiled: bool = False,
) -> None:
    """After a trace: restore the modules when it failed or left a stray tracer (then raise).

    ``compiled``: the trace is a compiled program's (``program.Program``), whose
    error for a buffer first registered in it says how to declare it instead.
    """
    leak = None
    if ok:
        # Values the modules held before the trace are allowed too; collecting their
        # ids costs a pass over every attribute, so only when a first look finds one.
        leak = find_leak(named_modules, allowed)
        if leak:
            for snap in snapshots:
                snap.known(allowed)
            leak = find_leak(named_modules, allowed)
    if not ok or leak:
        new_buffer = _new_buffer(snapshots, allowed) if leak and compiled else None
        for snap in snapshots:
            snap.restore()
        if new_buffer:
            raise TracerLeakError(new_buffer)
    if leak:
        raise TracerLeakError(LEAK_HELP.format(what=leak))


@contextlib.contextmanager
def bound(
    slots: Sequence[Slot],
    values: Sequence[Any],
    named_modules: Sequence[tuple[str, Any]] = (),
    compiled: bool = False,
) -> Iterator[None]:
    """Put ``values`` into ``slots`` for the duration of the block.

    On exit the slots get their old values back. When the block raises, the
    listed modules are restored to their state before the block. When it
    succeeds but left a traced value anywhere in those modules, they are
    restored and :class:`TracerLeakError` is raised (``compiled``: see
    :func:`check_and_restore`).
    """
    olds = [c[k] for c, k in slots]
    snaps = [Snapshot(m) for _, m in named_modules]
    for (c, k), v in zip(slots, values):
        c[k] = v
    stack = state.local.bound
    stack.append({id(c) for c, _ in slots})
    ok = False
    try:
        yield
        ok = True
    finally:
        stack.pop()
        for (c, k), v in zip(slots, olds):
            c[k] = v
        check_and_restore(snaps, named_modules, ok, {id(v) for v in olds}, compiled)
