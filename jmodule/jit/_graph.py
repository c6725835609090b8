"""The ``graph`` and ``inlined_graph`` views: a forward's jaxpr with named inputs.

``graph`` is JAX's own jaxpr text, with parameters and buffers named by their
``state_dict`` keys and arguments by ``forward``'s parameter names instead of
``a``, ``b``, ``c``. ``inlined_graph`` first replaces every call-like equation
(``jit``, ``closed_call``, ``custom_jvp_call``, ``custom_vjp_call``,
``checkpoint``) by the equations of the program it calls, at every depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.extend import core as jex_core

from jmodule import _jax_internals as _jx
from jmodule.jit import ops
from jmodule.jit._trace import Traced

#: Primitives whose equation is a call of another jaxpr, and the parameter holding it.
CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "checkpoint": "jaxpr",
    "remat": "jaxpr",
}


def _callee(eqn: Any) -> tuple[Any, Sequence[Any]] | None:
    """``(jaxpr, consts)`` called by a call-like equation, or None."""
    param = CALLS.get(eqn.primitive.name)
    inner = eqn.params.get(param) if param else None
    if isinstance(inner, jex_core.ClosedJaxpr):
        return inner.jaxpr, inner.consts
    if isinstance(inner, jex_core.Jaxpr) and not inner.constvars:
        return inner, ()
    return None


def _evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """Run ``jaxpr``, inlining calls and the calls inside nested programs."""
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        callee = _callee(eqn)
        if callee is not None:
            outs = _evaluate(callee[0], callee[1], invals)
        else:
            outs = _bind_inlined(eqn, invals)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            if not isinstance(v, jex_core.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _bind_inlined(eqn: Any, invals: list[Any]) -> Any:
    params = {k: _inline_param(v) for k, v in eqn.params.items()}
    try:
        return ops.bind(eqn.primitive, *invals, **params)
    except Exception:  # a primitive that rejects a re-traced body: keep it as it was
        return ops.bind(eqn.primitive, *invals, **eqn.params)


def _inline_param(value: Any) -> Any:
    if isinstance(value, jex_core.ClosedJaxpr):
        return inline(value)
    if type(value) is tuple and value and all(isinstance(v, jex_core.ClosedJaxpr) for v in value):
        return tuple(inline(v) for v in value)
    return value


def _specs(avals: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
        for a in avals
    ]


def has_calls(jaxpr: Any) -> bool:
    """True when ``jaxpr`` (or a program nested in it) has a call-like equation."""
    for eqn in jaxpr.eqns:
        if _callee(eqn) is not None:
            return True
        for sub in jex_core.jaxprs_in_params(eqn.params):
            if has_calls(sub):
                return True
    return False


def inline(closed: Any) -> Any:
    """``closed`` (a ClosedJaxpr) with every call inlined, at every depth."""
    if not has_calls(closed.jaxpr):
        return closed
    specs = _specs(closed.in_avals)
    return jax.make_jaxpr(lambda *a: _evaluate(closed.jaxpr, closed.consts, a))(*specs)


def input_names(traced: Traced, arg_names: Sequence[str] | None) -> list[str]:
    """One display name per jaxpr input: state keys, then argument paths."""
    names = ["rng_key" if n == ops.RNG_KEY else n for n in traced.names]
    flat, _ = jax.tree_util.tree_flatten_with_path(traced.signature.tree)
    for path, _leaf in flat:
        top, *rest = path
        if top.idx == 0 and rest:
            idx = rest[0].idx
            base = arg_names[idx] if arg_names and idx < len(arg_names) else f"args[{idx}]"
            names.append(base + jax.tree_util.keystr(tuple(rest[1:])))
        else:
            names.append(jax.tree_util.keystr(tuple(rest)).strip("[]'"))
    return names


def output_names(traced: Traced) -> list[str]:
    """One display name per jaxpr output: ``out`` leaves, then ``<state key>.new``."""
    num_out = traced.out_tree.num_leaves
    outs = ["out"] if num_out == 1 else [f"out{i}" for i in range(num_out)]
    news = [traced.names[i] for i in traced.changed]
    return outs + [("rng_key" if n == ops.RNG_KEY else n) + ".new" for n in news]


def render(
    closed: Any, in_names: Sequence[str], out_names: Sequence[str], header: Sequence[str]
) -> str:
    """The jaxpr text of ``closed`` with its inputs and outputs named, after ``header``."""
    jaxpr = closed.jaxpr
    names: dict[Any, str] = {}
    for v, name in zip(jaxpr.invars, in_names):
        names[v] = name
    for v, name in zip(jaxpr.outvars, out_names):
        if isinstance(v, jex_core.Var) and v not in names:
            names[v] = name
    lines = [f"# {line}" for line in header]
    return "\n".join([*lines, _pretty(jaxpr, names)]) + "\n"


def _pretty(jaxpr: Any, names: dict[Any, str]) -> str:
    # JAX's printer with our names seeded (a private API: _jax_internals.pretty_jaxpr).
    # Fresh names skip ours, so they never collide.
    try:
        return _jx.pretty_jaxpr(jaxpr, names)
    except (AttributeError, TypeError):  # pragma: no cover - future jax
        legend = ", ".join(f"{i}: {n}" for i, n in enumerate(names.values()))
        return f"# inputs and outputs, in order: {legend}\n{jaxpr.pretty_print()}"
