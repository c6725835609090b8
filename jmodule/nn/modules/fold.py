"""Sliding-block layers, as in ``torch.nn``: :class:`Unfold` (``im2col``) and :class:`Fold`
(``col2im``), wrapping ``jm.nn.functional.unfold`` / ``fold``; attributes and ``repr``
are PyTorch's.
"""

from __future__ import annotations

from typing import Any

from jmodule.nn import functional as F
from jmodule.nn.modules.module import Module

__all__ = ["Fold", "Unfold"]


class Fold(Module):
    """Combine sliding local blocks into an image, summing overlaps, as ``torch.nn.Fold``.

    Input ``(N, C * kh * kw, L)`` or ``(C * kh * kw, L)``; output
    ``(N, C, *output_size)`` or ``(C, *output_size)``.

    Args:
        output_size: spatial size of the output (int or pair).
        kernel_size: block size.
        dilation: spacing of the elements within a block.
        padding: implicit padding of the output (values there are dropped).
        stride: step between blocks.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Fold((4, 5), 2)(jnp.ones((2, 12, 12))).shape
    (2, 3, 4, 5)
    """

    def __init__(
        self,
        output_size: Any,
        kernel_size: Any,
        dilation: Any = 1,
        padding: Any = 0,
        stride: Any = 1,
    ) -> None:
        super().__init__()
        self.output_size = output_size
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Any) -> Any:
        return F.fold(
            input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride
        )

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, kernel_size={self.kernel_size}, "
            f"dilation={self.dilation}, padding={self.padding}, stride={self.stride}"
        )


class Unfold(Module):
    """Extract sliding local blocks, as ``torch.nn.Unfold``.

    Input ``(N, C, H, W)`` or ``(C, H, W)``; output ``(N, C * kh * kw, L)``
    or ``(C * kh * kw, L)``, ``L`` the number of blocks.

    Args:
        kernel_size: block size (int or pair).
        dilation: spacing of the elements within a block.
        padding: implicit zero padding on both sides.
        stride: step between blocks.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Unfold(2, stride=2)(jnp.ones((2, 3, 4, 6))).shape
    (2, 12, 6)
    """

    def __init__(
        self,
        kernel_size: Any,
        dilation: Any = 1,
        padding: Any = 0,
        stride: Any = 1,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Any) -> Any:
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, dilation={self.dilation}, "
            f"padding={self.padding}, stride={self.stride}"
        )
