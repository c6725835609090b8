"""Embedding tables, as in ``torch.nn``: ``Embedding`` and ``EmbeddingBag``.

``weight`` is ``(num_embeddings, embedding_dim)`` drawn from N(0, 1), with
the ``padding_idx`` row zeroed, as PyTorch's. Gradients are dense (JAX has
no sparse gradients; ``sparse=True`` is accepted and shown in ``repr``).
"""

from __future__ import annotations

from typing import Any

import jax

from jmodule._lowering import state
from jmodule._placement import factory as _factory
from jmodule.nn import functional as F
from jmodule.nn import init
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter, as_array

__all__ = ["Embedding", "EmbeddingBag"]


def _check_padding_idx(padding_idx: int | None, num_embeddings: int) -> int | None:
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(
            f"Padding_idx must be within num_embeddings (got padding_idx={padding_idx} for "
            f"{num_embeddings} embeddings)"
        )
    return padding_idx % num_embeddings


class _EmbeddingBase(Module):
    def _make_weight(self, _weight: Any, freeze: bool, dtype: Any, device: Any) -> None:
        shape = (self.num_embeddings, self.embedding_dim)
        if _weight is None:
            self.weight = Parameter(_factory.empty(shape, dtype, device), requires_grad=not freeze)
            self.reset_parameters()
            return
        value = as_array(_weight)
        if tuple(value.shape) != shape:
            raise ValueError(
                "Shape of weight does not match num_embeddings and embedding_dim: got "
                f"{tuple(value.shape)}, expected {shape}"
            )
        self.weight = Parameter(value, requires_grad=not freeze)

    def reset_parameters(self) -> None:
        """Draw the table from N(0, 1); zero the ``padding_idx`` row."""
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self) -> None:
        value = state.peek(self.weight)
        if self.padding_idx is not None and not isinstance(value, jax.ShapeDtypeStruct):
            state.assign(self.weight, value.at[self.padding_idx].set(0))


class Embedding(_EmbeddingBase):
    """A lookup table of ``num_embeddings`` vectors, as ``torch.nn.Embedding``.

    Args:
        num_embeddings: rows of the table.
        embedding_dim: size of each vector.
        padding_idx: this row starts at zero and gets no gradient.
        max_norm: rows looked up with a larger norm are re-normalised in
            place (as PyTorch; also inside compiled calls).
        norm_type: the p of that norm.
        scale_grad_by_freq: divide gradients by each index's count in the batch.
        sparse: accepted; gradients are dense.
        _weight: an initial table (PyTorch's private argument).
        _freeze: the table does not require grad.
        device, dtype: where and how to allocate the table.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Embedding(10, 3)(jnp.array([[1, 2], [4, 5]])).shape
    (2, 2, 3)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Any = None,
        _freeze: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = _check_padding_idx(padding_idx, num_embeddings)
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        self._make_weight(_weight, _freeze, dtype, device)

    def forward(self, input: Any) -> jax.Array:
        return F.embedding(
            input,
            self.weight,
            self.padding_idx,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.sparse,
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq is not False:
            s += f", scale_grad_by_freq={self.scale_grad_by_freq}"
        if self.sparse is not False:
            s += ", sparse=True"
        return s

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Any,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Embedding:
        """An Embedding holding ``embeddings`` (2-D), frozen unless ``freeze=False``.

        >>> import jax.numpy as jnp
        >>> from jmodule import nn
        >>> nn.Embedding.from_pretrained(jnp.eye(3)).weight.requires_grad
        False
        """
        table = as_array(embeddings)
        if table.ndim != 2:
            raise ValueError(
                f"Embeddings parameter is expected to be 2-dimensional, got shape "
                f"{tuple(table.shape)}"
            )
        return cls(
            table.shape[0],
            table.shape[1],
            padding_idx,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            sparse,
            _weight=table,
            _freeze=freeze,
        )


class EmbeddingBag(_EmbeddingBase):
    """Sums, means or maxima of bags of embeddings, as ``torch.nn.EmbeddingBag``.

    ``forward(input, offsets=None, per_sample_weights=None)``: bags are the
    rows of a 2-D ``input``, or the slices of a 1-D ``input`` that start at
    each of ``offsets`` (see ``F.embedding_bag``).

    Args:
        num_embeddings, embedding_dim, max_norm, norm_type,
            scale_grad_by_freq, sparse, _weight, padding_idx, device, dtype:
            as :class:`Embedding` (``padding_idx`` entries are left out of bags).
        mode: ``'sum'``, ``'mean'`` or ``'max'``.
        include_last_offset: ``offsets`` ends with the end of the last bag.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> bag = nn.EmbeddingBag(10, 3, mode="sum")
    >>> bag(jnp.array([1, 2, 4, 5]), jnp.array([0, 2])).shape
    (2, 3)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: Any = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode has to be one of sum, mean or max, but got {mode!r}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.padding_idx = _check_padding_idx(padding_idx, num_embeddings)
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset
        self._make_weight(_weight, False, dtype, device)

    def forward(self, input: Any, offsets: Any = None, per_sample_weights: Any = None) -> Any:
        return F.embedding_bag(
            input,
            self.weight,
            offsets,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.mode,
            self.sparse,
            per_sample_weights,
            self.include_last_offset,
            self.padding_idx,
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq is not False:
            s += f", scale_grad_by_freq={self.scale_grad_by_freq}"
        s += f", mode={self.mode!r}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Any,
        freeze: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
    ) -> EmbeddingBag:
        """An EmbeddingBag holding ``embeddings`` (2-D), frozen unless ``freeze=False``.

        >>> import jax.numpy as jnp
        >>> from jmodule import nn
        >>> nn.EmbeddingBag.from_pretrained(jnp.eye(3), mode="sum").embedding_dim
        3
        """
        table = as_array(embeddings)
        if table.ndim != 2:
            raise ValueError(
                f"Embeddings parameter is expected to be 2-dimensional, got shape "
                f"{tuple(table.shape)}"
            )
        bag = cls(
            table.shape[0],
            table.shape[1],
            max_norm,
            norm_type,
            scale_grad_by_freq,
            mode,
            sparse,
            table,
            include_last_offset,
            padding_idx,
        )
        bag.weight.requires_grad = not freeze
        return bag
