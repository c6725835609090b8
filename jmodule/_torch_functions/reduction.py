"""Reductions, scans, sorting and norms with PyTorch's arguments: ``jm.sum``,
``jm.std`` (unbiased by default, ``correction=``), ``jm.max`` (with ``dim``: a
``(values, indices)`` named tuple), ``jm.topk``, ``jm.sort``, ``jm.cumsum``, ...

Integer and bool sums, products and cumulative sums give int64 (int32 while
JAX's x64 mode is off), as PyTorch's do. ``sum``, ``max``, ``min``, ``all``
and ``any`` are served as ``jm.sum``/... without rebinding Python's builtins
(see :data:`BUILTIN_NAMED`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._convert import torch_scalar_name
from jmodule._torch_functions._common import (
    arr,
    canon_dims,
    compute_dtype,
    float_input,
    long_dtype,
    norm_dim,
    out_dtype,
    return_type,
)
from jmodule.amp import _autocast as _amp

__all__ = [
    "amax",
    "amin",
    "aminmax",
    "argmax",
    "argmin",
    "argsort",
    "bincount",
    "bucketize",
    "count_nonzero",
    "cummax",
    "cummin",
    "cumprod",
    "cumsum",
    "diff",
    "dist",
    "kthvalue",
    "log_softmax",
    "logcumsumexp",
    "logsumexp",
    "mean",
    "median",
    "msort",
    "nanmean",
    "nansum",
    "norm",
    "prod",
    "quantile",
    "searchsorted",
    "softmax",
    "sort",
    "std",
    "std_mean",
    "topk",
    "trace",
    "unique",
    "var",
    "var_mean",
]

# torch.return_types.* named tuples, with PyTorch's field names.
MaxResult = return_type("max", ("values", "indices"))
MinResult = return_type("min", ("values", "indices"))
SortResult = return_type("sort", ("values", "indices"))
TopkResult = return_type("topk", ("values", "indices"))
KthvalueResult = return_type("kthvalue", ("values", "indices"))
MedianResult = return_type("median", ("values", "indices"))
CummaxResult = return_type("cummax", ("values", "indices"))
CumminResult = return_type("cummin", ("values", "indices"))
AminmaxResult = return_type("aminmax", ("min", "max"))

RETURN_TYPES = {
    c.__name__: c
    for c in (
        MaxResult,
        MinResult,
        SortResult,
        TopkResult,
        KthvalueResult,
        MedianResult,
        CummaxResult,
        CumminResult,
        AminmaxResult,
    )
}


def _int_sum_dtype(x: jax.Array, dtype: Any) -> Any:
    if dtype is not None:
        return out_dtype(dtype)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return long_dtype()
    return x.dtype


def _sum(
    input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None, out: Any = None
) -> jax.Array:
    """The sum over ``dim`` (an int, a tuple, or None for all); integers and bools sum to
    int64 (int32 without x64)."""
    x = arr(input)
    dt = _int_sum_dtype(x, dtype)
    axes = canon_dims(dim, x.ndim)
    if jnp.issubdtype(dt, jnp.floating) and jnp.dtype(dt).itemsize < 4:
        # PyTorch casts to a half dtype first and accumulates in float32.
        return jnp.sum(x.astype(dt), axes, dtype=jnp.float32, keepdims=keepdim).astype(dt)
    return jnp.sum(x, axes, dtype=dt, keepdims=keepdim)


def nansum(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> jax.Array:
    """The sum over ``dim``, NaNs counted as zero."""
    x = arr(input)
    return jnp.nansum(x, canon_dims(dim, x.ndim), dtype=_int_sum_dtype(x, dtype), keepdims=keepdim)


def _float_only(name: str, x: jax.Array, dtype: Any) -> jax.Array:
    x = compute_dtype(x, dtype)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(
            f"{name}(): could not infer output dtype. Input dtype must be either a floating "
            f"point or complex dtype. Got: {torch_scalar_name(x.dtype)}"
        )
    return x


def mean(
    input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None, out: Any = None
) -> jax.Array:
    """The mean over ``dim``; floating inputs only (or give ``dtype``), as in PyTorch.

    Raises:
        RuntimeError: an integer input without ``dtype``.
    """
    x = _float_only("mean", arr(input), dtype)
    return jnp.mean(x, canon_dims(dim, x.ndim), keepdims=keepdim)


def nanmean(input: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> jax.Array:
    """The mean over ``dim`` of the non-NaN elements."""
    x = _float_only("nanmean", arr(input), dtype)
    return jnp.nanmean(x, canon_dims(dim, x.ndim), keepdims=keepdim)


def prod(
    input: Any, dim: int | None = None, keepdim: bool = False, *, dtype: Any = None
) -> jax.Array:
    """The product over ``dim`` (one dim, or all); integers give int64 (int32 without x64).
    Under ``jm.autocast`` on CPU it computes in float32, as PyTorch's."""
    x = arr(input)
    (x,) = _amp.cast("prod", x) if dtype is None else _amp.cast_given_dtype("prod", x)
    axis = None if dim is None else norm_dim(dim, x.ndim)
    return jnp.prod(x, axis, dtype=_int_sum_dtype(x, dtype), keepdims=keepdim)


def _moments_args(dim: Any, unbiased: Any, correction: Any) -> tuple[Any, float]:
    if isinstance(dim, bool):  # std(x, True): the legacy ``unbiased`` positional
        dim, unbiased = None, dim
    if correction is not None and unbiased is not None:
        raise RuntimeError("std/var: cannot pass both unbiased and correction")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, float(correction)


def _moments(name: str, input: Any, dim: Any, correction: float, keepdim: bool) -> tuple:
    x = arr(input)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError("std and var only support floating point and complex dtypes")
    return _var_mean(x, canon_dims(dim, x.ndim), correction, keepdim)


@functools.partial(jax.jit, static_argnames=("axes", "correction", "keepdim"))
def _var_mean(x: jax.Array, axes: Any, correction: float, keepdim: bool) -> tuple:
    n = x.size if axes is None else math.prod(x.shape[a] for a in axes)
    m = jnp.mean(x, axes, keepdims=True)
    sq = jnp.abs(x - m) ** 2 if jnp.iscomplexobj(x) else jnp.square(x - m)
    var_ = jnp.sum(sq, axes, keepdims=keepdim) / max(n - correction, 0)
    return var_, (m if keepdim else jnp.squeeze(m, axes))


def var(
    input: Any,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: float | None = None,
    out: Any = None,
) -> jax.Array:
    """The variance over ``dim``, dividing by ``N - correction`` (``correction=1``, the
    unbiased estimate, by default; ``unbiased=False`` is ``correction=0``)."""
    dim, c = _moments_args(dim, unbiased, correction)
    return _moments("var", input, dim, c, keepdim)[0]


def std(
    input: Any,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: float | None = None,
    out: Any = None,
) -> jax.Array:
    """The standard deviation over ``dim`` (unbiased by default; see :func:`var`)."""
    dim, c = _moments_args(dim, unbiased, correction)
    return jnp.sqrt(_moments("std", input, dim, c, keepdim)[0])


def var_mean(
    input: Any,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(var, mean)`` over ``dim``."""
    dim, c = _moments_args(dim, unbiased, correction)
    return _moments("var_mean", input, dim, c, keepdim)


def std_mean(
    input: Any,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(std, mean)`` over ``dim``."""
    dim, c = _moments_args(dim, unbiased, correction)
    v, m = _moments("std_mean", input, dim, c, keepdim)
    return jnp.sqrt(v), m


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") or hasattr(x, "__jax_array__")


def _extreme(name: str, input: Any, dim: Any, keepdim: bool, largest: bool) -> Any:
    x = arr(input)
    if _is_array(dim):
        return (jnp.maximum if largest else jnp.minimum)(x, arr(dim))
    if dim is None:
        if x.size == 0:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument."
            )
        return jnp.max(x) if largest else jnp.min(x)
    d = norm_dim(dim, x.ndim)
    if x.ndim == 0:
        return (MaxResult if largest else MinResult)(x, jnp.zeros((), long_dtype()))
    if x.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
    idx = (jnp.argmax if largest else jnp.argmin)(x, axis=d, keepdims=keepdim)
    values = (jnp.max if largest else jnp.min)(x, axis=d, keepdims=keepdim)
    return (MaxResult if largest else MinResult)(values, idx.astype(long_dtype()))


def _max(input: Any, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> Any:
    """The largest element; with ``dim``, a ``(values, indices)`` named tuple; with an
    array as second argument, the elementwise :func:`maximum`. NaN propagates."""
    return _extreme("max", input, dim, keepdim, True)


def _min(input: Any, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> Any:
    """The smallest element; with ``dim``, a ``(values, indices)`` named tuple."""
    return _extreme("min", input, dim, keepdim, False)


def amax(input: Any, dim: Any = (), keepdim: bool = False, *, out: Any = None) -> jax.Array:
    """The maximum over ``dim`` (an int or tuple; ``()`` means all dims)."""
    x = arr(input)
    return jnp.max(x, canon_dims(dim, x.ndim), keepdims=keepdim)


def amin(input: Any, dim: Any = (), keepdim: bool = False, *, out: Any = None) -> jax.Array:
    """The minimum over ``dim`` (an int or tuple; ``()`` means all dims)."""
    x = arr(input)
    return jnp.min(x, canon_dims(dim, x.ndim), keepdims=keepdim)


def aminmax(input: Any, *, dim: int | None = None, keepdim: bool = False) -> Any:
    """``(min, max)`` as a named tuple with fields ``min`` and ``max``."""
    x = arr(input)
    axis = None if dim is None else norm_dim(dim, x.ndim)
    return AminmaxResult(jnp.min(x, axis, keepdims=keepdim), jnp.max(x, axis, keepdims=keepdim))


def _arg(fn: Any, input: Any, dim: Any, keepdim: bool) -> jax.Array:
    x = arr(input)
    if dim is None:
        i = fn(x.reshape(-1))
        return (i.reshape((1,) * x.ndim) if keepdim else i).astype(long_dtype())
    return fn(x, axis=norm_dim(dim, x.ndim), keepdims=keepdim).astype(long_dtype())


def argmax(input: Any, dim: int | None = None, keepdim: bool = False) -> jax.Array:
    """The index of the largest element (of the flattened array when ``dim`` is None)."""
    return _arg(jnp.argmax, input, dim, keepdim)


def argmin(input: Any, dim: int | None = None, keepdim: bool = False) -> jax.Array:
    """The index of the smallest element (of the flattened array when ``dim`` is None)."""
    return _arg(jnp.argmin, input, dim, keepdim)


def _all(input: Any, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> jax.Array:
    """Whether every element over ``dim`` is non-zero (bool)."""
    x = arr(input)
    return jnp.all(x, canon_dims(dim, x.ndim), keepdims=keepdim)


def _any(input: Any, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> jax.Array:
    """Whether any element over ``dim`` is non-zero (bool)."""
    x = arr(input)
    return jnp.any(x, canon_dims(dim, x.ndim), keepdims=keepdim)


def count_nonzero(input: Any, dim: Any = None) -> jax.Array:
    """The number of non-zero elements over ``dim`` (int64, int32 without x64)."""
    x = arr(input)
    return jnp.count_nonzero(x, canon_dims(dim, x.ndim)).astype(long_dtype())


def _last(x: jax.Array, d: int) -> jax.Array:
    return jnp.moveaxis(x, d, -1)


def topk(
    input: Any,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    out: Any = None,
) -> Any:
    """The ``k`` largest (or, with ``largest=False``, smallest) elements along ``dim``, as a
    ``(values, indices)`` named tuple. Results are always sorted."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    n = x.shape[d] if x.ndim else 1
    k = int(k)
    if not 0 <= k <= n:
        raise RuntimeError("selected index k out of range")
    xl = _last(x, d) if x.ndim else x.reshape(1)
    if largest:
        values, idx = jax.lax.top_k(xl, k)
    else:
        idx = jnp.argsort(xl, axis=-1, stable=True)[..., :k]
        values = jnp.take_along_axis(xl, idx, axis=-1)
    if x.ndim == 0:
        return TopkResult(values.reshape(()) if k else values, idx.astype(long_dtype()))
    return TopkResult(jnp.moveaxis(values, -1, d), jnp.moveaxis(idx, -1, d).astype(long_dtype()))


def _argsort(x: jax.Array, d: int, descending: bool) -> jax.Array:
    # Stable both ways; NaN sorts as the largest value (last ascending, first descending).
    return jnp.argsort(x, axis=d, stable=True, descending=descending)


def sort(input: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
    """Sorted values along ``dim`` and their indices, as a ``(values, indices)`` named
    tuple (always stable; NaN sorts as the largest value)."""
    x = arr(input)
    if x.ndim == 0:
        norm_dim(dim, 0)
        return SortResult(x, jnp.zeros((), long_dtype()))
    d = norm_dim(dim, x.ndim)
    idx = _argsort(x, d, descending)
    return SortResult(jnp.take_along_axis(x, idx, axis=d), idx.astype(long_dtype()))


def argsort(input: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> jax.Array:
    """The indices that sort ``input`` along ``dim`` (stable)."""
    return sort(input, dim, descending, stable).indices


def msort(input: Any) -> jax.Array:
    """Values sorted along dim 0."""
    return sort(input, 0).values


def kthvalue(input: Any, k: int, dim: int = -1, keepdim: bool = False) -> Any:
    """The ``k``-th smallest element (1-based) along ``dim`` and its index."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    n = x.shape[d] if x.ndim else 1
    if not 1 <= int(k) <= n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    s = sort(x, d)
    take = lambda a: jnp.take(a, int(k) - 1, axis=d) if x.ndim else a
    values, idx = take(s.values), take(s.indices)
    if keepdim and x.ndim:
        values, idx = jnp.expand_dims(values, d), jnp.expand_dims(idx, d)
    return KthvalueResult(values, idx)


def median(input: Any, dim: int | None = None, keepdim: bool = False) -> Any:
    """The lower median (of all elements, or along ``dim`` as a ``(values, indices)``
    named tuple), as ``torch.median``."""
    x = arr(input)
    if dim is None:
        flat = jnp.sort(x.reshape(-1))
        return flat[(flat.shape[0] - 1) // 2]
    d = norm_dim(dim, x.ndim)
    n = x.shape[d] if x.ndim else 1
    r = kthvalue(x, (n - 1) // 2 + 1, d, keepdim)
    return MedianResult(r.values, r.indices)


def quantile(
    input: Any,
    q: Any,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    interpolation: str = "linear",
) -> jax.Array:
    """The ``q``-th quantiles along ``dim`` (all elements when None); under
    ``jm.autocast`` on CPU in float32, as PyTorch's."""
    x, q = _amp.cast("quantile", arr(input), q if isinstance(q, (int, float)) else arr(q))
    x = float_input(x)
    axis = None if dim is None else norm_dim(dim, x.ndim)
    return jnp.quantile(
        x, arr(q).astype(x.dtype), axis=axis, keepdims=keepdim, method=interpolation
    )


def cumsum(input: Any, dim: int, *, dtype: Any = None, out: Any = None) -> jax.Array:
    """Cumulative sums along ``dim``; integers give int64 (int32 without x64)."""
    x = arr(input)
    if x.ndim == 0:
        norm_dim(dim, 0)
        return x.astype(_int_sum_dtype(x, dtype))
    return jnp.cumsum(x, norm_dim(dim, x.ndim), dtype=_int_sum_dtype(x, dtype))


def cumprod(input: Any, dim: int, *, dtype: Any = None, out: Any = None) -> jax.Array:
    """Cumulative products along ``dim``; integers give int64 (int32 without x64)."""
    x = arr(input)
    if x.ndim == 0:
        norm_dim(dim, 0)
        return x.astype(_int_sum_dtype(x, dtype))
    return jnp.cumprod(x, norm_dim(dim, x.ndim), dtype=_int_sum_dtype(x, dtype))


def _cum_extreme(input: Any, dim: int, largest: bool) -> tuple[jax.Array, jax.Array]:
    x = arr(input)
    if x.ndim == 0:
        norm_dim(dim, 0)
        return x, jnp.zeros((), long_dtype())
    return _cum_scan(x, norm_dim(dim, x.ndim), largest)


@functools.partial(jax.jit, static_argnames=("d", "largest"))
def _cum_scan(x: jax.Array, d: int, largest: bool) -> tuple[jax.Array, jax.Array]:
    # One compiled kernel (an associative scan is many small ops eagerly).
    i = jax.lax.broadcasted_iota(long_dtype(), x.shape, d)

    def combine(a: tuple, b: tuple) -> tuple:
        (va, ia), (vb, ib) = a, b
        take_b = (vb >= va) if largest else (vb <= va)
        if jnp.issubdtype(va.dtype, jnp.floating):
            take_b = (take_b | jnp.isnan(vb)) & ~(jnp.isnan(va) & ~jnp.isnan(vb))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    return jax.lax.associative_scan(combine, (x, i), axis=d)


def cummax(input: Any, dim: int) -> Any:
    """Running maxima along ``dim`` and their indices, a ``(values, indices)`` named tuple."""
    return CummaxResult(*_cum_extreme(input, dim, True))


def cummin(input: Any, dim: int) -> Any:
    """Running minima along ``dim`` and their indices, a ``(values, indices)`` named tuple."""
    return CumminResult(*_cum_extreme(input, dim, False))


def logcumsumexp(input: Any, dim: int) -> jax.Array:
    """``log(cumsum(exp(input)))`` along ``dim``, computed stably."""
    x = float_input(arr(input))
    return jax.lax.cumlogsumexp(x, axis=norm_dim(dim, x.ndim)) if x.ndim else x


def logsumexp(input: Any, dim: Any, keepdim: bool = False, *, out: Any = None) -> jax.Array:
    """``log(sum(exp(input)))`` over ``dim``, computed stably."""
    x = float_input(arr(input))
    return _logsumexp(x, axis=canon_dims(dim, x.ndim), keepdims=keepdim)


_logsumexp = jax.jit(jax.nn.logsumexp, static_argnames=("axis", "keepdims"))


def _softmax_input(name: str, input: Any, dtype: Any) -> tuple[jax.Array, Any]:
    x = compute_dtype(arr(input), dtype)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise NotImplementedError(
            f"\"{name}_lastdim_kernel_impl\" not implemented for '{torch_scalar_name(x.dtype)}'"
        )
    # Half inputs are computed in float32 and rounded once, as PyTorch's kernels do.
    return x.astype(jnp.promote_types(x.dtype, jnp.float32)), x.dtype


def softmax(input: Any, dim: int, dtype: Any = None) -> jax.Array:
    """``exp(x) / sum(exp(x))`` along ``dim`` (``dtype`` casts the input first)."""
    x, dt = _softmax_input("softmax", input, dtype)
    d = norm_dim(dim, x.ndim)
    return (jax.nn.softmax(x, axis=d) if x.ndim else jnp.ones_like(x)).astype(dt)


def log_softmax(input: Any, dim: int, dtype: Any = None) -> jax.Array:
    """``log(softmax(x, dim))``, computed stably."""
    x, dt = _softmax_input("log_softmax", input, dtype)
    d = norm_dim(dim, x.ndim)
    return (jax.nn.log_softmax(x, axis=d) if x.ndim else jnp.zeros_like(x)).astype(dt)


def vector_norm(x: jax.Array, p: Any, axes: Any, keepdim: bool) -> jax.Array:
    """The ``p``-norm of ``x`` over ``axes`` (None: all)."""
    a = jnp.abs(x)
    if p == math.inf:
        return jnp.max(a, axes, keepdims=keepdim)
    if p == -math.inf:
        return jnp.min(a, axes, keepdims=keepdim)
    if p == 0:
        return jnp.sum(a != 0, axes, keepdims=keepdim).astype(a.dtype)
    if p == 1:
        return jnp.sum(a, axes, keepdims=keepdim)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axes, keepdims=keepdim))
    return jnp.sum(a**p, axes, keepdims=keepdim) ** (1.0 / p)


def norm(
    input: Any,
    p: Any = "fro",
    dim: Any = None,
    keepdim: bool = False,
    out: Any = None,
    dtype: Any = None,
) -> jax.Array:
    """The norm of ``input`` as ``torch.norm``: ``p`` a number (a vector norm over ``dim``,
    all elements when None; ``inf``, ``-inf`` and 0 included), ``"fro"`` (the 2-norm of
    the elements) or ``"nuc"`` (the nuclear norm of matrices in ``dim``)."""
    x = compute_dtype(arr(input), dtype)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. Got "
            f"{torch_scalar_name(x.dtype)}"
        )
    axes = canon_dims(dim, x.ndim)
    if p == "fro":
        return vector_norm(x, 2, axes, keepdim)
    if p == "nuc":
        axes = axes or tuple(range(x.ndim))
        if len(axes) != 2:
            raise RuntimeError("nuclear norm needs exactly two dims")
        moved = jnp.moveaxis(x, axes, (-2, -1))
        s = jnp.linalg.svd(moved, compute_uv=False).sum(-1)
        if keepdim:
            s = jnp.expand_dims(s, tuple(sorted(axes)))
        return s
    if isinstance(p, str):
        raise RuntimeError(f"norm(): unknown p={p!r} (use a number, 'fro' or 'nuc')")
    return vector_norm(x, float(p), axes, keepdim)


def dist(input: Any, other: Any, p: float = 2) -> jax.Array:
    """``norm(input - other, p)``."""
    return vector_norm(float_input(arr(input) - arr(other)), float(p), None, False)


def trace(input: Any) -> jax.Array:
    """The sum of a matrix's diagonal (integers give int64, int32 without x64); under
    ``jm.autocast`` on CPU in float32, as PyTorch's."""
    (x,) = _amp.cast("trace", arr(input))
    if x.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {x.ndim}")
    return jnp.trace(x, dtype=_int_sum_dtype(x, None))


def diff(
    input: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None
) -> jax.Array:
    """The ``n``-th forward difference along ``dim``."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    kw = {}
    if prepend is not None:
        kw["prepend"] = arr(prepend)
    if append is not None:
        kw["append"] = arr(append)
    return jnp.diff(x, int(n), axis=d, **kw)


def searchsorted(
    sorted_sequence: Any,
    input: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Any = None,
) -> jax.Array:
    """Insertion indices of ``input`` into the (last dim of) ``sorted_sequence``."""
    seq, x = arr(sorted_sequence), arr(input)
    side = side or ("right" if right else "left")
    if sorter is not None:
        seq = jnp.take_along_axis(seq, arr(sorter), axis=-1)
    if seq.ndim <= 1:
        out = jnp.searchsorted(seq, x, side=side)
    else:
        fn = lambda s, v: jnp.searchsorted(s, v, side=side)
        for _ in range(seq.ndim - 1):
            fn = jax.vmap(fn)
        out = fn(seq, x)
    return out.astype(jnp.int32 if out_int32 else long_dtype())


def bucketize(
    input: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False
) -> jax.Array:
    """The bucket of each element of ``input`` among the sorted 1-d ``boundaries``
    (``boundaries[i-1] < x <= boundaries[i]``, or ``<=``/``<`` with ``right=True``)."""
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def _eager_only(name: str, x: jax.Array) -> None:
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"jm.{name} has a result whose shape depends on the values of its input, which a "
            "compiled program cannot have. Call it eagerly, outside jm.compile / jax.jit."
        )


def unique(
    input: Any,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
) -> Any:
    """The distinct values (sorted), with the inverse indices and counts when asked, as
    ``torch.unique``. Eager only (the count of values depends on the data)."""
    x = arr(input)
    _eager_only("unique", x)
    axis = None if dim is None else norm_dim(dim, x.ndim)
    vals, inv, counts = np.unique(np.asarray(x), return_inverse=True, return_counts=True, axis=axis)
    out = [jnp.asarray(vals)]
    if return_inverse:
        out.append(jnp.asarray(inv.reshape(x.shape if axis is None else -1), long_dtype()))
    if return_counts:
        out.append(jnp.asarray(counts, long_dtype()))
    return out[0] if len(out) == 1 else tuple(out)


def bincount(input: Any, weights: Any = None, minlength: int = 0) -> jax.Array:
    """How often each non-negative int occurs (weighted when ``weights`` is given). Eager
    only (the length depends on the largest value)."""
    x = arr(input)
    _eager_only("bincount", x)
    length = max(int(np.asarray(x).max()) + 1 if x.size else 0, int(minlength))
    w = None if weights is None else arr(weights)
    out = jnp.bincount(x, w, length=length)
    return out if w is not None else out.astype(long_dtype())


#: Public names that are Python builtins, served by ``jmodule.__getattr__``.
BUILTIN_NAMED = {"sum": _sum, "max": _max, "min": _min, "all": _all, "any": _any}
for _name, _fn in BUILTIN_NAMED.items():
    _fn.__name__ = _fn.__qualname__ = _name
