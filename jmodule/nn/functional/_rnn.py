"""Recurrent cells and the ``jax.lax.scan`` loop behind ``RNN``/``LSTM``/``GRU``.

The cell functions match PyTorch's ``torch.rnn_tanh_cell``, ``torch.rnn_relu_cell``,
``torch.lstm_cell`` and ``torch.gru_cell`` (gate order LSTM ``i, f, g, o``;
GRU ``r, z, n``). The recurrence runs in at least float32 (bfloat16/float16
inputs and weights are upcast; outputs are cast back), so long sequences do
not accumulate half-precision rounding in the hidden state.

Sequence layers project the whole input sequence at once (one matmul) and scan
only the hidden-to-hidden part; the reverse direction of a bidirectional layer
is the same scan with ``reverse=True``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jmodule import random as _random
from jmodule._lowering import state as _state
from jmodule.amp import _autocast as _amp
from jmodule.nn.functional._utils import compute_dtype
from jmodule.nn.parameter import as_array

__all__ = ["gru_cell", "lstm_cell", "rnn_relu_cell", "rnn_tanh_cell"]

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


def _scan_direction(
    mode: str, x: jax.Array, carry: Any, weights: Weights, reverse: bool
) -> tuple[jax.Array, Any]:
    """Run one direction of one layer over ``x`` ``(L, N, I)``; returns ``(outputs, carry)``."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    dtype = x.dtype
    # Cast the recurrent weights once, outside the loop.
    w_hh = w_hh.astype(dtype)
    b_hh = None if b_hh is None else b_hh.astype(dtype)
    w_hr = None if w_hr is None else w_hr.astype(dtype)
    gi = _linear(x, w_ih, b_ih, dtype)

    def body(carry: Any, gi_t: jax.Array) -> tuple[Any, jax.Array]:
        new = _step(mode, gi_t, carry, w_hh, b_hh, w_hr)
        return new, new[0] if mode == "LSTM" else new

    carry, outputs = jax.lax.scan(body, carry, gi, reverse=reverse)
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
) -> tuple[jax.Array, Any]:
    """A stacked (bi)directional recurrence on ``(L, N, I)``, as PyTorch's ``_VF.lstm`` etc.

    ``hx`` is ``h0`` ``(D * num_layers, N, H_out)`` (a pair ``(h0, c0)`` for
    LSTM); ``weights`` lists each layer's directions in PyTorch's order
    (``l0``, ``l0_reverse``, ``l1``, ...) as ``(w_ih, w_hh, b_ih, b_hh,
    w_hr)``. Dropout applies to the outputs of every layer but the last, in
    training mode, with a key from the default generator. Returns
    ``(output, h_n)`` (``(output, (h_n, c_n))`` for LSTM); output is
    ``(L, N, D * H_out)``.
    """
    drop = dropout > 0.0 and training and num_layers > 1
    key = _random.next_key() if drop else None
    arrays = tuple(tuple(None if w is None else as_array(w) for w in group) for group in weights)
    hx = jax.tree.map(as_array, hx)
    input = as_array(input)
    if _state.local.autocast is not None:
        input, hx, arrays = _autocast_layers(mode, input, hx, arrays)
    return _stack(
        mode,
        input,
        hx,
        arrays,
        key,
        num_layers=num_layers,
        bidirectional=bidirectional,
        dropout=dropout if drop else 0.0,
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


@functools.partial(jax.jit, static_argnames=("mode", "num_layers", "bidirectional", "dropout"))
def _stack(
    mode: str,
    input: jax.Array,
    hx: Any,
    weights: tuple[Weights, ...],
    key: jax.Array | None,
    *,
    num_layers: int,
    bidirectional: bool,
    dropout: float,
) -> tuple[jax.Array, Any]:
    """The whole stack as one program, so that eager calls compile once per configuration."""
    dtype = input.dtype
    compute = compute_dtype(dtype)
    hx = jax.tree.map(lambda h: h.astype(compute), hx)
    directions = 2 if bidirectional else 1
    x = input.astype(compute)
    finals = []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            idx = layer * directions + d
            carry = (hx[0][idx], hx[1][idx]) if mode == "LSTM" else hx[idx]
            out, carry = _scan_direction(mode, x, carry, weights[idx], reverse=d == 1)
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
    output = x.astype(dtype)
    if mode == "LSTM":
        h_n = jnp.stack([h for h, _ in finals]).astype(dtype)
        c_n = jnp.stack([c for _, c in finals]).astype(dtype)
        return output, (h_n, c_n)
    return output, jnp.stack(finals).astype(dtype)
