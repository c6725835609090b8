"""Embedding lookups and one-hot encoding, as in ``torch.nn.functional``.

Differences from PyTorch, forced by JAX:

* Gradients are dense arrays (``sparse=True`` is accepted and changes
  nothing numerically).
* Out-of-range indices raise ``IndexError`` when the indices are concrete
  (eager calls); inside compiled code they cannot be checked, and their
  rows come out as NaN (JAX's gather would otherwise clamp them silently).
* ``max_norm`` re-normalises the looked-up rows of a :class:`Parameter`
  weight in place, as PyTorch does; a plain ``jax.Array`` weight cannot
  change, so only the output uses the re-normalised rows.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._lowering import state
from jmodule.nn.functional._normalization import _norm
from jmodule.nn.functional._pooling import index_dtype
from jmodule.nn.functional._utils import concrete, jit
from jmodule.nn.parameter import as_array

__all__ = ["embedding", "embedding_bag", "one_hot"]


def _indices(input: Any, name: str) -> jax.Array:
    idx = as_array(input)
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        raise RuntimeError(
            f"{name}: expected integer indices (int32 or int64), but got an array of dtype "
            f"{idx.dtype}"
        )
    return idx


def _check_range(idx: jax.Array, rows: int) -> None:
    values = concrete(idx)
    if values is not None and values.size and (values.min() < 0 or values.max() >= rows):
        bad = values.min() if values.min() < 0 else values.max()
        raise IndexError(
            f"index out of range in self: index {int(bad)} for an embedding table of {rows} rows"
        )


def _padding_idx(padding_idx: int | None, rows: int) -> int | None:
    if padding_idx is None:
        return None
    if not -rows <= padding_idx < rows:
        raise ValueError(f"Padding_idx must be within num_embeddings (got {padding_idx})")
    return padding_idx % rows


def _renorm(weight: Any, idx: jax.Array, max_norm: float, norm_type: float) -> jax.Array:
    """PyTorch's ``embedding_renorm_``: rows of ``weight`` used by ``idx`` whose
    norm exceeds ``max_norm`` are scaled to ``max_norm``. Written back to a
    Parameter ``weight``; returned as a value whose gradient is the identity
    (PyTorch re-normalises outside autograd)."""
    w = as_array(weight)
    used = jnp.zeros(w.shape[0], bool).at[idx.reshape(-1)].set(True)[:, None]
    compute = jnp.promote_types(w.dtype, jnp.float32)
    norms = _norm(jax.lax.stop_gradient(w).astype(compute), norm_type, 1)
    scale = jnp.where(used & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    renormed = (jax.lax.stop_gradient(w).astype(compute) * scale).astype(w.dtype)
    if state.is_cell(weight):
        state.assign(weight, renormed)
    return w + jax.lax.stop_gradient(renormed - w)


def _rows(w: jax.Array, idx: jax.Array) -> jax.Array:
    """``w[idx]``, with NaN rows for indices outside the table (negative ones included)."""
    idx = jnp.where(idx < 0, w.shape[0], idx)
    return jnp.take(w, idx, axis=0, mode="fill")


def _freq_scaled(rows: jax.Array, idx: jax.Array, num: int) -> jax.Array:
    """Same values; gradients divided by each index's count in the batch."""
    counts = jnp.zeros(num, rows.dtype).at[idx.reshape(-1)].add(1)[idx]
    counts = counts.reshape(counts.shape + (1,) * (rows.ndim - idx.ndim))
    frozen = jax.lax.stop_gradient(rows)
    return frozen + (rows - frozen) / counts


def embedding(
    input: Any,
    weight: Any,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> jax.Array:
    """Look up rows of ``weight`` (``(num_embeddings, dim)``) at integer ``input``.

    Args:
        input: integer indices of any shape.
        weight: the table.
        padding_idx: this row gets no gradient.
        max_norm: re-normalise looked-up rows whose ``norm_type``-norm
            exceeds it (in place on a Parameter, as PyTorch).
        norm_type: the p of the norm for ``max_norm``.
        scale_grad_by_freq: divide each row's gradient by its count in ``input``.
        sparse: accepted; gradients are dense in JAX.

    Returns:
        ``input.shape + (dim,)``.

    Raises:
        RuntimeError: non-integer indices.
        IndexError: an index outside the table (checked on concrete indices;
            inside compiled code such rows come out as NaN).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.embedding(jnp.array([2, 0]), jnp.arange(6.0).reshape(3, 2))
    Array([[4., 5.],
           [0., 1.]], dtype=float32)
    """
    idx = _indices(input, "embedding")
    w = as_array(weight)
    if w.ndim != 2:
        raise RuntimeError(f"embedding: 'weight' must be 2-D, got shape {tuple(w.shape)}")
    _check_range(idx, w.shape[0])
    pad = _padding_idx(padding_idx, w.shape[0])
    if max_norm is not None:
        w = _renorm(weight, idx, max_norm, norm_type)
    rows = _rows(w, idx)
    if pad is not None:
        keep = (idx != pad)[..., None]
        rows = jnp.where(keep, rows, jax.lax.stop_gradient(rows))
    if scale_grad_by_freq:
        rows = _freq_scaled(rows, idx, w.shape[0])
    return rows


def _check_bags(idx: jax.Array, offsets: Any) -> None:
    if idx.ndim == 2:
        if offsets is not None:
            raise ValueError(
                "if input is 2D, then offsets has to be None, as input is treated is a "
                f"mini-batch of fixed length sequences. However, found offsets of type "
                f"{type(offsets).__name__}"
            )
        return
    if idx.ndim != 1:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {idx.ndim}")
    if offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")
    off = as_array(offsets)
    if off.ndim != 1:
        raise ValueError(f"offsets has to be a 1D Tensor, but got Tensor of dimension {off.ndim}")
    known = concrete(off)
    if known is not None and known.size and known[0] != 0:
        raise RuntimeError(
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start "
            f"from position 0. However, got {int(known[0])}"
        )


def _bags(
    idx: jax.Array, offsets: Any, include_last_offset: bool
) -> tuple[jax.Array, jax.Array, int]:
    """(flat indices, bag id of each, number of bags)."""
    if idx.ndim == 2:
        b, n = idx.shape
        return idx.reshape(-1), jnp.repeat(jnp.arange(b), n), b
    starts = offsets[:-1] if include_last_offset else offsets
    bags = starts.shape[0]
    position = jnp.arange(idx.shape[0])
    bag = jnp.searchsorted(starts, position, side="right") - 1
    if include_last_offset:  # entries past the last offset belong to no bag
        bag = jnp.where(position < offsets[-1], bag, bags)
    return idx, bag, bags


@jit("include_last_offset", "mode", "pad", "scale_grad_by_freq")
def _bag_reduce(
    idx: jax.Array,
    w: jax.Array,
    offsets: Any,
    per_sample_weights: Any,
    include_last_offset: bool,
    mode: str,
    pad: int | None,
    scale_grad_by_freq: bool,
) -> jax.Array:
    flat, bag, bags = _bags(idx, offsets, include_last_offset)
    compute = jnp.promote_types(w.dtype, jnp.float32)
    rows = _rows(w, flat).astype(compute)
    if scale_grad_by_freq:
        rows = _freq_scaled(rows, flat, w.shape[0])
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1).astype(compute)
    if pad is not None:
        bag = jnp.where(flat != pad, bag, bags)  # padding entries join no bag
    count = jax.ops.segment_sum(jnp.ones(flat.shape, compute), bag, num_segments=bags)
    if mode == "max":
        out = jax.ops.segment_max(rows, bag, num_segments=bags)
        out = jnp.where(count[:, None] > 0, out, jnp.zeros((), compute))
    else:
        out = jax.ops.segment_sum(rows, bag, num_segments=bags)
        if mode == "mean":
            out = out / jnp.maximum(count, 1)[:, None]
    return out.astype(w.dtype)


def embedding_bag(
    input: Any,
    weight: Any,
    offsets: Any = None,
    max_norm: float | None = None,
    norm_type: float = 2,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: Any = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> jax.Array:
    """Sum, mean or max of embedding rows per bag, as ``F.embedding_bag``.

    Bags are the rows of a 2-D ``input``, or the slices of a 1-D ``input``
    starting at each of ``offsets``. Entries equal to ``padding_idx`` are left
    out (and not counted by the mean); empty bags give zeros.

    Args:
        input: ``(B, N)`` indices, or 1-D indices with ``offsets``.
        weight: ``(num_embeddings, dim)``.
        offsets: 1-D start positions of the bags (1-D ``input`` only).
        max_norm, norm_type: as :func:`embedding`.
        scale_grad_by_freq: as :func:`embedding` (not with ``'max'``).
        mode: ``'sum'``, ``'mean'`` or ``'max'``.
        sparse: accepted; gradients are dense in JAX.
        per_sample_weights: weights of each entry, ``input``'s shape (``'sum'`` only).
        include_last_offset: ``offsets`` has one extra, final entry (the end).
        padding_idx: an index excluded from every bag.

    Returns:
        ``(B, dim)``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.embedding_bag(jnp.array([[0, 2]]), jnp.arange(6.0).reshape(3, 2))
    Array([[2., 3.]], dtype=float32)
    """
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"mode has to be one of sum, mean or max, but got {mode!r}")
    idx = _indices(input, "embedding_bag")
    w = as_array(weight)
    if per_sample_weights is not None:
        if mode != "sum":
            raise NotImplementedError(
                "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                f"supported for mode='sum' (got mode='{mode}')."
            )
        psw = as_array(per_sample_weights)
        if psw.shape != idx.shape:
            raise ValueError(
                f"embedding_bag: If per_sample_weights ({tuple(psw.shape)}) is not None, then "
                f"it must have the same shape as the input ({tuple(idx.shape)})"
            )
    if scale_grad_by_freq and mode == "max":
        raise ValueError("max mode does not support scaling the gradient by the frequency")
    _check_range(idx, w.shape[0])
    pad = _padding_idx(padding_idx, w.shape[0])
    _check_bags(idx, offsets)
    if max_norm is not None:
        w = _renorm(weight, idx, max_norm, norm_type)
    return _bag_reduce(
        idx, w, offsets, per_sample_weights, include_last_offset, mode, pad, scale_grad_by_freq
    )


def one_hot(tensor: Any, num_classes: int = -1) -> jax.Array:
    """Integer labels to one-hot vectors, as ``torch.nn.functional.one_hot``.

    The result has JAX's default integer dtype (int32 unless x64 is enabled;
    PyTorch's is int64). ``num_classes=-1`` means ``max + 1``, which needs
    concrete labels (not inside compiled code).

    Raises:
        RuntimeError: non-integer labels, a negative label or one
            ``>= num_classes`` (checked on concrete labels), or
            ``num_classes=-1`` under tracing.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.one_hot(jnp.array([0, 2]))
    Array([[1, 0, 0],
           [0, 0, 1]], dtype=int32)
    """
    labels = as_array(tensor)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise RuntimeError(
            f"one_hot is only applicable to index tensor of integer type, got {labels.dtype}"
        )
    values = concrete(labels)
    if num_classes == -1:
        if values is None:
            raise RuntimeError(
                "one_hot(num_classes=-1) infers the class count from the labels' values, "
                "which are not known inside compiled code (the output shape would depend on "
                "data). Pass num_classes explicitly."
            )
        num_classes = int(values.max()) + 1 if values.size else 0
    if values is not None and values.size:
        if values.min() < 0:
            raise RuntimeError("Class values must be non-negative.")
        if values.max() >= num_classes:
            raise RuntimeError(
                f"Class values must be smaller than num_classes ({num_classes}), got "
                f"{int(np.max(values))}."
            )
    return (labels[..., None] == jnp.arange(num_classes)).astype(index_dtype())
