"""The arguments of compiled calls: arrays are traced, everything else is static.

``wrap_leaf`` turns one leaf of a call's arguments into what ``jax.jit`` is
given (an array, or a :class:`Static` carrying a hashable value in the tree
structure); ``describe_args`` and ``diff`` say, for recompilation reasons,
what a call's arguments were and how they changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jmodule._lowering import state
from jmodule._tensor import Tensor

__all__ = ["Static", "describe_args", "diff", "unwrap_static", "wrap_leaf"]


class Static:
    """A non-array argument, passed to ``jax.jit`` as part of the tree structure."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Static
            and type(self.value) is type(other.value)
            and bool(self.value == other.value)
        )

    def __hash__(self) -> int:
        return hash((type(self.value), self.value))

    def __repr__(self) -> str:
        return f"Static({self.value!r})"


jax.tree_util.register_pytree_node(Static, lambda s: ((), s.value), lambda v, _: Static(v))


def wrap_leaf(x: Any) -> Any:
    """Arrays stay dynamic; Parameters become their arrays; the rest is static."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return x
    if state.is_cell(x):
        return state.read(x)
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"Compiled calls take arrays (traced) and hashable Python values (compile-time "
            f"constants); got an unhashable {type(x).__name__}. Pass it as an array, a tuple, "
            "or a dict/list of arrays."
        ) from None
    return Static(x)


def unwrap_static(tree: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda x: x.value if type(x) is Static else x,
        tree,
        is_leaf=lambda x: type(x) is Static,
    )


def describe_args(args: Any, kwargs: Any, arg_names: Sequence[str] | None) -> dict[str, tuple]:
    """Name -> (shape, dtype) or ("value", v) for every argument leaf."""
    out = {}
    flat, _ = jax.tree_util.tree_flatten_with_path(
        (args, kwargs), is_leaf=lambda x: type(x) is Static or type(x) is Tensor
    )
    for path, leaf in flat:
        top, *rest = path
        if top.idx == 0 and rest:  # positional: use forward's parameter names
            idx = rest[0].idx
            base = arg_names[idx] if arg_names and idx < len(arg_names) else f"args[{idx}]"
            name = base + jax.tree_util.keystr(tuple(rest[1:]))
        else:
            name = jax.tree_util.keystr(tuple(rest)).strip("[]'")
        if type(leaf) is Static:
            out[name] = ("value", leaf.value)
        elif type(leaf) is Tensor:  # a one-leaf pytree: its array, said to be a Tensor
            out[name] = (tuple(leaf.shape), str(leaf.dtype), "jm.Tensor")
        else:
            out[name] = (tuple(leaf.shape), str(leaf.dtype))
    return out


def _fmt(sig: tuple) -> str:
    if sig[0] == "none":
        return "None"
    if sig[0] == "value":
        return repr(sig[1])
    return f"{sig[0]} {sig[1]}"


def diff(kind: str, old: dict[str, tuple], new: dict[str, tuple]) -> str | None:
    """Say how two signatures differ: the first changed, added or removed entry."""
    for name, sig in new.items():
        if name not in old:
            return f"{kind} '{name}' added"
        before = old[name]
        if before == sig:
            continue
        if before[0] in ("value", "none") or sig[0] in ("value", "none"):
            return f"{kind} {name} changed: {_fmt(before)} -> {_fmt(sig)}"
        if before[2:] != sig[2:]:
            kinds = [s[2] if s[2:] else "jax.Array" for s in (before, sig)]
            return f"{kind} {name} changed: a {kinds[0]} -> a {kinds[1]}"
        if before[0] != sig[0]:
            return f"{kind} shape changed: {name} {before[0]} -> {sig[0]}"
        return f"{kind} dtype changed: {name} {before[1]} -> {sig[1]}"
    for name in old:
        if name not in new:
            return f"{kind} '{name}' removed"
    return None
