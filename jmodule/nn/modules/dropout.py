"""Dropout layers."""

from __future__ import annotations

from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.modules.module import Module

__all__ = ["Dropout"]


class Dropout(Module):
    """Zero elements with probability ``p`` in training mode; identity in eval.

    Masks come from the default generator (``jm.manual_seed``); compiled
    calls thread it, so each compiled call draws a fresh mask and a re-seeded
    run repeats exactly.

    Args:
        p: probability of an element being zeroed.
        inplace: accepted for PyTorch compatibility.

    Raises:
        ValueError: ``p`` is outside [0, 1].
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
