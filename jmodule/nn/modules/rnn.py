"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and their cells, as ``torch.nn``'s.

Parameter names, shapes, order and initialisation (``U(-1/sqrt(H), 1/sqrt(H))``
for every weight and bias) are PyTorch's, so a PyTorch ``state_dict`` loads
unchanged. The time loop is ``jax.lax.scan`` (see ``functional/_rnn.py``).

``RNN``/``LSTM``/``GRU`` accept a ``PackedSequence`` (``jm.nn.utils.rnn``)
and return one, with each sequence's final state taken at its own last step,
as PyTorch's. A PackedSequence's layout (``batch_sizes``, ``sorted_indices``,
``unsorted_indices``) is host data, static under ``jm.compile``: pack inside
the compiled function from lengths given as a Python list, or pass the
PackedSequence itself (its ``data`` is traced, its layout is part of the
program; a new layout compiles once).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import state as _state
from jmodule._placement import factory as _factory
from jmodule.nn import init
from jmodule.nn.functional import _rnn
from jmodule.nn.functional._rnn import PackedSequence
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter, as_array

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNBase", "RNNCell", "RNNCellBase"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}

_TUPLE_HELP = (
    "{name} expects an array or a PackedSequence as input; got a {type}. Build packed "
    "input with jm.nn.utils.rnn.pack_padded_sequence or pack_sequence."
)


def _check_array(name: str, input: Any) -> jax.Array:
    if isinstance(input, (tuple, list)):
        raise TypeError(_TUPLE_HELP.format(name=name, type=type(input).__name__))
    return as_array(input)


class RNNBase(Module):
    """Shared constructor, parameters and checks of ``RNN``, ``LSTM`` and ``GRU``.

    >>> from jmodule import nn
    >>> nn.LSTM(3, 4, num_layers=2).weight_hh_l1.shape
    (16, 4)
    """

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if (
            not isinstance(dropout, numbers.Number)
            or isinstance(dropout, bool)
            or not 0 <= dropout <= 1
        ):
            raise ValueError(
                "dropout should be a number in range [0, 1] representing the probability of "
                "an element being zeroed"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero "
                f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                f"num_layers={num_layers}",
                stacklevel=3,
            )
        for name, value, kind in (
            ("bias", bias, bool),
            ("batch_first", batch_first, bool),
            ("input_size", input_size, int),
            ("hidden_size", hidden_size, int),
        ):
            if not isinstance(value, kind):
                raise TypeError(
                    f"{name} should be of type {kind.__name__}, got: {type(value).__name__}"
                )
        if input_size <= 0:
            raise ValueError("input_size must be greater than zero")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError(
                "proj_size should be a positive integer or zero to disable projections"
            )
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + mode)
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        directions = 2 if bidirectional else 1
        names: list[str] = []
        all_weights: list[list[str]] = []
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else real_hidden * directions
            for direction in range(directions):
                suffix = "_reverse" if direction == 1 else ""
                shapes = {
                    "weight_ih": (gate_size, layer_input),
                    "weight_hh": (gate_size, real_hidden),
                }
                if bias:
                    shapes.update(bias_ih=(gate_size,), bias_hh=(gate_size,))
                if proj_size > 0:
                    shapes["weight_hr"] = (proj_size, hidden_size)
                group = []
                for kind, shape in shapes.items():
                    name = f"{kind}_l{layer}{suffix}"
                    setattr(self, name, Parameter(_factory.empty(shape, dtype, device)))
                    group.append(name)
                names.extend(group)
                all_weights.append(group)
        self._flat_weights_names = names
        self._all_weights = all_weights
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw every weight and bias from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """Does nothing: PyTorch compacts weights for cuDNN here; JAX needs no such step."""

    @property
    def _flat_weights(self) -> list[Parameter]:
        return [getattr(self, name) for name in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        """The parameters grouped per layer and direction, as PyTorch's ``all_weights``."""
        return [[getattr(self, name) for name in group] for group in self._all_weights]

    def _layer_weights(self) -> list[tuple[Any, Any, Any, Any, Any]]:
        out = []
        for group in self._all_weights:
            ws = {name.split("_l")[0]: getattr(self, name) for name in group}
            out.append(
                (
                    ws["weight_ih"],
                    ws["weight_hh"],
                    ws.get("bias_ih"),
                    ws.get("bias_hh"),
                    ws.get("weight_hr"),
                )
            )
        return out

    def _hidden_shape(self, batch: int, cell: bool = False) -> tuple[int, int, int]:
        directions = 2 if self.bidirectional else 1
        size = self.proj_size if self.proj_size > 0 and not cell else self.hidden_size
        return (self.num_layers * directions, batch, size)

    def _check_hidden(self, hx: jax.Array, expected: tuple, what: str = "hidden size") -> None:
        if tuple(hx.shape) != expected:
            raise RuntimeError(f"Expected {what} {expected}, got {list(hx.shape)}")

    def _prepare(self, input: Any) -> tuple[jax.Array, bool]:
        """Checks; returns ``(x as (L, N, H_in), batched)``."""
        x = _check_array(type(self).__name__, input)
        name = type(self).__name__
        if x.ndim not in (2, 3):
            raise ValueError(
                f"{name}: Expected input to be 2D or 3D, got {x.ndim}D tensor instead "
                f"(shape {tuple(x.shape)})"
            )
        self._check_input(x)
        batched = x.ndim == 3
        if not batched:
            x = x[:, None]
        elif self.batch_first:
            x = x.swapaxes(0, 1)
        return x, batched

    def _check_input(self, x: jax.Array) -> None:
        name = type(self).__name__
        weight_dtype = as_array(self._flat_weights[0]).dtype
        if x.dtype != weight_dtype and _state.local.autocast is None:  # autocast casts them
            raise ValueError(
                f"{name} input dtype ({x.dtype}) does not match weight dtype ({weight_dtype}). "
                f"Convert input: input.astype({weight_dtype}), or convert model: "
                f"model.to({x.dtype})"
            )
        if x.shape[-1] != self.input_size:
            raise RuntimeError(
                f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                f"got {x.shape[-1]}"
            )

    def _packed_data(self, input: PackedSequence) -> jax.Array:
        """A PackedSequence's data, checked as PyTorch's ``check_input`` does."""
        x = as_array(input.data)
        if x.ndim != 2:
            raise RuntimeError(f"input must have 2 dimensions, got {x.ndim}")
        self._check_input(x)
        return x

    @staticmethod
    def permute_hidden(hx: Any, permutation: Any) -> Any:
        """``hx`` (or each of ``(h, c)``) reordered along the batch dimension, as PyTorch's."""
        if permutation is None:
            return hx
        return jax.tree.map(lambda h: jnp.take(as_array(h), permutation, axis=1), hx)

    def _run_packed(self, input: PackedSequence, hx: Any) -> tuple[PackedSequence, Any]:
        """The packed forward: ``hx`` (original batch order, checked) -> (output, h_n)."""
        hx = self.permute_hidden(hx, input.sorted_indices)
        output, h_n = _rnn.rnn_layers(
            self.mode,
            self._packed_data(input),
            hx,
            self._layer_weights(),
            self.num_layers,
            self.bidirectional,
            self.dropout,
            self.training,
            batch_sizes=input.batch_sizes,
        )
        return input._replace(data=output), self.permute_hidden(h_n, input.unsorted_indices)

    def _finish(self, output: jax.Array, batched: bool) -> jax.Array:
        if not batched:
            return output[:, 0]
        return output.swapaxes(0, 1) if self.batch_first else output

    def _run(self, x: jax.Array, hx: Any) -> tuple[jax.Array, Any]:
        return _rnn.rnn_layers(
            self.mode,
            x,
            hx,
            self._layer_weights(),
            self.num_layers,
            self.bidirectional,
            self.dropout,
            self.training,
        )

    def _single_forward(self, input: Any, hx: Any) -> tuple[Any, jax.Array]:
        """RNN and GRU: one hidden state."""
        if isinstance(input, PackedSequence):
            x = self._packed_data(input)
            batch = int(input.batch_sizes[0])
            if hx is None:
                hx = jnp.zeros(self._hidden_shape(batch), x.dtype)
            else:
                hx = as_array(hx)
                self._check_hidden(hx, self._hidden_shape(batch))
            return self._run_packed(input, hx)
        x, batched = self._prepare(input)
        batch = x.shape[1]
        if hx is None:
            hx = jnp.zeros(self._hidden_shape(batch), x.dtype)
        else:
            hx = as_array(hx)
            want = 3 if batched else 2
            if hx.ndim != want:
                raise RuntimeError(
                    f"For {'batched 3-D' if batched else 'unbatched 2-D'} input, hx should "
                    f"also be {want}-D but got {hx.ndim}-D tensor"
                )
            if not batched:
                hx = hx[:, None]
            self._check_hidden(hx, self._hidden_shape(batch))
        output, h_n = self._run(x, hx)
        return self._finish(output, batched), h_n if batched else h_n[:, 0]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class RNN(RNNBase):
    """Elman RNN, ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``, as ``torch.nn.RNN``.

    Args:
        input_size: features per input step.
        hidden_size: features of the hidden state.
        num_layers: stacked layers.
        nonlinearity: ``"tanh"`` or ``"relu"``.
        bias: use ``bias_ih``/``bias_hh``.
        batch_first: inputs and outputs are ``(N, L, H)``.
        dropout: dropout on each layer's output but the last (training mode).
        bidirectional: also run each layer backwards and concatenate.
        device, dtype: where and in what dtype to create the parameters.

    Call: ``rnn(input, hx=None) -> (output, h_n)``, input ``(L, N, H_in)``
    (``(N, L, H_in)`` with ``batch_first``) or unbatched ``(L, H_in)``; ``hx``
    and ``h_n`` are ``(D * num_layers, N, H)``.

    ``input`` may also be a ``PackedSequence`` (``jm.nn.utils.rnn``): the
    output is then one too, ``batch_first`` does not apply (packed data is
    time-major), ``hx``/``h_n`` are in the batch order given to the packing
    function, and ``h_n`` holds each sequence's state at its own last step,
    as PyTorch's. The packed layout is host data, static under
    ``jm.compile`` (see ``jm.nn.utils.rnn``): pack from lengths given as a
    Python list; traced lengths raise ``TypeError``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> out, h = nn.RNN(3, 4, num_layers=2)(jnp.ones((5, 2, 3)))
    >>> out.shape, h.shape
    ((5, 2, 4), (2, 2, 4))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(
                f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        super().__init__(mode, *args, **kwargs)
        self.nonlinearity = nonlinearity

    def forward(self, input: Any, hx: Any = None) -> tuple[jax.Array, jax.Array]:
        return self._single_forward(input, hx)


class GRU(RNNBase):
    """Gated recurrent unit layers, as ``torch.nn.GRU`` (gates ``r, z, n``).

    Arguments and call as :class:`RNN` (without ``nonlinearity``), packed input included.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> out, h = nn.GRU(3, 4, bidirectional=True)(jnp.ones((5, 2, 3)))
    >>> out.shape, h.shape
    ((5, 2, 8), (2, 2, 4))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)

    def forward(self, input: Any, hx: Any = None) -> tuple[jax.Array, jax.Array]:
        return self._single_forward(input, hx)


class LSTM(RNNBase):
    """Long short-term memory layers, as ``torch.nn.LSTM`` (gates ``i, f, g, o``).

    Arguments as :class:`RNN` (without ``nonlinearity``), plus ``proj_size``:
    when > 0 the hidden state is projected to that size by ``weight_hr_l{k}``.

    Call: ``lstm(input, (h_0, c_0)=None) -> (output, (h_n, c_n))``; ``h`` is
    ``(D * num_layers, N, proj_size or hidden_size)``, ``c`` is
    ``(D * num_layers, N, hidden_size)``. A ``PackedSequence`` input gives a
    ``PackedSequence`` output, as for :class:`RNN`.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> out, (h, c) = nn.LSTM(3, 4, proj_size=2, batch_first=True)(jnp.ones((2, 5, 3)))
    >>> out.shape, h.shape, c.shape
    ((2, 5, 2), (1, 2, 2), (1, 2, 4))
    >>> packed = nn.utils.rnn.pack_sequence([jnp.ones((5, 3)), jnp.ones((2, 3))])
    >>> out, (h, c) = nn.LSTM(3, 4)(packed)
    >>> out.data.shape, out.batch_sizes.tolist(), h.shape
    ((7, 4), [2, 2, 1, 1, 1], (1, 2, 4))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("LSTM", *args, **kwargs)

    def forward(
        self, input: Any, hx: tuple[Any, Any] | None = None
    ) -> tuple[Any, tuple[jax.Array, jax.Array]]:
        if isinstance(input, PackedSequence):
            x = self._packed_data(input)
            batch = int(input.batch_sizes[0])
            if hx is None:
                h0 = jnp.zeros(self._hidden_shape(batch), x.dtype)
                c0 = jnp.zeros(self._hidden_shape(batch, cell=True), x.dtype)
            else:
                if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                    raise TypeError(
                        f"LSTM expects hx as a pair (h_0, c_0); got {type(hx).__name__}"
                    )
                h0, c0 = as_array(hx[0]), as_array(hx[1])
                self._check_hidden(h0, self._hidden_shape(batch), "hidden[0] size")
                self._check_hidden(c0, self._hidden_shape(batch, cell=True), "hidden[1] size")
            return self._run_packed(input, (h0, c0))
        x, batched = self._prepare(input)
        batch = x.shape[1]
        if hx is None:
            h0 = jnp.zeros(self._hidden_shape(batch), x.dtype)
            c0 = jnp.zeros(self._hidden_shape(batch, cell=True), x.dtype)
        else:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"LSTM expects hx as a pair (h_0, c_0); got {type(hx).__name__}")
            h0, c0 = as_array(hx[0]), as_array(hx[1])
            want = 3 if batched else 2
            if h0.ndim != want or c0.ndim != want:
                kind = "batched 3-D" if batched else "unbatched 2-D"
                raise RuntimeError(
                    f"For {kind} input, hx and cx should also be {want}-D but got "
                    f"({h0.ndim}-D, {c0.ndim}-D) tensors"
                )
            if not batched:
                h0, c0 = h0[:, None], c0[:, None]
            self._check_hidden(h0, self._hidden_shape(batch), "hidden[0] size")
            self._check_hidden(c0, self._hidden_shape(batch, cell=True), "hidden[1] size")
        output, (h_n, c_n) = self._run(x, (h0, c0))
        if not batched:
            h_n, c_n = h_n[:, 0], c_n[:, 0]
        return self._finish(output, batched), (h_n, c_n)


class RNNCellBase(Module):
    """Shared parameters of the cells: ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``.

    >>> from jmodule import nn
    >>> nn.GRUCell(3, 4).weight_ih.shape
    (12, 3)
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool,
        num_chunks: int,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(
            _factory.empty((num_chunks * hidden_size, input_size), dtype, device)
        )
        self.weight_hh = Parameter(
            _factory.empty((num_chunks * hidden_size, hidden_size), dtype, device)
        )
        if bias:
            self.bias_ih = Parameter(_factory.empty((num_chunks * hidden_size,), dtype, device))
            self.bias_hh = Parameter(_factory.empty((num_chunks * hidden_size,), dtype, device))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = self.__dict__.get("nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"
        return s

    def reset_parameters(self) -> None:
        """Re-draw every weight and bias from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _prepare(self, input: Any, hx: Any, what: str = "hidden") -> tuple[jax.Array, Any, bool]:
        name = type(self).__name__
        x = as_array(input)
        if x.ndim not in (1, 2):
            raise ValueError(
                f"{name}: Expected input to be 1D or 2D, got {x.ndim}D instead "
                f"(shape {tuple(x.shape)})"
            )
        if x.shape[-1] != self.input_size:
            raise RuntimeError(
                f"{name}: input has inconsistent input_size: got {x.shape[-1]} expected "
                f"{self.input_size}"
            )
        batched = x.ndim == 2
        if not batched:
            x = x[None]
        expected = (x.shape[0], self.hidden_size)
        if hx is None:
            return x, None, batched
        hs = hx if isinstance(hx, (tuple, list)) else (hx,)
        out = []
        for idx, h in enumerate(hs):
            h = as_array(h)
            label = f"hx[{idx}]" if isinstance(hx, (tuple, list)) else what
            if h.ndim not in (1, 2):
                raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got {h.ndim}D instead")
            h = h if batched else h[None]
            if tuple(h.shape) != expected:
                raise RuntimeError(
                    f"{name}: Expected {label} of shape {expected} (batch, hidden_size), "
                    f"got {tuple(h.shape)}"
                )
            out.append(h)
        return x, tuple(out) if isinstance(hx, (tuple, list)) else out[0], batched

    def _weights(self) -> tuple[Any, Any, Any, Any]:
        return self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh


class RNNCell(RNNCellBase):
    """One Elman RNN step, as ``torch.nn.RNNCell``.

    Args:
        input_size, hidden_size: feature sizes.
        bias: use ``bias_ih``/``bias_hh``.
        nonlinearity: ``"tanh"`` or ``"relu"``.
        device, dtype: where and in what dtype to create the parameters.

    Call: ``cell(input, hx=None) -> h'``, input ``(N, H_in)`` or ``(H_in,)``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.RNNCell(3, 4)(jnp.ones((2, 3))).shape
    (2, 4)
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Any, hx: Any = None) -> jax.Array:
        x, h, batched = self._prepare(input, hx)
        if h is None:
            h = jnp.zeros((x.shape[0], self.hidden_size), x.dtype)
        if self.nonlinearity == "tanh":
            out = _rnn.rnn_tanh_cell(x, h, *self._weights())
        elif self.nonlinearity == "relu":
            out = _rnn.rnn_relu_cell(x, h, *self._weights())
        else:
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        return out if batched else out[0]


class LSTMCell(RNNCellBase):
    """One LSTM step, as ``torch.nn.LSTMCell``: ``cell(input, (h, c)=None) -> (h', c')``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> h, c = nn.LSTMCell(3, 4)(jnp.ones((2, 3)))
    >>> h.shape, c.shape
    ((2, 4), (2, 4))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input: Any, hx: tuple[Any, Any] | None = None) -> tuple[jax.Array, jax.Array]:
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError(f"LSTMCell expects hx as a pair (h, c); got {type(hx).__name__}")
        x, hc, batched = self._prepare(input, hx)
        if hc is None:
            zeros = jnp.zeros((x.shape[0], self.hidden_size), x.dtype)
            hc = (zeros, zeros)
        h, c = _rnn.lstm_cell(x, hc, *self._weights())
        return (h, c) if batched else (h[0], c[0])


class GRUCell(RNNCellBase):
    """One GRU step, as ``torch.nn.GRUCell``: ``cell(input, hx=None) -> h'``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.GRUCell(3, 4)(jnp.ones(3)).shape
    (4,)
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input: Any, hx: Any = None) -> jax.Array:
        x, h, batched = self._prepare(input, hx)
        if h is None:
            h = jnp.zeros((x.shape[0], self.hidden_size), x.dtype)
        out = _rnn.gru_cell(x, h, *self._weights())
        return out if batched else out[0]
