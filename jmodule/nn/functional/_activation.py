"""Activation functions, as in ``torch.nn.functional``.

Each works on any shape and dtype. As PyTorch does on CPU and GPU, bfloat16
and float16 inputs are computed in float32 and rounded once at the end.
``inplace=`` is accepted everywhere PyTorch has it; JAX arrays are immutable,
so the result is always a new array.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from jmodule import random as _random
from jmodule.amp import _autocast as _amp
from jmodule.nn.functional._utils import jit, upcast
from jmodule.nn.parameter import as_array

__all__ = [
    "celu",
    "elu",
    "gelu",
    "glu",
    "hardshrink",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "leaky_relu",
    "log_softmax",
    "logsigmoid",
    "mish",
    "prelu",
    "relu6",
    "rrelu",
    "selu",
    "sigmoid",
    "silu",
    "softmax",
    "softmin",
    "softplus",
    "softshrink",
    "softsign",
    "tanh",
    "tanhshrink",
    "threshold",
]

# PyTorch's SELU constants (torch/csrc/.../Activation.h).
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _zero(x: jax.Array) -> jax.Array:
    return jnp.zeros((), x.dtype)


@jit("threshold", "value", "inplace")
def threshold(input: Any, threshold: float, value: float, inplace: bool = False) -> jax.Array:
    """``input`` where ``input > threshold``, else ``value``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.threshold(jnp.array([0.5, 2.0]), 1.0, -1.0)
    Array([-1.,  2.], dtype=float32)
    """
    x = as_array(input)
    return jnp.where(x > threshold, x, jnp.asarray(value, x.dtype))


@jit("min_val", "max_val", "inplace")
def hardtanh(
    input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False
) -> jax.Array:
    """Clamp to ``[min_val, max_val]``; the gradient is zero outside the open interval.

    Raises:
        ValueError: ``min_val > max_val``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.hardtanh(jnp.array([-3.0, 0.5, 3.0]))
    Array([-1. ,  0.5,  1. ], dtype=float32)
    """
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    x = as_array(input)
    lo, hi = jnp.asarray(min_val, x.dtype), jnp.asarray(max_val, x.dtype)
    # where() (not clip) so the gradient at the bounds is zero, as PyTorch's.
    return jnp.where(x <= lo, lo, jnp.where(x >= hi, hi, x))


@jit("inplace")
def relu6(input: Any, inplace: bool = False) -> jax.Array:
    """``min(max(x, 0), 6)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.relu6(jnp.array([-1.0, 7.0]))
    Array([0., 6.], dtype=float32)
    """
    return hardtanh(input, 0.0, 6.0)


@jit("negative_slope", "inplace")
def leaky_relu(input: Any, negative_slope: float = 0.01, inplace: bool = False) -> jax.Array:
    """``x`` for ``x > 0``, else ``negative_slope * x``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.leaky_relu(jnp.array([-2.0, 2.0]), 0.5)
    Array([-1.,  2.], dtype=float32)
    """
    return _leaky(as_array(input), negative_slope)


@upcast
def _leaky(x: jax.Array, slope: Any) -> jax.Array:
    return jnp.where(x > 0, x, x * slope)


@jit(autocast="prelu")
def prelu(input: Any, weight: Any) -> jax.Array:
    """Leaky ReLU with a learned slope per channel (dimension 1), as ``F.prelu``.

    ``weight`` has one element (shared) or one per channel; inputs with
    fewer than two dimensions have one channel.

    Raises:
        RuntimeError: the number of slopes does not match the channel count.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.prelu(jnp.array([[-2.0, 2.0]]), jnp.array([0.5]))
    Array([[-1.,  2.]], dtype=float32)
    """
    x, w = as_array(input), as_array(weight)
    channels = x.shape[1] if x.ndim >= 2 else 1
    if w.size != 1 and w.size != channels:
        raise RuntimeError(
            "Mismatch of parameter numbers and input channel size. Found parameter numbers = "
            f"{w.size} and channel size = {channels} (input shape {tuple(x.shape)})."
        )
    if w.size > 1:
        w = w.reshape((channels,) + (1,) * (x.ndim - 2))
    else:
        w = w.reshape(())
    return _leaky(x, w.astype(jnp.promote_types(x.dtype, jnp.float32)))


def rrelu(
    input: Any,
    lower: float = 1.0 / 8,
    upper: float = 1.0 / 3,
    training: bool = False,
    inplace: bool = False,
) -> jax.Array:
    """Randomized leaky ReLU: in training, each negative element gets a slope drawn
    from U(lower, upper) (default generator); in eval the slope is their mean.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.rrelu(jnp.array([-3.0, 1.0]), 0.1, 0.3)
    Array([-0.6,  1. ], dtype=float32)
    """
    x = as_array(input)
    if not training:
        return _leaky(x, (lower + upper) / 2)
    compute = jnp.promote_types(x.dtype, jnp.float32)
    slope = jax.random.uniform(_random.next_key(), x.shape, compute, lower, upper)
    xc = x.astype(compute)
    return jnp.where(xc > 0, xc, xc * slope).astype(x.dtype)


@upcast
def _elu(x: jax.Array, alpha: float, scale: float = 1.0, input_scale: float = 1.0) -> jax.Array:
    neg = alpha * jnp.expm1(jnp.minimum(x, 0) * input_scale)
    return scale * jnp.where(x > 0, x, neg)


@jit("alpha", "inplace")
def elu(input: Any, alpha: float = 1.0, inplace: bool = False) -> jax.Array:
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.elu(jnp.array([0.0, 1.0]))
    Array([0., 1.], dtype=float32)
    """
    return _elu(as_array(input), alpha)


@jit("inplace")
def selu(input: Any, inplace: bool = False) -> jax.Array:
    """``scale * elu(x, alpha)`` with PyTorch's self-normalising constants.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.selu(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """
    return _elu(as_array(input), _SELU_ALPHA, _SELU_SCALE)


@jit("alpha", "inplace")
def celu(input: Any, alpha: float = 1.0, inplace: bool = False) -> jax.Array:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    Raises:
        ValueError: ``alpha`` is zero.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.celu(jnp.array([2.0]))
    Array([2.], dtype=float32)
    """
    if alpha == 0:
        raise ValueError("ZeroDivisionError: alpha cannot be 0 for CELU")
    return _elu(as_array(input), alpha, 1.0, 1.0 / alpha)


@jit("approximate")
def gelu(input: Any, approximate: str = "none") -> jax.Array:
    """Gaussian error linear unit: exact (``'none'``, via erf) or ``'tanh'`` approximation.

    Raises:
        RuntimeError: ``approximate`` is neither ``'none'`` nor ``'tanh'``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.gelu(jnp.array([0.0, 10.0]), approximate="tanh")
    Array([ 0., 10.], dtype=float32)
    """
    if approximate not in ("none", "tanh"):
        raise RuntimeError(
            f"approximate argument must be either none or tanh, got approximate={approximate!r}"
        )
    return _gelu(as_array(input), approximate == "tanh")


@upcast
def _gelu(x: jax.Array, tanh: bool) -> jax.Array:
    if tanh:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + jnp.tanh(inner))
    return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


@jit("inplace")
def silu(input: Any, inplace: bool = False) -> jax.Array:
    """``x * sigmoid(x)`` (swish).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.silu(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """
    return upcast(lambda x: x * jax.nn.sigmoid(x))(as_array(input))


@jit("inplace")
def mish(input: Any, inplace: bool = False) -> jax.Array:
    """``x * tanh(softplus(x))``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.mish(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """
    return upcast(lambda x: x * jnp.tanh(jax.nn.softplus(x)))(as_array(input))


@jit()
def sigmoid(input: Any) -> jax.Array:
    """``1 / (1 + exp(-x))``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.sigmoid(jnp.array([0.0]))
    Array([0.5], dtype=float32)
    """
    return upcast(jax.nn.sigmoid)(as_array(input))


@jit()
def tanh(input: Any) -> jax.Array:
    """Hyperbolic tangent.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.tanh(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """
    return upcast(jnp.tanh)(as_array(input))


@jit("inplace")
def hardsigmoid(input: Any, inplace: bool = False) -> jax.Array:
    """``relu6(x + 3) / 6``; the gradient is ``1/6`` inside (-3, 3), zero outside.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.hardsigmoid(jnp.array([-4.0, 0.0, 4.0]))
    Array([0. , 0.5, 1. ], dtype=float32)
    """
    return upcast(lambda x: hardtanh(x + 3.0, 0.0, 6.0) / 6.0)(as_array(input))


@jit("inplace")
def hardswish(input: Any, inplace: bool = False) -> jax.Array:
    """``x * relu6(x + 3) / 6``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.hardswish(jnp.array([-4.0, 4.0]))
    Array([0., 4.], dtype=float32)
    """
    return upcast(_hardswish)(as_array(input))


def _hardswish(x: jax.Array) -> jax.Array:
    # PyTorch's gradient: 0 below -3, x/3 + 1/2 up to 3 (inclusive), 1 above.
    mid = x * (x + 3.0) / 6.0
    return jnp.where(x < -3.0, jnp.zeros_like(x), jnp.where(x <= 3.0, mid, x))


@jit("beta", "threshold", autocast="softplus")
def softplus(input: Any, beta: float = 1.0, threshold: float = 20.0) -> jax.Array:
    """``log(1 + exp(beta * x)) / beta``, linear where ``beta * x > threshold``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.softplus(jnp.array([30.0]))
    Array([30.], dtype=float32)
    """
    return upcast(_softplus)(as_array(input), beta, threshold)


def _softplus(x: jax.Array, beta: float, threshold: float) -> jax.Array:
    z = x * beta
    linear = z > threshold
    safe = jnp.where(linear, jnp.zeros_like(z), z)  # no overflow in the unused branch
    return jnp.where(linear, x, jnp.log1p(jnp.exp(safe)) / beta)


@jit()
def softsign(input: Any) -> jax.Array:
    """``x / (1 + |x|)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.softsign(jnp.array([1.0]))
    Array([0.5], dtype=float32)
    """
    return upcast(lambda x: x / (1.0 + jnp.abs(x)))(as_array(input))


@jit()
def logsigmoid(input: Any) -> jax.Array:
    """``log(sigmoid(x))``, computed stably.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.logsigmoid(jnp.array([-100.0, 0.0])).round(4)  # log(sigmoid(-100)) underflows
    Array([-100.    ,   -0.6931], dtype=float32)
    """
    return upcast(jax.nn.log_sigmoid)(as_array(input))


@jit("lambd")
def hardshrink(input: Any, lambd: float = 0.5) -> jax.Array:
    """``x`` where ``|x| > lambd``, else 0.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.hardshrink(jnp.array([0.3, 1.0]))
    Array([0., 1.], dtype=float32)
    """
    x = as_array(input)
    return jnp.where((x > lambd) | (x < -lambd), x, _zero(x))


@jit("lambd")
def softshrink(input: Any, lambd: float = 0.5) -> jax.Array:
    """Shrink towards zero by ``lambd``: ``x - lambd``, ``x + lambd`` or 0.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.softshrink(jnp.array([0.3, 1.0]))
    Array([0. , 0.5], dtype=float32)
    """
    if lambd < 0:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")

    def f(x: jax.Array) -> jax.Array:
        return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, _zero(x)))

    return upcast(f)(as_array(input))


@jit()
def tanhshrink(input: Any) -> jax.Array:
    """``x - tanh(x)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.tanhshrink(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """
    return upcast(lambda x: x - jnp.tanh(x))(as_array(input))


@jit("dim")
def glu(input: Any, dim: int = -1) -> jax.Array:
    """Gated linear unit: split ``dim`` in halves ``a, b`` and return ``a * sigmoid(b)``.

    Raises:
        RuntimeError: the size of ``dim`` is odd.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.glu(jnp.array([2.0, 0.0]))
    Array([1.], dtype=float32)
    """
    x = as_array(input)
    if x.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    axis = dim % x.ndim
    if x.shape[axis] % 2:
        raise RuntimeError(
            f"Halving dimension must be even, but dimension {axis} is size {x.shape[axis]} "
            f"(input shape {tuple(x.shape)})"
        )

    def f(x: jax.Array) -> jax.Array:
        a, b = jnp.split(x, 2, axis=axis)
        return a * jax.nn.sigmoid(b)

    return upcast(f)(x)


def _softmax_dim(name: str, ndim: int, stacklevel: int) -> int:
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to "
        "include dim=X as an argument.",
        UserWarning,
        stacklevel=stacklevel + 1,
    )
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_like(name: str, fn: Any, input: Any, dim: Any, stacklevel: int, dtype: Any) -> Any:
    x = as_array(input)
    if dtype is not None:
        x = x.astype(dtype)
    else:
        (x,) = _amp.cast(name, x)
    if dim is None:
        dim = _softmax_dim(name, x.ndim, stacklevel)
    return _softmax_core(x, fn, dim)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _softmax_core(x: jax.Array, fn: Any, dim: int) -> jax.Array:
    if x.ndim == 0:
        return upcast(lambda v: fn(v.reshape(1), axis=0).reshape(()))(x)
    return upcast(lambda v: fn(v, axis=dim))(x)


def softmax(input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
    """``exp(x) / sum(exp(x))`` along ``dim``.

    Args:
        input: the input array.
        dim: the axis to normalise. ``None`` picks one as PyTorch does (0 for
            0-, 1- and 3-D inputs, else 1) and warns, as PyTorch does.
        _stacklevel: where the warning points (PyTorch's argument).
        dtype: cast the input to this dtype first.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.softmax(jnp.zeros((1, 2)), dim=-1)
    Array([[0.5, 0.5]], dtype=float32)
    """
    return _softmax_like("softmax", jax.nn.softmax, input, dim, _stacklevel, dtype)


def log_softmax(
    input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
) -> jax.Array:
    """``log(softmax(x))`` along ``dim``, computed stably (arguments as :func:`softmax`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.log_softmax(jnp.zeros((1, 2)), dim=1).round(4)
    Array([[-0.6931, -0.6931]], dtype=float32)
    """
    return _softmax_like("log_softmax", jax.nn.log_softmax, input, dim, _stacklevel, dtype)


def softmin(input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
    """``softmax(-x)`` along ``dim`` (arguments as :func:`softmax`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.softmin(jnp.array([0.0, 0.0]), dim=0)
    Array([0.5, 0.5], dtype=float32)
    """
    x = as_array(input)
    if dtype is not None:
        x = x.astype(dtype)
    else:  # softmax(-x): softmax's policy
        (x,) = _amp.cast("softmax", x)
    return _softmax_like("softmin", _negated_softmax, x, dim, _stacklevel, None)


def _negated_softmax(x: jax.Array, axis: int) -> jax.Array:
    return jax.nn.softmax(-x, axis=axis)
