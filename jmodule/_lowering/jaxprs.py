"""What a jaxpr's outputs are without computing them (public ``jax.extend.core`` API only).

The eager tape leaves constant residuals out of its forward programs and the
optimizers fill their initial state on the host (``optim/optimizer._initial``):
both read which outputs of a traced function are scalar constants.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal as _Literal

__all__ = ["constant_outputs"]


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
