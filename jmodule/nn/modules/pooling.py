"""Pooling layers, as in ``torch.nn``: max, average and adaptive pooling in 1-3 dimensions.

Each wraps its ``jm.nn.functional`` counterpart; attributes and ``repr``
are PyTorch's. Inputs are ``(N, C, *spatial)`` or unbatched ``(C, *spatial)``.
"""

from __future__ import annotations

from typing import Any

from jmodule.nn import functional as F
from jmodule.nn.functional._utils import ntuple
from jmodule.nn.modules.module import Module

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
]


class _MaxPoolNd(Module):
    _functional: Any = None

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input: Any) -> Any:
        return type(self)._functional(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            ceil_mode=self.ceil_mode,
            return_indices=self.return_indices,
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool1d(_MaxPoolNd):
    """1-D max pooling, as ``torch.nn.MaxPool1d``.

    Args:
        kernel_size: window size.
        stride: window step (default ``kernel_size``).
        padding: implicit ``-inf`` padding on both sides.
        dilation: spacing of window elements.
        return_indices: also return the positions of the maxima.
        ceil_mode: round the output size up.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.MaxPool1d(2)(jnp.array([[1.0, 3.0, 2.0, 5.0]]))
    Array([[3., 5.]], dtype=float32)
    """

    _functional = staticmethod(F.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """2-D max pooling (arguments as :class:`MaxPool1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.MaxPool2d(3, stride=2, padding=1)(jnp.ones((1, 2, 8, 8))).shape
    (1, 2, 4, 4)
    """

    _functional = staticmethod(F.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    """3-D max pooling (arguments as :class:`MaxPool1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.MaxPool3d(2)(jnp.ones((1, 2, 4, 4, 4))).shape
    (1, 2, 2, 2, 2)
    """

    _functional = staticmethod(F.max_pool3d)


class AvgPool1d(Module):
    """1-D average pooling, as ``torch.nn.AvgPool1d``.

    Args:
        kernel_size: window size.
        stride: window step (default ``kernel_size``).
        padding: implicit zero padding on both sides.
        ceil_mode: round the output size up.
        count_include_pad: count padding zeros in the divisor.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AvgPool1d(2)(jnp.array([[1.0, 3.0, 2.0, 6.0]]))
    Array([[2., 4.]], dtype=float32)
    """

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> None:
        super().__init__()
        self.kernel_size = ntuple(kernel_size, 1)
        self.stride = ntuple(stride if stride is not None else kernel_size, 1)
        self.padding = ntuple(padding, 1)
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, input: Any) -> Any:
        return F.avg_pool1d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AvgPoolNd(Module):
    _functional: Any = None

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Any) -> Any:
        return type(self)._functional(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(_AvgPoolNd):
    """2-D average pooling (arguments as :class:`AvgPool1d`, plus ``divisor_override``).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AvgPool2d(2)(jnp.ones((1, 2, 4, 4))).shape
    (1, 2, 2, 2)
    """

    _functional = staticmethod(F.avg_pool2d)


class AvgPool3d(_AvgPoolNd):
    """3-D average pooling (arguments as :class:`AvgPool2d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AvgPool3d(2)(jnp.ones((1, 2, 4, 4, 4))).shape
    (1, 2, 2, 2, 2)
    """

    _functional = staticmethod(F.avg_pool3d)


class _AdaptiveAvgPoolNd(Module):
    _functional: Any = None

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Any) -> Any:
        return type(self)._functional(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed output length, as ``torch.nn.AdaptiveAvgPool1d``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AdaptiveAvgPool1d(2)(jnp.array([[1.0, 2.0, 3.0]]))
    Array([[1.5, 2.5]], dtype=float32)
    """

    _functional = staticmethod(F.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed output size (an entry may be None: keep that size).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AdaptiveAvgPool2d((1, 1))(jnp.ones((2, 3, 5, 5))).shape
    (2, 3, 1, 1)
    """

    _functional = staticmethod(F.adaptive_avg_pool2d)


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    """3-D adaptive average pooling.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AdaptiveAvgPool3d(1)(jnp.ones((2, 3, 4, 4, 4))).shape
    (2, 3, 1, 1, 1)
    """

    _functional = staticmethod(F.adaptive_avg_pool3d)


class _AdaptiveMaxPoolNd(Module):
    _functional: Any = None

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def forward(self, input: Any) -> Any:
        return type(self)._functional(input, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed output length, as ``torch.nn.AdaptiveMaxPool1d``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AdaptiveMaxPool1d(1)(jnp.array([[1.0, 4.0, 3.0]]))
    Array([[4.]], dtype=float32)
    """

    _functional = staticmethod(F.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """2-D adaptive max pooling.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AdaptiveMaxPool2d(2)(jnp.ones((1, 3, 5, 5))).shape
    (1, 3, 2, 2)
    """

    _functional = staticmethod(F.adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """3-D adaptive max pooling.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.AdaptiveMaxPool3d(1)(jnp.ones((1, 3, 2, 2, 2))).shape
    (1, 3, 1, 1, 1)
    """

    _functional = staticmethod(F.adaptive_max_pool3d)
