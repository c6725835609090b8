"""The static structure of a module tree, and the slots holding its state.

``describe(module)`` walks the tree once and returns a hashable key (what a
compiled program depends on: classes, names, mode, hooks, requires_grad,
plain attributes) plus the ordered slots of its state (from
``state.tree_slots``). It is cached on the module until the module's version
moves (``state.touch``: a change anywhere in its own tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jmodule._lowering import state
from jmodule._lowering.state import Slot


@dataclass(frozen=True)
class ModuleInfo:
    """What a compiled program depends on, for one module of the tree."""

    cls: str
    #: Identity of the module's plain attributes (a new token on every write).
    stamp: object
    training: bool
    pre_hooks: tuple[int, ...]
    hooks: tuple[int, ...]
    backward_hooks: tuple[int, ...]
    params: tuple[tuple[str, bool | None], ...]
    buffers: tuple[str, ...]
    children: tuple[str, ...]


@dataclass(frozen=True)
class Description:
    """A tree's structure key, state slots and their dotted names."""

    key: tuple
    infos: dict[str, ModuleInfo]
    slots: tuple[Slot, ...]
    names: tuple[str, ...]
    named_modules: tuple[tuple[str, Any], ...]
    #: ``(param.__dict__, "grad")`` of every parameter, for programs that
    #: compute gradients (``jm.compile``); a plain forward never touches them.
    grad_slots: tuple[Slot, ...] = ()
    grad_names: tuple[str, ...] = ()
    #: Per slot in ``slots``: the Parameter whose value it holds, or None.
    cells: tuple[Any, ...] = ()
    #: The version of the described object this description is valid for.
    version: int = -1


def describe(root: Any) -> Description:
    """Describe ``root``'s tree, reusing the cached description while its version holds."""
    d = root.__dict__
    cached = d.get("_jm_desc")
    if cached is not None and cached.version == d.get("_jm_version", 0):
        return cached
    tree = state.tree_slots(root, grads=True)
    infos: dict[str, ModuleInfo] = {}
    for path, m in tree.named_modules:
        md = m.__dict__
        infos[path] = ModuleInfo(
            cls=type(m).__qualname__,
            stamp=md.get("_stamp"),
            training=md["training"],
            pre_hooks=tuple(md["_forward_pre_hooks"]),
            hooks=tuple(md["_forward_hooks"]),
            backward_hooks=(*md["_backward_pre_hooks"], *md["_backward_hooks"]),
            params=tuple(
                (name, None if p is None else p.requires_grad)
                for name, p in md["_parameters"].items()
            ),
            buffers=tuple(
                name if b is not None else name + "=None" for name, b in md["_buffers"].items()
            ),
            children=tuple(k for k, v in md["_modules"].items() if v is not None),
        )
    n = len(tree.slots) - len(tree.params)  # the grad slots come last
    params = iter(tree.params)
    desc = Description(
        key=tuple(infos.items()),
        infos=infos,
        slots=tree.slots[:n],
        names=tree.names[:n],
        named_modules=tree.named_modules,
        grad_slots=tree.slots[n:],
        grad_names=tree.names[n:],
        cells=tuple(next(params) if k == "param" else None for k in tree.kinds[:n]),
        # Read after the walk: enumerating may link parameters, never touch them.
        version=d.get("_jm_version", 0),
    )
    d["_jm_desc"] = desc
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
        if o.stamp is not n.stamp:
            return f"an attribute of {_where(path)} was set"
    return "global hooks or a stateful argument changed"
