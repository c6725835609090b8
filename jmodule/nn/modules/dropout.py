"""Dropout layers, as in ``torch.nn``: element-wise, channel-wise and alpha dropout.

Masks come from the default generator (``jm.manual_seed``); compiled calls
thread it, so each compiled call draws fresh masks and a re-seeded run
repeats exactly. In eval mode every layer is the identity.
"""

from __future__ import annotations

from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.modules.module import Module

__all__ = [
    "AlphaDropout",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
    "Dropout3d",
    "FeatureAlphaDropout",
]


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


class _DropoutNd(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(_DropoutNd):
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` input with probability ``p``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Dropout1d(0.5).eval()(jnp.ones((2, 3, 4))).shape
    (2, 3, 4)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(_DropoutNd):
    """Zero whole channels of ``(N, C, H, W)`` input with probability ``p``.

    A 3-D input is treated as ``(N, C, L)``, with PyTorch's warning.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Dropout2d(0.5).eval()(jnp.ones((2, 3, 4, 4))).shape
    (2, 3, 4, 4)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.dropout2d(input, self.p, self.training, self.inplace)


class Dropout3d(_DropoutNd):
    """Zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Dropout3d(0.5).eval()(jnp.ones((1, 2, 2, 2, 2))).shape
    (1, 2, 2, 2, 2)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.dropout3d(input, self.p, self.training, self.inplace)


class AlphaDropout(_DropoutNd):
    """Dropout that keeps SELU activations' mean and variance, as ``torch.nn.AlphaDropout``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AlphaDropout(0.2).eval()(jnp.ones(3))
    Array([1., 1., 1.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.alpha_dropout(input, self.p, self.training)


class FeatureAlphaDropout(_DropoutNd):
    """Alpha dropout of whole channels (dimension 1).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.FeatureAlphaDropout(0.2).eval()(jnp.ones((2, 3))).shape
    (2, 3)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.feature_alpha_dropout(input, self.p, self.training)
