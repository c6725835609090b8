"""Activation layers, as in ``torch.nn``.

Each wraps the function of the same name in ``jm.nn.functional``; the
constructor arguments, attributes and ``repr`` are PyTorch's. ``inplace`` is
accepted for compatibility (JAX returns new arrays).
"""

from __future__ import annotations

from typing import Any

import jax

from jmodule._placement import factory as _factory
from jmodule.nn import functional as F
from jmodule.nn import init
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "GLU",
    "SELU",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "LeakyReLU",
    "LogSigmoid",
    "LogSoftmax",
    "Mish",
    "PReLU",
    "RReLU",
    "ReLU",
    "ReLU6",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softmax2d",
    "Softmin",
    "Softplus",
    "Softshrink",
    "Softsign",
    "Tanh",
    "Tanhshrink",
    "Threshold",
]


class ReLU(Module):
    """``max(x, 0)`` elementwise.

    Args:
        inplace: accepted for PyTorch compatibility (JAX returns new arrays).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReLU()(jnp.array([-1.0, 2.0]))
    Array([0., 2.], dtype=float32)
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class _Inplace(Module):
    """An activation whose only argument is ``inplace`` (shown in ``repr`` when set)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class _NoArgs(Module):
    """An activation without arguments (extra ones are ignored, as PyTorch's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()


class Threshold(Module):
    """``x`` where ``x > threshold``, else ``value``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Threshold(0.5, -1.0)(jnp.array([0.0, 1.0]))
    Array([-1.,  1.], dtype=float32)
    """

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"threshold={self.threshold}, value={self.value}{inplace}"


class Hardtanh(Module):
    """Clamp to ``[min_val, max_val]``.

    ``min_value``/``max_value`` are PyTorch's deprecated spellings.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Hardtanh(-2.0, 2.0)(jnp.array([-3.0, 3.0]))
    Array([-2.,  2.], dtype=float32)
    """

    def __init__(
        self,
        min_val: float = -1.0,
        max_val: float = 1.0,
        inplace: bool = False,
        min_value: float | None = None,
        max_value: float | None = None,
    ) -> None:
        super().__init__()
        self.min_val = min_val if min_value is None else min_value
        self.max_val = max_val if max_value is None else max_value
        self.inplace = inplace
        if self.max_val <= self.min_val:
            raise ValueError(
                f"max_val ({self.max_val}) must be greater than min_val ({self.min_val})"
            )

    def forward(self, input: Any) -> jax.Array:
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"min_val={self.min_val}, max_val={self.max_val}{inplace}"


class ReLU6(Hardtanh):
    """``min(max(x, 0), 6)``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReLU6()(jnp.array([-1.0, 8.0]))
    Array([0., 6.], dtype=float32)
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    """``x`` for ``x > 0``, else ``negative_slope * x``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LeakyReLU(0.5)(jnp.array([-2.0]))
    Array([-1.], dtype=float32)
    """

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"negative_slope={self.negative_slope}{inplace}"


class PReLU(Module):
    """Leaky ReLU with a learned slope: one shared, or one per channel (dimension 1).

    ``weight`` has shape ``(num_parameters,)`` and starts at ``init``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.PReLU()(jnp.array([-4.0, 1.0]))
    Array([-1.,  1.], dtype=float32)
    """

    def __init__(
        self, num_parameters: int = 1, init: float = 0.25, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(_factory.empty((num_parameters,), dtype, device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set every slope to ``init``."""
        init.constant_(self.weight, self.init)

    def forward(self, input: Any) -> jax.Array:
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class RReLU(Module):
    """Randomized leaky ReLU: slopes from U(lower, upper) in training, their mean in eval.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.RReLU(0.1, 0.3).eval()(jnp.array([-1.0]))
    Array([-0.2], dtype=float32)
    """

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower = lower
        self.upper = upper
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"lower={self.lower}, upper={self.upper}{inplace}"


class ELU(Module):
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ELU()(jnp.array([1.0]))
    Array([1.], dtype=float32)
    """

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"alpha={self.alpha}{inplace}"


class CELU(ELU):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.CELU(0.5)(jnp.array([1.0]))
    Array([1.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.celu(input, self.alpha, self.inplace)


class SELU(_Inplace):
    """Scaled ELU with PyTorch's self-normalising constants.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.SELU()(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.selu(input, self.inplace)


class GELU(Module):
    """Gaussian error linear unit, exact (``'none'``) or ``'tanh'``-approximated.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.GELU("tanh")(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Any) -> jax.Array:
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(_Inplace):
    """``x * sigmoid(x)``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.SiLU()(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.silu(input, self.inplace)


class Mish(_Inplace):
    """``x * tanh(softplus(x))``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Mish()(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.mish(input, self.inplace)


class Hardswish(Module):
    """``x * relu6(x + 3) / 6``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Hardswish()(jnp.array([4.0]))
    Array([4.], dtype=float32)
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Any) -> jax.Array:
        return F.hardswish(input, self.inplace)


class Hardsigmoid(Hardswish):
    """``relu6(x + 3) / 6``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Hardsigmoid()(jnp.array([0.0]))
    Array([0.5], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.hardsigmoid(input, self.inplace)


class Sigmoid(_NoArgs):
    """``1 / (1 + exp(-x))``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Sigmoid()(jnp.array([0.0]))
    Array([0.5], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.sigmoid(input)


class Tanh(_NoArgs):
    """Hyperbolic tangent.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Tanh()(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.tanh(input)


class Softsign(_NoArgs):
    """``x / (1 + |x|)``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Softsign()(jnp.array([1.0]))
    Array([0.5], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.softsign(input)


class LogSigmoid(_NoArgs):
    """``log(sigmoid(x))``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LogSigmoid()(jnp.array([-100.0]))
    Array([-100.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.logsigmoid(input)


class Tanhshrink(_NoArgs):
    """``x - tanh(x)``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Tanhshrink()(jnp.array([0.0]))
    Array([0.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.tanhshrink(input)


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Softplus()(jnp.array([30.0]))
    Array([30.], dtype=float32)
    """

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input: Any) -> jax.Array:
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Hardshrink(Module):
    """``x`` where ``|x| > lambd``, else 0.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Hardshrink()(jnp.array([0.2, 1.0]))
    Array([0., 1.], dtype=float32)
    """

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Any) -> jax.Array:
        return F.hardshrink(input, self.lambd)

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    """Shrink towards zero by ``lambd``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Softshrink()(jnp.array([0.2, 1.0]))
    Array([0. , 0.5], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.softshrink(input, self.lambd)


class GLU(Module):
    """Gated linear unit over ``dim``: ``a * sigmoid(b)`` of its two halves.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.GLU()(jnp.ones((2, 4))).shape
    (2, 2)
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Any) -> jax.Array:
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(Module):
    """``softmax`` along ``dim`` (``None``: PyTorch's legacy choice, with its warning).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Softmax(dim=1)(jnp.zeros((1, 2)))
    Array([[0.5, 0.5]], dtype=float32)
    """

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Any) -> jax.Array:
        return F.softmax(input, self.dim, _stacklevel=6)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """``log_softmax`` along ``dim``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LogSoftmax(dim=0)(jnp.zeros(1))
    Array([0.], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.log_softmax(input, self.dim, _stacklevel=6)


class Softmin(Softmax):
    """``softmax(-x)`` along ``dim``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Softmin(dim=0)(jnp.zeros(2))
    Array([0.5, 0.5], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        return F.softmin(input, self.dim, _stacklevel=6)


class Softmax2d(_NoArgs):
    """Softmax over the channels of ``(N, C, H, W)`` or ``(C, H, W)`` input.

    Raises:
        ValueError: the input is not 3-D or 4-D.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Softmax2d()(jnp.zeros((2, 1, 1)))[:, 0, 0]
    Array([0.5, 0.5], dtype=float32)
    """

    def forward(self, input: Any) -> jax.Array:
        if input.ndim not in (3, 4):
            raise ValueError(
                f"Softmax2d: expected input to be 3D or 4D, got {input.ndim}D instead "
                f"(shape {tuple(input.shape)})"
            )
        return F.softmax(input, -3, _stacklevel=6)
