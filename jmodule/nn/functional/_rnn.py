"""Recurrent cells and the ``jax.lax.scan`` loop behind ``RNN``/``LSTM``/``GRU``.

The cell functions match PyTorch's ``torch.rnn_tanh_cell``, ``torch.rnn_relu_cell``,
``torch.lstm_cell`` and ``torch.gru_cell`` (gate order LSTM ``i, f, g, o``;
GRU ``r, z, n``). The recurrence runs in at least float32 (bfloat16/float16
inputs and weights are upcast; outputs are cast back), so long sequences do
not accumulate half-precision rounding in the hidden state.

Sequence layers project the whole input sequence at once (one matmul) and scan
only the hidden-to-hidden part; the reverse direction of a bidirectional layer
is the same scan with ``reverse=True``.

Packed sequences (:class:`PackedSequence`, built by ``jm.nn.utils.rnn``) run
the same scan over the padded ``(T, B, I)`` batch with a mask: a sequence's
state stops changing after its own last step (forward) and starts at its own
last step (reverse), so the final states are PyTorch's. The packed layout
(``batch_sizes`` and the sort permutation) is host data, as PyTorch keeps it
on the CPU: under a trace it is static, part of the program.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _placement
from jmodule import random as _random
from jmodule._lowering import state as _state
from jmodule._placement import device as _device
from jmodule.amp import _autocast as _amp
from jmodule.nn.functional._utils import compute_dtype
from jmodule.nn.parameter import as_array

__all__ = ["gru_cell", "lstm_cell", "rnn_relu_cell", "rnn_tanh_cell"]

# (PackedSequence and invert_permutation are public through jm.nn.utils.rnn.)

# Per layer and direction: (w_ih, w_hh, b_ih, b_hh, w_hr); biases/w_hr may be None.
Weights = tuple[Any, Any, Any, Any, Any]


def _linear(x: jax.Array, w: Any, b: Any, dtype: Any) -> jax.Array:
    out = jnp.matmul(x, as_array(w).astype(dtype).T)
    return out if b is None else out + as_array(b).astype(dtype)


def _step(mode: str, gi: jax.Array, carry: Any, w_hh: Any, b_hh: Any, w_hr: Any) -> Any:
    """One time step from the input projection ``gi``; returns the new carry."""
    dtype = gi.dtype
    if mode == "LSTM":
        h, c = carry
        i, f, g, o = jnp.split(gi + _linear(h, w_hh, b_hh, dtype), 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        if w_hr is not None:
            h = _linear(h, w_hr, None, dtype)
        return h, c
    h = carry
    gh = _linear(h, w_hh, b_hh, dtype)
    if mode == "GRU":
        i_r, i_z, i_n = jnp.split(gi, 3, axis=-1)
        h_r, h_z, h_n = jnp.split(gh, 3, axis=-1)
        r = jax.nn.sigmoid(i_r + h_r)
        z = jax.nn.sigmoid(i_z + h_z)
        n = jnp.tanh(i_n + r * h_n)
        return (1 - z) * n + z * h
    pre = gi + gh
    return jnp.tanh(pre) if mode == "RNN_TANH" else jax.nn.relu(pre)


def _cell(mode: str, input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any) -> Any:
    def arr(w: Any) -> Any:
        return None if w is None else as_array(w)

    hx = jax.tree.map(as_array, hx)
    x, ws = as_array(input), (arr(w_ih), arr(w_hh), arr(b_ih), arr(b_hh))
    out = None
    if _state.local.autocast is not None:
        x, hx, ws, out = _autocast_cell(mode, x, hx, ws)
    return _cell_jit(mode, x, hx, *ws, out=out)


_CELL_OPS = {"LSTM": "lstm_cell", "GRU": "gru_cell", "RNN_TANH": "rnn_tanh_cell"}


def _autocast_cell(mode: str, x: Any, hx: Any, ws: tuple) -> tuple[Any, Any, tuple, Any]:
    """What PyTorch's autocast casts for a cell: ``(x, hx, weights, output dtype)``.

    CUDA casts the cell op's arguments (``lstm_cell``, ...) to the low dtype.
    Elsewhere a cell is a composite of ``linear`` calls: their operands are
    cast, and the LSTM/GRU state update promotes with the given hidden state
    (an RNN cell's output is the sum of two ``linear`` outputs).
    """
    op = _CELL_OPS.get(mode, "rnn_relu_cell")
    if _amp.policy(op) is not None:
        flat, tree = jax.tree.flatten((x, hx, ws))
        x, hx, ws = jax.tree.unflatten(tree, _amp.cast(op, *flat))
        return x, hx, ws, None
    if mode in ("LSTM", "GRU"):
        flat, tree = jax.tree.flatten((x, ws))
        x, ws = jax.tree.unflatten(tree, _amp.cast("linear", *flat))
        return x, hx, ws, jnp.result_type(x.dtype, *jax.tree.leaves(hx))
    flat, tree = jax.tree.flatten((x, hx, ws))
    x, hx, ws = jax.tree.unflatten(tree, _amp.cast("linear", *flat))
    return x, hx, ws, None


@functools.partial(jax.jit, static_argnames=("mode", "out"))
def _cell_jit(
    mode: str, x: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, out: Any = None
) -> Any:
    """One step as one program (eager calls compile once per shape, not once per operation).

    The new state is in ``x``'s dtype, or ``out`` when given.
    """
    compute = compute_dtype(x.dtype)
    carry = jax.tree.map(lambda h: h.astype(compute), hx)
    new = _step(mode, _linear(x.astype(compute), w_ih, b_ih, compute), carry, w_hh, b_hh, None)
    return jax.tree.map(lambda h: h.astype(x.dtype if out is None else out), new)


def rnn_tanh_cell(
    input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
) -> jax.Array:
    """One Elman step ``tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)``, as ``torch.rnn_tanh_cell``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x, h = jnp.ones((2, 3)), jnp.zeros((2, 4))
    >>> F.rnn_tanh_cell(x, h, jnp.ones((4, 3)), jnp.ones((4, 4))).shape
    (2, 4)
    """
    return _cell("RNN_TANH", input, hx, w_ih, w_hh, b_ih, b_hh)


def rnn_relu_cell(
    input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
) -> jax.Array:
    """One Elman step with ReLU, as ``torch.rnn_relu_cell``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.rnn_relu_cell(jnp.ones(3), jnp.zeros(4), jnp.ones((4, 3)), jnp.ones((4, 4)))[0]
    Array(3., dtype=float32)
    """
    return _cell("RNN_RELU", input, hx, w_ih, w_hh, b_ih, b_hh)


def lstm_cell(
    input: Any,
    hx: tuple[Any, Any],
    w_ih: Any,
    w_hh: Any,
    b_ih: Any = None,
    b_hh: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """One LSTM step returning ``(h', c')``, as ``torch.lstm_cell`` (gates ``i, f, g, o``).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> h, c = F.lstm_cell(jnp.ones((2, 3)), (jnp.zeros((2, 4)),) * 2,
    ...                    jnp.ones((16, 3)), jnp.ones((16, 4)))
    >>> h.shape, c.shape
    ((2, 4), (2, 4))
    """
    return _cell("LSTM", input, tuple(hx), w_ih, w_hh, b_ih, b_hh)


def gru_cell(
    input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
) -> jax.Array:
    """One GRU step, as ``torch.gru_cell`` (gates ``r, z, n``).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.gru_cell(jnp.ones((2, 3)), jnp.zeros((2, 4)), jnp.ones((12, 3)), jnp.ones((12, 4))).shape
    (2, 4)
    """
    return _cell("GRU", input, hx, w_ih, w_hh, b_ih, b_hh)


# ---------------------------------------------------------------------------- packed sequences

_TRACED_HOST = (
    "{what} is a traced array (inside jm.compile, jax.jit or a transformation), but "
    "sequence lengths and a PackedSequence's layout are host data: PyTorch keeps them on "
    "the CPU as int64, and JAX must know them when it compiles, because they decide the "
    "packed array's shape. Pass them as a Python list or tuple (a static argument of "
    "jm.compile: each new value compiles once), or compute them with numpy inside the "
    "function; a numpy array passed as an argument of jm.compile is traced like any array "
    "(pass lengths.tolist())."
)


def host_ints(x: Any, what: str) -> np.ndarray:
    """``x`` (a list, tuple, numpy/jax array or CPU torch tensor) as a numpy int64 array.

    Raises:
        TypeError: ``x`` is a traced value (its numbers are not known while compiling).
    """
    if isinstance(x, jax.core.Tracer) or any(
        isinstance(v, jax.core.Tracer) for v in (x if isinstance(x, (list, tuple)) else ())
    ):
        raise TypeError(_TRACED_HOST.format(what=what))
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    elif isinstance(x, (list, tuple)):
        x = [np.asarray(v) for v in x]
    out = np.asarray(x).astype(np.int64)
    out.flags.writeable = False
    return out


def invert_permutation(permutation: Any) -> Any:
    """The inverse of ``permutation`` (None stays None), as ``torch.nn.utils.rnn``'s.

    A concrete permutation gives a numpy int64 array (host data, like a
    PackedSequence's indices); a traced one a ``jax.Array``.

    >>> import numpy as np
    >>> invert_permutation(np.array([2, 0, 1]))
    array([1, 2, 0])
    """
    if permutation is None:
        return None
    if isinstance(permutation, jax.core.Tracer):
        return jnp.zeros_like(permutation).at[permutation].set(jnp.arange(permutation.shape[0]))
    p = host_ints(permutation, "permutation")
    out = np.empty_like(p)
    out[p] = np.arange(p.size)
    out.flags.writeable = False
    return out


class _Layout:
    """A PackedSequence's host data, the static part of its pytree (hashable)."""

    __slots__ = ("arrays", "key")

    def __init__(self, arrays: tuple[np.ndarray | None, ...]):
        self.arrays = arrays
        self.key = tuple(None if a is None else tuple(a.tolist()) for a in arrays)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Layout and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"_Layout{self.key}"


class PackedSequence_(NamedTuple):
    data: Any
    batch_sizes: Any
    sorted_indices: Any
    unsorted_indices: Any


class PackedSequence(PackedSequence_):
    """A batch of variable-length sequences, packed, as ``torch.nn.utils.rnn.PackedSequence``.

    ``data`` holds the steps of all sequences, time-major: the first step of
    every sequence, then the second step of those that have one, ...;
    ``batch_sizes[t]`` is how many sequences have a step ``t``. The sequences
    are sorted by decreasing length; ``sorted_indices`` says which original
    batch element each sorted one is (``None``: the input was already
    sorted) and ``unsorted_indices`` is its inverse. Build one with
    ``pack_padded_sequence`` or ``pack_sequence`` rather than by hand.
    ``RNN``/``LSTM``/``GRU`` accept one and return one.

    Differences from PyTorch that JAX forces: ``batch_sizes``,
    ``sorted_indices`` and ``unsorted_indices`` are numpy int64 arrays (host
    data: PyTorch keeps ``batch_sizes`` on the CPU too), not device arrays.
    As a pytree (``jax.jit``, ``jm.compile`` arguments and results) only
    ``data`` is a leaf; the layout is static, part of the structure, so a new
    layout compiles a new program. Building a PackedSequence from traced
    ``batch_sizes`` or indices raises ``TypeError``.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> packed = jm.nn.utils.rnn.pack_sequence([jnp.array([1, 2, 3]), jnp.array([4, 5])])
    >>> packed.data, packed.batch_sizes
    (Array([1, 4, 2, 5, 3], dtype=int32), array([2, 2, 1]))
    """

    def __new__(
        cls,
        data: Any,
        batch_sizes: Any = None,
        sorted_indices: Any = None,
        unsorted_indices: Any = None,
    ) -> PackedSequence:
        if batch_sizes is None:  # PackedSequence((data, batch_sizes), sorted_indices)
            if not (isinstance(data, (list, tuple)) and len(data) == 2):
                raise AssertionError("Expected data to be a list or tuple of length 2")
            data, batch_sizes = data
        batch_sizes = host_ints(batch_sizes, "batch_sizes")
        if sorted_indices is not None:
            sorted_indices = host_ints(sorted_indices, "sorted_indices")
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        else:
            unsorted_indices = host_ints(unsorted_indices, "unsorted_indices")
        return tuple.__new__(cls, (data, batch_sizes, sorted_indices, unsorted_indices))

    def to(self, *args: Any, **kwargs: Any) -> PackedSequence:
        """``data`` moved and/or cast (a device, a dtype, both, or an array to match).

        The layout stays host data. Returns ``self`` when nothing changes.
        """
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        kwargs.pop("copy", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword argument(s) {sorted(kwargs)}")
        for arg in args:
            if isinstance(arg, bool):
                continue
            if isinstance(arg, jax.Array):
                device, dtype = arg.sharding, arg.dtype
            elif _placement.is_dtype(arg):
                dtype = arg
            else:
                device = arg
        data = self.data
        if dtype is not None:
            if type(dtype).__module__.startswith("torch"):
                dtype = str(dtype).removeprefix("torch.")
            dtype = _device.canonical_dtype(dtype, what="the PackedSequence")
            if data.dtype != dtype:
                data = data.astype(dtype)
        if device is not None:
            data = _placement.move(data, _device.resolve(device))
        return self if data is self.data else self._replace(data=data)

    def cpu(self) -> PackedSequence:
        """``data`` on the CPU."""
        return self.to("cpu")

    def double(self) -> PackedSequence:
        """``data`` as float64 (needs JAX's x64 mode)."""
        return self.to(jnp.float64)

    def float(self) -> PackedSequence:
        """``data`` as float32."""
        return self.to(jnp.float32)

    def half(self) -> PackedSequence:
        """``data`` as float16."""
        return self.to(jnp.float16)

    def long(self) -> PackedSequence:
        """``data`` as int64 (needs JAX's x64 mode)."""
        return self.to(jnp.int64)

    def int(self) -> PackedSequence:
        """``data`` as int32."""
        return self.to(jnp.int32)

    def short(self) -> PackedSequence:
        """``data`` as int16."""
        return self.to(jnp.int16)

    def char(self) -> PackedSequence:
        """``data`` as int8."""
        return self.to(jnp.int8)

    def byte(self) -> PackedSequence:
        """``data`` as uint8."""
        return self.to(jnp.uint8)

    @property
    def is_cuda(self) -> bool:
        """Whether ``data`` lives on a GPU."""
        devices = getattr(self.data, "devices", None)
        return devices is not None and any(d.platform == "gpu" for d in devices())


def _flatten_packed(p: PackedSequence) -> tuple[tuple[Any], _Layout]:
    return (p.data,), _Layout(tuple(p[1:]))


def _unflatten_packed(layout: _Layout, children: Any) -> PackedSequence:
    # No checks: JAX rebuilds trees with placeholders (tracers, None, object()).
    return tuple.__new__(PackedSequence, (children[0], *layout.arrays))


jax.tree_util.register_pytree_with_keys(
    PackedSequence,
    lambda p: (((jax.tree_util.GetAttrKey("data"), p.data),), _Layout(tuple(p[1:]))),
    _unflatten_packed,
    flatten_func=_flatten_packed,
)


def packed_layout(batch_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(positions, lengths, steps, batch)`` of a packed layout.

    ``positions[k]`` is where packed row ``k`` lies in the flattened
    ``(steps * batch)`` padded array (time-major); ``lengths`` are the sorted
    sequences' lengths.
    """
    steps = int(batch_sizes.shape[0])
    batch = int(batch_sizes[0]) if steps else 0
    live = np.arange(batch)[None, :] < batch_sizes[:, None]
    t, b = np.nonzero(live)
    return t * batch + b, live.sum(axis=0).astype(np.int64), steps, batch


def _scan_direction(
    mode: str,
    x: jax.Array,
    carry: Any,
    weights: Weights,
    reverse: bool,
    mask: jax.Array | None = None,
) -> tuple[jax.Array, Any]:
    """Run one direction of one layer over ``x`` ``(L, N, I)``; returns ``(outputs, carry)``.

    ``mask`` ``(L, N, 1)`` (packed sequences) says which steps exist: elsewhere
    the carry passes through unchanged and the output is zero.
    """
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    dtype = x.dtype
    # Cast the recurrent weights once, outside the loop.
    w_hh = w_hh.astype(dtype)
    b_hh = None if b_hh is None else b_hh.astype(dtype)
    w_hr = None if w_hr is None else w_hr.astype(dtype)
    gi = _linear(x, w_ih, b_ih, dtype)

    def body(carry: Any, xs: Any) -> tuple[Any, jax.Array]:
        gi_t, live = xs
        new = _step(mode, gi_t, carry, w_hh, b_hh, w_hr)
        if live is not None:
            new = jax.tree.map(lambda n, o: jnp.where(live, n, o), new, carry)
            h = new[0] if mode == "LSTM" else new
            return new, jnp.where(live, h, jnp.zeros((), h.dtype))
        return new, new[0] if mode == "LSTM" else new

    carry, outputs = jax.lax.scan(body, carry, (gi, mask), reverse=reverse)
    return outputs, carry


def rnn_layers(
    mode: str,
    input: Any,
    hx: Any,
    weights: Sequence[Weights],
    num_layers: int,
    bidirectional: bool,
    dropout: float,
    training: bool,
    batch_sizes: Any = None,
) -> tuple[jax.Array, Any]:
    """A stacked (bi)directional recurrence on ``(L, N, I)``, as PyTorch's ``_VF.lstm`` etc.

    ``hx`` is ``h0`` ``(D * num_layers, N, H_out)`` (a pair ``(h0, c0)`` for
    LSTM); ``weights`` lists each layer's directions in PyTorch's order
    (``l0``, ``l0_reverse``, ``l1``, ...) as ``(w_ih, w_hh, b_ih, b_hh,
    w_hr)``. Dropout applies to the outputs of every layer but the last, in
    training mode, with a key from the default generator. Returns
    ``(output, h_n)`` (``(output, (h_n, c_n))`` for LSTM); output is
    ``(L, N, D * H_out)``.

    With ``batch_sizes`` (host data, a PackedSequence's), ``input`` is packed
    data ``(sum(lengths), I)`` and so is the output; ``hx`` is in the sorted
    order.
    """
    drop = dropout > 0.0 and training and num_layers > 1
    key = _random.next_key() if drop else None
    arrays = tuple(tuple(None if w is None else as_array(w) for w in group) for group in weights)
    hx = jax.tree.map(as_array, hx)
    input = as_array(input)
    if _state.local.autocast is not None:
        input, hx, arrays = _autocast_layers(mode, input, hx, arrays)
    packed = None
    if batch_sizes is not None:
        positions, lengths, steps, batch = packed_layout(host_ints(batch_sizes, "batch_sizes"))
        # Arrays, not static: eager calls with new lengths of the same shapes reuse the program.
        packed = (jnp.asarray(positions), jnp.asarray(lengths), steps, batch)
    return _stack(
        mode,
        input,
        hx,
        arrays,
        key,
        None if packed is None else packed[:2],
        num_layers=num_layers,
        bidirectional=bidirectional,
        dropout=dropout if drop else 0.0,
        shape=None if packed is None else packed[2:],
    )


def _autocast_layers(mode: str, input: Any, hx: Any, weights: tuple) -> tuple[Any, Any, tuple]:
    """What PyTorch's autocast casts for a recurrent layer on CPU.

    LSTM runs ``mkldnn_rnn_layer`` (everything in the low dtype); RNN's
    cells are ``linear`` composites (everything low too); GRU's gates come
    from ``linear`` (weights low) while its output follows the input.
    """
    flat, tree = jax.tree.flatten((input, hx, weights))
    if mode == "LSTM":
        flat = list(_amp.cast("mkldnn_rnn_layer", *flat))
    elif mode != "GRU":
        flat = list(_amp.cast("linear", *flat))
    else:
        n = len(jax.tree.leaves((input, hx)))
        flat = flat[:n] + list(_amp.cast("linear", *flat[n:]))
    return jax.tree.unflatten(tree, flat)


@functools.partial(
    jax.jit, static_argnames=("mode", "num_layers", "bidirectional", "dropout", "shape")
)
def _stack(
    mode: str,
    input: jax.Array,
    hx: Any,
    weights: tuple[Weights, ...],
    key: jax.Array | None,
    packed: tuple[jax.Array, jax.Array] | None,
    *,
    num_layers: int,
    bidirectional: bool,
    dropout: float,
    shape: tuple[int, int] | None,
) -> tuple[jax.Array, Any]:
    """The whole stack as one program, so that eager calls compile once per configuration.

    ``packed`` is ``(positions, lengths)`` of packed input (``shape`` its
    ``(steps, batch)``): the data is laid out padded ``(steps, batch, I)``,
    run with a mask, and packed again.
    """
    dtype = input.dtype
    compute = compute_dtype(dtype)
    hx = jax.tree.map(lambda h: h.astype(compute), hx)
    directions = 2 if bidirectional else 1
    x = input.astype(compute)
    mask = None
    if packed is not None:
        positions, lengths = packed
        steps, batch = shape
        x = jnp.zeros((steps * batch, x.shape[-1]), compute).at[positions].set(x)
        x = x.reshape(steps, batch, -1)
        mask = (jnp.arange(steps)[:, None] < lengths[None, :])[..., None]
    finals = []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            idx = layer * directions + d
            carry = (hx[0][idx], hx[1][idx]) if mode == "LSTM" else hx[idx]
            out, carry = _scan_direction(mode, x, carry, weights[idx], d == 1, mask)
            outs.append(out)
            finals.append(carry)
        x = outs[0] if directions == 1 else jnp.concatenate(outs, axis=-1)
        if dropout > 0.0 and layer < num_layers - 1:
            key, sub = jax.random.split(key)
            if dropout >= 1.0:
                x = jnp.zeros_like(x)
            else:
                keep = jax.random.bernoulli(sub, 1.0 - dropout, x.shape)
                x = jnp.where(keep, x / (1.0 - dropout), jnp.zeros((), x.dtype))
    if packed is not None:
        x = x.reshape(steps * batch, -1)[positions]
    output = x.astype(dtype)
    if mode == "LSTM":
        h_n = jnp.stack([h for h, _ in finals]).astype(dtype)
        c_n = jnp.stack([c for _, c in finals]).astype(dtype)
        return output, (h_n, c_n)
    return output, jnp.stack(finals).astype(dtype)
