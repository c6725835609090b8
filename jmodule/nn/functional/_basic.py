"""Linear, ReLU, dropout and batch norm: the functional forms the core layers use."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from jmodule import random as _random
from jmodule.nn.functional._utils import jit
from jmodule.nn.parameter import as_array

__all__ = ["batch_norm", "batch_norm_update", "dropout", "linear", "relu"]


@jit(autocast="linear", inline=True)
def linear(input: Any, weight: Any, bias: Any = None) -> jax.Array:
    """``input @ weight.T + bias``, as ``torch.nn.functional.linear``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.linear(jnp.ones((2, 3)), jnp.ones((4, 3))).shape
    (2, 4)
    """
    x, w = as_array(input), as_array(weight)
    b = None if bias is None else as_array(bias)
    if w.ndim == 2 and x.ndim >= 1 and x.shape[-1] != w.shape[1]:
        raise RuntimeError(_matmul_shapes(x.shape, w.shape))
    out = jnp.matmul(x, w.T)
    if b is not None:
        out = out + b
    return out


def _matmul_shapes(x: tuple, w: tuple) -> str:
    """PyTorch's message for ``linear`` on an input whose last dimension is not ``w``'s."""
    rows = math.prod(x[:-1]) if len(x) > 1 else 1
    return (
        f"mat1 and mat2 shapes cannot be multiplied ({rows}x{x[-1]} and {w[1]}x{w[0]}): "
        f"the input's last dimension ({x[-1]}) must equal the weight's in_features ({w[1]})"
    )


@jit("inplace", inline=True)
def relu(input: Any, inplace: bool = False) -> jax.Array:
    """max(input, 0). ``inplace`` is accepted; JAX returns a new array."""
    return jax.nn.relu(as_array(input))


def dropout(
    input: Any,
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
) -> jax.Array:
    """Zero elements with probability ``p`` and scale the rest by ``1/(1-p)``.

    The mask is drawn from the default generator (``jm.manual_seed``), which
    compiled code threads through, so compiled and eager runs draw the same
    masks.

    Raises:
        ValueError: ``p`` is outside [0, 1].
    """
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    x = as_array(input)
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return jnp.zeros_like(x)
    return _dropout_mask(_random.next_key(), x, p)


@functools.partial(jax.jit, static_argnames="p", inline=True)
def _dropout_mask(key: jax.Array, x: jax.Array, p: float) -> jax.Array:
    """``x`` with elements zeroed with probability ``p`` (drawn from ``key``), the rest scaled."""
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), jnp.zeros((), x.dtype)).astype(x.dtype)


@jit("training", "eps", inline=True)
def batch_norm_update(
    input: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: Any = 0.1,
    eps: float = 1e-5,
) -> tuple[jax.Array, Any, Any]:
    """Batch normalisation returning ``(output, new_running_mean, new_running_var)``.

    The functional core of ``BatchNorm*``: statistics over every axis but 1;
    in training mode the running statistics move by ``momentum`` towards the
    batch mean and the unbiased batch variance.
    """
    x = as_array(input)
    shape = [1] * x.ndim
    shape[1] = x.shape[1]
    compute = jnp.promote_types(x.dtype, jnp.float32)
    xc = x.astype(compute)
    w = None if weight is None else as_array(weight).astype(compute)
    b = None if bias is None else as_array(bias).astype(compute)
    if training:
        n = x.size // x.shape[1]
        if n <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {x.shape}"
            )
        ones = jnp.ones(x.shape[1], compute)
        out, mean, var = _batch_norm_training(
            float(eps), xc, ones if w is None else w, jnp.zeros_like(ones) if b is None else b
        )
        if running_mean is not None:
            rm = as_array(running_mean)
            rv = as_array(running_var)
            m = jnp.asarray(momentum, compute)
            running_mean = ((1 - m) * rm + m * jax.lax.stop_gradient(mean)).astype(rm.dtype)
            unbiased = jax.lax.stop_gradient(var) * (n / (n - 1))
            running_var = ((1 - m) * rv + m * unbiased).astype(rv.dtype)
        return out.astype(x.dtype), running_mean, running_var
    mean = as_array(running_mean).astype(compute)
    var = as_array(running_var).astype(compute)
    out = (xc - mean.reshape(shape)) * jax.lax.rsqrt(var.reshape(shape) + eps)
    if w is not None:
        out = out * w.reshape(shape)
    if b is not None:
        out = out + b.reshape(shape)
    return out.astype(x.dtype), running_mean, running_var


def _batch_statistics(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-channel mean and biased variance over every axis but 1 (two passes)."""
    axes = (0, *range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    return mean, jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _batch_norm_training(
    eps: float, x: jax.Array, w: jax.Array, b: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Training-mode batch norm: ``(output, batch mean, biased batch variance)``.

    The derivative is written out (a custom JVP) rather than traced through
    the statistics: its transpose, the gradient, then takes the textbook
    two reductions per channel and one elementwise pass. Differentiating
    through ``mean`` and ``var`` made a ResNet-18 training step on the CPU
    ~10% slower. Forward mode and higher derivatives work as usual.
    """
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = _batch_statistics(x)
    out = (x - mean) * jax.lax.rsqrt(var + eps) * w.reshape(shape) + b.reshape(shape)
    return out, mean.reshape(-1), var.reshape(-1)


@_batch_norm_training.defjvp
def _batch_norm_training_jvp(eps: float, primals: tuple, tangents: tuple) -> tuple:
    x, w, b = primals
    tx, tw, tb = tangents
    shape = (1, -1) + (1,) * (x.ndim - 2)
    axes = (0, *range(2, x.ndim))
    mean, var = _batch_statistics(x)
    inv = jax.lax.rsqrt(var + eps)
    centered = x - mean
    xhat = centered * inv
    t_mean = jnp.mean(tx, axis=axes, keepdims=True)
    t_var = 2 * jnp.mean(tx * centered, axis=axes, keepdims=True)
    t_xhat = inv * (tx - t_mean - xhat * jnp.mean(tx * xhat, axis=axes, keepdims=True))
    t_out = t_xhat * w.reshape(shape) + xhat * tw.reshape(shape) + tb.reshape(shape)
    # the primal through the function itself, so that its derivative is this rule again
    return _batch_norm_training(eps, x, w, b), (t_out, t_mean.reshape(-1), t_var.reshape(-1))


def batch_norm(
    input: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> jax.Array:
    """Batch normalisation, as ``torch.nn.functional.batch_norm``.

    Difference from PyTorch: JAX arrays are immutable, so ``running_mean``
    and ``running_var`` are *not* updated in place. Use the ``BatchNorm*``
    modules (which keep them as buffers) or :func:`batch_norm_update`, which
    returns the new statistics.
    """
    return batch_norm_update(
        input, running_mean, running_var, weight, bias, training, momentum, eps
    )[0]
