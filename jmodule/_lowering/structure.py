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
    #: The class itself: a class defined again (a notebook cell run again) is another one.
    kind: type
    #: The module's plain attributes by value (:func:`attributes`): an equal new model
    #: has equal ones, so its programs are reused.
    attrs: tuple
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
    #: The buffers registered as None (``register_buffer("mask", None)``): no state (what
    #: ``jm.jit`` exports and sharding places has values), but a compiled program may
    #: give them one (``compiled._plan_for``).
    none_slots: tuple[Slot, ...] = ()
    none_names: tuple[str, ...] = ()
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
    tree = state.tree_slots(root, grads=True, nones=True)
    infos: dict[str, ModuleInfo] = {}
    for path, m in tree.named_modules:
        md = m.__dict__
        infos[path] = ModuleInfo(
            cls=type(m).__qualname__,
            kind=type(m),
            attrs=attributes(md),
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

    def of(*kinds: str) -> tuple[tuple[Slot, ...], tuple[str, ...]]:
        picked = [i for i, k in enumerate(tree.kinds) if k in kinds]
        return tuple(tree.slots[i] for i in picked), tuple(tree.names[i] for i in picked)

    slots, names = of("param", "buffer")
    grad_slots, grad_names = of("grad")
    none_slots, none_names = of("none")
    params = iter(tree.params)
    desc = Description(
        key=tuple(infos.items()),
        infos=infos,
        slots=slots,
        names=names,
        named_modules=tree.named_modules,
        grad_slots=grad_slots,
        grad_names=grad_names,
        none_slots=none_slots,
        none_names=none_names,
        cells=tuple(
            next(params) if k == "param" else None for k in tree.kinds if k in ("param", "buffer")
        ),
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


#: A module's hook dictionaries (``Module.__init__`` makes each an empty ``OrderedDict``).
HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)

#: Module attributes that are bookkeeping, not what ``forward`` computes with.
BOOKKEEPING = frozenset(
    {
        "training",
        "_parameters",
        "_buffers",
        "_modules",
        "_non_persistent_buffers_set",
        *HOOK_DICTS,
        "_is_full_backward_hook",
        "_stamp",
        "_compiled",
        "_compile_options",
    }
)


class _Same:
    """An attribute compared by identity (an array, a function, any unhashable object).

    Holding the object keeps its id from being reused while a program keyed on it lives.
    """

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is _Same and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} object at {id(self.obj):#x}>"


_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def _value(v: Any, depth: int = 0) -> Any:
    """A hashable stand-in for ``v`` that is equal for equal plain values."""
    t = type(v)
    if t in _SCALARS:
        return (t, repr(v)) if t in (float, complex) else (t, v)  # repr: -0.0 and nan
    if depth < 4 and t in (tuple, list) and len(v) <= 256:
        return (t, tuple(_value(x, depth + 1) for x in v))
    if depth < 4 and t is dict and len(v) <= 256:
        return (t, tuple((_value(k, depth + 1), _value(x, depth + 1)) for k, x in v.items()))
    try:
        hash(v)
    except TypeError:
        return _Same(v)
    if t.__hash__ is object.__hash__:
        return _Same(v)  # equality by identity anyway
    return (t, v)


def attributes(d: dict) -> tuple:
    """A module's plain attributes (from its ``__dict__``), as hashable values.

    Two modules whose attributes hold equal numbers, strings, tuples, ... (and
    the same arrays, functions and other objects) compute the same forward, so
    programs traced for one serve the other: a model made again in a notebook
    cell reuses what the previous one compiled.
    """
    return tuple(
        (k, _value(v)) for k, v in d.items() if k not in BOOKKEEPING and k not in state.PRIVATE
    )


def _plain(v: Any) -> Any:
    """What :func:`_value` stood in for, to print it."""
    if type(v) is tuple and len(v) == 2 and isinstance(v[0], type):
        t, payload = v
        if t in (float, complex):
            return t(payload)
        if t in (tuple, list):
            return t(_plain(x) for x in payload)
        if t is dict:
            return {_plain(k): _plain(x) for k, x in payload}
        return payload
    return v


def _short(v: Any) -> str:
    text = repr(_plain(v))
    return text if len(text) <= 40 else text[:37] + "..."


def describe_path(path: str) -> str:
    """``'[0].fc1.weight'`` -> ``"'fc1.weight' of argument 0"``: a slot's name, for users."""
    return _named(path)


def _named(path: str, name: str = "") -> str:
    """``'[1].fc1'`` + ``'scale'`` -> ``"'fc1.scale' of argument 1"`` (``jm.compile``'s paths)."""
    where = ""
    if path.startswith("["):
        index, _, path = path[1:].partition("]")
        path = path.lstrip(".")
        where = f" of argument {index}"
    full = ".".join(p for p in (path, name) if p)
    return f"'{full}'{where}" if full else f"the root module{where}"


def _attribute_change(path: str, old: dict, new: dict) -> str:
    for name in new:
        if name not in old:
            return f"attribute {_named(path, name)} was added"
    for name in old:
        if name not in new:
            return f"attribute {_named(path, name)} was deleted"
    for name, v in new.items():
        if old[name] != v:
            return f"attribute {_named(path, name)} changed ({_short(old[name])} -> {_short(v)})"
    return f"attributes of {_named(path)} changed"


def _where(path: str) -> str:
    return _named(path)


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
                    return f"requires_grad of parameter {_named(path, name)} changed"
            return f"parameters of {_where(path)} changed ({list(old_rg)} -> {list(new_rg)})"
        if o.buffers != n.buffers:
            if len(o.buffers) == len(n.buffers):
                for a, b in zip(o.buffers, n.buffers):
                    if a == b + "=None":  # register_buffer(name, None), then a value
                        return f"buffer {_named(path, b)} was given a value (it was None)"
                    if b == a + "=None":
                        return f"buffer {_named(path, a)} was set to None"
            return f"buffers of {_where(path)} changed ({list(o.buffers)} -> {list(n.buffers)})"
        if o.children != n.children:
            return f"children of {_where(path)} changed"
        if o.cls != n.cls:
            return f"class of {_where(path)} changed ({o.cls} -> {n.cls})"
        if o.kind is not n.kind:
            return f"class {n.cls} of {_where(path)} was defined again"
        if o.attrs != n.attrs:
            return _attribute_change(path, dict(o.attrs), dict(n.attrs))
    return "global hooks or a stateful argument changed"
