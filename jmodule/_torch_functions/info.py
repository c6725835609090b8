"""Tests and facts about arrays: ``jm.is_tensor``, ``jm.numel``, ``jm.is_floating_point``,
``jm.clone``, dtype helpers."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import state
from jmodule._torch_functions._common import arr, default_float, out_dtype

__all__ = [
    "can_cast",
    "clone",
    "detach",
    "finfo",
    "iinfo",
    "is_complex",
    "is_floating_point",
    "is_nonzero",
    "is_tensor",
    "numel",
    "promote_types",
    "result_type",
]


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is an array jmodule computes with: a ``jax.Array`` (traced values
    included) or a Parameter/Buffer, as ``torch.is_tensor`` is True for tensors and
    parameters. numpy arrays and Python numbers are not."""
    return isinstance(obj, jax.Array) or state.is_cell(obj)


def numel(input: Any) -> int:
    """The number of elements, a Python ``int``."""
    shape = getattr(input, "shape", None)
    if shape is None:
        shape = arr(input).shape
    return math.prod(shape)


def is_floating_point(input: Any) -> bool:
    """Whether the dtype is a floating one (float16/bfloat16/float32/float64)."""
    return bool(jnp.issubdtype(arr(input).dtype, jnp.floating))


def is_complex(input: Any) -> bool:
    """Whether the dtype is complex."""
    return bool(jnp.issubdtype(arr(input).dtype, jnp.complexfloating))


def is_nonzero(input: Any) -> bool:
    """The truth of a one-element array, a Python ``bool``.

    Raises:
        RuntimeError: the array has not exactly one element.
    """
    x = arr(input)
    if x.size == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if x.size > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(x.reshape(()))


def clone(input: Any, *, memory_format: Any = None) -> jax.Array:
    """A copy of ``input`` (a Parameter's value is read, so gradients flow through it)."""
    return jnp.array(arr(input), copy=True)


def detach(input: Any) -> jax.Array:
    """``input`` cut from gradients (``jax.lax.stop_gradient``)."""
    return jax.lax.stop_gradient(arr(input))


def result_type(tensor1: Any, tensor2: Any) -> Any:
    """The dtype an operation on both gives (JAX's promotion, PyTorch's for arrays)."""
    return jnp.result_type(arr(tensor1), arr(tensor2))


def promote_types(type1: Any, type2: Any) -> Any:
    """The smallest dtype both cast to safely."""
    return jnp.promote_types(out_dtype(type1), out_dtype(type2))


def can_cast(from_: Any, to: Any) -> bool:
    """Whether ``from_`` casts to ``to`` under PyTorch's (same-kind) casting rule."""
    return bool(jnp.can_cast(jnp.dtype(from_), jnp.dtype(to), casting="same_kind"))


def finfo(type: Any = None) -> Any:
    """Machine limits of a floating dtype (``jnp.finfo``; the default dtype when None)."""
    return jnp.finfo(type if type is not None else default_float())


def iinfo(type: Any) -> Any:
    """Machine limits of an integer dtype (``jnp.iinfo``)."""
    return jnp.iinfo(type)
