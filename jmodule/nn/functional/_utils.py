"""Small helpers shared by the functional layers (argument tuples, dtypes, checks)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._jax_internals import ArrayImpl as _ArrayImpl
from jmodule._lowering import state as _state
from jmodule._lowering import tape as _tape
from jmodule._lowering.state import is_cell
from jmodule.amp import _autocast as _amp
from jmodule.nn.parameter import as_array


def ntuple(value: Any, n: int) -> tuple:
    """``value`` repeated ``n`` times unless it is already a sequence (PyTorch's ``_ntuple``)."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,) * n


def compute_dtype(dtype: Any) -> Any:
    """The dtype PyTorch computes in for ``dtype`` ("opmath"): float32 for half types."""
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.promote_types(dtype, jnp.float32)
    return dtype


def upcast(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """Run ``fn(x, ...)`` in float32 for bfloat16/float16 ``x`` and cast back, as PyTorch does."""

    def wrapped(x: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
        compute = compute_dtype(x.dtype)
        if compute == x.dtype:
            return fn(x, *args, **kwargs)
        return fn(x.astype(compute), *args, **kwargs).astype(x.dtype)

    return wrapped


def concrete(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array when its value is known now (not traced), else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def shape_str(shape: Any) -> str:
    """A shape as PyTorch prints it in messages: ``[2, 3, 4]``."""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def check_float(x: jax.Array, name: str) -> jax.Array:
    """``x``, or PyTorch's kind of error for an integer input to a floating-point-only op."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(
            f"{name}: expected a floating-point input, got dtype {x.dtype} (PyTorch raises "
            "too); cast it with .astype(jnp.float32)"
        )
    return x


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def region_jit(fn: Callable, **jit_kwargs: Any) -> Callable:
    """``jax.jit(fn, **jit_kwargs)``, one per ``jm.autocast`` state (see :func:`jit`).

    For compiled helpers that call autocast-aware ops: a program traced inside
    a region carries its casts, and jax.jit's cache does not see the region.
    """
    compiled_for: dict[Any, Callable] = {None: jax.jit(fn, **jit_kwargs)}

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        region = _state.local.autocast
        compiled = compiled_for.get(region)
        if compiled is None:
            compiled = compiled_for.setdefault(region, _region_program(fn, jit_kwargs))
        return compiled(*args, **kwargs)

    return call


def _region_program(fn: Callable, jit_kwargs: dict) -> Callable:
    """``jax.jit`` of a fresh wrapper of ``fn``, for one autocast region.

    A fresh function object, because JAX caches traces by the function traced
    (across ``jax.jit`` objects): a second ``jax.jit(fn)`` would reuse the
    trace made in another region, casts and all.
    """

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return jax.jit(traced, **jit_kwargs)


def jit(
    *static: str,
    autocast: str | Callable[[dict], str | None] | None = None,
    inline: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorate a functional layer with ``jax.jit``, the named arguments static.

    An eager call then runs as one compiled program per configuration (and
    input shape) instead of dispatching and compiling each primitive on its
    own, as ``jax.nn``'s functions do; inside an eager ``jm.backward`` it is
    one operation on the tape (``_lowering/tape.py``: one forward and one
    backward program). Inside a trace it is a nested ``jax.jit`` call (XLA
    inlines it), or, with ``inline``, its operations traced in place.
    Lists among the static arguments are frozen to tuples; torch tensors and
    Parameters among the others become plain arrays.

    ``autocast`` names the aten op whose ``jm.autocast`` policy applies to
    the array arguments (or is ``bound arguments -> op name or None``): they
    are cast before the compiled call, so its cache keys on the cast dtypes.
    """

    def decorate(fn: Callable) -> Callable:
        # One program per autocast state (``fn`` may call other autocast-aware ops).
        compiled = region_jit(fn, static_argnames=static, inline=inline)
        signature = inspect.signature(fn)
        kinds = [p.kind for p in signature.parameters.values()]
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        # Positional calls (what layers make) skip binding the signature: the position
        # of each static argument is known.
        n_positional = len(kinds) if all(k == positional for k in kinds) else 0
        static_at = frozenset(i for i, n in enumerate(signature.parameters) if n in static)
        names = tuple(signature.parameters)
        position = {n: i for i, n in enumerate(names)}
        defaults = tuple(p.default for p in signature.parameters.values())

        def positional(args: tuple, kwargs: dict) -> tuple | None:
            """``args`` and ``kwargs`` as positional arguments (defaults filling the gaps), or
            None where only binding the signature can tell (or raise PyTorch's error)."""
            n = len(args)
            try:
                at = [position[k] for k in kwargs]
            except KeyError:
                return None
            if min(at) < n:
                return None
            out = list(args)
            for i in range(n, max(at) + 1):
                name = names[i]
                if name in kwargs:
                    out.append(kwargs[name])
                elif defaults[i] is inspect.Parameter.empty:
                    return None
                else:
                    out.append(defaults[i])
            return tuple(out)

        def full(n: int, statics: tuple, dynamic: Sequence[Any]) -> list:
            s, d = iter(statics), iter(dynamic)
            return [next(s) if i in static_at else next(d) for i in range(n)]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs and n_positional:  # F.relu(x, inplace=True): by position, no binding
                given = positional(args, kwargs)
                if given is not None:
                    args, kwargs = given, {}
            if not kwargs and len(args) <= n_positional and _state.local.autocast is None:
                args = tuple(
                    _freeze(v)
                    if i in static_at
                    else v
                    if v is None or type(v) is _ArrayImpl or isinstance(v, jax.Array)
                    else _device_scalar(v)
                    if type(v) in _SCALAR_TYPES
                    else _as_array(v)
                    for i, v in enumerate(args)
                )
                tape = _tape.active_tape()
                if tape is None:
                    return compiled(*args)
                # One operation on the eager jm.backward's tape, keyed without jax.jit's
                # argument parsing (the static arguments are known by position).
                n = len(args)
                statics = tuple(args[i] for i in static_at if i < n)
                try:
                    hash(statics)
                except TypeError:
                    return compiled(*args)
                return tape.call(
                    (call, n, statics),
                    lambda *d: fn(*full(n, statics, d)),
                    [a for i, a in enumerate(args) if i not in static_at],
                    lambda *d: compiled(*full(n, statics, d)),
                )
            bound = signature.bind(*args, **kwargs)
            arrays = []
            for name, value in bound.arguments.items():
                if name in static:
                    bound.arguments[name] = _freeze(value)
                elif value is not None and not isinstance(value, (jax.Array, np.ndarray)):
                    bound.arguments[name] = _as_array(value)
                if name not in static and isinstance(bound.arguments[name], jax.Array):
                    arrays.append(name)
            if autocast is not None and _state.local.autocast is not None:
                op = autocast if isinstance(autocast, str) else autocast(bound.arguments)
                if op is not None:
                    cast = _amp.cast(op, *(bound.arguments[n] for n in arrays))
                    bound.arguments.update(zip(arrays, cast))
            return compiled(*bound.args, **bound.kwargs)

        return call

    return decorate


def autocast(op: str, *args: Any) -> tuple[Any, ...]:
    """``args`` cast by ``jm.autocast``'s policy for aten op ``op`` (unchanged outside a region).

    Parameters among them are read as arrays first; None and Python numbers pass.
    """
    if _state.local.autocast is None:
        return args
    return _amp.cast(op, *(_as_array(a) if a is not None else None for a in args))


def autocast_op(
    op: str | tuple[str, ...] | Callable[[tuple, dict], str | None],
) -> Callable[[Callable], Callable]:
    """Decorate a functional layer so ``jm.autocast`` casts its array arguments for aten ``op``.

    ``op`` is an aten op name, several applied in turn (an op PyTorch runs as
    a composite of listed ops), or ``(args, kwargs) -> op name or None``.
    Outside an autocast region the call goes straight through.
    """

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if _state.local.autocast is not None:
                args, kwargs = _cast_all(op(args, kwargs) if callable(op) else op, args, kwargs)
            return fn(*args, **kwargs)

        return call

    return decorate


def _cast_all(ops: str | tuple[str, ...] | None, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Every array (or Parameter) among ``args`` and ``kwargs`` cast for ``ops``, together."""
    if ops is None:
        return args, kwargs
    values = [*args, *kwargs.values()]
    where = [i for i, v in enumerate(values) if isinstance(v, jax.Array) or is_cell(v)]
    arrays = tuple(as_array(values[i]) for i in where)
    for name in (ops,) if isinstance(ops, str) else ops:
        arrays = _amp.cast(name, *arrays)
    for i, v in zip(where, arrays):
        values[i] = v
    n = len(args)
    return tuple(values[:n]), dict(zip(kwargs, values[n:]))


def _as_array(value: Any) -> Any:
    if isinstance(value, (bool, int, float, complex)):
        return value
    return as_array(value)


_SCALAR_TYPES = frozenset({bool, int, float, complex})

#: Device copies of Python scalars passed to compiled layers eagerly, by type, value and
#: x64 mode: ``jax.jit`` would copy ``momentum=0.1`` to the device on every call.
_SCALARS: dict[tuple, jax.Array] = {}


def _device_scalar(value: Any) -> Any:
    """``value`` (a Python scalar) as a weakly typed device array, made once per value.

    Only outside a trace, and never for a huge integer (which jax.jit refuses as it is).
    """
    key = (type(value), repr(value), jax.config.jax_enable_x64)
    out = _SCALARS.get(key)
    if out is None:
        if not _tape.eager() or _state.local.bound:
            return value
        try:
            out = _tape.untaped(jnp.asarray, value)
        except OverflowError:
            return value
        if len(_SCALARS) >= 1024:
            _SCALARS.clear()
        _SCALARS[key] = out
    return out


def broadcast_shapes(a: tuple, b: tuple) -> tuple[int, ...]:
    """``a`` and ``b`` broadcast together, or PyTorch's error (``a`` is "tensor a")."""
    ndim = max(len(a), len(b))
    a = (1,) * (ndim - len(a)) + tuple(a)
    b = (1,) * (ndim - len(b)) + tuple(b)
    for i, (m, n) in enumerate(zip(a, b)):
        if m != n and m != 1 and n != 1:
            raise RuntimeError(
                f"The size of tensor a ({m}) must match the size of tensor b ({n}) at "
                f"non-singleton dimension {i}"
            )
    return tuple(n if m == 1 else m for m, n in zip(a, b))


@jax.custom_jvp
def clamp_min_straight_through(x: jax.Array, low: Any) -> jax.Array:
    """``max(x, low)`` whose gradient is the identity, as PyTorch's in-place clamp under no_grad."""
    return jnp.maximum(x, low)


@clamp_min_straight_through.defjvp
def clamp_min_straight_through_jvp(primals: tuple, tangents: tuple) -> tuple:
    x, low = primals
    return jnp.maximum(x, low), tangents[0]
