"""Functional use of modules, as ``torch.func``: a module as a pure function of its state.

``functional_call(model, state, args)`` runs ``model`` with the arrays in
``state`` standing in for its parameters and buffers, without changing the
model. It is the bridge to plain JAX: wrap it in ``jax.jit``, ``jax.grad``,
``jax.vmap`` as you would any function of arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jmodule import random as _random
from jmodule._lowering import binding, state
from jmodule._lowering.state import Slot

__all__ = ["functional_call", "state_slots"]


def state_slots(module: Any) -> dict[str, Slot]:
    """Every parameter and buffer of ``module`` by dotted name, tied names included."""
    return state.tree_slots(module, aliases=True).aliases


def functional_call(
    module: Any,
    parameter_and_buffer_dicts: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
    rng_key: Any = None,
) -> Any:
    """Call ``module`` with ``parameter_and_buffer_dicts`` replacing its state.

    The module is unchanged afterwards: buffer writes made by ``forward``
    (BatchNorm statistics) are discarded, as arrays are immutable and the
    call is pure. Names not given keep the module's current values (unless
    ``strict``). Random draws (dropout) use ``rng_key`` when given; without
    it, a draw inside ``jax.jit``/``jax.grad`` raises a clear error rather
    than silently reusing one key.

    Args:
        module: the module to call.
        parameter_and_buffer_dicts: ``{name: array}`` (or several such dicts)
            keyed like ``state_dict()``.
        args: positional arguments (a single non-tuple value is one argument).
        kwargs: keyword arguments.
        tie_weights: tied parameters follow any of their names (always True
            here: a tied parameter is one slot).
        strict: require every parameter and buffer to be given.
        rng_key: a ``jax.random`` key for random draws inside the call.

    Returns:
        Whatever ``forward`` returns.

    Raises:
        ValueError: unknown names, conflicting values for tied names, or
            (``strict``) missing names.

    >>> import jax, jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Linear(3, 1)
    >>> params = {k: jnp.zeros_like(v) for k, v in model.state_dict().items()}
    >>> jm.func.functional_call(model, params, (jnp.ones((2, 3)),))
    Array([[0.],
           [0.]], dtype=float32)
    >>> grads = jax.grad(lambda p: jm.func.functional_call(model, p, jnp.ones(3)).sum())(params)
    >>> sorted(grads)
    ['bias', 'weight']
    """
    del tie_weights
    dicts = (
        [parameter_and_buffer_dicts]
        if isinstance(parameter_and_buffer_dicts, Mapping)
        else list(parameter_and_buffer_dicts)
    )
    given: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            if k in given:
                raise ValueError(f"{k} appeared in multiple dictionaries; behavior is undefined")
            given[k] = v
    slots = state_slots(module)
    unknown = sorted(set(given) - set(slots))
    if unknown:
        raise ValueError(f"Unexpected key(s): {', '.join(repr(k) for k in unknown)}.")
    if strict:
        missing = sorted(set(slots) - set(given))
        if missing:
            raise ValueError(f"Missing key(s): {', '.join(repr(k) for k in missing)}.")
    chosen: dict[tuple[int, str], tuple[Slot, Any, str]] = {}
    for name, slot in slots.items():
        ident = (id(slot[0]), slot[1])
        if name in given:
            value = state.value(given[name])
            if ident in chosen and chosen[ident][2] in given and chosen[ident][1] is not value:
                raise ValueError(
                    f"{chosen[ident][2]} and {name} are tied but were given different values"
                )
            chosen[ident] = (slot, value, name)
        elif ident not in chosen:
            chosen[ident] = (slot, slot[0][slot[1]], name)
    bound_slots = [s for s, _, _ in chosen.values()]
    values = [v for _, v, _ in chosen.values()]
    if rng_key is not None:
        bound_slots.append(state.rng_slot(_random.default_generator))
        values.append(rng_key)
    if not isinstance(args, tuple):
        args = (args,)
    with binding.bound(bound_slots, values, tuple(module.named_modules())):
        return module(*args, **(kwargs or {}))
