"""A module's forward as a flat pure function, traced for views and export.

:class:`FlatForward` binds the module's state slots (the same slots
``model.compile()`` uses) and runs the forward under them:

    pure(state_values: list, arg_leaves: list) -> (output_leaves, new_state_values)

Flat lists of arrays in and out keep the traced program free of jmodule's own
pytree types, so ``jax.export`` can serialize it and the views can name every
input. Which state the forward wrote, and the output's tree, are recorded
when it is traced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from jmodule import random as _random
from jmodule._lowering import binding, state, structure
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.arguments import Static, describe_args, unwrap_static, wrap_leaf
from jmodule.jit._errors import TracingError

Forward = Callable[[Sequence[Any], tuple, dict], Any]

#: The name of the symbolic batch dimension with ``dynamic_batch=True``.
BATCH = "batch"


def _is_static(x: Any) -> bool:
    return type(x) is Static


def spec_of(x: Any) -> jax.ShapeDtypeStruct:
    """The abstract value of an array or tracer."""
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


@dataclass(frozen=True, eq=False)
class Signature:
    """What a forward was traced for: ``(args, kwargs)`` with array leaves abstract.

    Array leaves are ``jax.ShapeDtypeStruct``; non-array leaves are
    :class:`Static` (compile-time constants).
    """

    tree: tuple[tuple, dict]

    @classmethod
    def of(cls, args: tuple, kwargs: dict) -> Signature:
        """The signature of a call (leaves may be arrays, tracers or Static)."""
        wrapped = jax.tree_util.tree_map(
            lambda x: x if _is_static(x) else wrap_leaf(x),
            (tuple(args), dict(kwargs)),
            is_leaf=lambda x: _is_static(x) or state.is_cell(x),
        )
        tree = jax.tree_util.tree_map(
            lambda x: x if _is_static(x) else spec_of(x), wrapped, is_leaf=_is_static
        )
        return cls(tree)

    def leaves(self) -> tuple[list[jax.ShapeDtypeStruct], Any]:
        """Array specs and the tree definition (static values are part of it)."""
        leaves, treedef = jax.tree_util.tree_flatten(self.tree, is_leaf=None)
        return leaves, treedef

    def describe(self, arg_names: Sequence[str] | None) -> str:
        """``x: f32[8,16], scale=2.0`` for headers and messages."""
        parts = []
        for name, sig in describe_args(*self.tree, arg_names).items():
            if sig[0] == "value":
                parts.append(f"{name}={sig[1]!r}")
            else:
                parts.append(f"{name}: {_short(sig[1], sig[0])}")
        return ", ".join(parts) or "no arguments"

    def symbolic(self, constraints: Sequence[str] = ()) -> Signature:
        """This signature with dimension 0 of every array input symbolic (``batch``)."""
        (batch,) = jax.export.symbolic_shape(BATCH, constraints=tuple(constraints))

        def make(x: Any) -> Any:
            if _is_static(x) or not x.shape:
                return x
            return jax.ShapeDtypeStruct((batch, *x.shape[1:]), x.dtype, weak_type=x.weak_type)

        return Signature(jax.tree_util.tree_map(make, self.tree, is_leaf=_is_static))


def _short(dtype: str, shape: tuple) -> str:
    short = jax.numpy.dtype(dtype).name
    for long, abbrev in (("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c")):
        if short.startswith(long):
            short = abbrev + short[len(long) :]
            break
    return f"{short}[{','.join(str(d) for d in shape)}]"


@dataclass
class Traced:
    """One trace of a forward: its jaxpr and what it says about state and output."""

    jaxpr: Any  # jax.extend.core.ClosedJaxpr
    names: tuple[str, ...]  # state slot names, in input order
    num_args: int  # array argument leaves after the state
    changed: tuple[int, ...]  # indices (into names) of the state the forward wrote
    out_tree: Any  # treedef of the forward's output
    signature: Signature
    lowered: Any = None  # jax.stages.Traced, for StableHLO


class FlatForward:
    """``forward`` over flat lists of arrays, bound to a module's current state.

    Make one holding the module's lock (``state.lock``) and trace it before the
    structure changes.
    """

    def __init__(self, module: Any, forward: Forward):
        desc = structure.describe(module)
        self.module = module
        self.forward = forward
        self.slots = (*desc.slots, state.rng_slot(_random.default_generator))
        self.names = (*desc.names, state.RNG_NAME)
        self.named_modules = desc.named_modules
        self.changed: tuple[int, ...] = ()
        self.out_tree: Any = None
        self._treedef: Any = None

    def state_values(self) -> list[Any]:
        """The current value of every slot, in input order."""
        return [c[k] for c, k in self.slots]

    def state_specs(self) -> list[jax.ShapeDtypeStruct]:
        """Abstract values of the state, in input order."""
        return [spec_of(v) for v in self.state_values()]

    def __call__(self, state: list, arg_leaves: list) -> tuple[list, list]:
        args, kwargs = unwrap_static(jax.tree_util.tree_unflatten(self._treedef, arg_leaves))
        slots = self.slots
        with binding.bound(slots, state, self.named_modules):
            out = self.forward((self.module,), args, kwargs)
            changed = tuple(i for i, (c, k) in enumerate(slots) if c[k] is not state[i])
            new = [slots[i][0][slots[i][1]] for i in changed]
        out_leaves, self.out_tree = jax.tree_util.tree_flatten(out)
        self.changed = changed
        return out_leaves, new

    def trace(self, signature: Signature) -> Traced:
        """Trace for ``signature`` (no computation, no state change)."""
        arg_specs, self._treedef = signature.leaves()
        traced = jax.jit(self).trace(self.state_specs(), arg_specs)
        return Traced(
            jaxpr=traced.jaxpr,
            names=self.names,
            num_args=len(arg_specs),
            changed=self.changed,
            out_tree=self.out_tree,
            signature=signature,
            lowered=traced,
        )

    def export(self, signature: Signature, platforms: Sequence[str]) -> Any:
        """``jax.export.Exported`` of the forward for ``signature`` on ``platforms``."""
        arg_specs, self._treedef = signature.leaves()
        state = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in self.state_specs()]
        return jax.export.export(jax.jit(self), platforms=tuple(platforms))(state, arg_specs)


def trace_symbolic(run: Callable[[Signature], Any], signature: Signature) -> tuple[Any, str]:
    """``run(signature.symbolic())``, retried with ``batch >= 2`` if the forward needs it.

    A forward may only be defined for batches of two or more (training-mode
    batch norm refuses one sample per channel, as PyTorch does); then the
    comparison ``batch <= 1`` is inconclusive unless the symbol is constrained.
    Returns the result and the constraint used (``""`` for none).
    """
    # the public base of the class jax.export's shape polymorphism raises
    InconclusiveDimensionOperation = jax.errors.InconclusiveDimensionOperation

    try:
        return run(signature.symbolic()), ""
    except TracingError as e:
        if not isinstance(e.jax_error, InconclusiveDimensionOperation):
            raise
        first = e
    constraint = f"{BATCH} >= 2"
    try:
        return run(signature.symbolic([constraint])), constraint
    except TracingError as e:
        if isinstance(e.jax_error, InconclusiveDimensionOperation):
            raise first from _tracebacks.cause(first.jax_error)
        raise
