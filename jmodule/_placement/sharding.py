"""Sharding rules and checks: which ``PartitionSpec`` each array of a module gets.

A rule set is an ordered list of ``(pattern, spec)`` pairs (or a dict, in its
order). Patterns are ``fnmatch`` patterns over ``state_dict`` names
(``"encoder.*.weight"``); a leading ``"*."`` also matches at the top level,
so ``"*.weight"`` covers a bare ``Linear``'s ``weight``. The first pattern
that matches a name decides; names no rule matches are replicated. A spec is
a ``PartitionSpec`` or a callable ``(name, shape) -> PartitionSpec | None``
(``None``: no opinion, the next matching rule decides), which is how the
presets choose a dimension by shape.

Every spec is checked against the array's shape and the mesh before anything
moves; all problems are reported at once. The same check covers one
``NamedSharding`` given to every array (:func:`check_fits`).

This is the layer beneath ``Module.to``/``to_empty`` (``nn/modules/_casting.py``)
and ``jm.distributed.shard`` (``distributed/_rules.py``); it imports neither.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jmodule._lowering import state

__all__ = [
    "ArrayPlan",
    "Rules",
    "ShardingRuleError",
    "Spec",
    "allocate",
    "axis_size",
    "check_fits",
    "matches",
    "plan",
    "rule_pairs",
    "spec_problem",
]

Spec: TypeAlias = PartitionSpec | Callable[[str, tuple[int, ...]], PartitionSpec | None]
Rules: TypeAlias = Mapping[str, Spec] | Sequence[tuple[str, Spec]]


class ShardingRuleError(ValueError):
    """A sharding rule cannot apply to the parameter it matched."""


ShardingRuleError.__module__ = "jmodule.distributed"  # where users import it from

_FIX = (
    "Fix each rule (another PartitionSpec, or a more specific pattern placed before it: the "
    "first matching rule wins), or use a mesh whose axis sizes divide these dimensions."
)


def matches(name: str, pattern: str) -> bool:
    """Whether ``name`` matches ``pattern`` (a leading ``"*."`` also matches nothing).

    >>> matches("weight", "*.weight"), matches("0.fc.bias", "*.weight")
    (True, False)
    """
    if fnmatch.fnmatchcase(name, pattern):
        return True
    return pattern.startswith("*.") and fnmatch.fnmatchcase(name, pattern[2:])


def rule_pairs(rules: Rules | None) -> list[tuple[str, Spec]]:
    """``rules`` as a checked list of ``(pattern, spec)`` pairs.

    Raises:
        TypeError: a pattern that is not a string, or a spec that is neither a
            ``PartitionSpec`` nor a callable.
    """
    if rules is None:
        return []
    items = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
    out = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"sharding rules are (pattern, PartitionSpec) pairs or a dict of them; got {item!r}"
            )
        pattern, spec = item
        if not isinstance(pattern, str):
            raise TypeError(f"a rule's pattern must be a str, got {pattern!r}")
        if not (isinstance(spec, PartitionSpec) or callable(spec)):
            raise TypeError(
                f"rule {pattern!r}: expected a jax.sharding.PartitionSpec (e.g. "
                f"P('model', None)) or a callable (name, shape) -> PartitionSpec, got {spec!r}"
            )
        out.append((pattern, spec))
    return out


def _spec_text(spec: Any) -> str:
    return repr(spec) if isinstance(spec, PartitionSpec) else getattr(spec, "__name__", repr(spec))


def _axes(entry: Any) -> tuple:
    return entry if isinstance(entry, tuple) else (entry,)


def spec_problem(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> str | None:
    """Why ``spec`` cannot shard an array of ``shape`` on ``mesh`` (``None`` if it can)."""
    if len(spec) > len(shape):
        return f"the spec has {len(spec)} entries but the array has {len(shape)} dimension(s)"
    used: set[str] = set()
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        size = 1
        for axis in _axes(entry):
            if not isinstance(axis, str):
                return f"entry {entry!r} of dimension {dim} is not a mesh axis name"
            if axis not in mesh.shape:
                known = ", ".join(repr(a) for a in mesh.axis_names)
                return f"mesh axis {axis!r} is not in the mesh (its axes are {known})"
            if axis in used:
                return f"mesh axis {axis!r} is used for more than one dimension"
            used.add(axis)
            size *= mesh.shape[axis]
        if shape[dim] % size:
            return (
                f"dimension {dim} (size {shape[dim]}) is not divisible by {size}, the number of "
                f"devices along mesh axis {entry!r}"
            )
    return None


@dataclass(frozen=True)
class ArrayPlan:
    """Where one state array goes: its slot, dotted name and sharding."""

    name: str
    container: dict
    key: str
    sharding: NamedSharding
    is_param: bool


def _entries(module: Any, prefix: str, recurse: bool) -> Iterator[tuple[str, dict, str, bool]]:
    """``(name, container, key, is_param)`` of every parameter (once) and buffer."""
    tree = state.tree_slots(module, prefixes=[prefix + "." if prefix else ""], recurse=recurse)
    for (container, key), name, kind in zip(tree.slots, tree.names, tree.kinds):
        yield name, container, key, kind == "param"


def _decide(
    name: str, shape: tuple[int, ...], pairs: list[tuple[str, Spec]], mesh: Mesh
) -> tuple[PartitionSpec, str | None]:
    """The spec for ``name`` and a problem text naming the rule, if it cannot apply."""
    for pattern, spec in pairs:
        if not matches(name, pattern):
            continue
        chosen = spec(name, shape) if callable(spec) else spec
        if chosen is None:
            continue
        if not isinstance(chosen, PartitionSpec):
            return PartitionSpec(), (
                f"rule {pattern!r} -> {_spec_text(spec)} returned {chosen!r}, not a PartitionSpec"
            )
        problem = spec_problem(chosen, shape, mesh)
        if problem:
            shown = _spec_text(spec)
            if callable(spec):
                shown += f" (chose {chosen!r})"
            return chosen, f"rule {pattern!r} -> {shown}: {problem}"
        return chosen, None
    return PartitionSpec(), None


def plan(module: Any, mesh: Mesh, rules: Rules | None, recurse: bool = True) -> list[ArrayPlan]:
    """Where each parameter (once) and buffer of ``module`` goes by ``rules`` on ``mesh``.

    Raises:
        TypeError: ``mesh`` is not a ``Mesh``, or a malformed rule.
        ShardingRuleError: a matching rule cannot apply (every problem listed).
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(
            "expected a jax.sharding.Mesh (see jm.distributed.make_mesh), got "
            f"{type(mesh).__name__}"
        )
    pairs = rule_pairs(rules)
    out, problems = [], []
    for name, container, key, is_param in _entries(module, "", recurse):
        shape = tuple(container[key].shape)
        spec, problem = _decide(name, shape, pairs, mesh)
        if problem:
            problems.append(f"  '{name}' of shape {shape}: {problem}")
            continue
        out.append(ArrayPlan(name, container, key, NamedSharding(mesh, spec), is_param))
    if problems:
        axes = ", ".join(f"'{a}': {n}" for a, n in mesh.shape.items())
        raise ShardingRuleError(
            f"cannot shard {len(problems)} array(s) of {type(module).__name__} on the mesh "
            f"{{{axes}}}:\n" + "\n".join(problems) + "\n" + _FIX
        )
    return out


def check_fits(module: Any, sharding: Any, recurse: bool = True) -> None:
    """Check that one ``NamedSharding`` can hold every parameter and buffer of ``module``.

    ``Module.to(sharding)`` and ``to_empty(device=sharding)`` give every array
    the same sharding; this finds, before anything moves, each array it cannot
    hold (a dimension the mesh axes do not divide, a scalar under a
    non-empty spec) and reports them all. Other shardings pass unchecked.

    Args:
        module: the model whose parameters and buffers would all get ``sharding``.
        sharding: the one sharding for all of them.
        recurse: include submodules' arrays.

    Raises:
        ShardingRuleError: naming each array, its shape and the problem.

    >>> import jmodule as jm
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jm.distributed.make_mesh({"data": 1})
    >>> check_fits(jm.nn.BatchNorm1d(4), NamedSharding(mesh, P("data")))
    Traceback (most recent call last):
    ...
    jmodule.distributed.ShardingRuleError: cannot place 1 array(s) of BatchNorm1d with P('data',) on the mesh {'data': 1}:
      'num_batches_tracked' of shape (): the spec has 1 entries but the array has 0 dimension(s)
    Give such arrays their own spec with jm.distributed.shard(module, mesh, rules) (e.g. P() for scalars), or use a mesh whose axis sizes divide these dimensions.
    """  # noqa: E501
    if not (isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh)):
        return
    problems = []
    for name, container, key, _ in _entries(module, "", recurse):
        shape = tuple(container[key].shape)
        problem = spec_problem(sharding.spec, shape, sharding.mesh)
        if problem:
            problems.append(f"  '{name}' of shape {shape}: {problem}")
    if problems:
        axes = ", ".join(f"'{a}': {n}" for a, n in sharding.mesh.shape.items())
        raise ShardingRuleError(
            f"cannot place {len(problems)} array(s) of {type(module).__name__} with "
            f"{sharding.spec!r} on the mesh {{{axes}}}:\n" + "\n".join(problems) + "\nGive such "
            "arrays their own spec with jm.distributed.shard(module, mesh, rules) (e.g. P() for "
            "scalars), or use a mesh whose axis sizes divide these dimensions."
        )


def allocate(module: Any, mesh: Mesh, rules: Rules | None, recurse: bool = True) -> Any:
    """``module.to_empty(device=(mesh, rules))``: allocate each array already sharded.

    Every parameter and buffer becomes zeros created directly with its
    sharding, so each device allocates only its own shard; ``.grad`` is
    cleared. Initialise afterwards with ``reset_parameters()`` (which fills
    each shard in place) or ``load_state_dict``.
    """
    placements = plan(module, mesh, rules, recurse)
    for p in placements:
        value = p.container[p.key]
        p.container[p.key] = jnp.zeros(value.shape, value.dtype, device=p.sharding)
        if p.is_param:
            p.container["grad"] = None
    state.touch(module)
    return module


def axis_size(mesh: Mesh, axis: str | tuple[str, ...]) -> int:
    """Devices along ``axis`` (a name or a tuple of names) of ``mesh``.

    Raises:
        ValueError: an axis the mesh does not have (the message lists its axes).
    """
    size = 1
    for a in _axes(axis):
        if a not in mesh.shape:
            known = ", ".join(repr(n) for n in mesh.axis_names)
            raise ValueError(f"mesh axis {a!r} is not in the mesh (its axes are {known})")
        size *= mesh.shape[a]
    return size
