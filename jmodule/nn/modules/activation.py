"""Activation layers."""

from __future__ import annotations

from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.modules.module import Module

__all__ = ["ReLU"]


class ReLU(Module):
    """``max(x, 0)`` elementwise.

    Args:
        inplace: accepted for PyTorch compatibility (JAX returns new arrays).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReLU()(jnp.array([-1.0, 2.0]))
    Array([0., 2.], dtype=float32)
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""
