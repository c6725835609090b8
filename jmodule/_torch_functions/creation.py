"""Creation functions: ``jm.tensor``, ``jm.zeros``, ``jm.arange``, ``jm.eye``, ...

dtype inference is PyTorch's: Python floats give the default dtype
(``jm.get_default_dtype()``, float32), Python ints give int64 (int32 while
JAX's x64 mode is off), bools give bool; numpy and jax arrays keep their dtype
(64-bit ones narrowed when x64 is off, as JAX narrows all data). JAX has no
uninitialised memory, so ``empty`` returns zeros. JAX arrays are immutable,
so ``out=`` is refused, and ``requires_grad=True`` is refused with a pointer
to ``jm.nn.Parameter`` (gradients in jmodule are taken with respect to
parameters).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._lowering import state
from jmodule._torch_functions._common import (
    arr,
    default_float,
    long_dtype,
    out_dtype,
    place,
    shape_arg,
)

__all__ = [
    "arange",
    "as_tensor",
    "empty",
    "empty_like",
    "eye",
    "from_numpy",
    "full",
    "full_like",
    "linspace",
    "logspace",
    "meshgrid",
    "ones",
    "ones_like",
    "scalar_tensor",
    "tensor",
    "tril",
    "tril_indices",
    "triu",
    "triu_indices",
    "zeros",
    "zeros_like",
]

_OUT_HELP = (
    "out= is not supported: JAX arrays are immutable. Use the returned array "
    "(`y = jm.{name}(...)` instead of `jm.{name}(..., out=y)`)."
)
_GRAD_HELP = (
    "requires_grad=True is not supported on plain arrays: jmodule computes gradients with "
    "respect to parameters. Wrap the value in jm.nn.Parameter(x) (requires_grad=True is its "
    "default) and differentiate with jm.backward / jm.grad."
)


def check_torch_only(name: str, out: Any = None, requires_grad: bool = False) -> None:
    """Refuse the arguments JAX cannot honour (``out=``, ``requires_grad=True``)."""
    if out is not None:
        raise TypeError(_OUT_HELP.format(name=name))
    if requires_grad:
        raise ValueError(_GRAD_HELP)


def _scalar_kind(x: Any) -> int:
    """0 bool, 1 int, 2 float, 3 complex: PyTorch's categories for Python scalars."""
    if isinstance(x, bool | np.bool_):
        return 0
    if isinstance(x, numbers.Integral):
        return 1
    if isinstance(x, numbers.Real):
        return 2
    if isinstance(x, numbers.Complex):
        return 3
    raise TypeError(f"Could not infer dtype of {type(x).__name__}")


def _complex_default() -> Any:
    return jnp.complex128 if default_float() == jnp.float64 else jnp.complex64


def _kind_dtype(kind: int) -> Any:
    return (jnp.bool_, long_dtype(), default_float(), _complex_default())[kind]


def _leaves(data: Any, out: list) -> None:
    if isinstance(data, (list, tuple)):
        for d in data:
            _leaves(d, out)
    else:
        out.append(data)


def _infer(data: Any) -> Any:
    """The dtype ``torch.tensor(data)`` gives (None: use the data's own)."""
    if isinstance(data, (jax.Array, np.ndarray, np.generic)) or state.is_cell(data):
        return None
    leaves: list = []
    _leaves(data, leaves)
    if any(hasattr(leaf, "dtype") for leaf in leaves):
        return None
    kinds = [_scalar_kind(leaf) for leaf in leaves]
    return _kind_dtype(max(kinds, default=2))


def _narrow(dt: Any) -> Any:
    return jax.dtypes.canonicalize_dtype(dt)


def _host(data: Any, dt: Any) -> np.ndarray:
    """``data`` as a numpy array of ``dt``; integers that do not fit raise ``OverflowError``
    (int64 data is int32 while JAX's x64 mode is off) instead of wrapping around."""
    host = np.asarray(data)
    dt = np.dtype(dt)
    if dt.kind in "iu" and host.dtype.kind in "iu" and host.size:
        info = np.iinfo(dt)
        if host.min() < info.min or host.max() > info.max:
            bad = host[(host < info.min) | (host > info.max)].flat[0]
            raise OverflowError(
                f"Python int {bad} too large to convert to {dt.name} (64-bit integers are "
                "32-bit while JAX's x64 mode is off; turn it on with "
                "`jax.config.update('jax_enable_x64', True)`)"
            )
    return host.astype(dt, copy=False)


def tensor(
    data: Any,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> jax.Array:
    """A new array holding a copy of ``data``, as ``torch.tensor``.

    Args:
        data: a Python scalar or (nested) list, a numpy/jax array, a Parameter.
        dtype: the result's dtype; inferred as PyTorch does when None.
        device: where to place it (``"cpu"``, ``"cuda:0"``, a ``jax.Device``).
        requires_grad: must be False (use ``jm.nn.Parameter`` for gradients).
        pin_memory: accepted and ignored (XLA manages host memory).
    """
    check_torch_only("tensor", requires_grad=requires_grad)
    want = out_dtype(dtype)
    if state.is_cell(data):
        data = arr(data)
    if want is None:
        inferred = _infer(data)
        if inferred is not None:
            want = inferred
    if type(data).__module__.startswith("torch"):
        data = arr(data)
    if isinstance(data, (list, tuple)):
        leaves: list = []
        _leaves(data, leaves)
        if any(isinstance(leaf, jax.Array) or state.is_cell(leaf) for leaf in leaves):
            # ``jm.tensor([loss_a, loss_b])``: jnp stacks arrays (traced ones too).
            data = jnp.asarray(jax.tree_util.tree_map(arr, data, is_leaf=state.is_cell))
    if isinstance(data, jax.Array):
        x = jnp.array(data, dtype=want, copy=True)
    elif want is None:
        host = np.asarray(data)
        x = jnp.asarray(_host(host, _narrow(host.dtype)))
    else:
        x = jnp.asarray(_host(data, want))
    return place(x, device)


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> jax.Array:
    """``data`` as an array, sharing it when it already is one of the right dtype,
    as ``torch.as_tensor``."""
    if state.is_cell(data):
        data = arr(data)
    if isinstance(data, jax.Array) and (dtype is None or jnp.dtype(out_dtype(dtype)) == data.dtype):
        return place(data, device) if device is not None else data
    return tensor(data, dtype=dtype, device=device)


def from_numpy(ndarray: np.ndarray) -> jax.Array:
    """A numpy array as a ``jax.Array``, as ``torch.from_numpy``.

    Difference from PyTorch: the result is a copy (JAX arrays do not share
    numpy's memory, and they are immutable, so writes to the numpy array are
    not seen). 64-bit data is narrowed when JAX's x64 mode is off.

    Raises:
        TypeError: ``ndarray`` is not a numpy array.
    """
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(ndarray).__name__})")
    return jnp.asarray(_host(ndarray, _narrow(ndarray.dtype)))


def scalar_tensor(
    s: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False
) -> jax.Array:
    """A 0-d array of ``s`` in the default float dtype, as ``torch.scalar_tensor``."""
    check_torch_only("scalar_tensor", requires_grad=requires_grad)
    return place(jnp.asarray(s, out_dtype(dtype) or default_float()), device)


def _filled(
    name: str,
    size: tuple,
    value: Any,
    dtype: Any,
    device: Any,
    out: Any,
    requires_grad: bool,
) -> jax.Array:
    check_torch_only(name, out, requires_grad)
    shape = shape_arg(size)
    dt = out_dtype(dtype) or default_float()
    return place(jnp.full(shape, value, dt), device)


def zeros(
    *size: Any,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """An array of zeros of shape ``size`` (``zeros(2, 3)`` or ``zeros((2, 3))``)."""
    return _filled("zeros", size, 0, dtype, device, out, requires_grad)


def ones(
    *size: Any,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """An array of ones of shape ``size``."""
    return _filled("ones", size, 1, dtype, device, out, requires_grad)


def empty(
    *size: Any,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    pin_memory: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """An array of shape ``size``. JAX has no uninitialised memory: it holds zeros."""
    return _filled("empty", size, 0, dtype, device, out, requires_grad)


def _fill_dtype(value: Any) -> Any:
    if hasattr(value, "dtype"):
        return arr(value).dtype
    return _kind_dtype(_scalar_kind(value))


def full(
    size: Sequence[int],
    fill_value: Any,
    *,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """An array of shape ``size`` filled with ``fill_value``; its dtype is inferred from
    the value when ``dtype`` is None (bool, int64, or the default float), as in PyTorch."""
    check_torch_only("full", out, requires_grad)
    dt = out_dtype(dtype) or _fill_dtype(fill_value)
    return place(jnp.full(shape_arg((size,)), arr(fill_value), dt), device)


def _like(input: Any, dtype: Any) -> tuple[tuple[int, ...], Any]:
    x = arr(input)
    return x.shape, out_dtype(dtype) or x.dtype


def zeros_like(
    input: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """Zeros of ``input``'s shape and (unless ``dtype`` is given) dtype."""
    check_torch_only("zeros_like", requires_grad=requires_grad)
    shape, dt = _like(input, dtype)
    return place(jnp.zeros(shape, dt), device)


def ones_like(
    input: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """Ones of ``input``'s shape and dtype."""
    check_torch_only("ones_like", requires_grad=requires_grad)
    shape, dt = _like(input, dtype)
    return place(jnp.ones(shape, dt), device)


def empty_like(
    input: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """An array of ``input``'s shape and dtype (zeros: JAX has no uninitialised memory)."""
    check_torch_only("empty_like", requires_grad=requires_grad)
    shape, dt = _like(input, dtype)
    return place(jnp.zeros(shape, dt), device)


def full_like(
    input: Any,
    fill_value: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """``input``'s shape and dtype, filled with ``fill_value``."""
    check_torch_only("full_like", requires_grad=requires_grad)
    shape, dt = _like(input, dtype)
    return place(jnp.full(shape, arr(fill_value), dt), device)


def _is_float(x: Any) -> bool:
    if hasattr(x, "dtype"):
        return jnp.issubdtype(arr(x).dtype, jnp.inexact)
    return isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral)


def _number(x: Any) -> Any:
    if isinstance(x, jax.core.Tracer) or (state.is_cell(x) and isinstance(arr(x), jax.core.Tracer)):
        raise TypeError(
            "arange/linspace bounds must be concrete numbers: the result's length is fixed when "
            "a program is compiled. Pass them as Python numbers (static arguments)."
        )
    if hasattr(x, "dtype") or state.is_cell(x):
        x = np.asarray(arr(x)).item()
    return x


def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    *,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """``[start, end)`` in steps of ``step``, as ``torch.arange`` (``arange(end)`` too).

    The dtype is int64 (int32 without x64) when all of ``start``, ``end``,
    ``step`` are integers, else the default float dtype.

    Raises:
        RuntimeError: ``step`` is zero or points away from ``end``.
    """
    check_torch_only("arange", out, requires_grad)
    if end is None:
        start, end = 0, start
    floating = any(_is_float(v) for v in (start, end, step))
    start, end, step = _number(start), _number(end), _number(step)
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0 and end != start:
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    n = max(math.ceil((end - start) / step), 0)
    dt = out_dtype(dtype) or (default_float() if floating else long_dtype())
    if jnp.issubdtype(dt, jnp.integer) and not floating:
        x = start + step * jnp.arange(n, dtype=dt)
    else:
        acc = jnp.promote_types(dt, jnp.float32)
        x = (jnp.asarray(start, acc) + jnp.asarray(step, acc) * jnp.arange(n, dtype=acc)).astype(dt)
    return place(x.astype(dt), device)


def linspace(
    start: Any,
    end: Any,
    steps: int,
    *,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """``steps`` evenly spaced values from ``start`` to ``end`` (both included)."""
    check_torch_only("linspace", out, requires_grad)
    steps = _steps(steps)
    dt = out_dtype(dtype) or default_float()
    acc = jnp.promote_types(dt, jnp.float32) if jnp.issubdtype(dt, jnp.inexact) else jnp.float32
    x = jnp.linspace(jnp.asarray(_number(start), acc), jnp.asarray(_number(end), acc), steps)
    return place(x.astype(dt), device)


def _steps(steps: Any) -> int:
    steps = int(steps)
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    return steps


def logspace(
    start: Any,
    end: Any,
    steps: int,
    base: float = 10.0,
    *,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """``base ** linspace(start, end, steps)``, as ``torch.logspace``."""
    check_torch_only("logspace", out, requires_grad)
    steps = _steps(steps)
    dt = out_dtype(dtype) or default_float()
    acc = jnp.promote_types(dt, jnp.float32) if jnp.issubdtype(dt, jnp.inexact) else jnp.float32
    e = jnp.linspace(jnp.asarray(_number(start), acc), jnp.asarray(_number(end), acc), steps)
    return place(jnp.power(jnp.asarray(base, acc), e).astype(dt), device)


def eye(
    n: int,
    m: int | None = None,
    *,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """The ``n x m`` identity matrix (``m`` defaults to ``n``)."""
    check_torch_only("eye", out, requires_grad)
    n, m = shape_arg((n, n if m is None else m))
    return place(jnp.eye(n, m, dtype=out_dtype(dtype) or default_float()), device)


def _matrix(name: str, input: Any) -> jax.Array:
    x = arr(input)
    if x.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    return x


def tril(input: Any, diagonal: int = 0, *, out: Any = None) -> jax.Array:
    """The lower triangle of the last two dims (``diagonal`` shifts it), the rest zero."""
    check_torch_only("tril", out)
    return jnp.tril(_matrix("tril", input), int(diagonal))


def triu(input: Any, diagonal: int = 0, *, out: Any = None) -> jax.Array:
    """The upper triangle of the last two dims (``diagonal`` shifts it), the rest zero."""
    check_torch_only("triu", out)
    return jnp.triu(_matrix("triu", input), int(diagonal))


def tril_indices(
    row: int,
    col: int,
    offset: int = 0,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
) -> jax.Array:
    """A ``2 x N`` array of the (row, column) indices of a ``row x col`` lower triangle,
    in row-major order, as ``torch.tril_indices``."""
    r, c = np.tril_indices(int(row), int(offset), int(col))
    return place(jnp.asarray(np.stack([r, c]), out_dtype(dtype) or long_dtype()), device)


def triu_indices(
    row: int,
    col: int,
    offset: int = 0,
    *,
    dtype: Any = None,
    device: Any = None,
    layout: Any = None,
) -> jax.Array:
    """A ``2 x N`` array of the indices of a ``row x col`` upper triangle, row-major."""
    r, c = np.triu_indices(int(row), int(offset), int(col))
    return place(jnp.asarray(np.stack([r, c]), out_dtype(dtype) or long_dtype()), device)


def meshgrid(*tensors: Any, indexing: str | None = None) -> tuple[jax.Array, ...]:
    """Coordinate grids from 1-d arrays, as ``torch.meshgrid``.

    ``indexing`` is ``"ij"`` (PyTorch's default, used when None) or ``"xy"``.
    A single list of arrays is accepted too.
    """
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    indexing = "ij" if indexing is None else indexing
    if indexing not in ("ij", "xy"):
        raise RuntimeError(
            f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}'
        )
    xs = [arr(t) for t in tensors]
    for x in xs:
        if x.ndim > 1:
            raise RuntimeError(
                f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {x.ndim}D"
            )
    return tuple(jnp.meshgrid(*[x.reshape(-1) for x in xs], indexing=indexing))
