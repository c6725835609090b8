"""``Flatten`` and ``Unflatten``, as in ``torch.nn``."""

from __future__ import annotations

import math
from typing import Any

import jax

from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import as_array

__all__ = ["Flatten", "Unflatten"]


def _dim(dim: int, ndim: int) -> int:
    low, high = (-ndim, ndim - 1) if ndim else (-1, 0)
    if not low <= dim <= high:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{low}, {high}], but got {dim})"
        )
    return dim % max(ndim, 1)


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> jax.Array:
    """``torch.flatten``: merge dimensions ``start_dim..end_dim`` (inclusive) into one."""
    x = as_array(x)
    if x.ndim == 0:
        return x.reshape(1)
    start, end = _dim(start_dim, x.ndim), _dim(end_dim, x.ndim)
    if start > end:
        raise RuntimeError(
            f"flatten() has invalid args: start_dim ({start_dim}) cannot come after end_dim "
            f"({end_dim}) for input of shape {tuple(x.shape)}"
        )
    merged = math.prod(x.shape[start : end + 1])
    return x.reshape((*x.shape[:start], merged, *x.shape[end + 1 :]))


class Flatten(Module):
    """Flatten dimensions ``start_dim..end_dim`` into one, as ``torch.nn.Flatten``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Flatten()(jnp.ones((2, 3, 4))).shape
    (2, 12)
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input: Any) -> jax.Array:
        return flatten(input, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dimension ``dim`` into ``unflattened_size``, as ``torch.nn.Unflatten``.

    One entry of ``unflattened_size`` may be -1 (inferred). Named-tensor
    dimensions (strings) are not supported.

    Raises:
        TypeError: ``dim`` is not an int, or ``unflattened_size`` is not a
            tuple or list of ints.
        RuntimeError: the sizes do not multiply up to the size of ``dim``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Unflatten(1, (2, 3))(jnp.ones((4, 6))).shape
    (4, 2, 3)
    """

    def __init__(self, dim: int, unflattened_size: Any) -> None:
        super().__init__()
        if not isinstance(dim, int):
            raise TypeError(
                f"invalid argument type for dim parameter: {type(dim).__name__} (jmodule "
                "supports integer dimensions; named tensors do not exist in JAX)"
            )
        if not isinstance(unflattened_size, (tuple, list)) or not all(
            isinstance(s, int) for s in unflattened_size
        ):
            raise TypeError(
                "unflattened_size must be tuple of ints, but found type "
                f"{type(unflattened_size).__name__}"
            )
        self.dim = dim
        self.unflattened_size = unflattened_size

    def forward(self, input: Any) -> jax.Array:
        x = as_array(input)
        dim = _dim(self.dim, x.ndim)
        sizes = list(self.unflattened_size)
        n = x.shape[dim]
        known = math.prod(s for s in sizes if s != -1)
        if sizes.count(-1) == 1 and known and n % known == 0:
            sizes[sizes.index(-1)] = n // known
        if sizes.count(-1) > 1 or math.prod(sizes) != n:
            raise RuntimeError(
                f"unflatten: Provided sizes {list(self.unflattened_size)} don't multiply up to "
                f"the size of dim {self.dim} ({n}) in the input tensor of shape "
                f"{tuple(x.shape)}"
            )
        return x.reshape(x.shape[:dim] + tuple(sizes) + x.shape[dim + 1 :])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
