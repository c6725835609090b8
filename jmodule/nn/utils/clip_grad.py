"""Gradient clipping, as ``torch.nn.utils.clip_grad``.

The functions read and write each parameter's ``.grad`` (``Parameter.grad``,
the attribute the optimizers read), so they work eagerly and inside a
``jm.compile``d training step, where the gradients are traced values: the
clipping is arithmetic (no Python branch on a value), as PyTorch's is.

One difference JAX forces: ``error_if_nonfinite=True`` needs the norm's value
to decide whether to raise, which a compiled program does not have while it is
traced. There it raises a ``RuntimeError`` saying so (check
``jnp.isfinite(total_norm)`` on the returned norm after the step instead). A
check compiled into the program (a host callback that raises) would surface
only as an XLA runtime error after the step has consumed its donated
buffers, leaving the model's arrays deleted.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import state as _state

__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm"]

#: What PyTorch's clipping functions take: one array/parameter or an iterable of them.
ArraysT = Any | Iterable[Any]

_NONFINITE = (
    "The total norm of order {p} for gradients from `parameters` is non-finite, so it "
    "cannot be clipped. To disable this error and scale the gradients by the non-finite "
    "norm anyway, set `error_if_nonfinite=False`"
)

_TRACED_NONFINITE = (
    "error_if_nonfinite=True cannot raise inside a compiled function (jm.compile, jax.jit): "
    "the total norm is only known when the program runs, and a compiled program cannot raise "
    "a Python error on a value. Pass error_if_nonfinite=False, return the total norm from "
    "the step and check it outside (bool(jnp.isfinite(norm))), or call it eagerly."
)


@functools.partial(jax.jit, static_argnums=1)
def _total_norm(arrays: list[Any], norm_type: float) -> jax.Array:
    """The norm of the per-array norms (one program for all arrays: eagerly one dispatch)."""
    norms = [jnp.linalg.vector_norm(jnp.ravel(a), ord=norm_type) for a in arrays]
    return jnp.linalg.vector_norm(jnp.stack(norms), ord=norm_type)


@jax.jit
def _scaled(grads: list[Any], max_norm: Any, total_norm: Any) -> list[Any]:
    coef = jnp.minimum(max_norm / (total_norm + 1e-6), 1.0)
    return [(g * coef).astype(g.dtype) for g in grads]


@jax.jit
def _clamped(grads: list[Any], clip_value: Any) -> list[Any]:
    return [jnp.clip(g, -clip_value, clip_value).astype(g.dtype) for g in grads]


def _as_list(items: ArraysT) -> list[Any]:
    if _state.is_cell(items) or isinstance(items, jax.Array):
        return [items]
    return list(items)


def _scalar(x: Any) -> Any:
    """A Python number as ``float`` (as PyTorch does), an array as itself (traced is fine)."""
    if isinstance(x, (int, float)):
        return float(x)
    return _state.value(x)


def _grads(parameters: ArraysT) -> tuple[list[Any], list[Any]]:
    params = _as_list(parameters)
    with_grad = [p for p in params if p.grad is not None]
    return with_grad, [p.grad for p in with_grad]


def get_total_norm(
    tensors: ArraysT,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> jax.Array:
    """The ``norm_type``-norm of all ``tensors`` together, as if concatenated.

    As ``torch.nn.utils.get_total_norm``: the norm of the per-array norms.

    Args:
        tensors: an array or an iterable of arrays (gradients, usually).
        norm_type: the order of the norm: ``2.0``, ``1.0``, ``inf``, ``-inf``,
            ``0`` or any ``p``.
        error_if_nonfinite: raise ``RuntimeError`` when the norm is nan or
            inf (eagerly; inside a compiled function this raises saying it
            cannot, see the module docstring).
        foreach: accepted for PyTorch compatibility (JAX fuses the loop
            either way).

    Returns:
        The total norm, a scalar array (``0.0`` for no arrays).

    Raises:
        RuntimeError: ``error_if_nonfinite`` and the norm is nan or inf, or
            ``error_if_nonfinite`` while the norm is traced.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> jm.nn.utils.get_total_norm([jnp.array([3.0]), jnp.array([4.0])])
    Array(5., dtype=float32)
    >>> jm.nn.utils.get_total_norm([jnp.array([3.0, -4.0])], norm_type=float("inf"))
    Array(4., dtype=float32)
    """
    del foreach  # one fused program either way
    arrays = [_state.value(t) for t in _as_list(tensors)]
    norm_type = float(norm_type)
    if not arrays:
        return jnp.zeros((), jnp.float32)
    total = _total_norm(arrays, norm_type)
    if error_if_nonfinite:
        if isinstance(total, jax.core.Tracer):
            raise RuntimeError(_TRACED_NONFINITE)
        if not bool(jnp.isfinite(total)):
            raise RuntimeError(_NONFINITE.format(p=norm_type))
    return total


def clip_grads_with_norm_(
    parameters: ArraysT,
    max_norm: float,
    total_norm: Any,
    foreach: bool | None = None,
) -> None:
    """Scale the ``.grad`` of ``parameters`` by ``max_norm / (total_norm + 1e-6)``, at most 1.

    As ``torch.nn.utils.clip_grads_with_norm_``: with :func:`get_total_norm`
    it is :func:`clip_grad_norm_` in two steps (so the norm can be reduced
    across devices in between).

    Args:
        parameters: a parameter or an iterable of parameters; those whose
            ``.grad`` is None are left alone.
        max_norm: the largest norm the gradients may have (a number or a
            scalar array).
        total_norm: the gradients' total norm (from :func:`get_total_norm`).
        foreach: accepted for PyTorch compatibility.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> w.grad = jnp.array([3.0, 4.0])
    >>> jm.nn.utils.clip_grads_with_norm_([w], 1.0, jnp.array(5.0))
    >>> w.grad.round(4)
    Array([0.6, 0.8], dtype=float32)
    """
    del foreach  # one fused program either way
    params, grads = _grads(parameters)
    if not grads:
        return
    new = _scaled(grads, _scalar(max_norm), _state.value(total_norm))
    for p, g in zip(params, new):
        p.grad = g


def clip_grad_norm_(
    parameters: ArraysT,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> jax.Array:
    """Clip the gradients of ``parameters`` in place to a total norm of ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: the norm is computed over all
    gradients together, as if concatenated, and each ``.grad`` is multiplied
    by ``min(1, max_norm / (total_norm + 1e-6))``. Works inside a
    ``jm.compile``d step (between ``jm.backward`` and ``opt.step()``).

    Args:
        parameters: a parameter or an iterable of parameters; those whose
            ``.grad`` is None are skipped.
        max_norm: the largest norm the gradients may have.
        norm_type: the order of the norm (``2.0``, ``1.0``, ``inf``, any ``p``).
        error_if_nonfinite: raise ``RuntimeError`` when the total norm is nan
            or inf (eagerly only: inside a compiled function it raises saying
            so, since the value is not known while tracing).
        foreach: accepted for PyTorch compatibility.

    Returns:
        The total norm of the gradients before clipping (a scalar array).

    Raises:
        RuntimeError: see ``error_if_nonfinite``.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> w.grad = jnp.array([3.0, 4.0])
    >>> jm.nn.utils.clip_grad_norm_([w], max_norm=1.0)
    Array(5., dtype=float32)
    >>> w.grad.round(4)
    Array([0.6, 0.8], dtype=float32)
    """
    params = _as_list(parameters)
    max_norm = _scalar(max_norm)
    _, grads = _grads(params)
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(params, max_norm, total, foreach)
    return total


def clip_grad_value_(
    parameters: ArraysT,
    clip_value: float,
    foreach: bool | None = None,
) -> None:
    """Clamp every ``.grad`` of ``parameters`` in place to ``[-clip_value, clip_value]``.

    As ``torch.nn.utils.clip_grad_value_``.

    Args:
        parameters: a parameter or an iterable of parameters; those whose
            ``.grad`` is None are skipped.
        clip_value: the largest absolute value a gradient element may have.
        foreach: accepted for PyTorch compatibility.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(3))
    >>> w.grad = jnp.array([-2.0, 0.5, 3.0])
    >>> jm.nn.utils.clip_grad_value_(w, 1.0)
    >>> w.grad
    Array([-1. ,  0.5,  1. ], dtype=float32)
    """
    del foreach  # one fused program either way
    clip_value = _scalar(clip_value)
    params, grads = _grads(parameters)
    for p, g in zip(params, _clamped(grads, clip_value)):
        p.grad = g
