"""Sliding-block extraction and its inverse, as ``torch.nn.functional.unfold`` / ``fold``.

``unfold`` (PyTorch's ``im2col``) turns ``(N, C, H, W)`` (or unbatched
``(C, H, W)``) input into ``(N, C * kh * kw, L)`` columns, one per block, the
rows ordered channel first, then kernel row, then kernel column. ``fold``
(``col2im``) puts such columns back into an ``(N, C, H, W)`` image, summing
values where blocks overlap. Both are exact data movement (strided slices
and interior padding), so gradients are the adjoint operation, as PyTorch's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule.nn.functional._utils import compute_dtype, jit, ntuple, shape_str
from jmodule.nn.parameter import as_array

__all__ = ["fold", "unfold"]


def _pair(value: Any, what: str, name: str) -> tuple[int, int]:
    out = ntuple(value, 2)
    if len(out) != 2:
        raise RuntimeError(f"{name}: It is expected {what} equals to 2, but got size {len(out)}")
    return int(out[0]), int(out[1])


def _geometry(name: str, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> tuple:
    k = _pair(kernel_size, "kernel_size", name)
    d = _pair(dilation, "dilation", name)
    p = _pair(padding, "padding", name)
    s = _pair(stride, "stride", name)
    if min(k) <= 0:
        raise RuntimeError(
            f"{name}: kernel size should be greater than zero, but got kernel_height: {k[0]} "
            f"kernel_width: {k[1]}"
        )
    if min(s) <= 0:
        raise RuntimeError(
            f"{name}: stride should be greater than zero, but got stride_height: {s[0]} "
            f"stride_width: {s[1]}"
        )
    if min(d) <= 0:
        raise RuntimeError(
            f"{name}: dilation should be greater than zero, but got dilation_height: {d[0]} "
            f"dilation_width: {d[1]}"
        )
    if min(p) < 0:
        raise RuntimeError(
            f"{name}: padding should be non-negative, but got pad_height: {p[0]} pad_width: {p[1]}"
        )
    return k, d, p, s


def _blocks(sizes: tuple, k: tuple, d: tuple, p: tuple, s: tuple) -> tuple[int, int]:
    h, w = (
        (n + 2 * pp - (dd * (kk - 1) + 1)) // ss + 1 for n, kk, dd, pp, ss in zip(sizes, k, d, p, s)
    )
    return h, w


def _pairs(*values: tuple) -> str:
    return ", ".join(f"{name}=({a}, {b})" for name, (a, b) in values)


@jit("kernel_size", "dilation", "padding", "stride")
def _unfold(input: Any, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> jax.Array:
    x = as_array(input)
    if x.ndim not in (3, 4) or any(n == 0 for n in x.shape[-3:]):
        raise RuntimeError(
            "unfold: Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other "
            f"non-zero dimensions for input, but got: {shape_str(x.shape)}"
        )
    batched = x.ndim == 4
    x = x if batched else x[None]
    k, d, p, s = _geometry("unfold", kernel_size, dilation, padding, stride)
    n, c, h, w = x.shape
    bh, bw = _blocks((h, w), k, d, p, s)
    if bh < 1 or bw < 1:
        raise RuntimeError(
            f"unfold: Given input with spatial size ({h}, {w}), "
            + _pairs(("kernel_size", k), ("dilation", d), ("padding", p))
            + f", calculated shape of the array of sliding blocks as ({bh}, {bw}), but its "
            "components must be at least one."
        )
    xp = jnp.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    cols = []
    for i in range(k[0]):
        for j in range(k[1]):
            start = (0, 0, i * d[0], j * d[1])
            limit = (n, c, start[2] + (bh - 1) * s[0] + 1, start[3] + (bw - 1) * s[1] + 1)
            cols.append(jax.lax.slice(xp, start, limit, (1, 1, *s)))
    out = jnp.stack(cols, axis=2).reshape(n, c * k[0] * k[1], bh * bw)
    return out if batched else out[0]


@jit("output_size", "kernel_size", "dilation", "padding", "stride")
def _fold(
    input: Any, output_size: Any, kernel_size: Any, dilation: Any, padding: Any, stride: Any
) -> jax.Array:
    x = as_array(input)
    if x.ndim not in (2, 3) or any(n == 0 for n in x.shape[-2:]):
        raise RuntimeError(
            "fold: Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size "
            f"and non-zero dimensions for input, but got: {shape_str(x.shape)}"
        )
    batched = x.ndim == 3
    x = x if batched else x[None]
    size = _pair(output_size, "output_size", "fold")
    k, d, p, s = _geometry("fold", kernel_size, dilation, padding, stride)
    n, rows, length = x.shape
    if rows % (k[0] * k[1]):
        raise RuntimeError(
            "fold: Expected size of input's dimension 1 to be divisible by the product of "
            f"kernel_size, but got input.size(1)={rows} and kernel_size=({k[0]}, {k[1]})."
        )
    bh, bw = _blocks(size, k, d, p, s)
    if length != bh * bw:
        raise RuntimeError(
            "fold: Given "
            + _pairs(
                ("output_size", size),
                ("kernel_size", k),
                ("dilation", d),
                ("padding", p),
                ("stride", s),
            )
            + ", expected size of input's dimension 2 to match the calculated number of "
            f"sliding blocks {bh} * {bw} = {bh * bw}, but got input.size(2)={length}."
        )
    c = rows // (k[0] * k[1])
    compute = compute_dtype(x.dtype)
    y = x.astype(compute).reshape(n, c, k[0] * k[1], bh, bw)
    hp, wp = size[0] + 2 * p[0], size[1] + 2 * p[1]
    zero = np.array(0, compute)
    total = jnp.zeros((n, c, hp, wp), compute)
    for i in range(k[0]):
        for j in range(k[1]):
            top, left = i * d[0], j * d[1]
            config = [
                (0, 0, 0),
                (0, 0, 0),
                (top, hp - top - (bh - 1) * s[0] - 1, s[0] - 1),
                (left, wp - left - (bw - 1) * s[1] - 1, s[1] - 1),
            ]
            total = total + jax.lax.pad(y[:, :, i * k[1] + j], zero, config)
    out = total[:, :, p[0] : p[0] + size[0], p[1] : p[1] + size[1]].astype(x.dtype)
    return out if batched else out[0]


def unfold(
    input: Any,
    kernel_size: Any,
    dilation: Any = 1,
    padding: Any = 0,
    stride: Any = 1,
) -> jax.Array:
    """Extract sliding local blocks (PyTorch's ``im2col``).

    Args:
        input: ``(N, C, H, W)`` or unbatched ``(C, H, W)``.
        kernel_size: block size (int or pair).
        dilation: spacing of the elements within a block.
        padding: implicit zero padding on both sides of each spatial axis.
        stride: step between blocks.

    Returns:
        ``(N, C * kh * kw, L)`` (or ``(C * kh * kw, L)``), ``L`` the number of
        blocks; rows ordered channel, then kernel row, then kernel column.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.unfold(jnp.arange(9.0).reshape(1, 1, 3, 3), 2)
    Array([[[0., 1., 3., 4.],
            [1., 2., 4., 5.],
            [3., 4., 6., 7.],
            [4., 5., 7., 8.]]], dtype=float32)
    """
    return _unfold(input, kernel_size, dilation, padding, stride)


def fold(
    input: Any,
    output_size: Any,
    kernel_size: Any,
    dilation: Any = 1,
    padding: Any = 0,
    stride: Any = 1,
) -> jax.Array:
    """Combine sliding local blocks into an image, summing overlaps (PyTorch's ``col2im``).

    The inverse layout of :func:`unfold`: ``fold(unfold(x))`` multiplies each
    pixel of ``x`` by the number of blocks covering it.

    Args:
        input: ``(N, C * kh * kw, L)`` or unbatched ``(C * kh * kw, L)``.
        output_size: spatial size ``(H, W)`` of the output (int or pair).
        kernel_size: block size (int or pair).
        dilation: spacing of the elements within a block.
        padding: implicit padding of the output (values there are dropped).
        stride: step between blocks.

    Returns:
        ``(N, C, H, W)`` (or ``(C, H, W)``).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.fold(jnp.ones((1, 4, 4)), (3, 3), 2)[0, 0]
    Array([[1., 2., 1.],
           [2., 4., 2.],
           [1., 2., 1.]], dtype=float32)
    """
    return _fold(input, output_size, kernel_size, dilation, padding, stride)
