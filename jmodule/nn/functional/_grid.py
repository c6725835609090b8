"""Spatial transformer sampling, ``affine_grid`` and ``grid_sample``, as in ``torch.nn.functional``.

Coordinate unnormalisation, border clipping and reflection follow PyTorch's
``GridSampler`` kernels (``grid_sampler_compute_source_index``), so values and
the gradients with respect to both the input and the grid match
``torch.autograd``. Sampling gathers from the flattened spatial plane.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._convert import torch_scalar_name
from jmodule.nn.functional._utils import autocast_op, check_float, jit, shape_str
from jmodule.nn.parameter import as_array

__all__ = ["affine_grid", "grid_sample"]

_DEFAULT_WARNING = (
    "Default grid_sample and affine_grid behavior has changed to align_corners=False since "
    "1.3.0. Please specify align_corners=True if the old behavior is desired. See the "
    "documentation of grid_sample for details."
)
_CUBIC_A = -0.75

# ----------------------------------------------------------------------------- affine_grid


def _base_coords(steps: int, align_corners: bool) -> np.ndarray:
    """PyTorch's ``linspace_from_neg_one``."""
    if steps <= 1:
        return np.zeros((steps,), np.float64)
    r = np.linspace(-1.0, 1.0, steps)
    return r if align_corners else r * (steps - 1) / steps


@jit("size", "align_corners")
def _affine_grid(theta: jax.Array, size: tuple[int, ...], align_corners: bool) -> jax.Array:
    spatial = size[2:]
    axes = [_base_coords(n, align_corners) for n in reversed(spatial)]  # x (W) first
    mesh = np.meshgrid(*axes, indexing="ij")  # each of shape (W, H[, D])
    base = np.stack([*mesh, np.ones_like(mesh[0])], axis=-1)  # (W, H[, D], d + 1)
    base = np.transpose(base, (*reversed(range(len(spatial))), len(spatial)))
    base = jnp.asarray(base.reshape(-1, len(spatial) + 1), theta.dtype)  # (P, d + 1)
    grid = jnp.einsum("pk,nik->npi", base, theta, precision=jax.lax.Precision.HIGHEST)
    return grid.reshape((size[0], *spatial, len(spatial)))


@autocast_op("bmm")
def affine_grid(theta: Any, size: Any, align_corners: bool | None = None) -> jax.Array:
    """Sampling grid for a batch of affine matrices, as ``torch.nn.functional.affine_grid``.

    Args:
        theta: ``(N, 2, 3)`` matrices for 2-D or ``(N, 3, 4)`` for 3-D
            transforms, mapping output to input normalised coordinates.
        size: the target output size ``(N, C, H, W)`` or ``(N, C, D, H, W)``.
        align_corners: as in :func:`grid_sample`; ``None`` means False and
            warns, as PyTorch.

    Returns:
        The grid, ``(N, H, W, 2)`` or ``(N, D, H, W, 3)``, last axis ``(x, y[, z])``.

    Raises:
        ValueError: integer ``theta``, ``theta`` not matching ``size``, or an
            empty output size.
        NotImplementedError: ``size`` of length other than 4 or 5.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> theta = jnp.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    >>> F.affine_grid(theta, (1, 1, 1, 2), align_corners=False)[0, 0]
    Array([[-0.5,  0. ],
           [ 0.5,  0. ]], dtype=float32)
    """
    if align_corners is None:
        warnings.warn(_DEFAULT_WARNING, UserWarning, stacklevel=2)
        align_corners = False
    theta = as_array(theta)
    if not jnp.issubdtype(theta.dtype, jnp.floating):
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    size = tuple(int(s) for s in size)
    if len(size) == 4:
        if theta.ndim != 3 or theta.shape[-2:] != (2, 3):
            raise ValueError(
                "Expected a batch of 2D affine matrices of shape Nx2x3 for size "
                f"{size}. Got {shape_str(theta.shape)}."
            )
    elif len(size) == 5:
        if theta.ndim != 3 or theta.shape[-2:] != (3, 4):
            raise ValueError(
                "Expected a batch of 3D affine matrices of shape Nx3x4 for size "
                f"{size}. Got {shape_str(theta.shape)}."
            )
    else:
        raise NotImplementedError(
            "affine_grid only supports 4D and 5D sizes, for 2D and 3D affine transforms, "
            f"respectively. Got size {size}."
        )
    if align_corners and min(size[2:]) == 1:
        warnings.warn(
            "Since version 1.3.0, affine_grid behavior has changed for unit-size grids when "
            "align_corners=True. This is not an intended use case of affine_grid. See the "
            "documentation of affine_grid for details.",
            UserWarning,
            stacklevel=2,
        )
    elif min(size) <= 0:
        raise ValueError(f"Expected non-zero, positive output size. Got {size}")
    if theta.shape[0] != size[0]:
        raise RuntimeError(
            f"affine_grid: theta has batch size {theta.shape[0]} but size asks for {size[0]}"
        )
    return _affine_grid(theta, size, bool(align_corners))


# ----------------------------------------------------------------------------- grid_sample


def _clip(x: jax.Array, n: int) -> jax.Array:
    """PyTorch's ``clip_coordinates``: gradient 0 at and beyond both limits."""
    return jnp.where(x <= 0, 0.0, jnp.where(x >= n - 1, float(n - 1), x)).astype(x.dtype)


def _reflect(x: jax.Array, twice_low: int, twice_high: int) -> jax.Array:
    """PyTorch's ``reflect_coordinates`` (with its gradient signs)."""
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    d = x - low
    d = jnp.where(d < 0, -d, d)
    extra = jnp.fmod(d, span)
    flips = jnp.floor(d / span)
    even = jnp.fmod(flips, 2) == 0
    return jnp.where(even, extra + low, span - extra + low)


def _pad_coords(x: jax.Array, n: int, padding_mode: str, align_corners: bool) -> jax.Array:
    """PyTorch's ``compute_coordinates``."""
    if padding_mode == "border":
        return _clip(x, n)
    if padding_mode == "reflection":
        x = _reflect(x, 0, 2 * (n - 1)) if align_corners else _reflect(x, -1, 2 * n - 1)
        return _clip(x, n)
    return x


def _unnormalize(g: jax.Array, n: int, align_corners: bool) -> jax.Array:
    if align_corners:
        return (g + 1) / 2 * (n - 1)
    return ((g + 1) * n - 1) / 2


def _cubic_weights(t: jax.Array) -> list[jax.Array]:
    a = _CUBIC_A

    def near(x: jax.Array) -> jax.Array:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: jax.Array) -> jax.Array:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@jit("mode", "padding_mode", "align_corners")
def _grid_sample(
    x: jax.Array, grid: jax.Array, mode: str, padding_mode: str, align_corners: bool
) -> jax.Array:
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    d = len(spatial)
    out_shape = grid.shape[1:-1]
    flat = x.reshape(n, c, -1)
    g = grid.reshape(n, -1, d)
    strides = [int(np.prod(spatial[a + 1 :])) for a in range(d)]
    # per spatial axis a (0 = outermost): sizes[a]; grid component d - 1 - a
    coords = [_unnormalize(g[..., d - 1 - a], spatial[a], align_corners) for a in range(d)]

    # Per axis, the K tap positions (integer-valued floats) and weights, each (n, P, K).
    if mode == "bicubic":
        base = [jnp.floor(p) for p in coords]
        offsets = jnp.arange(-1.0, 3.0, dtype=x.dtype)
        taps = [
            (  # PyTorch pads each tap's integer position, then casts it to int64
                jnp.trunc(_pad_coords(b[..., None] + offsets, s, padding_mode, align_corners)),
                jnp.stack(_cubic_weights(p - b), axis=-1),
            )
            for p, b, s in zip(coords, base, spatial)
        ]
    else:
        coords = [_pad_coords(p, s, padding_mode, align_corners) for p, s in zip(coords, spatial)]
        if mode == "nearest":
            taps = [(jnp.round(p)[..., None], jnp.ones((*p.shape, 1), x.dtype)) for p in coords]
        else:
            taps = []
            for p in coords:
                low = jnp.floor(p)
                taps.append((jnp.stack([low, low + 1], -1), jnp.stack([low + 1 - p, p - low], -1)))
    # Outer product over the axes: T = K ** d taps per output point.
    flat_idx = jnp.zeros((n, g.shape[1], 1), jnp.int32)
    weight = jnp.ones((n, g.shape[1], 1), x.dtype)
    for (pos, w), size, stride in zip(taps, spatial, strides):
        pos = jax.lax.stop_gradient(pos)
        inside = (pos >= 0) & (pos <= size - 1)
        i = jnp.clip(pos, 0, size - 1).astype(jnp.int32) * stride
        flat_idx = (flat_idx[..., :, None] + i[..., None, :]).reshape(n, g.shape[1], -1)
        w = jnp.where(inside, w, 0)
        weight = (weight[..., :, None] * w[..., None, :]).reshape(n, g.shape[1], -1)
    vals = jnp.take_along_axis(flat, flat_idx.reshape(n, 1, -1), axis=2)
    vals = vals.reshape(n, c, g.shape[1], -1)
    out = jnp.sum(vals * weight[:, None], axis=-1)
    return out.reshape((n, c, *out_shape))


@autocast_op("grid_sampler")
def grid_sample(
    input: Any,
    grid: Any,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool | None = None,
) -> jax.Array:
    """Sample ``input`` at the positions in ``grid``, as ``torch.nn.functional.grid_sample``.

    ``grid[..., 0]`` is x (width), ``grid[..., 1]`` y (height) and, for 5-D
    input, ``grid[..., 2]`` z (depth), normalised to ``[-1, 1]``.

    Args:
        input: ``(N, C, H_in, W_in)`` or ``(N, C, D_in, H_in, W_in)``.
        grid: ``(N, H_out, W_out, 2)`` or ``(N, D_out, H_out, W_out, 3)``.
        mode: ``'bilinear'``, ``'nearest'`` (rounding half to even, as
            PyTorch) or ``'bicubic'`` (4-D only).
        padding_mode: ``'zeros'``, ``'border'`` or ``'reflection'``.
        align_corners: -1 and 1 are the centres of the corner pixels (True)
            or their outer edges (False); ``None`` means False and warns, as
            PyTorch.

    Returns:
        ``(N, C, H_out, W_out)`` or ``(N, C, D_out, H_out, W_out)``.

    Raises:
        ValueError: unknown ``mode`` or ``padding_mode``.
        RuntimeError: integer input, dtypes or shapes that do not fit, or
            bicubic with 5-D input.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x = jnp.array([[[[0.0, 1.0], [2.0, 3.0]]]])
    >>> F.grid_sample(x, jnp.array([[[[0.0, 0.0], [1.0, -1.0]]]]), align_corners=True)
    Array([[[[1.5, 1. ]]]], dtype=float32)
    """
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(
            "nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or "
            f"'bicubic', but got: '{mode}'"
        )
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(
            "nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
            f"'reflection', but got: '{padding_mode}'"
        )
    if align_corners is None:
        warnings.warn(_DEFAULT_WARNING, UserWarning, stacklevel=2)
        align_corners = False
    x = as_array(input)
    g = as_array(grid)
    check_float(x, "grid_sample")
    if x.dtype != g.dtype:
        raise RuntimeError(
            "grid_sampler(): expected input and grid to have same dtype: expected scalar type "
            f"{torch_scalar_name(x.dtype)} but found {torch_scalar_name(g.dtype)}"
        )
    sizes = f"input with sizes {shape_str(x.shape)} and grid with sizes {shape_str(g.shape)}"
    if x.shape[0] != g.shape[0]:
        raise RuntimeError(
            f"grid_sampler(): expected grid and input to have same batch size, but got {sizes}"
        )
    if g.shape[-1] != x.ndim - 2:
        raise RuntimeError(
            f"grid_sampler(): expected grid to have size {x.ndim - 2} in last dimension, but "
            f"got grid with sizes {shape_str(g.shape)}"
        )
    for axis in range(2, x.ndim):
        if x.shape[axis] == 0:
            raise RuntimeError(
                "grid_sampler(): expected input to have non-empty spatial dimensions, but "
                f"input has sizes {shape_str(x.shape)} with dimension {axis} being empty"
            )
    want = 4 if x.ndim == 4 else 5
    if x.ndim != want or g.ndim != want:
        raise RuntimeError(
            f"grid_sampler(): expected {want}D input and grid with same number of dimensions, "
            f"but got {sizes}"
        )
    if mode == "bicubic" and want == 5:
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    return _grid_sample(x, g, mode, padding_mode, bool(align_corners))
