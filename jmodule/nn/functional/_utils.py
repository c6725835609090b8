"""Small helpers shared by the functional layers (argument tuples, dtypes, checks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def ntuple(value: Any, n: int) -> tuple:
    """``value`` repeated ``n`` times unless it is already a sequence (PyTorch's ``_ntuple``)."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,) * n


def compute_dtype(dtype: Any) -> Any:
    """The dtype PyTorch computes in for ``dtype`` ("opmath"): float32 for half types."""
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.promote_types(dtype, jnp.float32)
    return dtype


def upcast(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """Run ``fn(x, ...)`` in float32 for bfloat16/float16 ``x`` and cast back, as PyTorch does."""

    def wrapped(x: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
        compute = compute_dtype(x.dtype)
        if compute == x.dtype:
            return fn(x, *args, **kwargs)
        return fn(x.astype(compute), *args, **kwargs).astype(x.dtype)

    return wrapped


def concrete(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array when its value is known now (not traced), else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def shape_str(shape: Any) -> str:
    """A shape as PyTorch prints it in messages: ``[2, 3, 4]``."""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def check_float(x: jax.Array, name: str) -> None:
    """Raise PyTorch's error for an integer input to a floating-point-only op."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(f"{name}: expected a floating-point input, got dtype {x.dtype}")
