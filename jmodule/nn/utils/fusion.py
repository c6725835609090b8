"""Folding an eval-mode BatchNorm into the layer before it, as ``torch.nn.utils.fusion``.

``fuse_conv_bn_eval(conv, bn)`` returns a copy of ``conv`` whose weight and
bias compute ``bn(conv(x))`` (with ``bn``'s running statistics) in one layer;
``fuse_linear_bn_eval`` does the same for ``Linear``. The ``*_weights``
functions do the arithmetic on arrays.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from jmodule._lowering import state as _state
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = [
    "fuse_conv_bn_eval",
    "fuse_conv_bn_weights",
    "fuse_linear_bn_eval",
    "fuse_linear_bn_weights",
]

ConvT = TypeVar("ConvT", bound=Module)
LinearT = TypeVar("LinearT", bound=Module)


def _arr(x: Any) -> Any:
    return None if x is None else _state.peek(x) if _state.is_cell(x) else jnp.asarray(x)


def _requires_grad(x: Any) -> bool:
    return bool(_state.requires_grad(x)) if _state.is_cell(x) else False


def _check_eval(*modules: Module) -> None:
    if any(m.training for m in modules):
        raise AssertionError("Fusion only for eval!")


def _check_stats(bn: Module) -> None:
    if bn.running_mean is None or bn.running_var is None:
        raise AssertionError("bn.running_mean and bn.running_var must not be None")


def fuse_conv_bn_eval(conv: ConvT, bn: Module, transpose: bool = False) -> ConvT:
    """A copy of ``conv`` computing ``bn(conv(x))``, both in eval mode.

    As ``torch.nn.utils.fuse_conv_bn_eval``.

    Args:
        conv: a ``Conv1d``/``2d``/``3d`` (or transposed, with ``transpose``).
        bn: a BatchNorm over ``conv``'s output channels, with running stats.
        transpose: ``conv`` is a transposed convolution.

    Returns:
        The fused convolution (``conv`` itself is unchanged).

    Raises:
        AssertionError: either module is in training mode, or ``bn`` has no
            running statistics (as PyTorch's asserts).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> conv, bn = jm.nn.Conv2d(3, 4, 3).eval(), jm.nn.BatchNorm2d(4).eval()
    >>> fused = jm.nn.utils.fuse_conv_bn_eval(conv, bn)
    >>> x = jnp.ones((1, 3, 5, 5))
    >>> bool(jnp.allclose(fused(x), bn(conv(x)), atol=1e-5))
    True
    """
    _check_eval(conv, bn)
    fused = copy.deepcopy(conv)
    _check_stats(bn)
    fused.weight, fused.bias = fuse_conv_bn_weights(
        fused.weight,
        fused.bias,
        bn.running_mean,
        bn.running_var,
        bn.eps,
        bn.weight,
        bn.bias,
        transpose,
    )
    return fused


def fuse_conv_bn_weights(
    conv_w: Any,
    conv_b: Any | None,
    bn_rm: Any,
    bn_rv: Any,
    bn_eps: float,
    bn_w: Any | None,
    bn_b: Any | None,
    transpose: bool = False,
) -> tuple[Parameter, Parameter]:
    """The weight and bias of a convolution followed by an eval-mode BatchNorm, fused.

    As ``torch.nn.utils.fuse_conv_bn_weights``: ``w * (bn_w / sqrt(bn_rv +
    eps))`` per output channel, and ``(b - bn_rm) * bn_w / sqrt(bn_rv + eps)
    + bn_b``; a missing bias or affine weight counts as zeros or ones.

    Args:
        conv_w, conv_b: the convolution's weight and bias (or None).
        bn_rm, bn_rv: the BatchNorm's running mean and variance.
        bn_eps: the BatchNorm's ``eps``.
        bn_w, bn_b: the BatchNorm's affine weight and bias (or None).
        transpose: the weight is a transposed convolution's (channels on axis 1).

    Returns:
        ``(weight, bias)`` as parameters, in the convolution's dtypes.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w, b = jm.nn.utils.fuse_conv_bn_weights(
    ...     jnp.ones((2, 1, 1)), None, jnp.zeros(2), jnp.full(2, 3.0), 1.0, None, None
    ... )
    >>> w.shape, b.shape
    ((2, 1, 1), (2,))
    """
    w_req, b_req = _requires_grad(conv_w), _requires_grad(conv_b)
    conv_w, conv_b = _arr(conv_w), _arr(conv_b)
    bn_rm, bn_rv, bn_w, bn_b = _arr(bn_rm), _arr(bn_rv), _arr(bn_w), _arr(bn_b)
    w_dtype = conv_w.dtype
    b_dtype = conv_b.dtype if conv_b is not None else w_dtype
    if conv_b is None:
        conv_b = jnp.zeros_like(bn_rm)
    if bn_w is None:
        bn_w = jnp.ones_like(bn_rm)
    if bn_b is None:
        bn_b = jnp.zeros_like(bn_rm)
    rsqrt = jax.lax.rsqrt(bn_rv + bn_eps)
    shape = (1, -1) if transpose else (-1, 1)
    shape = shape + (1,) * (conv_w.ndim - 2)
    fused_w = (conv_w * (bn_w * rsqrt).reshape(shape)).astype(w_dtype)
    fused_b = ((conv_b - bn_rm) * rsqrt * bn_w + bn_b).astype(b_dtype)
    return Parameter(fused_w, w_req), Parameter(fused_b, b_req)


def fuse_linear_bn_eval(linear: LinearT, bn: Module) -> LinearT:
    """A copy of ``linear`` computing ``bn(linear(x))``, both in eval mode.

    As ``torch.nn.utils.fuse_linear_bn_eval``.

    Args:
        linear: a ``Linear``.
        bn: a ``BatchNorm1d`` over ``linear``'s outputs (or of one feature,
            broadcast), with running statistics.

    Returns:
        The fused linear layer (``linear`` itself is unchanged).

    Raises:
        AssertionError: either module is in training mode, the sizes do not
            match, or ``bn`` has no running statistics (as PyTorch's asserts).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> lin, bn = jm.nn.Linear(3, 4).eval(), jm.nn.BatchNorm1d(4).eval()
    >>> fused = jm.nn.utils.fuse_linear_bn_eval(lin, bn)
    >>> x = jnp.ones((2, 3))
    >>> bool(jnp.allclose(fused(x), bn(lin(x)), atol=1e-5))
    True
    """
    _check_eval(linear, bn)
    fused = copy.deepcopy(linear)
    if linear.out_features != bn.num_features and bn.num_features != 1:
        raise AssertionError(
            "To fuse, linear.out_features == bn.num_features or bn.num_features == 1, "
            f"got linear.out_features={linear.out_features} and bn.num_features={bn.num_features}"
        )
    _check_stats(bn)
    fused.weight, fused.bias = fuse_linear_bn_weights(
        fused.weight,
        fused.bias,
        bn.running_mean,
        bn.running_var,
        bn.eps,
        bn.weight,
        bn.bias,
    )
    return fused


def fuse_linear_bn_weights(
    linear_w: Any,
    linear_b: Any | None,
    bn_rm: Any,
    bn_rv: Any,
    bn_eps: float,
    bn_w: Any,
    bn_b: Any,
) -> tuple[Parameter, Parameter]:
    """The weight and bias of a ``Linear`` followed by an eval-mode BatchNorm, fused.

    As ``torch.nn.utils.fuse_linear_bn_weights``.

    Args:
        linear_w, linear_b: the layer's weight and bias (or None).
        bn_rm, bn_rv: the BatchNorm's running mean and variance.
        bn_eps: the BatchNorm's ``eps``.
        bn_w, bn_b: the BatchNorm's affine weight and bias.

    Returns:
        ``(weight, bias)`` as parameters, in the layer's dtypes.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w, b = jm.nn.utils.fuse_linear_bn_weights(
    ...     jnp.ones((2, 3)), None, jnp.zeros(2), jnp.full(2, 3.0), 1.0, jnp.ones(2), jnp.ones(2)
    ... )
    >>> w.round(decimals=4), b
    (Array([[0.5, 0.5, 0.5],
           [0.5, 0.5, 0.5]], dtype=float32), Parameter containing:
    Array([1., 1.], dtype=float32))
    """
    w_req, b_req = _requires_grad(linear_w), _requires_grad(linear_b)
    linear_w, linear_b = _arr(linear_w), _arr(linear_b)
    bn_rm, bn_rv, bn_w, bn_b = _arr(bn_rm), _arr(bn_rv), _arr(bn_w), _arr(bn_b)
    w_dtype = linear_w.dtype
    b_dtype = linear_b.dtype if linear_b is not None else w_dtype
    if linear_b is None:
        linear_b = jnp.zeros_like(bn_rm)
    scale = bn_w * jax.lax.rsqrt(bn_rv + bn_eps)
    fused_w = linear_w * scale[..., None].astype(w_dtype)
    fused_b = ((linear_b - bn_rm) * scale + bn_b).astype(b_dtype)
    return Parameter(fused_w, w_req), Parameter(fused_b, b_req)
