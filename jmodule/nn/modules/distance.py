"""Distance modules, as ``torch.nn``'s ``PairwiseDistance`` and ``CosineSimilarity``."""

from __future__ import annotations

from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.modules.module import Module

__all__ = ["CosineSimilarity", "PairwiseDistance"]


class PairwiseDistance(Module):
    """The ``p``-norm of ``x1 - x2 + eps`` over the last axis, as ``torch.nn.PairwiseDistance``.

    ``p`` is stored as ``self.norm``, as in PyTorch; see
    :func:`jmodule.nn.functional.pairwise_distance`.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.PairwiseDistance(eps=0.0)(jnp.array([[3.0, 4.0]]), jnp.zeros((1, 2)))
    Array([5.], dtype=float32)
    """

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> None:
        super().__init__()
        self.norm = p
        self.eps = eps
        self.keepdim = keepdim

    def forward(self, x1: Any, x2: Any) -> jax.Array:
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class CosineSimilarity(Module):
    """Cosine similarity along ``dim``, as ``torch.nn.CosineSimilarity``.

    Each norm is clamped at ``eps``; see
    :func:`jmodule.nn.functional.cosine_similarity`.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.CosineSimilarity(dim=0)(jnp.array([1.0, 0.0]), jnp.array([0.0, 3.0]))
    Array(0., dtype=float32)
    """

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x1: Any, x2: Any) -> jax.Array:
        return F.cosine_similarity(x1, x2, self.dim, self.eps)
