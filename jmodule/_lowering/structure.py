"""The static structure of a module tree, and the slots holding its state.

``describe(module)`` walks the tree once and returns a hashable key (what a
compiled program depends on: classes, names, mode, hooks, requires_grad,
plain attributes) plus the ordered slots of its state. It is cached on the
module until the global structure epoch moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jmodule._lowering import binding
from jmodule._lowering.binding import Slot


@dataclass(frozen=True)
class ModuleInfo:
    """What a compiled program depends on, for one module of the tree."""

    cls: str
    stamp: int
    training: bool
    pre_hooks: tuple[int, ...]
    hooks: tuple[int, ...]
    backward_hooks: tuple[int, ...]
    params: tuple[tuple[str, bool], ...]
    buffers: tuple[str, ...]
    children: tuple[str, ...]


@dataclass(frozen=True)
class Description:
    """A module tree's structure key, state slots and their dotted names."""

    key: tuple
    infos: dict[str, ModuleInfo]
    slots: tuple[Slot, ...]
    names: tuple[str, ...]
    named_modules: tuple[tuple[str, Any], ...]
    #: ``(param.__dict__, "grad")`` of every parameter, for programs that
    #: compute gradients (``jm.compile``); a plain forward never touches them.
    grad_slots: tuple[Slot, ...] = ()
    grad_names: tuple[str, ...] = ()


def describe(root: Any) -> Description:
    """Describe ``root``'s tree, reusing the cached description when valid."""
    cached = root.__dict__.get("_jm_desc")
    if cached is not None and cached[0] == binding.EPOCH.value:
        return cached[1]
    infos: dict[str, ModuleInfo] = {}
    slots: list[Slot] = []
    names: list[str] = []
    grad_slots: list[Slot] = []
    grad_names: list[str] = []
    seen: set[int] = set()
    named_modules = tuple(root.named_modules())
    for path, m in named_modules:
        d = m.__dict__
        dot = path + "." if path else ""
        params = []
        for name, p in d["_parameters"].items():
            params.append((name, None if p is None else p.requires_grad))
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                slots.append((p.__dict__, "_value"))
                names.append(dot + name)
                grad_slots.append((p.__dict__, "grad"))
                grad_names.append(dot + name + ".grad")
        buffers = []
        for name, b in d["_buffers"].items():
            buffers.append(name if b is not None else name + "=None")
            if b is not None:
                slots.append((d["_buffers"], name))
                names.append(dot + name)
        infos[path] = ModuleInfo(
            cls=type(m).__qualname__,
            stamp=d["_stamp"],
            training=d["training"],
            pre_hooks=tuple(d["_forward_pre_hooks"]),
            hooks=tuple(d["_forward_hooks"]),
            backward_hooks=(*d["_backward_pre_hooks"], *d["_backward_hooks"]),
            params=tuple(params),
            buffers=tuple(buffers),
            children=tuple(k for k, v in d["_modules"].items() if v is not None),
        )
    desc = Description(
        key=tuple(infos.items()),
        infos=infos,
        slots=tuple(slots),
        names=tuple(names),
        named_modules=named_modules,
        grad_slots=tuple(grad_slots),
        grad_names=tuple(grad_names),
    )
    root.__dict__["_jm_desc"] = (binding.EPOCH.value, desc)
    return desc


def stateful(key: Any, slots: Sequence[Slot], names: Sequence[str]) -> Description:
    """The description of a non-module stateful object (the ``jm.compile`` protocol).

    An object takes part in ``jm.compile`` by defining ``_jm_describe()``
    that returns ``stateful(key, slots, names)``: ``key`` is hashable and
    changes whenever the program it is used in must change; ``slots`` are the
    ``(dict, name)`` pairs holding its arrays.
    """
    return Description(key=key, infos={}, slots=tuple(slots), names=tuple(names), named_modules=())


def _where(path: str) -> str:
    return f"'{path}'" if path else "the root module"


def structural_change(old: dict[str, ModuleInfo], new: dict[str, ModuleInfo]) -> str:
    """Say, in words, the first difference between two descriptions."""
    for path in new:
        if path not in old:
            return f"module {_where(path)} added"
    for path in old:
        if path not in new:
            return f"module {_where(path)} removed"
    for path, n in new.items():
        o = old[path]
        if o.training != n.training:
            return f"training mode changed on {_where(path)} ({o.training} -> {n.training})"
        for kind, a, b in (
            ("forward pre-hook", o.pre_hooks, n.pre_hooks),
            ("forward hook", o.hooks, n.hooks),
            ("backward hook", o.backward_hooks, n.backward_hooks),
        ):
            if len(b) > len(a):
                return f"{kind} added on {_where(path)}"
            if len(b) < len(a):
                return f"{kind} removed on {_where(path)}"
            if a != b:
                return f"{kind}s replaced on {_where(path)}"
        if o.params != n.params:
            old_rg, new_rg = dict(o.params), dict(n.params)
            for name in new_rg:
                if name in old_rg and old_rg[name] != new_rg[name]:
                    return (
                        f"requires_grad of parameter '{path + '.' if path else ''}{name}' changed"
                    )
            return f"parameters of {_where(path)} changed ({list(old_rg)} -> {list(new_rg)})"
        if o.buffers != n.buffers:
            return f"buffers of {_where(path)} changed ({list(o.buffers)} -> {list(n.buffers)})"
        if o.children != n.children:
            return f"children of {_where(path)} changed"
        if o.cls != n.cls:
            return f"class of {_where(path)} changed ({o.cls} -> {n.cls})"
        if o.stamp != n.stamp:
            return f"an attribute of {_where(path)} was set"
    return "global hooks or a stateful argument changed"
