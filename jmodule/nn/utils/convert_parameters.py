"""Parameters as one flat vector and back, as ``torch.nn.utils.convert_parameters``."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import state as _state

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters: Iterable[Any]) -> jax.Array:
    """Flatten ``parameters`` and concatenate them into one 1-D array.

    As ``torch.nn.utils.parameters_to_vector``; the result is differentiable
    (``jm.backward`` sees the parameters it reads).

    Args:
        parameters: an iterable of parameters (or arrays), e.g.
            ``model.parameters()``.

    Returns:
        One vector holding every element, in iteration order.

    >>> import jmodule as jm
    >>> model = jm.nn.Linear(3, 2)
    >>> jm.nn.utils.parameters_to_vector(model.parameters()).shape
    (8,)
    """
    return jnp.concatenate([jnp.ravel(_state.value(p)) for p in parameters])


def vector_to_parameters(vec: Any, parameters: Iterable[Any]) -> None:
    """Copy consecutive slices of ``vec`` into ``parameters`` (the inverse of the above).

    As ``torch.nn.utils.vector_to_parameters``: each parameter's value is
    replaced by the next ``numel`` elements of ``vec`` in its shape (and, as
    PyTorch's ``param.data = ...``, ``vec``'s dtype). Works inside a
    ``jm.compile``d function.

    Args:
        vec: a 1-D array holding at least as many elements as the parameters.
        parameters: an iterable of parameters, e.g. ``model.parameters()``.

    Raises:
        TypeError: ``vec`` is not an array.
        RuntimeError: ``vec`` is too short for a parameter.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Linear(2, 1)
    >>> jm.nn.utils.vector_to_parameters(jnp.arange(3.0), model.parameters())
    >>> model.weight, model.bias
    (Parameter containing:
    Array([[0., 1.]], dtype=float32), Parameter containing:
    Array([2.], dtype=float32))
    """
    if not (_state.is_cell(vec) or isinstance(vec, jax.Array)):
        raise TypeError(f"expected jax.Array, but got: {_typename(vec)}")
    vec = _state.value(vec)
    pointer = 0
    for param in parameters:
        shape = tuple(_state.peek(param).shape)
        num = math.prod(shape)
        piece = vec[pointer : pointer + num]
        if piece.size != num:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {piece.size}")
        _state.assign(param, piece.reshape(shape))
        pointer += num


def _typename(x: Any) -> str:
    cls = type(x)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
