"""Max, average, power-average and adaptive pooling and max unpooling, as in
``torch.nn.functional``.

Windows run over the trailing 1, 2 or 3 dimensions of ``(N, C, *spatial)``
(or unbatched ``(C, *spatial)``) input. Max pooling over windows of up to
:data:`TAP_LIMIT` elements runs PyTorch's own loop over each window (one
strided slice per window element), so values, indices and gradients pick
the element PyTorch picks: the first maximum, the last NaN, the first
element inside the input of an all ``-inf`` window; its gradient is one
scatter-add. Larger max windows and average pooling lower to
``jax.lax.reduce_window`` (the gradient of a max goes to the first
maximum). Indices (``return_indices=True``) are
flat positions within each input plane, as PyTorch's, with JAX's default
integer dtype (int32 unless x64 is enabled; PyTorch returns int64);
``max_unpool*d`` takes them back (any integer dtype).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule.nn.functional._utils import (
    autocast_op,
    check_float,
    compute_dtype,
    concrete,
    jit,
    ntuple,
    shape_str,
)
from jmodule.nn.parameter import as_array

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "lp_pool1d",
    "lp_pool2d",
    "lp_pool3d",
    "max_pool1d",
    "max_pool1d_with_indices",
    "max_pool2d",
    "max_pool2d_with_indices",
    "max_pool3d",
    "max_pool3d_with_indices",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
]


def index_dtype() -> Any:
    """PyTorch's int64 where JAX allows it (x64 mode), else int32."""
    return jax.dtypes.canonicalize_dtype(jnp.int64)


def _batched(x: jax.Array, nd: int, name: str) -> tuple[jax.Array, bool]:
    if x.ndim == nd + 2:
        return x, True
    if x.ndim == nd + 1:
        return x[None], False
    raise RuntimeError(
        f"{name}: expected a {nd + 1}D (unbatched) or {nd + 2}D (batched) input, got input "
        f"of size {shape_str(x.shape)}"
    )


def _ints(value: Any, nd: int, what: str, name: str) -> tuple[int, ...]:
    out = ntuple(value, nd)
    if len(out) == 1 and nd > 1:
        out = out * nd
    if len(out) != nd:
        raise RuntimeError(f"{name}: {what} must either be a single int, or a tuple of {nd} ints")
    return tuple(int(v) for v in out)


class _Windows:
    """Window geometry of one pooling call (static Python ints)."""

    def __init__(
        self,
        nd: int,
        name: str,
        sizes: tuple,
        kernel_size: Any,
        stride: Any,
        padding: Any,
        dilation: Any,
        ceil_mode: bool,
    ) -> None:
        self.k = _ints(kernel_size, nd, "kernel_size", name)
        self.s = self.k if stride is None or stride == [] else _ints(stride, nd, "stride", name)
        self.p = _ints(padding, nd, "padding", name)
        self.d = _ints(dilation, nd, "dilation", name)
        self.out = []
        self.pads = []
        for n, k, s, p, d in zip(sizes, self.k, self.s, self.p, self.d):
            eff = d * (k - 1) + 1
            if p > eff // 2:
                raise RuntimeError(
                    f"{name}: pad should be at most half of effective kernel size, but got "
                    f"pad={p}, kernel_size={k} and dilation={d}"
                )
            span = n + 2 * p - eff
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= n + p:
                o -= 1  # the last window must start inside the input or left padding
            self.out.append(o)
            needed = (o - 1) * s + eff
            self.pads.append((p, max(needed - n - p, p)))
        if any(o < 1 for o in self.out):
            raise RuntimeError(
                f"{name}: given input size: ({'x'.join(map(str, sizes))}). Calculated output "
                f"size: ({'x'.join(map(str, self.out))}). Output size is too small"
            )

    def reduce(self, operands: Any, init: Any, fn: Any) -> Any:
        """``reduce_window`` over the spatial axes, cropped to the output size."""
        out = jax.lax.reduce_window(
            operands,
            init,
            fn,
            (1, 1, *self.k),
            (1, 1, *self.s),
            [(0, 0), (0, 0), *self.pads],
            window_dilation=(1, 1, *self.d),
        )
        crop = (slice(None), slice(None), *tuple(slice(0, o) for o in self.out))
        return jax.tree.map(lambda a: a[crop], out)


def _lowest(dtype: Any) -> Any:
    if jnp.issubdtype(dtype, jnp.floating):
        return np.array(-np.inf, dtype)
    return np.array(jnp.iinfo(dtype).min, dtype)


@jit("nd", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
def _max_pool(
    nd: int,
    input: Any,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    return_indices: bool,
) -> Any:
    name = f"max_pool{nd}d"
    x, batched = _batched(as_array(input), nd, name)
    win = _Windows(nd, name, x.shape[2:], kernel_size, stride, padding, dilation, ceil_mode)
    if _tiles(win, x.shape[2:]):
        result = _tile_max(x, win, return_indices)
    elif math.prod(win.k) <= TAP_LIMIT:
        result = _tap_max(x, win, return_indices)
    elif any(d != 1 for d in win.d):
        # JAX cannot differentiate a dilated reduce_window max: gather the windows.
        result = _gather_max(x, _dilated_tables(win, x.shape[2:]), return_indices)
    else:
        result = _reduce_max(x, win, return_indices)
    if batched:
        return result
    return tuple(r[0] for r in result) if return_indices else result[0]


#: Windows of at most this many elements pool as PyTorch's own loop over one
#: strided slice of the padded input per window element, so that values,
#: indices and gradients follow PyTorch's rule: the first maximum of each
#: window wins, except that a NaN wins over anything before it (the last NaN
#: wins); a window of only ``-inf`` picks its first element inside the input.
#: The output is then a gather of the winners (its gradient one scatter-add).
#: Larger windows lower to one ``reduce_window`` of (value, position) pairs by
#: the same rule, and a gather of the winners.
TAP_LIMIT = 64


def _replaces(challenger: jax.Array, best: jax.Array) -> jax.Array:
    """PyTorch's max-pool rule, the one every max-pool path here follows.

    PyTorch's CPU kernel walks each window in order, from ``-inf`` on its first
    element inside the input, and moves to a later element that is strictly
    greater or NaN. So ties go to the first maximum, the last NaN wins, and a
    window of only ``-inf`` picks its first element inside the input. This says
    whether a later element ``challenger`` replaces ``best``.
    """
    return (challenger > best) | (challenger != challenger)


def _torch_max_reducer(a: tuple, b: tuple) -> tuple:
    """The winner of two window elements ``(value, position)`` by :func:`_replaces`.

    The walk's rule made pairwise, for reductions (``reduce_window``,
    ``lax.reduce``) that may pair elements in any order: whichever of the two comes
    later replaces the other as the walk would. Padding has a position after
    every element of the input.
    """
    (av, ai), (bv, bi) = a, b
    take_b = jnp.where(bi > ai, _replaces(bv, av), ~_replaces(av, bv))
    return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)


def _tap_max(x: jax.Array, win: _Windows, return_indices: bool) -> Any:
    """Max pooling as PyTorch's loop over the window, one strided slice per element."""
    sizes = x.shape[2:]
    low = _lowest(x.dtype)
    grids = np.meshgrid(*(np.arange(o) for o in win.out), indexing="ij")
    index, flat, inside = [], [], []
    for offsets in itertools.product(*(range(n) for n in win.k)):
        index.append(
            tuple(
                slice(j * d, j * d + s * (o - 1) + 1, s)
                for j, d, s, o in zip(offsets, win.d, win.s, win.out)
            )
        )
        pos, ok = [], np.ones(win.out, bool)
        for j, d, s, (lo, _), g, n in zip(offsets, win.d, win.s, win.pads, grids, sizes):
            at = g * s + j * d - lo  # the position in the input (not the padded input)
            ok &= (at >= 0) & (at < n)
            pos.append(np.clip(at, 0, n - 1))
        flat.append(np.ravel_multi_index(tuple(pos), sizes).astype(np.int32))
        inside.append(None if ok.all() else ok)
    first = np.select([np.ones(win.out, bool) if m is None else m for m in inside], flat)

    def winners(v: jax.Array) -> jax.Array:
        """The flat input position of each window's winner."""
        # PyTorch's loop: start at -inf on the first element inside the input,
        # move on a strictly greater value or a NaN (so the last NaN wins).
        vp = jnp.pad(v, ((0, 0), (0, 0), *win.pads), constant_values=low)
        best, at = jnp.full(v.shape[:2] + tuple(win.out), low, v.dtype), jnp.asarray(first)
        for i, f, ok in zip(index, flat, inside):
            t = vp[(slice(None), slice(None), *i)]
            move = _replaces(t, best)
            if ok is not None:
                move = move & ok
            best, at = jnp.where(move, t, best), jnp.where(move, f, at)
        return at

    # The output is a gather of the winners from the input, so its derivative
    # is too: JAX transposes the gather into one scatter-add for the gradient
    # (reduce_window's own gradient, select-and-scatter, took 2-3x PyTorch's
    # time for ResNet's pool on the CPU; this form 0.6x), and forward mode
    # and higher derivatives work as for any gather.
    at = winners(jax.lax.stop_gradient(x))
    n, c = x.shape[:2]
    out = jnp.take_along_axis(
        x.reshape(n, c, -1), at.reshape(n, c, -1), axis=-1, mode="promise_in_bounds"
    ).reshape(at.shape)
    if not return_indices:
        return out
    return out, at.astype(index_dtype())


def _tiles(win: _Windows, sizes: tuple) -> bool:
    """Whether the windows tile the input: no padding or dilation, stride = kernel size.

    ``MaxPool2d(2)``, the pool of most small convnets. Such windows are the
    input reshaped (``(N, C, H / 2, 2, W / 2, 2)``), so their winners need no
    gather and their gradient no scatter-add (:func:`_tile_max`).
    """
    return (
        math.prod(win.k) <= TAP_LIMIT
        and all(d == 1 for d in win.d)
        and all(p == 0 for p in win.p)
        and tuple(win.k) == tuple(win.s)
        and all(o * k <= n for o, k, n in zip(win.out, win.k, sizes))
    )


def _window_walk(t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The winner of each window (the last axis of ``t``) by PyTorch's walk: value, position.

    One reduction of (value, position) pairs (:func:`_torch_max_reducer`), so
    XLA computes the winners once: an elementwise form of the walk would be
    repeated inside every fusion that reads the winners.
    """
    pos = jax.lax.broadcasted_iota(jnp.int32, t.shape, t.ndim - 1)
    init = (_lowest(t.dtype), np.array(np.iinfo(np.int32).max, np.int32))
    return tuple(jax.lax.reduce((t, pos), init, _torch_max_reducer, (t.ndim - 1,)))


@jax.custom_jvp
def _window_max(t: jax.Array) -> jax.Array:
    """The winner of each window (the last axis of ``t``); its derivative reaches the
    winning element only (PyTorch's max-pool gradient)."""
    return _window_walk(t)[0]


@_window_max.defjvp
def _window_max_jvp(primals: tuple, tangents: tuple) -> tuple:
    (t,), (dt,) = primals, tangents
    # The winners are constants of the derivative (as a gather's indices are), and the
    # value is this function again, so higher derivatives follow the same rule.
    at = _window_walk(jax.lax.stop_gradient(t))[1]
    onehot = jax.lax.broadcasted_iota(jnp.int32, t.shape, t.ndim - 1) == at[..., None]
    return _window_max(t), jnp.sum(jnp.where(onehot, dt, jnp.zeros_like(dt)), axis=-1)


def _tap_slices(x: jax.Array, k: tuple[int, ...], out: tuple[int, ...]) -> list[jax.Array]:
    """The element at each window position (in walk order) of windows that tile ``x``."""
    return [
        x[(slice(None), slice(None), *(slice(j, j + o * m, m) for j, o, m in zip(at, out, k)))]
        for at in itertools.product(*(range(m) for m in k))
    ]


def _windows_last(x: jax.Array, k: tuple[int, ...], out: tuple[int, ...]) -> jax.Array:
    """``(N, C, *out, prod(k))``: the windows tiling ``x``, each along the last axis."""
    nd = len(k)
    x = x[(slice(None), slice(None), *(slice(0, o * m) for o, m in zip(out, k)))]
    t = x.reshape(*x.shape[:2], *(v for o, m in zip(out, k) for v in (o, m)))
    order = (*range(2, 2 + 2 * nd, 2), *range(3, 3 + 2 * nd, 2))
    return t.transpose(0, 1, *order).reshape(*x.shape[:2], *out, math.prod(k))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _tiles_max(x: jax.Array, k: tuple[int, ...], out: tuple[int, ...]) -> jax.Array:
    """The largest element of each window tiling ``x`` (NaN if any is NaN).

    Its value is the elementwise maximum of one strided slice per window
    element, which XLA computes in one pass (about 2x faster than the reduction
    over windows moved last, on the CPU); its derivative is that reduction's
    (:func:`_window_max`), so gradients reach the walk's winner only.
    """
    return functools.reduce(jnp.maximum, _tap_slices(x, k, out))


@_tiles_max.defjvp
def _tiles_max_jvp(k: tuple, out: tuple, primals: tuple, tangents: tuple) -> tuple:
    return jax.jvp(lambda v: _window_max(_windows_last(v, k, out)), primals, tangents)


def _tile_max(x: jax.Array, win: _Windows, return_indices: bool) -> Any:
    """Max pooling over windows that tile the input (see :func:`_tiles`).

    The windows are a reshape and a transpose of the input, the winner of
    each is found by PyTorch's walk (:func:`_window_walk`), and the gradient
    is a one-hot mask of the winners times the output gradient: elementwise
    work XLA fuses, where a gather's gradient is a scatter-add (measured in
    the small CNN of ``benchmarks/models.py``: its two pools' gathers, index
    tables and scatters took 1.5 ms of a 3.7 ms training step on the CPU).
    """
    nd = x.ndim - 2
    k, out, sizes = tuple(win.k), tuple(win.out), x.shape[2:]
    if not return_indices:  # the value by slices: about 2x faster (see _tiles_max)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            return _tiles_max(x, k, out)
        return functools.reduce(jnp.maximum, _tap_slices(x, k, out))
    t = _windows_last(x, k, out)
    if jnp.issubdtype(t.dtype, jnp.inexact):
        result = _window_max(t)
    else:  # nothing to differentiate
        result = _window_walk(t)[0]
    at = _window_walk(jax.lax.stop_gradient(t))[1]
    flat = jnp.zeros(at.shape, jnp.int32)
    rest = at
    for j in range(nd):
        inner = math.prod(k[j + 1 :])
        offset, rest = rest // inner, rest % inner
        shape = [1] * (2 + nd)
        shape[2 + j] = out[j]
        origin = jnp.arange(out[j], dtype=jnp.int32).reshape(shape) * k[j]
        flat = flat * sizes[j] + origin + offset
    return result, flat.astype(index_dtype())


def _reduce_max(x: jax.Array, win: _Windows, return_indices: bool) -> Any:
    """Large windows: one ``reduce_window`` of (value, position) pairs by the rule, then a
    gather of the winners (so the gradient reaches the winner, as in PyTorch)."""
    low = _lowest(x.dtype)
    spatial = x.shape[2:]
    positions = jnp.arange(math.prod(spatial), dtype=index_dtype()).reshape(spatial)
    positions = jnp.broadcast_to(positions, x.shape)
    big = np.array(jnp.iinfo(positions.dtype).max, positions.dtype)
    _, idx = win.reduce((jax.lax.stop_gradient(x), positions), (low, big), _torch_max_reducer)
    n, c = x.shape[:2]
    out = jnp.take_along_axis(
        x.reshape(n, c, -1), idx.reshape(n, c, -1), axis=-1, mode="promise_in_bounds"
    ).reshape(idx.shape)
    return (out, idx) if return_indices else out


def _avg_divisor(win: _Windows, sizes: tuple, count_include_pad: bool) -> np.ndarray:
    """Per-output window sizes, PyTorch's way: clipped to the padded input
    (``count_include_pad``) or to the input itself."""
    divisor = np.ones((), np.float64)
    for n, k, s, p, o in zip(sizes, win.k, win.s, win.p, win.out):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        if count_include_pad:
            count = end - start
        else:
            count = np.minimum(end, n) - np.maximum(start, 0)
        divisor = np.multiply.outer(divisor, count)
    return divisor


@jit("nd", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
def _avg_pool(
    nd: int,
    input: Any,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Any,
) -> jax.Array:
    name = f"avg_pool{nd}d"
    x, batched = _batched(check_float(as_array(input), name), nd, name)
    win = _Windows(nd, name, x.shape[2:], kernel_size, stride, padding, 1, ceil_mode)
    compute = compute_dtype(x.dtype)
    total = win.reduce(x.astype(compute), np.array(0, compute), jax.lax.add)
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError(f"{name}: divisor must be not zero")
        out = total / divisor_override
    else:
        divisor = _avg_divisor(win, x.shape[2:], count_include_pad)
        out = total / jnp.asarray(divisor, compute)
    out = out.astype(x.dtype)
    return out if batched else out[0]


def max_pool1d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """1-D max pooling over ``(N, C, L)`` or ``(C, L)`` input.

    Args:
        input: the input.
        kernel_size: window size.
        stride: window step (default ``kernel_size``).
        padding: implicit ``-inf`` padding on both sides (at most half the window).
        dilation: spacing between window elements.
        ceil_mode: round the output size up (windows starting in the right
            padding are dropped, as PyTorch).
        return_indices: also return the flat input position of each maximum.

    Returns:
        The pooled array, or ``(pooled, indices)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.max_pool1d(jnp.array([[1.0, 3.0, 2.0, 5.0]]), 2)
    Array([[3., 5.]], dtype=float32)
    """
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """2-D max pooling over ``(N, C, H, W)`` input (arguments as :func:`max_pool1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.max_pool2d(jnp.ones((1, 1, 5, 5)), 3, stride=2, padding=1).shape
    (1, 1, 3, 3)
    """
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _max_pool3d_op(args: tuple, kwargs: dict) -> str | None:
    """PyTorch's aten op for the call: ``max_pool3d`` has an autocast policy on CPU, the
    ``max_pool3d_with_indices`` that ``return_indices=True`` runs has none."""
    indices = kwargs.get("return_indices", args[6] if len(args) > 6 else False)
    return None if indices else "max_pool3d"


@autocast_op(_max_pool3d_op)
def max_pool3d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """3-D max pooling over ``(N, C, D, H, W)`` input (arguments as :func:`max_pool1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.max_pool3d(jnp.ones((1, 1, 4, 4, 4)), 2).shape
    (1, 1, 2, 2, 2)
    """
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool1d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> jax.Array:
    """1-D average pooling over ``(N, C, L)`` or ``(C, L)`` input.

    Args:
        input: the input.
        kernel_size: window size.
        stride: window step (default ``kernel_size``).
        padding: implicit zero padding on both sides (at most half the window).
        ceil_mode: round the output size up.
        count_include_pad: count padding zeros in the divisor.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.avg_pool1d(jnp.array([[1.0, 3.0, 2.0, 6.0]]), 2)
    Array([[2., 4.]], dtype=float32)
    """
    return _avg_pool(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> jax.Array:
    """2-D average pooling (arguments as :func:`avg_pool1d`).

    Args:
        divisor_override: divide every window sum by this instead.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.avg_pool2d(jnp.ones((1, 1, 4, 4)), 2, divisor_override=1)[0, 0, 0, 0]
    Array(4., dtype=float32)
    """
    return _avg_pool(
        2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@autocast_op("avg_pool3d")
def avg_pool3d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> jax.Array:
    """3-D average pooling (arguments as :func:`avg_pool2d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.avg_pool3d(jnp.ones((1, 1, 4, 4, 4)), 2).shape
    (1, 1, 2, 2, 2)
    """
    return _avg_pool(
        3, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


# ----------------------------------------------------------------------------- adaptive


def _adaptive_sizes(output_size: Any, x: jax.Array, nd: int, name: str) -> tuple[int, ...]:
    sizes = ntuple(output_size, nd)
    if len(sizes) != nd:
        raise RuntimeError(f"{name}: output_size must be {nd} (got {output_size!r})")
    out = tuple(x.shape[2 + i] if s is None else int(s) for i, s in enumerate(sizes))
    if any(s < 0 for s in out):
        raise RuntimeError(f"{name}: output_size must be non-negative (got {output_size!r})")
    return out


def _adaptive_input(input: Any, nd: int, name: str) -> tuple[jax.Array, bool]:
    x = as_array(input)
    if x.ndim not in (nd + 1, nd + 2) or any(s == 0 for s in x.shape[-nd:]):
        raise RuntimeError(
            f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor with non-zero spatial sizes, "
            f"but got {shape_str(x.shape)}"
        )
    return (x, True) if x.ndim == nd + 2 else (x[None], False)


def adaptive_windows(n: int, o: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows of ``n`` inputs for ``o`` outputs: an
    ``(o, max_width)`` index table (clamped) and its validity mask."""
    i = np.arange(o)
    start = (i * n) // o
    end = ((i + 1) * n + o - 1) // o
    width = int((end - start).max()) if o else 1
    idx = start[:, None] + np.arange(width)[None, :]
    valid = idx < end[:, None]
    return np.minimum(idx, n - 1), valid


@jit("nd", "output_size")
def _adaptive_avg(nd: int, input: Any, output_size: Any) -> jax.Array:
    name = f"adaptive_avg_pool{nd}d"
    x, batched = _adaptive_input(check_float(as_array(input), name), nd, name)
    outs = _adaptive_sizes(output_size, x, nd, name)
    compute = compute_dtype(x.dtype)
    y = x.astype(compute)
    count = np.ones((), np.float64)
    for i, o in enumerate(outs):
        axis = 2 + i
        n = y.shape[axis]
        if o and n % o == 0:  # equal windows: a reshape
            y = y.reshape((*y.shape[:axis], o, n // o, *y.shape[axis + 1 :])).sum(axis + 1)
            count = np.multiply.outer(count, np.full(o, n // o))
            continue
        idx, valid = adaptive_windows(n, o)
        gathered = jnp.take(y, jnp.asarray(idx.reshape(-1)), axis=axis)
        gathered = gathered.reshape(y.shape[:axis] + idx.shape + y.shape[axis + 1 :])
        mask = jnp.asarray(valid.reshape(valid.shape + (1,) * (y.ndim - axis - 1)), compute)
        y = (gathered * mask).sum(axis + 1)
        count = np.multiply.outer(count, valid.sum(1))
    out = (y / jnp.asarray(count, compute)).astype(x.dtype)
    return out if batched else out[0]


def _gather_max(
    x: jax.Array, tables: list[tuple[np.ndarray, np.ndarray]], return_indices: bool
) -> Any:
    """Max over arbitrary windows of batched ``x``: one ``(out, width)`` index
    table and validity mask per spatial axis. One gather of every window, then
    one reduction of (value, place in the window) pairs by the rule
    (:func:`_torch_max_reducer`), so values, indices and the gradient (to the
    winner only) are PyTorch's."""
    nd = len(tables)
    spatial = x.shape[2:]
    outs = tuple(idx.shape[0] for idx, _ in tables)
    flat = np.zeros((1,) * (2 * nd), np.int64)
    valid = np.ones((1,) * (2 * nd), bool)
    step = 1
    for i in reversed(range(nd)):
        idx, ok = tables[i]
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = idx.shape
        flat = flat + np.clip(idx, 0, spatial[i] - 1).reshape(shape) * step
        valid = valid & ok.reshape(shape)
        step *= spatial[i]
    n_out, width = math.prod(outs), math.prod(flat.shape[nd:])
    flat = np.broadcast_to(flat, outs + flat.shape[nd:]).reshape(n_out, width)
    valid = np.broadcast_to(valid, outs + valid.shape[nd:]).reshape(n_out, width)
    planes = x.reshape((*x.shape[:2], -1))
    windows = jnp.take(planes, jnp.asarray(flat.reshape(-1)), axis=2)
    windows = windows.reshape((*x.shape[:2], n_out, width))
    low = _lowest(x.dtype)
    windows = jnp.where(jnp.asarray(valid), windows, low)
    big = np.iinfo(np.int32).max
    order = jnp.broadcast_to(
        jnp.asarray(np.where(valid, np.arange(width, dtype=np.int32), big)), windows.shape
    )
    _, arg = jax.lax.reduce(
        (jax.lax.stop_gradient(windows), order),
        (np.array(low, windows.dtype), np.int32(big)),
        _torch_max_reducer,
        (windows.ndim - 1,),
    )
    arg = arg[..., None]
    out = jnp.take_along_axis(windows, arg, axis=-1)[..., 0].reshape(x.shape[:2] + outs)
    if not return_indices:
        return out
    positions = jnp.asarray(flat, index_dtype())
    idx = jnp.take_along_axis(positions[None, None], arg, axis=-1)
    return out, idx[..., 0].reshape(x.shape[:2] + outs)


def _dilated_tables(win: _Windows, sizes: tuple) -> list[tuple[np.ndarray, np.ndarray]]:
    tables = []
    for n, k, s, p, d, o in zip(sizes, win.k, win.s, win.p, win.d, win.out):
        pos = (np.arange(o) * s - p)[:, None] + np.arange(k)[None, :] * d
        tables.append((pos, (pos >= 0) & (pos < n)))
    return tables


@jit("nd", "output_size", "return_indices")
def _adaptive_max(nd: int, input: Any, output_size: Any, return_indices: bool) -> Any:
    name = f"adaptive_max_pool{nd}d"
    x, batched = _adaptive_input(input, nd, name)
    outs = _adaptive_sizes(output_size, x, nd, name)
    tables = [adaptive_windows(n, o) for n, o in zip(x.shape[2:], outs)]
    result = _gather_max(x, tables, return_indices)
    if batched:
        return result
    return tuple(r[0] for r in result) if return_indices else result[0]


def adaptive_avg_pool1d(input: Any, output_size: Any) -> jax.Array:
    """Average pooling to a fixed output length, PyTorch's windows.

    Output ``i`` averages inputs ``floor(i * L / out)`` to ``ceil((i + 1) * L / out)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.adaptive_avg_pool1d(jnp.array([[1.0, 2.0, 3.0]]), 2)
    Array([[1.5, 2.5]], dtype=float32)
    """
    return _adaptive_avg(1, input, output_size)


def adaptive_avg_pool2d(input: Any, output_size: Any) -> jax.Array:
    """2-D adaptive average pooling; ``output_size`` entries may be None (keep size).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.adaptive_avg_pool2d(jnp.ones((1, 2, 5, 7)), (1, None)).shape
    (1, 2, 1, 7)
    """
    return _adaptive_avg(2, input, output_size)


@autocast_op("adaptive_avg_pool3d")
def adaptive_avg_pool3d(input: Any, output_size: Any) -> jax.Array:
    """3-D adaptive average pooling.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.adaptive_avg_pool3d(jnp.ones((1, 2, 3, 4, 5)), 1).shape
    (1, 2, 1, 1, 1)
    """
    return _adaptive_avg(3, input, output_size)


def adaptive_max_pool1d(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    """Max pooling to a fixed output length (windows as :func:`adaptive_avg_pool1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.adaptive_max_pool1d(jnp.array([[1.0, 4.0, 3.0]]), 2)
    Array([[4., 4.]], dtype=float32)
    """
    return _adaptive_max(1, input, output_size, return_indices)


def adaptive_max_pool2d(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    """2-D adaptive max pooling.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.adaptive_max_pool2d(jnp.ones((1, 2, 5, 7)), 2).shape
    (1, 2, 2, 2)
    """
    return _adaptive_max(2, input, output_size, return_indices)


@autocast_op("adaptive_max_pool3d")
def adaptive_max_pool3d(input: Any, output_size: Any, return_indices: bool = False) -> Any:
    """3-D adaptive max pooling.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.adaptive_max_pool3d(jnp.ones((1, 2, 3, 4, 5)), 1).shape
    (1, 2, 1, 1, 1)
    """
    return _adaptive_max(3, input, output_size, return_indices)


# ----------------------------------------------------------------------------- with indices


def max_pool1d_with_indices(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """:func:`max_pool1d` returning ``(pooled, indices)`` whatever ``return_indices`` says.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.max_pool1d_with_indices(jnp.array([[1.0, 3.0, 2.0, 5.0]]), 2)[1]
    Array([[1, 3]], dtype=int32)
    """
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """:func:`max_pool2d` returning ``(pooled, indices)`` whatever ``return_indices`` says.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.max_pool2d_with_indices(jnp.arange(16.0).reshape(1, 4, 4), 2)[1]
    Array([[[ 5,  7],
            [13, 15]]], dtype=int32)
    """
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool3d_with_indices(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """:func:`max_pool3d` returning ``(pooled, indices)`` whatever ``return_indices`` says.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.max_pool3d_with_indices(jnp.arange(8.0).reshape(1, 2, 2, 2), 2)[1]
    Array([[[[7]]]], dtype=int32)
    """
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, True)


# ----------------------------------------------------------------------------- power average


@jit("nd", "norm_type", "kernel_size", "stride", "ceil_mode")
def _lp_pool(
    nd: int, input: Any, norm_type: float, kernel_size: Any, stride: Any, ceil_mode: bool
) -> jax.Array:
    name = f"lp_pool{nd}d"
    x = check_float(as_array(input), name)
    if nd == 1 and not isinstance(kernel_size, int):
        raise TypeError(f"{name}: kernel_size must be an int, got {kernel_size!r}")
    if norm_type == math.inf:
        return _max_pool(nd, jnp.abs(x), kernel_size, stride, 0, 1, ceil_mode, False)
    if norm_type == -math.inf:
        return -_max_pool(nd, -jnp.abs(x), kernel_size, stride, 0, 1, ceil_mode, False)
    area = math.prod(_ints(kernel_size, nd, "kernel_size", name))
    root = 1.0 / norm_type
    out = _avg_pool(nd, jnp.power(x, norm_type), kernel_size, stride, 0, ceil_mode, True, None)
    # PyTorch's expression, its gradient included: zero where a window's sum is
    # zero, NaN (passed on, as PyTorch's relu does) where it is NaN.
    size = jnp.abs(out)
    size = jnp.where(size <= 0, jnp.zeros_like(size), size)
    return jnp.power(jnp.sign(out) * size * area, root)


def lp_pool1d(
    input: Any,
    norm_type: float,
    kernel_size: int,
    stride: Any = None,
    ceil_mode: bool = False,
) -> jax.Array:
    """1-D power-average pooling: ``(sum of x ** p over each window) ** (1 / p)``.

    Computed as PyTorch does (an average pool of ``x ** p`` times the window
    size), so windows of negative sums give NaN for even roots, odd ``p``
    keeps signs, ``ceil_mode`` windows cut by the input's end are rescaled by
    ``kernel_size / count``, and ``p = inf`` is a max pool of ``abs(x)``.

    Args:
        input: ``(N, C, L)`` or ``(C, L)``.
        norm_type: the power ``p`` (not zero).
        kernel_size: window size (an int, as PyTorch requires).
        stride: window step (default ``kernel_size``).
        ceil_mode: round the output size up.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.lp_pool1d(jnp.array([[3.0, 4.0, 1.0, 0.0]]), 2, 2).round(4)
    Array([[5., 1.]], dtype=float32)
    """
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(
    input: Any,
    norm_type: float,
    kernel_size: Any,
    stride: Any = None,
    ceil_mode: bool = False,
) -> jax.Array:
    """2-D power-average pooling over ``(N, C, H, W)`` or ``(C, H, W)`` (as :func:`lp_pool1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.lp_pool2d(jnp.ones((1, 1, 4, 4)), 1, 2)
    Array([[[[4., 4.],
             [4., 4.]]]], dtype=float32)
    """
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


@autocast_op("avg_pool3d")
def lp_pool3d(
    input: Any,
    norm_type: float,
    kernel_size: Any,
    stride: Any = None,
    ceil_mode: bool = False,
) -> jax.Array:
    """3-D power-average pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.lp_pool3d(jnp.ones((1, 1, 2, 2, 2)), 2, 2).round(4)
    Array([[[[[2.8284]]]]], dtype=float32)
    """
    return _lp_pool(3, input, norm_type, kernel_size, stride, ceil_mode)


# ----------------------------------------------------------------------------- unpooling


def _unpool_size(
    nd: int, name: str, x: jax.Array, kernel_size: Any, stride: Any, padding: Any, output_size: Any
) -> tuple[int, ...]:
    """PyTorch's ``_unpool_output_size``: the default ``(in - 1) * s - 2p + k``,
    or ``output_size`` (last ``nd`` of ``nd`` or ``nd + 2`` entries) within a
    stride of it."""
    k = _ints(kernel_size, nd, "kernel_size", name)
    s = k if stride is None else _ints(stride, nd, "stride", name)
    p = _ints(padding, nd, "padding", name)
    default = [(x.shape[-nd + i] - 1) * s[i] + k[i] - 2 * p[i] for i in range(nd)]
    if output_size is None:
        return tuple(default)
    sizes = [int(v) for v in ntuple(output_size, nd)]
    if len(sizes) == nd + 2:
        sizes = sizes[2:]
    if len(sizes) != nd:
        raise ValueError(
            f"output_size should be a sequence containing {nd} or {nd + 2} elements, but it has "
            f"a length of '{len(sizes)}'"
        )
    for i in range(nd):
        low, high = default[i] - s[i], default[i] + s[i]
        if not low < sizes[i] < high:
            raise ValueError(
                f'invalid output_size "{output_size}" (dim {i} must be between {low} and {high})'
            )
    return tuple(sizes)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _scatter_planes(values: jax.Array, positions: jax.Array, plane: int) -> jax.Array:
    """``(N, C, plane)`` zeros with ``values`` written at ``positions`` (both
    ``(N, C, M)``; out-of-range positions dropped). Its derivative is a
    scatter-add, so the gradient of every value is the output gradient at its
    position, repeated positions included, as PyTorch's ``max_unpool``."""
    return _scatter(values, positions, plane, add=False)


@_scatter_planes.defjvp
def _scatter_planes_jvp(plane: int, primals: tuple, tangents: tuple) -> tuple:
    values, positions = primals
    return _scatter_planes(values, positions, plane), _scatter(
        tangents[0], positions, plane, add=True
    )


def _scatter(values: jax.Array, positions: jax.Array, plane: int, add: bool) -> jax.Array:
    n, c, _ = values.shape
    positions = jnp.where(positions < 0, plane, positions)  # out of range, not wrapped
    where = jnp.zeros((n, c, plane), values.dtype).at[
        jnp.arange(n)[:, None, None], jnp.arange(c)[None, :, None], positions
    ]
    return where.add(values, mode="drop") if add else where.set(values, mode="drop")


@jit("nd", "size")
def _max_unpool(nd: int, input: jax.Array, indices: jax.Array, size: tuple) -> jax.Array:
    batched = input.ndim == nd + 2
    x, idx = (input, indices) if batched else (input[None], indices[None])
    n, c = x.shape[:2]
    flat = _scatter_planes(x.reshape(n, c, -1), idx.reshape(n, c, -1), math.prod(size))
    out = flat.reshape((n, c, *size))
    return out if batched else out[0]


def _unpool(
    nd: int,
    input: Any,
    indices: Any,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    output_size: Any,
) -> jax.Array:
    name = f"max_unpool{nd}d"
    x, idx = as_array(input), as_array(indices)
    if x.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(
            f"{name}: Input to max_unpooling{nd}d should be a {nd + 1}d or {nd + 2}d Tensor, but "
            f"got a tensor with {x.ndim} dimensions."
        )
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        raise RuntimeError(
            f"{name}: elements in indices should be an integer type but got: {idx.dtype}"
        )
    if idx.shape != x.shape:
        raise RuntimeError(
            f"{name}: Expected shape of indices to be same as that of the input tensor "
            f"({shape_str(x.shape)}) but got indices tensor with shape: {shape_str(idx.shape)}"
        )
    size = _unpool_size(nd, name, x, kernel_size, stride, padding, output_size)
    if any(v < 0 for v in size):
        raise ValueError(
            f"{name}: output_size must contain non-negative spatial dimensions, but got {size}"
        )
    values = concrete(idx)
    plane = math.prod(size)
    if values is not None and values.size and (values.min() < 0 or values.max() >= plane):
        bad = values.min() if values.min() < 0 else values.max()
        raise RuntimeError(
            f"{name}: Found an invalid max index: {int(bad)} (output volumes are of size "
            f"{'x'.join(map(str, size))})"
        )
    return _max_unpool(nd, x, idx, size)


@autocast_op("max_unpool2d")
def max_unpool1d(
    input: Any,
    indices: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    output_size: Any = None,
) -> jax.Array:
    """Partial inverse of :func:`max_pool1d`: each value goes back to its index, zeros elsewhere.

    Args:
        input: pooled ``(N, C, L)`` or ``(C, L)`` values.
        indices: the flat positions ``max_pool1d(..., return_indices=True)``
            returned (same shape as ``input``; any integer dtype).
        kernel_size: the pooling's window size.
        stride: the pooling's step (default ``kernel_size``).
        padding: the pooling's padding.
        output_size: the unpooled size (``L`` or ``(N, C, L)``), to undo a
            floor in the pooling's output size; default
            ``(L_in - 1) * stride - 2 * padding + kernel_size``.

    Raises:
        RuntimeError: an index outside the output (checked when ``indices``
            is concrete; inside a trace such values are dropped).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x = jnp.array([[1.0, 3.0, 2.0, 5.0]])
    >>> out, idx = F.max_pool1d(x, 2, return_indices=True)
    >>> F.max_unpool1d(out, idx, 2)
    Array([[0., 3., 0., 5.]], dtype=float32)
    """
    return _unpool(1, input, indices, kernel_size, stride, padding, output_size)


@autocast_op("max_unpool2d")
def max_unpool2d(
    input: Any,
    indices: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    output_size: Any = None,
) -> jax.Array:
    """Partial inverse of :func:`max_pool2d` (arguments as :func:`max_unpool1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x = jnp.arange(25.0).reshape(1, 1, 5, 5)
    >>> out, idx = F.max_pool2d(x, 2, return_indices=True)
    >>> F.max_unpool2d(out, idx, 2, output_size=x.shape).shape
    (1, 1, 5, 5)
    """
    return _unpool(2, input, indices, kernel_size, stride, padding, output_size)


@autocast_op("max_unpool3d")
def max_unpool3d(
    input: Any,
    indices: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    output_size: Any = None,
) -> jax.Array:
    """Partial inverse of :func:`max_pool3d` (arguments as :func:`max_unpool1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> out, idx = F.max_pool3d(jnp.ones((1, 2, 4, 4, 4)), 2, return_indices=True)
    >>> F.max_unpool3d(out, idx, 2).sum()
    Array(16., dtype=float32)
    """
    return _unpool(3, input, indices, kernel_size, stride, padding, output_size)
