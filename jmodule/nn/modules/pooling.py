"""Pooling layers, as in ``torch.nn``: max, average, power-average and adaptive
pooling and max unpooling in 1-3 dimensions.

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
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
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


class _LPPoolNd(Module):
    _functional: Any = None

    def __init__(
        self,
        norm_type: float,
        kernel_size: Any,
        stride: Any = None,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.norm_type = norm_type
        self.kernel_size = kernel_size
        self.stride = stride
        self.ceil_mode = ceil_mode

    def forward(self, input: Any) -> Any:
        return type(self)._functional(
            input, float(self.norm_type), self.kernel_size, self.stride, self.ceil_mode
        )

    def extra_repr(self) -> str:
        return (
            f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"ceil_mode={self.ceil_mode}"
        )


class LPPool1d(_LPPoolNd):
    """1-D power-average pooling, as ``torch.nn.LPPool1d``: ``(sum x ** p) ** (1 / p)`` per window.

    Args:
        norm_type: the power ``p`` (``inf`` gives max pooling of ``abs(x)``).
        kernel_size: window size (an int).
        stride: window step (default ``kernel_size``).
        ceil_mode: round the output size up.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LPPool1d(2, 2)(jnp.array([[3.0, 4.0, 1.0, 0.0]])).round(4)
    Array([[5., 1.]], dtype=float32)
    """

    _functional = staticmethod(F.lp_pool1d)


class LPPool2d(_LPPoolNd):
    """2-D power-average pooling (arguments as :class:`LPPool1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LPPool2d(2, (2, 3), stride=1)(jnp.ones((1, 2, 4, 4))).shape
    (1, 2, 3, 2)
    """

    _functional = staticmethod(F.lp_pool2d)


class LPPool3d(_LPPoolNd):
    """3-D power-average pooling (arguments as :class:`LPPool1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LPPool3d(1, 2)(jnp.ones((2, 4, 4, 4))).shape
    (2, 2, 2, 2)
    """

    _functional = staticmethod(F.lp_pool3d)


class _MaxUnpoolNd(Module):
    _functional: Any = None
    _nd: int = 1

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        nd = type(self)._nd
        self.kernel_size = _tuple(kernel_size, nd)
        self.stride = _tuple(stride if stride is not None else kernel_size, nd)
        self.padding = _tuple(padding, nd)

    def forward(self, input: Any, indices: Any, output_size: Any = None) -> Any:
        return type(self)._functional(
            input, indices, self.kernel_size, self.stride, self.padding, output_size
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


def _tuple(value: Any, nd: int) -> tuple:
    """PyTorch's ``_single`` / ``_pair`` / ``_triple``."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * nd


class MaxUnpool1d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool1d`, as ``torch.nn.MaxUnpool1d``.

    Called as ``unpool(input, indices, output_size=None)`` with the pooled
    values and the indices ``MaxPool1d(..., return_indices=True)`` returned;
    non-maximal positions are zero.

    Args:
        kernel_size: the pooling's window size.
        stride: the pooling's step (default ``kernel_size``).
        padding: the pooling's padding.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> out, idx = nn.MaxPool1d(2, return_indices=True)(jnp.array([[1.0, 3.0, 2.0, 5.0]]))
    >>> nn.MaxUnpool1d(2)(out, idx)
    Array([[0., 3., 0., 5.]], dtype=float32)
    """

    _functional = staticmethod(F.max_unpool1d)
    _nd = 1


class MaxUnpool2d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool2d` (arguments as :class:`MaxUnpool1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> x = jnp.ones((1, 2, 5, 5))
    >>> out, idx = nn.MaxPool2d(2, return_indices=True)(x)
    >>> nn.MaxUnpool2d(2)(out, idx, output_size=x.shape).shape
    (1, 2, 5, 5)
    """

    _functional = staticmethod(F.max_unpool2d)
    _nd = 2


class MaxUnpool3d(_MaxUnpoolNd):
    """Partial inverse of :class:`MaxPool3d` (arguments as :class:`MaxUnpool1d`).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> out, idx = nn.MaxPool3d(2, return_indices=True)(jnp.ones((2, 4, 4, 4)))
    >>> nn.MaxUnpool3d(2)(out, idx).shape
    (2, 4, 4, 4)
    """

    _functional = staticmethod(F.max_unpool3d)
    _nd = 3
