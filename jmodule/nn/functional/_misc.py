"""Padding, resampling, pixel shuffles, the bilinear form, channel-wise dropout and
distances (cosine similarity, pairwise and ``pdist``), as in ``torch.nn.functional``."""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import random as _random
from jmodule.nn.functional._pooling import _adaptive_avg
from jmodule.nn.functional._utils import (
    broadcast_shapes,
    check_float,
    clamp_min_straight_through,
    compute_dtype,
    jit,
    ntuple,
    shape_str,
)
from jmodule.nn.parameter import as_array

__all__ = [
    "alpha_dropout",
    "bilinear",
    "channel_shuffle",
    "cosine_similarity",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "feature_alpha_dropout",
    "interpolate",
    "pad",
    "pairwise_distance",
    "pdist",
    "pixel_shuffle",
    "pixel_unshuffle",
]

# ----------------------------------------------------------------------------- pad

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
_PAD_HELP = (
    "Supported combinations for non-constant padding:\n"
    "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
    "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
    "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)"
)


def _crop(x: jax.Array, pairs: list[tuple[int, int]]) -> jax.Array:
    index = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(x.shape, pairs))
    return x[index]


def _pad_op(mode: str, dims: int) -> str | None:
    """The aten op ``F.pad`` dispatches to (its autocast policy applies)."""
    if mode == "reflect":
        return f"reflection_pad{dims}d"
    if mode == "replicate":
        return f"replication_pad{dims}d"
    return None


def _interpolate_op(mode: str, dims: int, antialias: bool) -> str | None:
    """The aten op ``F.interpolate`` dispatches to (its autocast policy applies)."""
    if mode == "area":
        return f"adaptive_avg_pool{dims}d"
    return {
        "nearest": f"upsample_nearest{dims}d",
        "nearest-exact": f"_upsample_nearest_exact{dims}d",
        "linear": "upsample_linear1d",
        "bilinear": "_upsample_bilinear2d_aa" if antialias else "upsample_bilinear2d",
        "bicubic": "_upsample_bicubic2d_aa" if antialias else "upsample_bicubic2d",
        "trilinear": "upsample_trilinear3d",
    }.get(mode)


@jit(
    "pad",
    "mode",
    "value",
    autocast=lambda a: _pad_op(a.get("mode", "constant"), len(a["pad"]) // 2),
)
def pad(input: Any, pad: Any, mode: str = "constant", value: float | None = None) -> jax.Array:
    """Pad the last ``len(pad) // 2`` dimensions, as ``torch.nn.functional.pad``.

    ``pad`` lists (left, right) amounts starting from the last dimension:
    ``(left, right, top, bottom, ...)``. Negative amounts crop.

    Args:
        input: the array.
        pad: an even-length sequence of ints.
        mode: ``'constant'``, ``'reflect'``, ``'replicate'`` or ``'circular'``.
            The last three pad 1-3 trailing dimensions of a batched or
            unbatched input, as PyTorch.
        value: the fill for ``'constant'`` (default 0).

    Raises:
        RuntimeError: odd or too long ``pad``; reflect padding not smaller
            than the dimension; circular padding wrapping more than once.
        NotImplementedError: unknown mode, or an unsupported rank for a
            non-constant mode.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.pad(jnp.array([[1.0, 2.0, 3.0]]), (2, 1), mode="reflect")
    Array([[3., 2., 1., 2., 3., 2.]], dtype=float32)
    """
    x = as_array(input)
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise RuntimeError(f"Padding length must be divisible by 2, got pad={pad}")
    n_dims = len(pad) // 2
    if n_dims > x.ndim:
        raise RuntimeError(
            "Padding length should be less than or equal to two times the input dimension but "
            f"got padding length {len(pad)} and input of dimension {x.ndim}"
        )
    if mode not in _PAD_MODES:
        raise NotImplementedError(
            f"Unrecognised padding mode {mode}; expected one of {sorted(_PAD_MODES)}"
        )
    pairs = [(0, 0)] * (x.ndim - n_dims) + [
        (pad[2 * i], pad[2 * i + 1]) for i in reversed(range(n_dims))
    ]
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    if mode == "constant":
        fill = 0 if value is None else value
        return _crop(jnp.pad(x, grow, constant_values=jnp.asarray(fill, x.dtype)), pairs)
    if value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    if n_dims not in (1, 2, 3) or x.ndim not in (n_dims + 1, n_dims + 2):
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {x.ndim}D input tensor.\n{_PAD_HELP}"
        )
    if mode == "circular":  # PyTorch crops first, then wraps what is left
        x = _crop(x, pairs)
        for axis, (lo, hi) in enumerate(grow):
            if lo > x.shape[axis] or hi > x.shape[axis]:
                raise RuntimeError(
                    "Padding value causes wrapping around more than once: padding "
                    f"({lo}, {hi}) of dimension {axis} of size {x.shape[axis]}"
                )
        return jnp.pad(x, grow, mode="wrap")
    if mode == "reflect":
        for axis, (lo, hi) in enumerate(grow):
            if lo >= x.shape[axis] or hi >= x.shape[axis]:
                raise RuntimeError(
                    "Argument #4: Padding size should be less than the corresponding input "
                    f"dimension, but got: padding ({lo}, {hi}) at dimension {axis} of input "
                    f"{shape_str(x.shape)}"
                )
    return _crop(jnp.pad(x, grow, mode=_PAD_MODES[mode]), pairs)


# ----------------------------------------------------------------------------- interpolate

_INTERP_MODES = ("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")
_LINEAR_RANK = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}
_CUBIC_A = -0.75


def _scale(n: int, o: int, align_corners: bool, scale: float | None, f: Any) -> Any:
    """PyTorch's ``area_pixel_compute_scale`` in the compute precision ``f``."""
    if align_corners:
        return f(n - 1) / f(o - 1) if o > 1 else f(0)
    if scale is not None and scale > 0:
        return f(1.0 / scale)
    return f(n) / f(o)


def _nearest(n: int, o: int, scale: float | None, exact: bool) -> np.ndarray:
    i = np.arange(o)
    if o == n:
        return i
    if o == 2 * n and not exact:
        return i >> 1
    s = (
        np.float32(1.0 / scale)
        if scale is not None and scale > 0
        else np.float32(n) / np.float32(o)
    )
    src = (i.astype(np.float32) + np.float32(0.5 if exact else 0.0)) * s
    return np.minimum(np.floor(src).astype(np.int64), n - 1)


def _linear_taps(
    n: int, o: int, align_corners: bool, scale: float | None, cubic: bool, f: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each ``(o, taps)``, of linear or cubic interpolation."""
    s = _scale(n, o, align_corners, scale, f)
    i = np.arange(o).astype(f)
    src = s * i if align_corners else s * (i + f(0.5)) - f(0.5)
    if not cubic:
        src = np.maximum(src, f(0))
    base = np.minimum(np.floor(src).astype(np.int64), n - 1)
    t = np.clip(src - base.astype(f), f(0), f(1)).astype(f)
    if not cubic:
        idx = np.stack([base, np.minimum(base + 1, n - 1)], axis=1)
        return idx, np.stack([f(1) - t, t], axis=1)
    a = f(_CUBIC_A)

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1).astype(f)
    idx = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, n - 1)
    return idx, weights


def _resample_axis(y: jax.Array, axis: int, idx: np.ndarray, weights: np.ndarray | None) -> Any:
    if weights is None:
        return jnp.take(y, jnp.asarray(idx), axis=axis)
    taps = jnp.take(y, jnp.asarray(idx.reshape(-1)), axis=axis)
    taps = taps.reshape(y.shape[:axis] + idx.shape + y.shape[axis + 1 :])
    w = jnp.asarray(weights.reshape(weights.shape + (1,) * (y.ndim - axis - 1)), y.dtype)
    return (taps * w).sum(axis + 1)


@jit(
    "size",
    "scale_factor",
    "mode",
    "align_corners",
    "recompute_scale_factor",
    "antialias",
    autocast=lambda a: _interpolate_op(
        a.get("mode", "nearest"), a["input"].ndim - 2, a.get("antialias", False)
    ),
)
def interpolate(
    input: Any,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> jax.Array:
    """Resize ``(N, C, *spatial)`` input, as ``torch.nn.functional.interpolate``.

    Source positions, weights and rounding follow PyTorch's kernels
    (computed once, in float32, when the call is traced).

    Args:
        input: 3-D, 4-D or 5-D input.
        size: output spatial size (int or tuple).
        scale_factor: multiplier(s) for the spatial size (output size is
            ``floor(size * scale)``).
        mode: ``'nearest'``, ``'nearest-exact'``, ``'linear'`` (3-D),
            ``'bilinear'``/``'bicubic'`` (4-D), ``'trilinear'`` (5-D) or ``'area'``.
        align_corners: for the interpolating modes: map corner pixel
            centres onto each other (default False).
        recompute_scale_factor: compute the kernel's scale from the sizes
            rather than use ``scale_factor``.
        antialias: not supported (raises).

    Raises:
        ValueError: neither or both of ``size`` and ``scale_factor``;
            ``align_corners`` with a non-interpolating mode.
        NotImplementedError: a mode that does not fit the input's rank, an
            unknown mode, or ``antialias=True``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.interpolate(jnp.array([[[1.0, 3.0]]]), scale_factor=2, mode="linear")
    Array([[[1. , 1.5, 2.5, 3. ]]], dtype=float32)
    """
    x = as_array(input)
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError(
                "align_corners option can only be set with the interpolating modes: "
                "linear | bilinear | bicubic | trilinear"
            )
    elif align_corners is None:
        align_corners = False
    nd = x.ndim - 2
    if mode not in _INTERP_MODES or nd not in (1, 2, 3):
        raise NotImplementedError(
            f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {x.ndim}D) for the "
            f"modes: {' | '.join(_INTERP_MODES)} (got {mode})"
        )
    need = _LINEAR_RANK.get(mode)
    if need is not None and need != x.ndim:
        raise NotImplementedError(f"Got {x.ndim}D input, but {mode} mode needs {need}D input")
    if antialias:
        raise NotImplementedError(
            "interpolate(antialias=True) is not implemented in jmodule; use antialias=False "
            "(the same result for upsampling) or pre-filter with avg_pool2d before downsampling"
        )
    sizes, scales = _output_size(x, nd, size, scale_factor, recompute_scale_factor)
    if not mode.startswith("nearest"):
        check_float(x, f"interpolate(mode={mode!r})")
    if mode == "area":
        return _adaptive_avg(nd, x, sizes)
    f = np.float64 if x.dtype == jnp.float64 else np.float32
    compute = compute_dtype(x.dtype)
    y = x if mode.startswith("nearest") else x.astype(compute)
    for i, (n, o, s) in enumerate(zip(x.shape[2:], sizes, scales)):
        if mode.startswith("nearest"):
            y = _resample_axis(y, 2 + i, _nearest(n, o, s, mode == "nearest-exact"), None)
        else:
            idx, w = _linear_taps(n, o, bool(align_corners), s, mode == "bicubic", f)
            y = _resample_axis(y, 2 + i, idx, w)
    return y.astype(x.dtype)


def _output_size(
    x: jax.Array, nd: int, size: Any, scale_factor: Any, recompute: bool | None
) -> tuple[tuple[int, ...], tuple]:
    if (size is None) == (scale_factor is None):
        raise ValueError(
            "either size or scale_factor should be defined"
            if size is None
            else "only one of size or scale_factor should be defined"
        )
    spatial = tuple(x.shape[2:])
    if size is not None:
        if recompute:
            raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
        sizes = tuple(int(s) for s in ntuple(size, nd))
        if len(sizes) != nd:
            raise ValueError(
                "Input and output must have the same number of spatial dimensions, but got "
                f"input with spatial dimensions of {list(spatial)} and output size of {size}. "
                "Please provide input tensor in (N, C, d1, d2, ...,dK) format and output size "
                "in (o1, o2, ...,oK) format."
            )
        scales: tuple = (None,) * nd
    else:
        factors = tuple(float(s) for s in ntuple(scale_factor, nd))
        if len(factors) != nd:
            raise ValueError(
                "Input and scale_factor must have the same number of spatial dimensions, but "
                f"got input with spatial dimensions of {list(spatial)} and scale_factor of "
                f"shape {scale_factor}. Please provide input tensor in (N, C, d1, d2, ...,dK) "
                "format and scale_factor in (s1, s2, ...,sK) format."
            )
        sizes = tuple(math.floor(n * s) for n, s in zip(spatial, factors))
        scales = (None,) * nd if recompute else factors
    if any(o <= 0 for o in sizes):
        raise ValueError(
            f"Input and output sizes should be greater than 0, but got input {spatial} "
            f"and output {sizes}"
        )
    return sizes, scales


# ----------------------------------------------------------------------------- shuffles


@jit("upscale_factor")
def pixel_shuffle(input: Any, upscale_factor: int) -> jax.Array:
    """``(*, C * r**2, H, W) -> (*, C, H * r, W * r)``, as ``F.pixel_shuffle``.

    Raises:
        RuntimeError: fewer than 3 dimensions, or channels not divisible by ``r**2``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.pixel_shuffle(jnp.ones((1, 8, 2, 3)), 2).shape
    (1, 2, 4, 6)
    """
    x, r = as_array(input), int(upscale_factor)
    if x.ndim < 3:
        raise RuntimeError(
            f"pixel_shuffle expects input to have at least 3 dimensions, but got input with "
            f"{x.ndim} dimension(s)"
        )
    c, h, w = x.shape[-3:]
    if c % (r * r):
        raise RuntimeError(
            "pixel_shuffle expects its input's 'channel' dimension to be divisible by the "
            f"square of upscale_factor, but input.size(-3)={c} is not divisible by {r * r}"
        )
    lead = x.shape[:-3]
    y = x.reshape((*lead, c // (r * r), r, r, h, w))
    k = len(lead)
    y = jnp.transpose(y, (*tuple(range(k)), k, k + 3, k + 1, k + 4, k + 2))
    return y.reshape((*lead, c // (r * r), h * r, w * r))


@jit("downscale_factor")
def pixel_unshuffle(input: Any, downscale_factor: int) -> jax.Array:
    """``(*, C, H * r, W * r) -> (*, C * r**2, H, W)``, the inverse of :func:`pixel_shuffle`.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.pixel_unshuffle(jnp.ones((1, 2, 4, 6)), 2).shape
    (1, 8, 2, 3)
    """
    x, r = as_array(input), int(downscale_factor)
    if x.ndim < 3:
        raise RuntimeError(
            f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with "
            f"{x.ndim} dimension(s)"
        )
    c, h, w = x.shape[-3:]
    if h % r or w % r:
        raise RuntimeError(
            f"pixel_unshuffle expects height ({h}) and width ({w}) to be divisible by "
            f"downscale_factor ({r})"
        )
    lead = x.shape[:-3]
    y = x.reshape((*lead, c, h // r, r, w // r, r))
    k = len(lead)
    y = jnp.transpose(y, (*tuple(range(k)), k, k + 2, k + 4, k + 1, k + 3))
    return y.reshape((*lead, c * r * r, h // r, w // r))


@jit("groups")
def channel_shuffle(input: Any, groups: int) -> jax.Array:
    """Interleave ``groups`` channel groups: ``(N, g * k, *) -> (N, k * g, *)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.channel_shuffle(jnp.arange(4.0).reshape(1, 4, 1), 2)[0, :, 0]
    Array([0., 2., 1., 3.], dtype=float32)
    """
    x = as_array(input)
    if x.ndim < 3:
        raise RuntimeError(
            f"channel_shuffle expects input to have at least 3 dimensions, but got input with "
            f"{x.ndim} dimension(s)"
        )
    if groups <= 0 or x.shape[1] % groups:
        raise RuntimeError(
            f"Number of channels must be divisible by groups. Got {x.shape[1]} channels and "
            f"{groups} groups."
        )
    n, c = x.shape[:2]
    y = x.reshape((n, groups, c // groups, *x.shape[2:]))
    return jnp.swapaxes(y, 1, 2).reshape(x.shape)


# ----------------------------------------------------------------------------- bilinear


@jit(autocast="bilinear")
def bilinear(input1: Any, input2: Any, weight: Any, bias: Any = None) -> jax.Array:
    """``y[..., o] = x1 @ weight[o] @ x2 + bias[o]``, as ``F.bilinear``.

    Args:
        input1: ``(*, in1)``.
        input2: ``(*, in2)`` with the same leading dimensions.
        weight: ``(out, in1, in2)``.
        bias: optional ``(out,)``.

    Raises:
        RuntimeError: feature sizes or leading dimensions do not match.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.bilinear(jnp.ones((4, 2)), jnp.ones((4, 3)), jnp.ones((5, 2, 3))).shape
    (4, 5)
    """
    x1, x2, w = as_array(input1), as_array(input2), as_array(weight)
    if w.ndim != 3:
        raise RuntimeError(f"bilinear(): weight must be 3-D, got shape {tuple(w.shape)}")
    for i, x in ((1, x1), (2, x2)):
        if x.ndim == 0 or x.shape[-1] != w.shape[i]:
            got = x.shape[-1] if x.ndim else "a scalar"
            raise RuntimeError(
                f"bilinear(): input{i} size does not match weight size: got {got} but "
                f"expected {w.shape[i]} (input{i} shape {tuple(x.shape)}, weight shape "
                f"{tuple(w.shape)})"
            )
    if x1.shape[:-1] != x2.shape[:-1]:
        raise RuntimeError(
            f"bilinear(): input batch dimensions do not match: got {shape_str(x1.shape[:-1])} "
            f"and {shape_str(x2.shape[:-1])}"
        )
    dtype = jnp.result_type(x1.dtype, x2.dtype, w.dtype)
    compute = compute_dtype(dtype)
    out = jnp.einsum(
        "...i,oij,...j->...o",
        x1.astype(dtype),
        w.astype(dtype),
        x2.astype(dtype),
        preferred_element_type=compute,
    )
    if bias is not None:
        out = out + as_array(bias).astype(compute)
    return out.astype(dtype)


# ----------------------------------------------------------------------------- distances


def _check_dim(dim: int, ndim: int) -> int:
    low, high = (-ndim, ndim - 1) if ndim else (-1, 0)
    if not low <= dim <= high:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{low}, {high}], but got {dim})"
        )
    return dim % max(ndim, 1)


def _vector_norm(d: jax.Array, p: float, axis: int, keepdim: bool = False) -> jax.Array:
    """PyTorch's ``norm(d, p, axis)``, with its zero (not NaN) gradients at a zero vector."""
    a = jnp.sign(d) * d  # |d| with PyTorch's gradient sign(d): 0 at 0
    if p == math.inf:
        return a.max(axis, keepdims=keepdim)
    if p == -math.inf:
        return a.min(axis, keepdims=keepdim)
    if p == 0:
        return (d != 0).sum(axis, keepdims=keepdim).astype(d.dtype)
    if p == 1:
        return a.sum(axis, keepdims=keepdim)
    s = (jnp.square(d) if p == 2 else a**p).sum(axis, keepdims=keepdim)
    if p < 0:
        return s ** (1.0 / p)
    positive = s > 0
    safe = jnp.where(positive, s, 1)
    root = jnp.sqrt(safe) if p == 2 else safe ** (1.0 / p)
    return jnp.where(positive, root, 0)


@jit("dim", autocast="cosine_similarity")
def cosine_similarity(x1: Any, x2: Any, dim: int = 1, eps: float = 1e-8) -> jax.Array:
    """Cosine similarity along ``dim``, as ``torch.nn.functional.cosine_similarity``.

    ``x1`` and ``x2`` broadcast together. As in PyTorch 2.x each norm is
    clamped on its own, ``sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps))``
    (not ``x1·x2 / max(|x1||x2|, eps)``), and the clamp passes gradients
    through unchanged, as PyTorch's does.

    Raises:
        RuntimeError: shapes that do not broadcast, or integer inputs.
        IndexError: ``dim`` out of range.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x = jnp.array([[1.0, 0.0], [1.0, 1.0]])
    >>> F.cosine_similarity(x, jnp.array([[2.0, 0.0], [0.0, 2.0]])).round(4)
    Array([1.    , 0.7071], dtype=float32)
    """
    x1, x2 = as_array(x1), as_array(x2)
    dtype = jnp.result_type(x1, x2)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise RuntimeError(
            f"expected common dtype to be floating point, yet common dtype is {dtype}"
        )
    shape = broadcast_shapes(x1.shape, x2.shape)
    axis = _check_dim(dim, len(shape))
    compute = compute_dtype(dtype)
    view = shape if shape else (1,)
    x1 = jnp.broadcast_to(x1.astype(compute), shape).reshape(view)
    x2 = jnp.broadcast_to(x2.astype(compute), shape).reshape(view)
    n1 = clamp_min_straight_through(_vector_norm(x1, 2, axis, keepdim=True), eps)
    n2 = clamp_min_straight_through(_vector_norm(x2, 2, axis, keepdim=True), eps)
    out = ((x1 / n1) * (x2 / n2)).sum(axis)
    return out.reshape(shape[:axis] + shape[axis + 1 :]).astype(dtype)


@jit("p", "keepdim")
def pairwise_distance(
    x1: Any, x2: Any, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> jax.Array:
    """The ``p``-norm of ``x1 - x2 + eps`` over the last axis, as ``F.pairwise_distance``.

    ``x1`` and ``x2`` broadcast together; ``p`` may be any real, ``inf`` or
    ``-inf`` (``p=0`` counts the nonzero differences), as ``torch.norm``.
    Integer inputs give float32 distances.

    Raises:
        RuntimeError: shapes that do not broadcast.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.pairwise_distance(jnp.array([[3.0, 4.0]]), jnp.zeros((1, 2)), eps=0.0)
    Array([5.], dtype=float32)
    """
    x1, x2 = as_array(x1), as_array(x2)
    dtype = jnp.result_type(x1, x2)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.float32
    shape = broadcast_shapes(x1.shape, x2.shape)
    compute = compute_dtype(dtype)
    d = x1.astype(compute) - x2.astype(compute) + eps
    if not shape:
        return _vector_norm(d.reshape(1), p, -1).astype(dtype)
    return _vector_norm(d, p, -1, keepdim).astype(dtype)


@jit("p", autocast="pdist")
def pdist(input: Any, p: float = 2) -> jax.Array:
    """``p``-norm distances between the rows of ``(N, M)`` input, as ``torch.nn.functional.pdist``.

    Returns the upper triangle of the distance matrix, row by row: ``N(N-1)/2``
    values (``i < j``). Gradients at zero distances are zero, as PyTorch's.

    Raises:
        RuntimeError: input not 2-D or not floating point, or ``p < 0``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.pdist(jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])).round(4)
    Array([5.    , 1.    , 4.2426], dtype=float32)
    """
    x = as_array(input)
    if x.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {x.ndim}D")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise RuntimeError("pdist only supports floating-point dtypes")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    i, j = np.triu_indices(x.shape[0], 1)
    xc = x.astype(compute_dtype(x.dtype))
    return _vector_norm(xc[i] - xc[j], p, -1).astype(x.dtype)


# ----------------------------------------------------------------------------- dropout

_ALPHA = 1.7580993408473766  # -SELU's negative saturation value: scale * alpha


def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _noise_shape(x: jax.Array, feature: bool) -> tuple[int, ...]:
    if feature and x.ndim < 2:
        raise RuntimeError(
            f"Feature dropout requires at least 2 dimensions in the input, got shape "
            f"{tuple(x.shape)}"
        )
    return x.shape[:2] + (1,) * (x.ndim - 2) if feature else x.shape


def _feature_dropout(x: jax.Array, p: float, training: bool) -> jax.Array:
    if not training or p == 0.0 or x.size == 0:
        return x
    if p == 1.0:
        return x * jnp.zeros((), x.dtype)
    _noise_shape(x, feature=True)
    return _masked(x, _random.next_key(), p)


@jit("p")
def _masked(x: jax.Array, key: jax.Array, p: float) -> jax.Array:
    keep = jax.random.bernoulli(key, 1.0 - p, _noise_shape(x, feature=True))
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - p), x.dtype), jnp.zeros((), x.dtype))


def _alpha(x: jax.Array, p: float, training: bool, feature: bool) -> jax.Array:
    if not training or p == 0.0 or x.size == 0:
        return x
    if p == 1.0:
        return x * jnp.zeros((), x.dtype)
    _noise_shape(x, feature)
    return _alpha_masked(x, _random.next_key(), p, feature)


@jit("p", "feature")
def _alpha_masked(x: jax.Array, key: jax.Array, p: float, feature: bool) -> jax.Array:
    keep = jax.random.bernoulli(key, 1.0 - p, _noise_shape(x, feature))
    keep = keep.astype(compute_dtype(x.dtype))
    a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
    b = (keep - 1) * (_ALPHA * a) + _ALPHA * a * p
    return (x.astype(keep.dtype) * (keep * a) + b).astype(x.dtype)


def _unbatched(fn: Any, x: jax.Array, batched: bool) -> jax.Array:
    return fn(x) if batched else fn(x[None])[0]


def dropout1d(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` input with probability ``p``.

    Survivors are scaled by ``1 / (1 - p)``; masks come from the default
    generator (``jm.manual_seed``).

    Raises:
        ValueError: ``p`` outside [0, 1].
        RuntimeError: the input is not 2-D or 3-D.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.dropout1d(jnp.ones((2, 3, 4)), 0.5, training=False).shape
    (2, 3, 4)
    """
    _check_p(p)
    x = as_array(input)
    if x.ndim not in (2, 3):
        raise RuntimeError(
            f"dropout1d: Expected 2D or 3D input, but received a {x.ndim}D input (shape "
            f"{tuple(x.shape)}). Note that dropout1d exists to provide channel-wise dropout on "
            "inputs with 1 spatial dimension, a channel dimension, and an optional batch "
            "dimension (i.e. 2D or 3D inputs)."
        )
    return _unbatched(lambda v: _feature_dropout(v, p, training), x, x.ndim == 3)


def _deprecated_rank(name: str, ndim: int, spatial: int) -> None:
    warnings.warn(
        f"{name}: Received a {ndim}-D input to {name}, which is deprecated and will result "
        "in an error in a future release. To retain the behavior and silence this warning, "
        f"please use dropout instead. Note that {name} exists to provide channel-wise "
        f"dropout on inputs with {spatial} spatial dimensions, a channel dimension, and an "
        f"optional batch dimension (i.e. {spatial + 1}D or {spatial + 2}D inputs).",
        UserWarning,
        stacklevel=3,
    )


def dropout2d(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """Zero whole channels of ``(N, C, H, W)`` input with probability ``p``.

    As PyTorch, a 3-D input is treated as batched ``(N, C, L)`` (1-D
    channel-wise dropout), with PyTorch's warning.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.dropout2d(jnp.ones((2, 3, 4, 4)), 0.0).shape
    (2, 3, 4, 4)
    """
    _check_p(p)
    x = as_array(input)
    if x.ndim not in (3, 4):
        _deprecated_rank("dropout2d", x.ndim, 2)
    if x.ndim == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D "
            "dropout behavior is desired - input is interpreted as shape (N, C, L), where C "
            "is the channel dim. This behavior will change in a future release to interpret "
            "the input as one without a batch dimension, i.e. shape (C, H, W). To maintain "
            "the 1D channel-wise dropout behavior, please switch to using dropout1d instead.",
            UserWarning,
            stacklevel=2,
        )
    return _feature_dropout(x, p, training)


def dropout3d(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """Zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.dropout3d(jnp.ones((3, 2, 2, 2)), training=False).shape
    (3, 2, 2, 2)
    """
    _check_p(p)
    x = as_array(input)
    if x.ndim not in (4, 5):
        _deprecated_rank("dropout3d", x.ndim, 3)
    return _unbatched(lambda v: _feature_dropout(v, p, training), x, x.ndim == 5)


def alpha_dropout(input: Any, p: float = 0.5, training: bool = False, inplace: bool = False) -> Any:
    """Dropout that keeps SELU activations' zero mean and unit variance.

    Dropped elements are set to SELU's negative saturation value, then the
    whole output is affinely rescaled, as PyTorch's ``alpha_dropout``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.alpha_dropout(jnp.ones(3), 0.2)
    Array([1., 1., 1.], dtype=float32)
    """
    _check_p(p)
    return _alpha(as_array(input), p, training, feature=False)


def feature_alpha_dropout(
    input: Any, p: float = 0.5, training: bool = False, inplace: bool = False
) -> Any:
    """:func:`alpha_dropout` of whole channels (dimension 1).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.feature_alpha_dropout(jnp.ones((2, 3)), 0.2).shape
    (2, 3)
    """
    _check_p(p)
    return _alpha(as_array(input), p, training, feature=True)
