"""Variable-length sequences, as ``torch.nn.utils.rnn``: padding and packing.

``pad_sequence`` stacks sequences of different lengths into one padded
array; ``pack_padded_sequence`` / ``pack_sequence`` build a
:class:`PackedSequence`, which ``RNN``/``LSTM``/``GRU`` accept (each
sequence's final state is then the state at its own last step);
``pad_packed_sequence`` / ``unpack_sequence`` / ``unpad_sequence`` undo them.

Lengths are host data. PyTorch wants ``lengths`` on the CPU as int64 and
keeps ``batch_sizes`` there; JAX has to know them when it compiles, because
they decide the shape of the packed array. So ``lengths`` are a Python
list/tuple, a numpy array, a concrete ``jax.Array`` or a CPU torch tensor,
and a PackedSequence's ``batch_sizes``, ``sorted_indices`` and
``unsorted_indices`` are numpy int64 arrays, static under ``jm.compile`` and
``jax.jit`` (only ``data`` is traced). Inside a compiled function, pack from
lengths given as a Python list (a static argument: each new value compiles
once) or computed with numpy; traced lengths raise ``TypeError``:

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> from jmodule.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
>>> lstm = jm.nn.LSTM(2, 3, batch_first=True)
>>> @jm.compile
... def run(lstm, x, lengths):
...     packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
...     out, (h, c) = lstm(packed)
...     return pad_packed_sequence(out, batch_first=True)[0], h
>>> out, h = run(lstm, jnp.ones((2, 4, 2)), [2, 4])
>>> out.shape, h.shape, bool((out[0, 2:] == 0).all())
((2, 4, 3), (1, 2, 3), True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule.nn.functional._rnn import PackedSequence as PackedSequence
from jmodule.nn.functional._rnn import host_ints, packed_layout
from jmodule.nn.functional._rnn import invert_permutation as invert_permutation
from jmodule.nn.parameter import as_array

__all__ = [
    "PackedSequence",
    "invert_permutation",
    "pack_padded_sequence",
    "pack_sequence",
    "pad_packed_sequence",
    "pad_sequence",
    "unpack_sequence",
    "unpad_sequence",
]


def _lengths(lengths: Any) -> np.ndarray:
    out = host_ints(lengths, "pack_padded_sequence: `lengths`")
    if out.ndim != 1:
        raise RuntimeError(
            f"'lengths' argument should be a 1D CPU int64 tensor, but got {out.ndim}D lengths "
            "(give a list, tuple or 1-D numpy array of ints)"
        )
    return out


def pack_padded_sequence(
    input: Any,
    lengths: Any,
    batch_first: bool = False,
    enforce_sorted: bool = True,
) -> PackedSequence:
    """Pack a padded batch of variable-length sequences, as PyTorch's.

    Args:
        input: ``(T, B, *)`` (``(B, T, *)`` with ``batch_first``), padded.
        lengths: each sequence's length: host data (a list, tuple, numpy
            array, concrete ``jax.Array`` or CPU torch tensor; floats are
            truncated to ints, as ``torch.as_tensor(..., dtype=int64)`` does).
        batch_first: ``input`` is ``(B, T, *)``.
        enforce_sorted: ``lengths`` must be in decreasing order; with
            ``False`` the batch is sorted here and the permutation kept in
            ``sorted_indices`` / ``unsorted_indices``.

    Returns:
        A :class:`PackedSequence`.

    Raises:
        RuntimeError: as PyTorch: ``len(lengths)`` is not the batch size, a
            length is <= 0, or (``enforce_sorted``) the lengths are not
            decreasing; also a length longer than ``T`` (PyTorch reads past
            the end of the input there).
        IndexError: ``input`` has fewer than 2 dimensions.
        TypeError: ``lengths`` is traced (inside ``jm.compile`` / ``jax.jit``,
            from an array argument): JAX needs the packed shape when it
            compiles. Pass a Python list (static) or compute it with numpy.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1, 2, 0], [3, 0, 0], [4, 5, 6]])
    >>> packed = pack_padded_sequence(x, [2, 1, 3], batch_first=True, enforce_sorted=False)
    >>> packed.data, packed.batch_sizes, packed.sorted_indices
    (Array([4, 1, 3, 5, 2, 6], dtype=int32), array([3, 2, 1]), array([2, 0, 1]))
    """
    lengths = _lengths(lengths)
    x = as_array(input)
    if x.ndim < 2:
        top = max(x.ndim, 1)
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-top}, {top - 1}], but got 1)"
        )
    if batch_first:
        x = x.swapaxes(0, 1)
    steps, batch = x.shape[0], x.shape[1]
    if x.size == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    if lengths.shape[0] != batch:
        raise RuntimeError(
            f"Expected `len(lengths)` to be equal to batch_size, but got {lengths.shape[0]} "
            f"(batch_size={batch})"
        )
    sorted_indices = None
    if not enforce_sorted:
        sorted_indices = np.argsort(-lengths, kind="stable")
        lengths = lengths[sorted_indices]
        x = x[:, sorted_indices]
    if lengths[-1] <= 0:
        raise RuntimeError(
            "Length of all samples has to be greater than 0, but found an element in 'lengths' "
            "that is <= 0"
        )
    if np.any(lengths[1:] > lengths[:-1]):
        raise RuntimeError(
            "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
            "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence "
            "to sidestep this requirement if you do not need ONNX exportability."
        )
    if lengths[0] > steps:
        raise RuntimeError(
            f"pack_padded_sequence: a length ({int(lengths[0])}) is longer than the padded "
            f"input ({steps} steps); PyTorch reads past the end of the input here, jmodule "
            "refuses. Pad the input to the longest length."
        )
    batch_sizes = (np.arange(int(lengths[0]))[:, None] < lengths[None, :]).sum(axis=1)
    positions, _, _, _ = packed_layout(batch_sizes)
    data = x.reshape(steps * batch, *x.shape[2:])[positions]
    return PackedSequence(data, batch_sizes, sorted_indices, None)


def pad_packed_sequence(
    sequence: PackedSequence,
    batch_first: bool = False,
    padding_value: float = 0.0,
    total_length: int | None = None,
) -> tuple[jax.Array, np.ndarray]:
    """Pad a packed batch back to ``(T, B, *)``; the inverse of :func:`pack_padded_sequence`.

    Args:
        sequence: the :class:`PackedSequence`.
        batch_first: return ``(B, T, *)``.
        padding_value: the value of the padded elements.
        total_length: pad to this many steps (at least the longest length).

    Returns:
        ``(padded, lengths)``, in the batch order given to
        ``pack_padded_sequence`` / ``pack_sequence``. ``lengths`` is a numpy
        int64 array (host data; PyTorch returns a CPU int64 tensor).

    Raises:
        ValueError: ``total_length`` is shorter than the longest sequence.

    >>> import jax.numpy as jnp
    >>> packed = pack_padded_sequence(jnp.array([[1, 2], [3, 0]]), [2, 1], batch_first=True)
    >>> pad_packed_sequence(packed, batch_first=True, padding_value=-1)
    (Array([[ 1,  2],
           [ 3, -1]], dtype=int32), array([2, 1]))
    """
    max_seq_length = int(sequence.batch_sizes.shape[0])
    if total_length is not None:
        if total_length < max_seq_length:
            raise ValueError(
                "Expected total_length to be at least the length of the longest sequence in "
                f"input, but got total_length={total_length} and max sequence length being "
                f"{max_seq_length}"
            )
        max_seq_length = total_length
    positions, lengths, _, batch = packed_layout(host_ints(sequence.batch_sizes, "batch_sizes"))
    data = as_array(sequence.data)
    rest = data.shape[1:]
    padded = jnp.full((max_seq_length * batch, *rest), padding_value, data.dtype)
    padded = padded.at[positions].set(data).reshape(max_seq_length, batch, *rest)
    if batch_first:
        padded = padded.swapaxes(0, 1)
    unsorted = sequence.unsorted_indices
    if unsorted is not None:
        unsorted = host_ints(unsorted, "unsorted_indices")
        padded = jnp.take(padded, unsorted, axis=0 if batch_first else 1)
        lengths = lengths[unsorted]
    return padded, lengths


def pad_sequence(
    sequences: Any,
    batch_first: bool = False,
    padding_value: float = 0.0,
    padding_side: str = "right",
) -> jax.Array:
    """Stack sequences of different lengths ``(L_i, *)`` into one padded array, as PyTorch's.

    Args:
        sequences: an iterable of arrays (an array is iterated over its
            first dimension). All take the first one's dtype and trailing
            shape (smaller ones broadcast, as PyTorch's copy does).
        batch_first: return ``(B, T, *)`` rather than ``(T, B, *)``.
        padding_value: the value of the padded elements.
        padding_side: ``"right"`` (pad after each sequence) or ``"left"``.

    Returns:
        ``(T, B, *)`` (``(B, T, *)`` with ``batch_first``), ``T`` the longest length.

    Raises:
        RuntimeError: as PyTorch: not an iterable, an empty list, another
            ``padding_side``, or trailing shapes that do not match.

    >>> import jax.numpy as jnp
    >>> pad_sequence([jnp.ones(3), jnp.ones(1)], batch_first=True, padding_side="left")
    Array([[1., 1., 1.],
           [0., 0., 1.]], dtype=float32)
    """
    if not isinstance(sequences, Iterable):
        raise RuntimeError(
            "pad_sequence: Expected iterable for input sequences, but got arg of type: "
            f"{type(sequences)}"
        )
    if padding_side not in ("left", "right"):
        raise RuntimeError(
            f"Expected padding_side to be one of left or right, but got {padding_side}."
        )
    seqs = [as_array(s) for s in sequences]
    if not seqs:
        raise RuntimeError("received an empty list of sequences")
    if any(s.ndim == 0 for s in seqs):
        raise RuntimeError(
            "pad_sequence: every sequence needs a first (length) dimension; got a 0-d array"
        )
    dtype, trailing = seqs[0].dtype, seqs[0].shape[1:]
    steps = max(s.shape[0] for s in seqs)
    rows = []
    for s in seqs:
        shape = (s.shape[0], *trailing)
        try:
            s = jnp.broadcast_to(s.astype(dtype), shape)
        except ValueError:
            raise RuntimeError(_mismatch(shape, s.shape)) from None
        pad = jnp.full((steps - s.shape[0], *trailing), padding_value, dtype)
        rows.append(jnp.concatenate([s, pad] if padding_side == "right" else [pad, s]))
    return jnp.stack(rows, axis=0 if batch_first else 1)


def _mismatch(want: tuple, got: tuple) -> str:
    """PyTorch's broadcasting message for copying ``got`` into ``want``."""
    for dim in range(1, max(len(want), len(got)) + 1):
        a = want[-dim] if dim <= len(want) else 1
        b = got[-dim] if dim <= len(got) else 1
        if a != b and b != 1:
            return (
                f"The size of tensor a ({a}) must match the size of tensor b ({b}) at "
                f"non-singleton dimension {len(want) - dim}"
            )
    return f"pad_sequence: cannot copy a sequence of shape {got} into {want}"


def unpad_sequence(padded_sequences: Any, lengths: Any, batch_first: bool = False) -> list:
    """Split a padded batch into its sequences, ``[padded[:lengths[i], i], ...]``, as PyTorch's.

    ``lengths`` are host data (a list, numpy array, concrete array or CPU
    tensor; traced lengths raise ``TypeError``: each piece's shape depends
    on them). Unlike PyTorch, ``padded_sequences`` is not transposed in place
    (JAX arrays are immutable).

    >>> import jax.numpy as jnp
    >>> [s.tolist() for s in unpad_sequence(jnp.array([[1, 2], [3, 0]]), [2, 1], True)]
    [[1, 2], [3]]
    """
    lengths = host_ints(lengths, "unpad_sequence: `lengths`")
    x = as_array(padded_sequences)
    if not batch_first:
        x = x.swapaxes(0, 1)
    return [seq[: max(int(n), 0)] for seq, n in zip(x, lengths, strict=True)]


def pack_sequence(sequences: Any, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of sequences ``(L_i, *)``: ``pad_sequence`` then ``pack_padded_sequence``.

    Args:
        sequences: the sequences, by decreasing length unless ``enforce_sorted=False``.
        enforce_sorted: require decreasing lengths (else sort and keep the permutation).

    >>> import jax.numpy as jnp
    >>> pack_sequence([jnp.array([1, 2]), jnp.array([3, 4, 5])], enforce_sorted=False).data
    Array([3, 1, 4, 2, 5], dtype=int32)
    """
    seqs = [as_array(v) for v in sequences]
    lengths = [v.shape[0] for v in seqs]
    return pack_padded_sequence(pad_sequence(seqs), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list:
    """The sequences of a :class:`PackedSequence`, in their original order, as PyTorch's.

    >>> import jax.numpy as jnp
    >>> packed = pack_sequence([jnp.array([1]), jnp.array([2, 3])], enforce_sorted=False)
    >>> [s.tolist() for s in unpack_sequence(packed)]
    [[1], [2, 3]]
    """
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
