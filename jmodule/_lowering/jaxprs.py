"""What a jaxpr's outputs are without computing them (public JAX API only).

The optimizers fill their initial state on the host (``optim/optimizer._initial``)
from which outputs of a traced function are scalar constants
(:func:`constant_outputs`); the eager tape leaves out of its forward programs the
residuals that cheap operations make from inputs not differentiated or from
nothing, and those that rearrange inputs no larger than themselves
(:func:`recomputable`: the zeros of ReLU's derivative, a loss's gather indices
made from its labels, the transposed weight of ``x @ w.T``), and its backward
programs compute them again.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr as _ClosedJaxpr
from jax.extend.core import Literal as _Literal
from jax.extend.core import jaxpr_as_fun as _jaxpr_as_fun
from jax.extend.core import subjaxprs as _subjaxprs
from jax.interpreters.partial_eval import dce_jaxpr_consts as _dce_jaxpr_consts

__all__ = ["constant_outputs", "largest_product", "recomputable"]


#: Primitives that call a jaxpr and return its outputs (``jax.jit`` inside a trace).
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call"})


def constant_outputs(closed: Any) -> dict[int, tuple[Any, tuple[int, ...], Any]]:
    """``{output index: (value, shape, dtype)}`` of ``closed``'s outputs that are a scalar
    constant, broadcast or not (through nested ``jit`` calls): what needs no computing.

    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x: (x * 2, jnp.zeros_like(x), 0))(jnp.ones(3))
    >>> {j: (float(v), shape) for j, (v, shape, _) in constant_outputs(closed).items()}
    {1: (0.0, (3,)), 2: (0.0, ())}
    """
    producers: dict[int, dict] = {}

    def made(jaxpr: Any, var: Any) -> Any:
        if isinstance(var, _Literal):
            return var.val if np.shape(var.val) == () else None
        table = producers.get(id(jaxpr))
        if table is None:
            table = producers[id(jaxpr)] = {
                v: (eqn, i) for eqn in jaxpr.eqns for i, v in enumerate(eqn.outvars)
            }
        found = table.get(var)
        if found is None:
            return None  # an input
        eqn, i = found
        name = eqn.primitive.name
        if name == "broadcast_in_dim" and eqn.params.get("sharding") is None:
            return made(jaxpr, eqn.invars[0])
        if name in _CALLS and "jaxpr" in eqn.params:
            inner = eqn.params["jaxpr"]
            inner = getattr(inner, "jaxpr", inner)
            return made(inner, inner.outvars[i])
        return None

    out = {}
    for j, var in enumerate(closed.jaxpr.outvars):
        value = made(closed.jaxpr, var)
        aval = var.aval
        if value is not None and not jnp.issubdtype(aval.dtype, jax.dtypes.extended):
            out[j] = (np.asarray(value, aval.dtype), tuple(aval.shape), aval.dtype)
    return out


#: Primitives as cheap per element as reading their result back: an output made from
#: undifferentiated inputs by these alone is computed again in the backward program
#: (where XLA fuses it into its consumer) instead of being written by the forward and
#: held. Random bits, transcendental functions, contractions and sorts are not.
_CHEAP = frozenset(
    {
        "abs", "add", "and", "broadcast_in_dim", "clamp", "concatenate", "convert_element_type",
        "copy", "copy_p", "div", "dynamic_slice", "eq", "expand_dims", "gather", "ge", "gt",
        "iota", "le", "lt", "max", "min", "mul", "ne", "neg", "not", "or", "pad", "reduce_and",
        "reduce_max", "reduce_min", "reduce_or", "reduce_sum", "rem", "reshape", "rev",
        "select_n", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign",
        "slice", "squeeze", "sub", "transpose", "xor",
    }
)  # fmt: skip


#: Primitives that only move or widen what they read: an output made by these alone from
#: inputs no larger than itself (a weight's transpose, which a matrix product's derivative
#: needs) is computed again from those inputs, differentiated or not, in the backward: the
#: node keeps the inputs instead of a copy as large, and the forward writes nothing.
_LAYOUT = frozenset(
    {
        "broadcast_in_dim", "convert_element_type", "copy", "copy_p", "expand_dims",
        "reshape", "rev", "squeeze", "transpose",
    }
)  # fmt: skip


def _made_of(eqn: Any, allowed: frozenset) -> bool:
    """Whether ``eqn`` (through nested ``jit`` calls) is made of ``allowed`` primitives."""
    if eqn.effects:
        return False
    name = eqn.primitive.name
    if name in _CALLS and "jaxpr" in eqn.params:
        inner = eqn.params["jaxpr"]
        return all(_made_of(e, allowed) for e in getattr(inner, "jaxpr", inner).eqns)
    return name in allowed


def _nbytes(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def recomputable(
    closed: Any, differentiated: Any, outputs: Any
) -> tuple[tuple[int, ...], tuple[int, ...], Any] | None:
    """Which of ``closed``'s ``outputs`` are cheap to make again from inputs.

    An output is found when :data:`_CHEAP` operations make it from inputs not
    ``differentiated`` (positions), or :data:`_LAYOUT` operations from inputs,
    differentiated or not, no larger in bytes than the output (keeping them costs
    no more memory than keeping it). Returns ``(found, inputs, fn)``: the output
    indices found, the input positions they are made from, and
    ``fn(*those inputs)`` computing them (the part of the jaxpr they need, nested
    ``jit`` calls pruned too); None when there is none. A literal output is found
    (made from nothing); an output that is an input itself is not (the caller
    keeps the input).

    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x, t: (x * 2, t == 3, jnp.sin(t)))(1.0, jnp.arange(4))
    >>> found, inputs, fn = recomputable(closed, {0}, [0, 1, 2])
    >>> found, inputs, fn(jnp.arange(4))[0].tolist()
    ((1,), (1,), [False, False, False, True])
    """
    jaxpr = closed.jaxpr
    n = len(jaxpr.outvars)
    invars = set(jaxpr.invars)
    found = []
    for j in outputs:
        var = jaxpr.outvars[j]
        if not isinstance(var, _Literal) and var in invars:
            continue
        part, _, used = _dce_jaxpr_consts(jaxpr, [k == j for k in range(n)])
        if not any(used[i] for i in differentiated):
            if all(_made_of(e, _CHEAP) for e in part.eqns):
                found.append(j)
        elif all(_made_of(e, _LAYOUT) for e in part.eqns) and sum(
            _nbytes(v.aval) for v, u in zip(jaxpr.invars, used) if u
        ) <= _nbytes(var.aval):
            found.append(j)
    if not found:
        return None
    part, used_consts, used = _dce_jaxpr_consts(jaxpr, [k in found for k in range(n)])
    consts = [c for c, u in zip(closed.consts, used_consts) if u]
    inputs = tuple(i for i, u in enumerate(used) if u)
    return tuple(found), inputs, _jaxpr_as_fun(_ClosedJaxpr(part, consts))


def largest_product(closed: Any) -> int:
    """The most elements a ``dot_general`` of ``closed`` produces, through every inner jaxpr
    (nested ``jit`` calls, ``scan`` and ``cond`` bodies, custom derivative rules); 0 if none.

    >>> closed = jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b))(jnp.ones((4, 3)), jnp.ones((3, 5)))
    >>> largest_product(closed)
    20
    """
    most, stack = 0, [closed.jaxpr]
    while stack:
        jaxpr = stack.pop()
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                most = max(most, int(np.prod(eqn.outvars[0].aval.shape, dtype=np.int64)))
        stack.extend(_subjaxprs(jaxpr))
    return most
