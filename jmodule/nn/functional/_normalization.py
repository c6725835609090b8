"""Layer, group, RMS, instance and local-response normalisation, and ``normalize``,
as in ``torch.nn.functional``.

Statistics are computed in float32 for bfloat16/float16 inputs (PyTorch's
"opmath"), and the result is rounded once to the input's dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule.nn.functional._utils import autocast, check_float, compute_dtype, jit, shape_str
from jmodule.nn.parameter import as_array

__all__ = [
    "group_norm",
    "instance_norm",
    "instance_norm_update",
    "layer_norm",
    "local_response_norm",
    "normalize",
    "rms_norm",
]


def _shape(normalized_shape: Any) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


def _check_trailing(x: jax.Array, shape: tuple[int, ...]) -> None:
    if x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape) :]) != shape:
        raise RuntimeError(
            f"Given normalized_shape={list(shape)}, expected input with shape "
            f"[*, {', '.join(map(str, shape))}], but got input of size{shape_str(x.shape)}"
        )


def _affine(out: jax.Array, weight: Any, bias: Any, shape: tuple[int, ...]) -> jax.Array:
    if weight is not None:
        out = out * as_array(weight).astype(out.dtype).reshape(shape)
    if bias is not None:
        out = out + as_array(bias).astype(out.dtype).reshape(shape)
    return out


def _moments(x: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return mean, var


@jit("normalized_shape", "eps", autocast="layer_norm")
def layer_norm(
    input: Any,
    normalized_shape: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
) -> jax.Array:
    """Normalise over the trailing ``normalized_shape`` dimensions (biased variance).

    Raises:
        RuntimeError: the input's trailing shape is not ``normalized_shape``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.layer_norm(jnp.array([[1.0, 3.0]]), (2,)).round(3)
    Array([[-1.,  1.]], dtype=float32)
    """
    x = check_float(as_array(input), "layer_norm")
    shape = _shape(normalized_shape)
    _check_trailing(x, shape)
    xc = x.astype(compute_dtype(x.dtype))
    mean, var = _moments(xc, tuple(range(x.ndim - len(shape), x.ndim)))
    out = (xc - mean) * jax.lax.rsqrt(var + eps)
    return _affine(out, weight, bias, shape).astype(x.dtype)


@jit("normalized_shape", "eps", autocast="rms_norm")
def rms_norm(
    input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None
) -> jax.Array:
    """``x / sqrt(mean(x**2) + eps)`` over the trailing ``normalized_shape`` dimensions.

    ``eps=None`` uses the machine epsilon of the compute dtype (float32 for
    half-precision inputs), as PyTorch.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.rms_norm(jnp.array([[2.0, 2.0]]), (2,), eps=0.0).round(4)
    Array([[1., 1.]], dtype=float32)
    """
    x = check_float(as_array(input), "rms_norm")
    shape = _shape(normalized_shape)
    _check_trailing(x, shape)
    compute = compute_dtype(x.dtype)
    if eps is None:
        eps = float(jnp.finfo(compute).eps)
    xc = x.astype(compute)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    out = xc * jax.lax.rsqrt(jnp.mean(jnp.square(xc), axis=axes, keepdims=True) + eps)
    return _affine(out, weight, None, shape).astype(x.dtype)


@jit("num_groups", "eps", autocast="group_norm")
def group_norm(
    input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> jax.Array:
    """Normalise each of ``num_groups`` channel groups of ``(N, C, *)`` input.

    Raises:
        RuntimeError: ``C`` is not divisible by ``num_groups``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.group_norm(jnp.ones((2, 4, 3)), 2).shape
    (2, 4, 3)
    """
    x = check_float(as_array(input), "group_norm")
    if x.ndim < 2:
        raise RuntimeError(
            f"Expected at least 2 dimensions for input tensor but received {x.ndim} "
            f"(input shape {tuple(x.shape)})"
        )
    n, c = x.shape[:2]
    if c % num_groups:
        raise RuntimeError(
            "Expected number of channels in input to be divisible by num_groups, but got "
            f"input of shape {shape_str(x.shape)} and num_groups={num_groups}"
        )
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and as_array(param).shape != (c,):
            raise RuntimeError(
                f"Expected {name} to be a vector of size equal to the number of channels in "
                f"input, but got {name} of shape {shape_str(as_array(param).shape)} and input "
                f"of shape {shape_str(x.shape)}"
            )
    xc = x.astype(compute_dtype(x.dtype)).reshape(n, num_groups, -1)
    mean, var = _moments(xc, (2,))
    out = ((xc - mean) * jax.lax.rsqrt(var + eps)).reshape(x.shape)
    return _affine(out, weight, bias, (c,) + (1,) * (x.ndim - 2)).astype(x.dtype)


@jit("use_input_stats", "momentum", "eps")
def instance_norm_update(
    input: Any,
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[jax.Array, Any, Any]:
    """Instance normalisation returning ``(output, new_running_mean, new_running_var)``.

    The functional core of ``InstanceNorm*``: statistics per sample and
    channel over the spatial axes of ``(N, C, *spatial)`` input. With input
    statistics and running buffers, the buffers move by ``momentum`` towards
    the batch average of the per-instance mean and unbiased variance.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> out, mean, var = F.instance_norm_update(jnp.ones((2, 3, 4)), jnp.zeros(3), jnp.ones(3))
    >>> mean
    Array([0.1, 0.1, 0.1], dtype=float32)
    """
    x = check_float(as_array(input), "instance_norm")
    compute = compute_dtype(x.dtype)
    xc = x.astype(compute)
    axes = tuple(range(2, x.ndim))
    stat_shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if use_input_stats:
        mean, var = _moments(xc, axes)
        if running_mean is not None:
            n = x.size // (x.shape[0] * x.shape[1])
            m = jnp.asarray(momentum, compute)
            batch_mean = jax.lax.stop_gradient(mean).reshape(x.shape[:2]).mean(0)
            unbiased = jax.lax.stop_gradient(var).reshape(x.shape[:2]) * (n / max(n - 1, 1))
            rm, rv = as_array(running_mean), as_array(running_var)
            running_mean = ((1 - m) * rm + m * batch_mean).astype(rm.dtype)
            running_var = ((1 - m) * rv + m * unbiased.mean(0)).astype(rv.dtype)
    else:
        mean = as_array(running_mean).astype(compute).reshape(stat_shape)
        var = as_array(running_var).astype(compute).reshape(stat_shape)
    out = (xc - mean) * jax.lax.rsqrt(var + eps)
    out = _affine(out, weight, bias, stat_shape[1:])
    return out.astype(x.dtype), running_mean, running_var


def instance_norm(
    input: Any,
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> jax.Array:
    """Instance normalisation, as ``torch.nn.functional.instance_norm``.

    Difference from PyTorch: arrays are immutable, so ``running_mean`` and
    ``running_var`` are not updated in place; use the ``InstanceNorm*``
    modules or :func:`instance_norm_update`, which returns the new values.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.instance_norm(jnp.array([[[1.0, 3.0]]])).round(3)
    Array([[[-1.,  1.]]], dtype=float32)
    """
    return instance_norm_update(
        input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps
    )[0]


# PyTorch divides by an avg_pool3d of the squares (avg_pool2d for 3-D input).
@jit("size", "alpha", "beta", "k", autocast=lambda a: "avg_pool3d" if a["input"].ndim > 3 else None)
def local_response_norm(
    input: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0
) -> jax.Array:
    """Divide each element by ``(k + alpha * mean of x**2 over nearby channels) ** beta``.

    The window covers ``size`` channels (``size // 2`` before), zero-padded
    at the ends, as PyTorch.

    Raises:
        ValueError: fewer than 3 dimensions.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.local_response_norm(jnp.ones((1, 3, 2)), 2, alpha=1.0, beta=1.0)[0, :, 0].round(4)
    Array([0.6667, 0.5   , 0.5   ], dtype=float32)
    """
    x = check_float(as_array(input), "local_response_norm")
    if x.ndim < 3:
        raise ValueError(
            f"Expected 3D or higher dimensionality input (got {x.ndim} dimensions, shape "
            f"{tuple(x.shape)})"
        )
    if x.size == 0:
        return x
    xc = x.astype(compute_dtype(x.dtype))
    window = (1, size) + (1,) * (x.ndim - 2)
    pads = [(0, 0), (size // 2, (size - 1) // 2)] + [(0, 0)] * (x.ndim - 2)
    total = jax.lax.reduce_window(
        jnp.square(xc), np.array(0, xc.dtype), jax.lax.add, window, (1,) * x.ndim, pads
    )
    div = (total / size * alpha + k) ** beta
    return (xc / div).astype(x.dtype)


def _norm(x: jax.Array, p: float, axis: int) -> jax.Array:
    """The ``p``-norm along ``axis`` (kept), with a zero gradient at zero as PyTorch."""
    if p == float("inf"):
        return jnp.max(jnp.abs(x), axis=axis, keepdims=True)
    if p == float("-inf"):
        return jnp.min(jnp.abs(x), axis=axis, keepdims=True)
    if p == 0:
        return jnp.sum(x != 0, axis=axis, keepdims=True).astype(x.dtype)
    if p == 1:
        return jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    if p == 2:
        total = jnp.sum(jnp.square(x), axis=axis, keepdims=True)
    else:
        total = jnp.sum(jnp.abs(x) ** p, axis=axis, keepdims=True)
    positive = total > 0
    safe = jnp.where(positive, total, jnp.ones_like(total))
    root = jnp.sqrt(safe) if p == 2 else safe ** (1.0 / p)
    return jnp.where(positive, root, jnp.zeros_like(root))


def normalize(
    input: Any, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None
) -> jax.Array:
    """``x / max(||x||_p, eps)`` along ``dim``, as ``torch.nn.functional.normalize``.

    Raises:
        TypeError: ``out=`` is given (arrays are immutable; use the result).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.normalize(jnp.array([[3.0, 4.0]]))
    Array([[0.6, 0.8]], dtype=float32)
    """
    if out is not None:
        raise TypeError("normalize(out=...) is not supported: JAX arrays are immutable")
    (input,) = autocast("norm", input)  # PyTorch divides by input.norm(p, dim)
    return _normalize(input, p, dim, eps)


@jit("p", "dim", "eps")
def _normalize(input: Any, p: float, dim: int, eps: float) -> jax.Array:
    x = check_float(as_array(input), "normalize")
    xc = x.astype(compute_dtype(x.dtype))
    denom = jnp.maximum(_norm(xc, p, dim), eps)
    return (xc / denom).astype(x.dtype)
