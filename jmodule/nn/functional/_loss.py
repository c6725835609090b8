"""Loss functions, as ``torch.nn.functional``'s: same signatures, reductions and numerics.

Every loss computes in at least float32 (bfloat16/float16 inputs are upcast)
and returns the input's dtype. ``reduction`` is ``"none"``, ``"mean"`` or
``"sum"`` (``kl_div`` also takes ``"batchmean"``); the legacy
``size_average``/``reduce`` arguments are honoured with PyTorch's warning.

Class-index targets may be any integer dtype (JAX's default int32 included).
Checks that need target *values* (an index out of range, BCE inputs outside
[0, 1], CTC lengths) run when the values are known, i.e. eagerly; inside
compiled code they cannot raise.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

from jmodule.nn.functional._misc import pairwise_distance
from jmodule.nn.functional._utils import (
    autocast_op,
    broadcast_shapes,
    clamp_min_straight_through,
    compute_dtype,
    concrete,
    jit,
)
from jmodule.nn.parameter import as_array

__all__ = [
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cosine_embedding_loss",
    "cross_entropy",
    "ctc_loss",
    "gaussian_nll_loss",
    "hinge_embedding_loss",
    "huber_loss",
    "kl_div",
    "l1_loss",
    "margin_ranking_loss",
    "mse_loss",
    "multi_margin_loss",
    "multilabel_margin_loss",
    "multilabel_soft_margin_loss",
    "nll_loss",
    "poisson_nll_loss",
    "smooth_l1_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "triplet_margin_with_distance_loss",
]

_REDUCTIONS = ("none", "mean", "sum")


# ----------------------------------------------------------------------------- helpers


def legacy_get_string(size_average: bool | None, reduce: bool | None) -> str:
    """PyTorch's mapping of the deprecated ``size_average``/``reduce`` pair to ``reduction``."""
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    ret = "mean" if size_average and reduce else "sum" if reduce else "none"
    warnings.warn(
        f"size_average and reduce args will be deprecated, please use reduction='{ret}' instead.",
        UserWarning,
        stacklevel=3,
    )
    return ret


def _reduction(size_average: Any, reduce: Any, reduction: str, allowed=_REDUCTIONS) -> str:
    if size_average is not None or reduce is not None:
        return legacy_get_string(size_average, reduce)
    if reduction not in allowed:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _reduce(loss: jax.Array, reduction: str) -> jax.Array:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _float(*xs: Any) -> tuple[list[jax.Array], Any, Any]:
    """The arrays in their common compute dtype; also ``(compute, output dtype)``."""
    arrays = [as_array(x) for x in xs]
    dtype = jnp.result_type(*arrays)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.float32
    compute = compute_dtype(dtype)
    return [a.astype(compute) for a in arrays], compute, dtype


def _warn_broadcast(input: jax.Array, target: jax.Array) -> None:
    if input.shape != target.shape:
        warnings.warn(
            f"Using a target size ({tuple(target.shape)}) that is different to the input size "
            f"({tuple(input.shape)}). This will likely lead to incorrect results due to "
            "broadcasting. Please ensure they have the same size.",
            UserWarning,
            stacklevel=3,
        )


def _weighted_mean(loss: jax.Array, weight: Any, input: jax.Array, reduction: str) -> jax.Array:
    """``mse_loss``/``l1_loss`` with ``weight``: mean is ``sum(w * l) / sum(w)``."""
    w = as_array(weight)
    if w.shape != input.shape:
        raise ValueError(
            f"Weights and input must have the same size; got weight {tuple(w.shape)} and "
            f"input {tuple(input.shape)}."
        )
    loss = loss * w.astype(loss.dtype)
    if reduction == "mean":
        return loss.sum() / w.astype(loss.dtype).sum()
    return _reduce(loss, reduction)


# ----------------------------------------------------------------------------- regression


@autocast_op("mse_loss")
def mse_loss(
    input: Any,
    target: Any,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    weight: Any = None,
) -> jax.Array:
    """Mean squared error, as ``torch.nn.functional.mse_loss``.

    Shapes that differ are broadcast with PyTorch's warning. With ``weight``
    (the input's shape), ``"mean"`` is ``sum(w * (x - y)²) / sum(w)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.mse_loss(jnp.array([1.0, 2.0]), jnp.array([0.0, 0.0]))
    Array(2.5, dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x, y), _, dtype = _float(input, target)
    _warn_broadcast(x, y)
    loss = jnp.square(x - y)
    if weight is not None:
        return _weighted_mean(loss, weight, x, reduction).astype(dtype)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("l1_loss")
def l1_loss(
    input: Any,
    target: Any,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    weight: Any = None,
) -> jax.Array:
    """Mean absolute error, as ``torch.nn.functional.l1_loss`` (``weight`` as in :func:`mse_loss`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.l1_loss(jnp.array([1.0, -3.0]), jnp.zeros(2), reduction="sum")
    Array(4., dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x, y), _, dtype = _float(input, target)
    _warn_broadcast(x, y)
    loss = jnp.abs(x - y)
    if weight is not None:
        return _weighted_mean(loss, weight, x, reduction).astype(dtype)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("smooth_l1_loss")
def smooth_l1_loss(
    input: Any,
    target: Any,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    beta: float = 1.0,
) -> jax.Array:
    """``0.5 d² / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta``, as PyTorch's.

    ``beta=0`` is the L1 loss.

    Raises:
        RuntimeError: ``beta`` is negative.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.smooth_l1_loss(jnp.array([0.5, 3.0]), jnp.zeros(2), reduction="none")
    Array([0.125, 2.5  ], dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    (x, y), _, dtype = _float(input, target)
    _warn_broadcast(x, y)
    d = jnp.abs(x - y)
    if beta == 0.0:
        loss = d
    else:
        loss = jnp.where(d < beta, 0.5 * jnp.square(d) / beta, d - 0.5 * beta)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("huber_loss")
def huber_loss(
    input: Any,
    target: Any,
    reduction: str = "mean",
    delta: float = 1.0,
    weight: Any = None,
) -> jax.Array:
    """``0.5 d²`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``, as PyTorch's.

    With ``weight`` (the input's shape) each element is scaled and ``"mean"``
    is the plain mean of the weighted losses, as in PyTorch.

    Raises:
        RuntimeError: ``delta`` is not positive.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.huber_loss(jnp.array([0.5, 3.0]), jnp.zeros(2), delta=2.0, reduction="none")
    Array([0.125, 4.   ], dtype=float32)
    """
    reduction = _reduction(None, None, reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    (x, y), _, dtype = _float(input, target)
    _warn_broadcast(x, y)
    d = jnp.abs(x - y)
    loss = jnp.where(d < delta, 0.5 * jnp.square(d), delta * (d - 0.5 * delta))
    if weight is not None:
        w = as_array(weight)
        if w.shape != x.shape:
            raise ValueError(
                f"Weights and input must have the same size; got weight {tuple(w.shape)} and "
                f"input {tuple(x.shape)}."
            )
        loss = loss * w.astype(loss.dtype)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("poisson_nll_loss")
def poisson_nll_loss(
    input: Any,
    target: Any,
    log_input: bool = True,
    full: bool = False,
    size_average: bool | None = None,
    eps: float = 1e-8,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Poisson negative log-likelihood, as ``torch.nn.functional.poisson_nll_loss``.

    ``exp(input) - target * input`` with ``log_input`` (the input is the log
    of the rate), else ``input - target * log(input + eps)``. ``full`` adds
    Stirling's approximation ``t log t - t + log(2 pi t) / 2`` where
    ``target > 1`` (nothing elsewhere), as PyTorch does. Shapes broadcast.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.poisson_nll_loss(jnp.zeros(2), jnp.array([1.0, 2.0]), reduction="none")
    Array([1., 1.], dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x, y), _, dtype = _float(input, target)
    broadcast_shapes(y.shape, x.shape)
    loss = jnp.exp(x) - y * x if log_input else x - y * jnp.log(x + eps)
    if full:
        counted = y > 1
        t = jnp.where(counted, y, 2)  # finite (and gradient-safe) where masked out
        stirling = t * jnp.log(t) - t + 0.5 * jnp.log(2 * math.pi * t)
        loss = loss + jnp.where(counted, stirling, 0)
    return _reduce(loss, reduction).astype(dtype)


def gaussian_nll_loss(
    input: Any,
    target: Any,
    var: Any,
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> jax.Array:
    """Gaussian negative log-likelihood, as ``torch.nn.functional.gaussian_nll_loss``.

    ``0.5 (log(var) + (input - target)² / var)`` (plus ``0.5 log(2 pi)`` with
    ``full``), with ``var`` clamped below at ``eps``; as in PyTorch the clamp
    passes gradients through unchanged.

    Args:
        input: the expected means ``(N, *)`` or ``(*)``.
        target: samples, broadcast against ``input``.
        var: variances: a number, the input's shape, the input's shape without
            its last dimension, or the input's shape with one dimension of
            size 1 (a shared variance), as PyTorch accepts.
        full: add the constant term.
        eps: the clamp's lower bound.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.

    Raises:
        ValueError: a negative variance (checked when not traced), a ``var`` of
            another shape, or an unknown ``reduction``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.gaussian_nll_loss(jnp.array([1.0, 2.0]), jnp.array([1.0, 0.0]), 2.0).round(4)
    Array(0.8466, dtype=float32)
    """
    if isinstance(var, (int, float)) and not isinstance(var, bool):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        (x, y), compute, dtype = _float(input, target)
        v = jnp.full(x.shape, var, compute)
    else:
        (x, y, v), compute, dtype = _float(input, target, var)
        values = concrete(as_array(var))
        if values is not None and np.any(values < 0):
            raise ValueError("var has negative entry/entries")
    if v.shape != x.shape:
        if x.shape[:-1] == v.shape:
            v = v[..., None]
        elif not (x.ndim == v.ndim and sum(m for n, m in zip(x.shape, v.shape) if n != m) == 1):
            raise ValueError("var is of incorrect size")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not valid")
    broadcast_shapes(x.shape, y.shape)
    v = clamp_min_straight_through(v, eps)
    loss = 0.5 * (jnp.log(v) + jnp.square(x - y) / v)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction).astype(dtype)


# ----------------------------------------------------------------------------- classification


def _check_class_target(x: jax.Array, t: jax.Array, weight: Any) -> None:
    """PyTorch's shape checks for class-index targets (``nll_loss``/``cross_entropy``)."""
    shapes = f"(input {tuple(x.shape)}, target {tuple(t.shape)})"
    if x.ndim == 0:
        raise ValueError(f"input should be (C,), (N, C) or (N, C, d1, ...) {shapes}")
    if x.ndim == 1:
        if t.ndim != 0:
            raise RuntimeError(f"0D target tensor expected for a 1D (C,) input {shapes}")
    else:
        if t.ndim == 0 or (x.ndim == 2 and t.ndim != 1):
            raise RuntimeError(
                f"0D or 1D target tensor expected, multi-target not supported {shapes}"
            )
        if x.shape[0] != t.shape[0]:
            raise ValueError(
                f"Expected input batch_size ({x.shape[0]}) to match target batch_size "
                f"({t.shape[0]})."
            )
        if x.ndim > 2 and tuple(t.shape) != (x.shape[0], *x.shape[2:]):
            raise RuntimeError(
                f"Expected target size {[x.shape[0], *x.shape[2:]]}, got {list(t.shape)}"
            )
    classes = x.shape[0 if x.ndim == 1 else 1]
    if weight is not None and tuple(as_array(weight).shape) != (classes,):
        raise RuntimeError(
            f"weight tensor should be defined either for all {classes} classes or no classes "
            f"but got weight tensor of shape: {list(as_array(weight).shape)}"
        )


def _picked_nll(
    logp: jax.Array, target: Any, weight: Any, ignore_index: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(-w[t] * logp[t], w[t], valid)`` per element, zero where ``t == ignore_index``."""
    t = as_array(target)
    if not jnp.issubdtype(t.dtype, jnp.integer):
        raise RuntimeError(f"expected an integer class-index target, got dtype {t.dtype}")
    _check_class_target(logp, t, weight)
    class_dim = 0 if logp.ndim == 1 else 1
    classes = logp.shape[class_dim]
    valid = t != ignore_index
    _check_class_values(t, classes, ignore_index)
    safe = jnp.where(valid, t, 0)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(safe, class_dim), axis=class_dim)
    picked = jnp.squeeze(picked, class_dim)
    if weight is None:
        w = valid.astype(logp.dtype)
    else:
        w = jnp.where(valid, as_array(weight).astype(logp.dtype)[safe], 0)
    return -picked * w, w, valid


def _check_class_values(target: Any, classes: int, ignore_index: int) -> None:
    """PyTorch's IndexError for a class index outside ``[0, classes)`` (when not traced)."""
    values = concrete(target)
    if values is None or not np.issubdtype(values.dtype, np.integer):
        return
    bad = values[(values != ignore_index) & ((values < 0) | (values >= classes))]
    if bad.size:
        raise IndexError(f"Target {int(bad.flat[0])} is out of bounds.")


def _check_targets(input: Any, target: Any, ignore_index: int) -> None:
    """The value check of class-index targets, made eagerly before a compiled loss runs."""
    shape = getattr(input, "shape", None)
    if shape:
        _check_class_values(as_array(target), shape[0 if len(shape) == 1 else 1], ignore_index)


def _nll_reduce(loss: jax.Array, w: jax.Array, reduction: str) -> jax.Array:
    if reduction == "mean":
        return loss.sum() / w.sum()
    return _reduce(loss, reduction)


@autocast_op("nll_loss")
def nll_loss(
    input: Any,
    target: Any,
    weight: Any = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Negative log-likelihood of class indices, as ``torch.nn.functional.nll_loss``.

    Args:
        input: log-probabilities ``(N, C)``, ``(C,)`` or ``(N, C, d1, ...)``.
        target: class indices ``(N,)``, ``()`` or ``(N, d1, ...)``.
        weight: per-class weights ``(C,)``.
        ignore_index: targets equal to it contribute nothing (nor to the mean's
            denominator).
        reduction: ``"mean"`` divides by the summed weights of the counted targets.

    Raises:
        ValueError, RuntimeError: shapes that do not fit (PyTorch's messages).
        IndexError: a target outside ``[0, C)`` (checked when not traced).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.nll_loss(jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.75]])), jnp.array([0, 1])).round(4)
    Array(0.4904, dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    _check_targets(input, target, ignore_index)
    return _nll_loss(input, target, weight, ignore_index, reduction)


@jit("ignore_index", "reduction", inline=True)
def _nll_loss(input: Any, target: Any, weight: Any, ignore_index: int, reduction: str) -> Any:
    (x,), _, dtype = _float(input)
    loss, w, _ = _picked_nll(x, target, weight, ignore_index)
    return _nll_reduce(loss, w, reduction).astype(dtype)


@autocast_op(("cross_entropy_loss", "nll_loss"))
def cross_entropy(
    input: Any,
    target: Any,
    weight: Any = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> jax.Array:
    """Cross-entropy of logits, as ``torch.nn.functional.cross_entropy``.

    ``target`` is either class indices (an integer array, as :func:`nll_loss`)
    or class probabilities (a float array shaped like ``input``).
    ``label_smoothing`` mixes the target with the uniform distribution, as
    PyTorch does for both kinds of target.

    Raises:
        RuntimeError: ``ignore_index`` with probability targets, or a
            ``label_smoothing`` outside [0, 1].

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    >>> F.cross_entropy(logits, jnp.array([0, 1]), label_smoothing=0.1).round(4)
    Array(0.4773, dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    _check_targets(input, target, ignore_index)
    return _cross_entropy(input, target, weight, ignore_index, reduction, float(label_smoothing))


@jit("ignore_index", "reduction", "label_smoothing", inline=True)
def _cross_entropy(
    input: Any, target: Any, weight: Any, ignore_index: int, reduction: str, label_smoothing: float
) -> Any:
    (x,), compute, dtype = _float(input)
    class_dim = 0 if x.ndim == 1 else 1
    if x.ndim == 0:
        raise ValueError("cross_entropy expects input (C,), (N, C) or (N, C, d1, ...); got 0-D")
    classes = x.shape[class_dim]
    logp = jax.nn.log_softmax(x, axis=class_dim)
    t = as_array(target)
    w_shape = [1] * x.ndim
    w_shape[class_dim] = classes
    if jnp.issubdtype(t.dtype, jnp.floating):
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        if t.shape != x.shape:
            raise RuntimeError(
                f"Expected a probability target of the input's shape {tuple(x.shape)}, "
                f"got {tuple(t.shape)}"
            )
        if weight is not None and tuple(as_array(weight).shape) != (classes,):
            raise RuntimeError(
                f"weight tensor should be defined either for all {classes} classes or no "
                f"classes but got weight tensor of shape: {list(as_array(weight).shape)}"
            )
        t = t.astype(compute)
        if label_smoothing > 0:
            t = t * (1 - label_smoothing) + label_smoothing / classes
        terms = logp * t
        if weight is not None:
            terms = terms * as_array(weight).astype(compute).reshape(w_shape)
        loss = -terms.sum(axis=class_dim)
        if reduction == "mean":
            return (loss.sum() / (x.size // classes)).astype(dtype)
        return _reduce(loss, reduction).astype(dtype)
    nll, w, valid = _picked_nll(logp, t, weight, ignore_index)
    out = _nll_reduce(nll, w, reduction)
    if label_smoothing > 0:
        per_class = logp
        if weight is not None:
            per_class = logp * as_array(weight).astype(compute).reshape(w_shape)
        smooth = jnp.where(valid, -per_class.sum(axis=class_dim), 0)
        smooth = smooth.sum() / w.sum() if reduction == "mean" else _reduce(smooth, reduction)
        out = (1 - label_smoothing) * out + smooth * (label_smoothing / classes)
    return out.astype(dtype)


@autocast_op("binary_cross_entropy")
def binary_cross_entropy(
    input: Any,
    target: Any,
    weight: Any = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Binary cross-entropy of probabilities, as ``torch.nn.functional.binary_cross_entropy``.

    Log terms are clamped at -100, as in PyTorch, so 0 and 1 inputs give
    finite losses.

    Raises:
        ValueError: ``target`` and ``input`` shapes differ.
        RuntimeError: an input outside [0, 1] (checked when not traced).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> p, target = jnp.array([0.5, 1.0]), jnp.array([1.0, 0.0])
    >>> F.binary_cross_entropy(p, target, reduction="none").round(4)
    Array([  0.6931, 100.    ], dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x, y), compute, dtype = _float(input, target)
    if x.shape != y.shape:
        raise ValueError(
            f"Using a target size ({tuple(y.shape)}) that is different to the input size "
            f"({tuple(x.shape)}) is deprecated. Please ensure they have the same size."
        )
    values = concrete(input)
    if values is not None and np.any((values < 0) | (values > 1)):
        raise RuntimeError("all elements of input should be between 0 and 1")
    log_x = jnp.maximum(jnp.log(x), -100.0)
    log_1mx = jnp.maximum(jnp.log1p(-x), -100.0)
    loss = -(y * log_x + (1 - y) * log_1mx)
    if weight is not None:
        loss = loss * as_array(weight).astype(compute)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(
    input: Any,
    target: Any,
    weight: Any = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    pos_weight: Any = None,
) -> jax.Array:
    """Sigmoid and binary cross-entropy in one stable step, as PyTorch's.

    Args:
        weight: rescales each element's loss (broadcast).
        pos_weight: weight of the positive term, broadcast along the last
            (class) axis.

    Raises:
        ValueError: ``target`` and ``input`` shapes differ.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.binary_cross_entropy_with_logits(jnp.zeros(2), jnp.array([1.0, 0.0])).round(4)
    Array(0.6931, dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x, y), compute, dtype = _float(input, target)
    if x.shape != y.shape:
        raise ValueError(
            f"Target size ({tuple(y.shape)}) must be the same as input size ({tuple(x.shape)})"
        )
    softplus_neg = jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, 0)  # log(1 + e^-x)
    if pos_weight is not None:
        log_weight = 1 + (as_array(pos_weight).astype(compute) - 1) * y
        loss = (1 - y) * x + log_weight * softplus_neg
    else:
        loss = (1 - y) * x + softplus_neg
    if weight is not None:
        loss = loss * as_array(weight).astype(compute)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("kl_div")
def kl_div(
    input: Any,
    target: Any,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    log_target: bool = False,
) -> jax.Array:
    """Kullback-Leibler divergence of log-probabilities ``input`` from ``target``, as PyTorch's.

    Pointwise ``target * (log(target) - input)`` (``0`` where ``target == 0``),
    or ``exp(target) * (target - input)`` with ``log_target``.
    ``"batchmean"`` divides the sum by the batch size (the KL divergence);
    ``"mean"`` divides by the number of elements and warns, as PyTorch does.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> p = jnp.array([[0.25, 0.75]])
    >>> F.kl_div(jnp.log(p), p, reduction="batchmean")
    Array(0., dtype=float32)
    """
    if size_average is not None or reduce is not None:
        reduction = legacy_get_string(size_average, reduce)
    elif reduction not in (*_REDUCTIONS, "batchmean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    elif reduction == "mean":
        warnings.warn(
            "reduction: 'mean' divides the total loss by both the batch size and the support "
            "size.'batchmean' divides only by the batch size, and aligns with the KL div math "
            "definition.'mean' will be changed to behave the same as 'batchmean' in the next "
            "major release.",
            UserWarning,
            stacklevel=2,
        )
    (x, y), _, dtype = _float(input, target)
    loss = jnp.exp(y) * (y - x) if log_target else xlogy(y, y) - y * x
    if reduction == "batchmean":
        out = loss.sum() / x.shape[0] if x.ndim else loss.sum()
    else:
        out = _reduce(loss, reduction)
    return out.astype(dtype)


@autocast_op("soft_margin_loss")
def soft_margin_loss(
    input: Any,
    target: Any,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Two-class logistic loss ``log(1 + exp(-target * input))``, as PyTorch's.

    ``target`` holds 1 / -1; shapes broadcast. Computed as a stable softplus,
    so it stays finite where PyTorch's ``log1p(exp(...))`` overflows to inf.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.soft_margin_loss(jnp.zeros(2), jnp.array([1.0, -1.0])).round(4)
    Array(0.6931, dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x, y), _, dtype = _float(input, target)
    broadcast_shapes(x.shape, y.shape)
    return _reduce(jax.nn.softplus(-x * y), reduction).astype(dtype)


def multilabel_soft_margin_loss(
    input: Any,
    target: Any,
    weight: Any = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Multi-label one-versus-all logistic loss, as ``F.multilabel_soft_margin_loss``.

    Per sample, the mean over the ``C`` classes (the last axis) of
    ``-(y log sigmoid(x) + (1 - y) log sigmoid(-x))``, each class scaled by
    ``weight`` (broadcast) when given.

    Args:
        input: ``(N, C)`` or ``(C,)`` logits.
        target: 0 / 1 labels, the input's shape.
        weight: per-class (or broadcastable) weights.

    Raises:
        ValueError: an unknown ``reduction``.
        IndexError: a 0-D input.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.multilabel_soft_margin_loss(jnp.zeros((1, 2)), jnp.array([[1.0, 0.0]])).round(4)
    Array(0.6931, dtype=float32)
    """
    if size_average is not None or reduce is not None:
        reduction = legacy_get_string(size_average, reduce)
    elif reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not valid")
    (x, y), compute, dtype = _float(input, target)
    if x.ndim == 0:
        raise IndexError("Dimension specified as -1 but tensor has no dimensions")
    broadcast_shapes(x.shape, y.shape)
    loss = -(y * jax.nn.log_sigmoid(x) + (1 - y) * jax.nn.log_sigmoid(-x))
    if weight is not None:
        w = as_array(weight)
        broadcast_shapes(loss.shape, w.shape)
        loss = loss * w.astype(compute)
    loss = loss.sum(axis=-1) / x.shape[-1]
    return _reduce(loss, reduction).astype(dtype)


def _margin_shapes(x: jax.Array, t: jax.Array) -> tuple[int, int]:
    """``(samples, classes)`` of a multi-class margin loss's input; PyTorch's checks."""
    if not ((x.ndim <= 1 and x.size != 0) or (x.ndim == 2 and x.shape[1] != 0)):
        raise RuntimeError(
            "Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
            f"{list(x.shape)}"
        )
    if not jnp.issubdtype(t.dtype, jnp.integer):
        raise RuntimeError(
            f"expected scalar type Long but found {t.dtype} (any integer dtype is accepted)"
        )
    return (1, x.size) if x.ndim <= 1 else x.shape


@autocast_op("multi_margin_loss")
def multi_margin_loss(
    input: Any,
    target: Any,
    p: int = 1,
    margin: float = 1.0,
    weight: Any = None,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Multi-class hinge loss, as ``torch.nn.functional.multi_margin_loss``.

    Per sample, ``sum_{i != y} w[y] max(0, margin - x[y] + x[i])^p / C``.

    Args:
        input: ``(N, C)`` or ``(C,)`` scores.
        target: class indices ``(N,)``, or ``()`` / ``(1,)`` for a ``(C,)``
            input (any integer dtype).
        p: 1 or 2.
        margin: the margin.
        weight: per-class weights ``(C,)``, picked by each sample's target.
        reduction: ``"mean"`` averages over the samples.

    Raises:
        ValueError: ``p`` not 1 or 2, or a ``weight`` that is not 1-D.
        RuntimeError: shapes that do not fit, a float target, or (checked
            when not traced) a target outside ``[0, C)`` (PyTorch's messages).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.multi_margin_loss(jnp.array([[0.1, 0.2, 0.4, 0.8]]), jnp.array([3])).round(4)
    Array(0.325, dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and as_array(weight).ndim != 1:
        raise ValueError("weight must be one-dimensional")
    (x,), compute, dtype = _float(input)
    t = as_array(target)
    samples, classes = _margin_shapes(x, t)
    if t.ndim > 1 or t.size != samples:
        raise RuntimeError(
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of "
            f"input samples (batch size). Expected target size [{samples}], but got "
            f"{list(t.shape)}. Input has shape {list(x.shape)}."
        )
    if weight is not None and as_array(weight).size != classes:
        raise RuntimeError(
            f"inconsistent weight size, expected {classes} but got {list(as_array(weight).shape)}"
        )
    values = concrete(t)
    if values is not None and np.any((values < 0) | (values >= classes)):
        raise RuntimeError("target out of range")
    w = None if weight is None else as_array(weight).astype(compute)
    loss = _multi_margin(x.reshape(samples, classes), t.reshape(samples), w, p, margin)
    return _reduce(loss.reshape(t.shape), reduction).astype(dtype)


@functools.partial(jax.jit, static_argnames=("p",))
def _multi_margin(
    xs: jax.Array, t: jax.Array, w: jax.Array | None, p: int, margin: float
) -> jax.Array:
    """Per-sample multi-class hinge loss of ``(N, C)`` scores (jitted: one program eagerly)."""
    classes = xs.shape[1]
    t = jnp.clip(t, 0, classes - 1)
    z = margin - jnp.take_along_axis(xs, t[:, None], axis=1) + xs
    h = jnp.where(z > 0, z, 0)  # PyTorch's kernel: no gradient at z == 0
    if p == 2:
        h = h * h
    if w is not None:
        h = h * w[t][:, None]
    h = jnp.where(jnp.arange(classes) != t[:, None], h, 0)
    return h.sum(axis=1) / classes


@autocast_op("multilabel_margin_loss")
def multilabel_margin_loss(
    input: Any,
    target: Any,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """Multi-label hinge loss, as ``torch.nn.functional.multilabel_margin_loss``.

    ``target`` lists each sample's classes, padded with -1: only the indices
    before the first -1 count. Per sample,
    ``sum_{j in targets} sum_{i not in targets} max(0, 1 - (x[j] - x[i])) / C``
    (a repeated target counts each time, as in PyTorch).

    Args:
        input: ``(N, C)`` or ``(C,)`` scores.
        target: integer indices of the input's shape.

    Raises:
        RuntimeError: shapes that do not fit, a float target, or (checked
            when not traced) a target outside ``[-1, C)`` (PyTorch's messages).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x = jnp.array([[0.1, 0.2, 0.4, 0.8]])
    >>> round(float(F.multilabel_margin_loss(x, jnp.array([[3, 0, -1, 1]]))), 4)
    0.85
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x,), _, dtype = _float(input)
    t = as_array(target)
    samples, classes = _margin_shapes(x, t)
    fits = t.ndim <= 1 and t.size == classes if x.ndim <= 1 else t.shape == x.shape
    if not fits:
        raise RuntimeError(
            f"inconsistent target size: {list(t.shape)} for input of size: {list(x.shape)}"
        )
    values = concrete(t)
    if values is not None and np.any((values < -1) | (values >= classes)):
        raise RuntimeError("argument #2 'target' is out of range")
    loss = _multilabel_margin(x.reshape(samples, classes), t.reshape(samples, classes))
    if t.ndim <= 1:
        loss = loss.reshape(())
    return _reduce(loss, reduction).astype(dtype)


@jax.jit
def _multilabel_margin(xs: jax.Array, t: jax.Array) -> jax.Array:
    """Per-sample multi-label hinge loss of ``(N, C)`` scores (jitted: one program eagerly)."""
    classes = xs.shape[1]
    counted = jnp.cumprod((t >= 0).astype(jnp.int32), axis=1) > 0  # before the first -1
    safe = jnp.where(counted, t, 0)
    is_target = (counted[:, :, None] & (safe[:, :, None] == jnp.arange(classes))).any(axis=1)
    z = 1 - jnp.take_along_axis(xs, safe, axis=1)[:, :, None] + xs[:, None, :]
    h = jnp.where(counted[:, :, None] & ~is_target[:, None, :] & (z > 0), z, 0)
    return h.sum(axis=(1, 2)) / classes


# ----------------------------------------------------------------------------- embeddings, ranking


@autocast_op("hinge_embedding_loss")
def hinge_embedding_loss(
    input: Any,
    target: Any,
    margin: float = 1.0,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """``input`` where ``target == 1``, ``max(0, margin - input)`` where ``-1``, as PyTorch's.

    Shapes broadcast. As in PyTorch, a target that is neither 1 nor -1 gets
    both terms.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.hinge_embedding_loss(jnp.array([0.3, 0.3]), jnp.array([1, -1]), reduction="none")
    Array([0.3, 0.7], dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (x, y), _, dtype = _float(input, target)
    broadcast_shapes(y.shape, x.shape)
    loss = jnp.where(y != 1, jnp.maximum(margin - x, 0), 0) + jnp.where(y != -1, x, 0)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("cosine_embedding_loss")
def cosine_embedding_loss(
    input1: Any,
    input2: Any,
    target: Any,
    margin: float = 0,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """``1 - cos(x1, x2)`` for ``target == 1``, ``max(0, cos - margin)`` for ``-1``, as PyTorch's.

    Args:
        input1, input2: ``(N, D)`` or ``(D,)``.
        target: ``(N,)`` or ``()`` of 1 / -1.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> F.cosine_embedding_loss(x, x, jnp.array([1, -1]), reduction="none")
    Array([0., 1.], dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (a, b), _compute, dtype = _float(input1, input2)
    t = as_array(target)
    if a.shape != b.shape or a.ndim not in (1, 2) or t.shape != a.shape[:-1]:
        raise RuntimeError(
            "cosine_embedding_loss expects input1 and input2 of the same shape (N, D) or (D,) "
            f"and target (N,) or (); got input1 {tuple(a.shape)}, input2 {tuple(b.shape)}, "
            f"target {tuple(t.shape)}"
        )
    eps = 1e-12
    prod = (a * b).sum(-1)
    mag = jnp.sqrt(((a * a).sum(-1) + eps) * ((b * b).sum(-1) + eps))
    cos = prod / mag
    zeros = jnp.zeros_like(cos)
    pos = jnp.where(t == 1, 1 - cos, zeros)
    neg = jnp.where(t == -1, jnp.maximum(cos - margin, 0), zeros)
    return _reduce(pos + neg, reduction).astype(dtype)


@autocast_op("margin_ranking_loss")
def margin_ranking_loss(
    input1: Any,
    input2: Any,
    target: Any,
    margin: float = 0,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """``max(0, -target * (input1 - input2) + margin)``, as PyTorch's.

    Raises:
        RuntimeError: the three arrays differ in rank (PyTorch's check).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.margin_ranking_loss(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]), jnp.array([1, 1]))
    Array(0.5, dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    (a, b), compute, dtype = _float(input1, input2)
    t = as_array(target)
    if a.ndim != b.ndim or a.ndim != t.ndim:
        raise RuntimeError(
            "margin_ranking_loss : All input tensors should have same dimension but got sizes: "
            f"input1: {tuple(a.shape)}, input2: {tuple(b.shape)}, target: {tuple(t.shape)} "
        )
    loss = jnp.maximum(-t.astype(compute) * (a - b) + margin, 0)
    return _reduce(loss, reduction).astype(dtype)


@autocast_op("triplet_margin_loss")
def triplet_margin_loss(
    anchor: Any,
    positive: Any,
    negative: Any,
    margin: float = 1.0,
    p: float = 2,
    eps: float = 1e-6,
    swap: bool = False,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> jax.Array:
    """``max(d(a, p) - d(a, n) + margin, 0)`` with PyTorch's pairwise ``p``-norm distance.

    Args:
        anchor, positive, negative: ``(N, D)`` or ``(D,)``.
        swap: use ``min(d(a, n), d(p, n))`` as the negative distance.

    Raises:
        ValueError: ``margin`` is not positive.
        RuntimeError: the inputs differ in rank.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> a = jnp.zeros((1, 2))
    >>> F.triplet_margin_loss(a, a, a + 3.0).round(4)
    Array(0., dtype=float32)
    """
    reduction = _reduction(size_average, reduce, reduction)
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    (a, pos, neg), _, dtype = _float(anchor, positive, negative)
    if not a.ndim == pos.ndim == neg.ndim:
        raise RuntimeError(
            "The anchor, positive, and negative tensors are expected to have the same number "
            f"of dimensions, but got: anchor {a.ndim}D, positive {pos.ndim}D, and negative "
            f"{neg.ndim}D inputs"
        )
    d_pos = pairwise_distance(a, pos, p, eps)
    d_neg = pairwise_distance(a, neg, p, eps)
    if swap:
        d_neg = jnp.minimum(d_neg, pairwise_distance(pos, neg, p, eps))
    loss = jnp.maximum(margin + d_pos - d_neg, 0)
    return _reduce(loss, reduction).astype(dtype)


def triplet_margin_with_distance_loss(
    anchor: Any,
    positive: Any,
    negative: Any,
    *,
    distance_function: Callable[[Any, Any], jax.Array] | None = None,
    margin: float = 1.0,
    swap: bool = False,
    reduction: str = "mean",
) -> jax.Array:
    """Triplet loss with any distance, as ``F.triplet_margin_with_distance_loss``.

    ``max(d(a, p) - d(a, n) + margin, 0)``.

    Args:
        anchor, positive, negative: arrays of one rank.
        distance_function: ``(x1, x2) -> distances``; defaults to
            :func:`pairwise_distance`. Any JAX-traceable function or module.
        margin: a positive margin.
        swap: use ``min(d(a, n), d(p, n))`` as the negative distance.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.

    Raises:
        ValueError: an unknown ``reduction`` or a ``margin`` that is not positive.
        RuntimeError: the inputs differ in rank.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> a = jnp.zeros((1, 2))
    >>> F.triplet_margin_with_distance_loss(a, a + 1.0, a, distance_function=F.l1_loss)
    Array(2., dtype=float32)
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    a, pos, neg = as_array(anchor), as_array(positive), as_array(negative)
    if not a.ndim == pos.ndim == neg.ndim:
        raise RuntimeError(
            "The anchor, positive, and negative tensors are expected to have the same number "
            f"of dimensions, but got: anchor {a.ndim}D, positive {pos.ndim}D, and negative "
            f"{neg.ndim}D inputs"
        )
    distance = pairwise_distance if distance_function is None else distance_function
    d_pos = as_array(distance(a, pos))
    d_neg = as_array(distance(a, neg))
    if swap:
        d_neg = jnp.minimum(d_neg, as_array(distance(pos, neg)))
    (d_pos, d_neg), _, dtype = _float(d_pos, d_neg)
    gap = margin + d_pos - d_neg
    loss = jnp.where(gap >= 0, gap, 0)  # PyTorch's clamp_min: the gradient passes at 0
    return _reduce(loss, reduction).astype(dtype)


# ----------------------------------------------------------------------------- CTC


def _logsumexp(*xs: jax.Array) -> jax.Array:
    """Elementwise log(sum(exp)) that is ``-inf`` (with zero, not NaN, gradients) when all are."""
    m = xs[0]
    for x in xs[1:]:
        m = jnp.maximum(m, x)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0))
    s = sum(jnp.exp(x - m) for x in xs)
    positive = s > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, s, 1)) + m, -jnp.inf)


def _lengths(x: Any, batch: int, name: str) -> jax.Array:
    arr = jnp.asarray(np.asarray(x)) if isinstance(x, (tuple, list, int)) else as_array(x)
    arr = arr.reshape(-1) if arr.ndim == 0 else arr
    if arr.shape != (batch,):
        raise RuntimeError(
            f"{name} must have shape ({batch},) (one per batch element), got {tuple(arr.shape)}"
        )
    return arr.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("blank",))
def _ctc_nll(
    lp: jax.Array, t: jax.Array, in_len: jax.Array, tgt_len: jax.Array, blank: int
) -> jax.Array:
    """Per-element ``-log p(target | input)`` by the forward (alpha) recursion in log space.

    Jitted so that eager calls reuse one compiled loop per shape.
    """
    steps, batch, _ = lp.shape
    compute = lp.dtype
    width = t.shape[1]
    # Extended labels: blank, l1, blank, l2, ..., blank  (2S + 1).
    ext = jnp.full((batch, 2 * width + 1), blank, jnp.int32).at[:, 1::2].set(t)
    skip = jnp.zeros(ext.shape, bool)
    skip = skip.at[:, 2:].set((ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2]))
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (steps, *ext.shape)), axis=2)
    neg_inf = jnp.asarray(-jnp.inf, compute)
    alpha0 = jnp.full(ext.shape, neg_inf).at[:, 0].set(0.0)

    def step(alpha: jax.Array, inputs: tuple) -> tuple[jax.Array, None]:
        emit_t, step_t = inputs
        prev1 = jnp.concatenate([jnp.full((batch, 1), neg_inf), alpha[:, :-1]], axis=1)
        prev2 = jnp.concatenate([jnp.full((batch, 2), neg_inf), alpha[:, :-2]], axis=1)
        prev2 = jnp.where(skip, prev2, neg_inf)
        new = _logsumexp(alpha, prev1, prev2) + emit_t
        return jnp.where((step_t < in_len)[:, None], new, alpha), None

    alpha, _ = jax.lax.scan(step, alpha0, (emit, jnp.arange(steps)))
    last = jnp.take_along_axis(alpha, (2 * tgt_len)[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(alpha, jnp.maximum(2 * tgt_len - 1, 0)[:, None], axis=1)[:, 0]
    before = jnp.where(tgt_len > 0, before, neg_inf)
    return -_logsumexp(last, before)


@autocast_op("ctc_loss")
def ctc_loss(
    log_probs: Any,
    targets: Any,
    input_lengths: Any,
    target_lengths: Any,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
) -> jax.Array:
    """Connectionist Temporal Classification loss, as ``torch.nn.functional.ctc_loss``.

    Args:
        log_probs: ``(T, N, C)`` or unbatched ``(T, C)`` log-probabilities
            (e.g. ``log_softmax`` outputs).
        targets: ``(N, S)`` padded, or 1-D concatenated targets
            (``sum(target_lengths)``); never ``blank``.
        input_lengths, target_lengths: ``(N,)`` arrays or tuples.
        blank: the blank class.
        reduction: ``"mean"`` divides each loss by its target length, then
            averages over the batch.
        zero_infinity: impossible alignments give 0 (and zero gradients)
            instead of ``inf``.

    Returns:
        The loss (per batch element with ``"none"``).

    Gradients are the exact gradients of this function. PyTorch's backward
    instead returns ``exp(log_probs) - posterior``, the gradient through an
    implied ``log_softmax``; for ``log_probs = log_softmax(logits)`` the two
    agree exactly on ``logits``.

    Raises:
        RuntimeError: ``blank`` outside ``[0, C)``, lengths of the wrong
            shape, or (checked when not traced) lengths beyond ``T`` / ``S``.

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> lp = jax.nn.log_softmax(jnp.zeros((4, 1, 3)), axis=-1)
    >>> round(float(F.ctc_loss(lp, jnp.array([[1, 2]]), (4,), (2,), reduction="sum")), 4)
    1.6864
    """
    reduction = _reduction(None, None, reduction)
    (lp,), compute, dtype = _float(log_probs)
    batched = lp.ndim == 3
    if lp.ndim not in (2, 3):
        raise RuntimeError(
            f"ctc_loss expects log_probs (T, N, C) or (T, C); got shape {tuple(lp.shape)}"
        )
    if not batched:
        lp = lp[:, None]
    steps, batch, classes = lp.shape
    if not 0 <= blank < classes:
        raise RuntimeError("blank must be in label range")
    in_len = _lengths(input_lengths, batch, "input_lengths")
    tgt_len = _lengths(target_lengths, batch, "target_lengths")
    t = as_array(targets).astype(jnp.int32)
    if not batched and t.ndim == 1:
        t = t[None]
    if t.ndim == 1 and t.shape[0] == 0:
        t = jnp.zeros((batch, 1), jnp.int32)
    elif t.ndim == 1:  # concatenated: gather each element's run into a padded row
        starts = jnp.cumsum(tgt_len) - tgt_len
        idx = starts[:, None] + jnp.arange(t.shape[0])[None]
        inside = idx < (starts + tgt_len)[:, None]
        t = jnp.where(inside, t[jnp.clip(idx, 0, t.shape[0] - 1)], 0)
    elif t.ndim != 2 or t.shape[0] != batch:
        raise RuntimeError(
            f"targets must be (N, S) = ({batch}, S) or 1-D concatenated; got {tuple(t.shape)}"
        )
    width = t.shape[1]
    for name, lengths, limit, what in (
        ("input_lengths", in_len, steps, "T"),
        ("target_lengths", tgt_len, width, "S"),
    ):
        values = concrete(lengths)
        if values is not None and values.size and values.max() > limit:
            raise RuntimeError(
                f"Expected {name} to have value at most {limit} ({what}), but got value "
                f"{int(values.max())}"
            )
    loss = _ctc_nll(lp, t, in_len, tgt_len, blank)
    if zero_infinity:
        loss = jnp.where(jnp.isinf(loss), jnp.zeros((), compute), loss)
    if reduction == "mean":
        out = (loss / jnp.maximum(tgt_len, 1).astype(compute)).mean()
    elif reduction == "sum":
        out = loss.sum()
    else:
        out = loss if batched else loss[0]
    return out.astype(dtype)
