"""``Identity``, ``Linear`` and ``Bilinear``."""

from __future__ import annotations

import math
from typing import Any

import jax

from jmodule._placement import factory as _factory
from jmodule.nn import functional as F
from jmodule.nn import init
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = ["Bilinear", "Identity", "Linear"]


class Identity(Module):
    """Returns its input; ignores constructor arguments, as PyTorch's does.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Identity(54, unused="x")(jnp.ones(2))
    Array([1., 1.], dtype=float32)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Any) -> Any:
        return input


class Linear(Module):
    """``y = x @ W.T + b`` with PyTorch's parameter names, shapes and init.

    ``weight`` is ``(out_features, in_features)`` drawn from
    ``kaiming_uniform_(a=sqrt(5))``; ``bias`` from U(-1/sqrt(in), 1/sqrt(in)).

    Args:
        in_features: size of each input sample.
        out_features: size of each output sample.
        bias: learn an additive bias.
        device: where to allocate (default: the current ``jm.device`` context).
        dtype: parameter dtype (default float32).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Linear(3, 2)(jnp.ones((4, 3))).shape
    (4, 2)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(_factory.empty((out_features, in_features), dtype, device))
        if bias:
            self.bias = Parameter(_factory.empty((out_features,), dtype, device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw the parameters from PyTorch's default distributions."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.calculate_fan_in_and_fan_out(self.weight.shape)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Any) -> jax.Array:
        shape = getattr(input, "shape", None)
        if shape is not None and len(shape) >= 1 and shape[-1] != self.in_features:
            raise RuntimeError(
                f"{self._get_name()}({self.extra_repr()}) got an input of shape {tuple(shape)}: "
                f"its last dimension must be in_features={self.in_features}. (PyTorch says: "
                f"mat1 and mat2 shapes cannot be multiplied "
                f"({math.prod(shape[:-1]) if len(shape) > 1 else 1}x{shape[-1]} "
                f"and {self.in_features}x{self.out_features}))"
            )
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Bilinear(Module):
    """``y = x1 @ W @ x2 + b`` per output feature, as ``torch.nn.Bilinear``.

    ``weight`` is ``(out_features, in1_features, in2_features)`` and ``bias``
    ``(out_features,)``, both drawn from U(-1/sqrt(in1), 1/sqrt(in1)).

    Args:
        in1_features: size of each first input sample.
        in2_features: size of each second input sample.
        out_features: size of each output sample.
        bias: learn an additive bias.
        device, dtype: where and how to allocate the parameters.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Bilinear(2, 3, 4)(jnp.ones((5, 2)), jnp.ones((5, 3))).shape
    (5, 4)
    """

    def __init__(
        self,
        in1_features: int,
        in2_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        shape = (out_features, in1_features, in2_features)
        self.weight = Parameter(_factory.empty(shape, dtype, device))
        if bias:
            self.bias = Parameter(_factory.empty((out_features,), dtype, device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw weight and bias from U(-1/sqrt(in1), 1/sqrt(in1))."""
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Any, input2: Any) -> jax.Array:
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )
