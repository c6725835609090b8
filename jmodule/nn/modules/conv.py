"""Convolution layers, as in ``torch.nn``: ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d``.

Parameter names, shapes and default initialisation are PyTorch's, so a
PyTorch ``state_dict`` loads unchanged: ``weight`` is
``(out, in / groups, *kernel)`` (transposed: ``(in, out / groups, *kernel)``)
drawn from ``kaiming_uniform_(a=sqrt(5))``; ``bias`` from U(-1/sqrt(fan_in),
1/sqrt(fan_in)). Non-zero ``padding_mode`` pads with ``F.pad`` first, as
PyTorch does.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from jmodule._placement import factory as _factory
from jmodule.nn import functional as F
from jmodule.nn import init
from jmodule.nn.functional._conv import same_padding
from jmodule.nn.functional._utils import ntuple
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_PADDING_STRINGS = ("same", "valid")


class _ConvNd(Module):
    _nd = 0

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any,
        padding: Any,
        dilation: Any,
        transposed: bool,
        output_padding: Any,
        groups: int,
        bias: bool,
        padding_mode: str,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        nd = self._nd
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups:
            raise ValueError(
                f"in_channels must be divisible by groups (in_channels={in_channels}, "
                f"groups={groups})"
            )
        if out_channels % groups:
            raise ValueError(
                f"out_channels must be divisible by groups (out_channels={out_channels}, "
                f"groups={groups})"
            )
        kernel_size, stride, dilation = (
            _tuple(v, nd, name)
            for v, name in (
                (kernel_size, "kernel_size"),
                (stride, "stride"),
                (dilation, "dilation"),
            )
        )
        if isinstance(padding, str):
            if padding not in _PADDING_STRINGS:
                raise ValueError(
                    f"Invalid padding string {padding!r}, should be one of {set(_PADDING_STRINGS)}"
                )
            if transposed:
                raise ValueError(
                    f"{type(self).__name__}: padding must be an int or a tuple of ints, got "
                    f"{padding!r}"
                )
            if padding == "same" and any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
        else:
            padding = _tuple(padding, nd, "padding")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(
                f"padding_mode must be one of {set(_PADDING_MODES)}, but got "
                f"padding_mode='{padding_mode}'"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.transposed = transposed
        self.output_padding = _tuple(output_padding, nd, "output_padding")
        self.groups = groups
        self.padding_mode = padding_mode
        # F.pad's (last-dim-first) amounts for a non-zeros padding_mode.
        if padding == "same":
            pairs = same_padding(kernel_size, dilation)
        elif padding == "valid":
            pairs = [(0, 0)] * nd
        else:
            pairs = [(p, p) for p in padding]
        self._reversed_padding_repeated_twice = [p for pair in reversed(pairs) for p in pair]
        if transposed:
            shape = (in_channels, out_channels // groups, *kernel_size)
        else:
            shape = (out_channels, in_channels // groups, *kernel_size)
        self.weight = Parameter(_factory.empty(shape, dtype, device))
        if bias:
            self.bias = Parameter(_factory.empty((out_channels,), dtype, device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw the parameters from PyTorch's default distributions."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.calculate_fan_in_and_fan_out(self.weight.shape)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        nd = self._nd
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


def _tuple(value: Any, nd: int, name: str) -> tuple[int, ...]:
    out = ntuple(value, nd)
    if len(out) != nd:
        raise ValueError(f"{name} must be an int or a tuple of {nd} ints, got {value!r}")
    return tuple(int(v) for v in out)


class _Conv(_ConvNd):
    _functional: Any = None

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            False,
            0,
            groups,
            bias,
            padding_mode,
            device,
            dtype,
        )

    def _conv_forward(self, input: Any, weight: Any, bias: Any) -> jax.Array:
        conv = type(self)._functional
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Any) -> jax.Array:
        return self._conv_forward(input, self.weight, self.bias)


class Conv1d(_Conv):
    """1-D convolution over ``(N, C_in, L)`` or ``(C_in, L)`` input, as ``torch.nn.Conv1d``.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: int or 1-tuple.
        stride: int or 1-tuple.
        padding: int, 1-tuple, ``'valid'`` or ``'same'``.
        dilation: int or 1-tuple.
        groups: blocked connections between input and output channels.
        bias: learn a bias.
        padding_mode: ``'zeros'``, ``'reflect'``, ``'replicate'`` or ``'circular'``.
        device, dtype: where and how to allocate the parameters.

    Raises:
        ValueError: channels not divisible by ``groups``, an unknown padding
            string or mode, or ``'same'`` with a stride.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Conv1d(2, 4, 3, padding=1)(jnp.ones((1, 2, 8))).shape
    (1, 4, 8)
    """

    _nd = 1
    _functional = staticmethod(F.conv1d)


class Conv2d(_Conv):
    """2-D convolution over ``(N, C_in, H, W)`` input (arguments as :class:`Conv1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Conv2d(3, 8, 3, stride=2, padding=1)(jnp.ones((1, 3, 8, 8))).shape
    (1, 8, 4, 4)
    """

    _nd = 2
    _functional = staticmethod(F.conv2d)


class Conv3d(_Conv):
    """3-D convolution over ``(N, C_in, D, H, W)`` input (arguments as :class:`Conv1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Conv3d(2, 4, 3, padding="same")(jnp.ones((1, 2, 4, 4, 4))).shape
    (1, 4, 4, 4, 4)
    """

    _nd = 3
    _functional = staticmethod(F.conv3d)


class _ConvTranspose(_ConvNd):
    _functional: Any = None

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if padding_mode != "zeros":
            raise ValueError(
                f'Only "zeros" padding mode is supported for {type(self).__name__} '
                f"(got padding_mode={padding_mode!r})"
            )
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            True,
            output_padding,
            groups,
            bias,
            padding_mode,
            device,
            dtype,
        )

    def _output_padding(self, input: Any, output_size: Any) -> tuple[int, ...]:
        """The ``output_padding`` that makes the output ``output_size`` (PyTorch's rule)."""
        if output_size is None:
            return self.output_padding
        nd = self._nd
        non_spatial = 2 if input.ndim == nd + 2 else 1
        size = [int(s) for s in output_size]
        if len(size) == nd + non_spatial:
            size = size[non_spatial:]
        if len(size) != nd:
            raise ValueError(
                f"ConvTranspose{nd}D: for {input.ndim}D input, output_size must have {nd} or "
                f"{nd + non_spatial} elements (got {len(output_size)})"
            )
        spatial = input.shape[input.ndim - nd :]
        lows = [
            (n - 1) * s - 2 * p + d * (k - 1) + 1
            for n, s, p, d, k in zip(
                spatial, self.stride, self.padding, self.dilation, self.kernel_size
            )
        ]
        highs = [lo + s - 1 for lo, s in zip(lows, self.stride)]
        for want, lo, hi in zip(size, lows, highs):
            if not lo <= want <= hi:
                raise ValueError(
                    f"requested an output size of {tuple(size)}, but valid sizes range from "
                    f"{tuple(lows)} to {tuple(highs)} (for an input of {tuple(spatial)})"
                )
        return tuple(want - lo for want, lo in zip(size, lows))

    def forward(self, input: Any, output_size: Any = None) -> jax.Array:
        output_padding = self._output_padding(input, output_size)
        return type(self)._functional(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            output_padding,
            self.groups,
            self.dilation,
        )


class ConvTranspose1d(_ConvTranspose):
    """1-D transposed convolution, as ``torch.nn.ConvTranspose1d``.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, groups,
            bias, dilation, device, dtype: as :class:`Conv1d` (padding is
            ints only; ``padding_mode`` must be ``'zeros'``).
        output_padding: extra size added to one side of the output.

    ``forward(input, output_size=None)``: ``output_size`` picks the
    ``output_padding`` that gives that size, as PyTorch.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ConvTranspose1d(2, 4, 3, stride=2)(jnp.ones((1, 2, 5))).shape
    (1, 4, 11)
    """

    _nd = 1
    _functional = staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTranspose):
    """2-D transposed convolution (arguments as :class:`ConvTranspose1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> up = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1)
    >>> up(jnp.ones((1, 4, 5, 5)), output_size=(10, 10)).shape
    (1, 2, 10, 10)
    """

    _nd = 2
    _functional = staticmethod(F.conv_transpose2d)


class ConvTranspose3d(_ConvTranspose):
    """3-D transposed convolution (arguments as :class:`ConvTranspose1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ConvTranspose3d(2, 1, 2, stride=2)(jnp.ones((1, 2, 2, 2, 2))).shape
    (1, 1, 4, 4, 4)
    """

    _nd = 3
    _functional = staticmethod(F.conv_transpose3d)
