"""``PixelShuffle``, ``PixelUnshuffle`` and ``ChannelShuffle``, as in ``torch.nn``."""

from __future__ import annotations

from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.modules.module import Module

__all__ = ["ChannelShuffle", "PixelShuffle", "PixelUnshuffle"]


class PixelShuffle(Module):
    """``(*, C * r**2, H, W) -> (*, C, H * r, W * r)``, as ``torch.nn.PixelShuffle``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.PixelShuffle(2)(jnp.ones((1, 8, 3, 3))).shape
    (1, 2, 6, 6)
    """

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input: Any) -> jax.Array:
        return F.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """``(*, C, H * r, W * r) -> (*, C * r**2, H, W)``, as ``torch.nn.PixelUnshuffle``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.PixelUnshuffle(2)(jnp.ones((1, 2, 6, 6))).shape
    (1, 8, 3, 3)
    """

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input: Any) -> jax.Array:
        return F.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class ChannelShuffle(Module):
    """Interleave ``groups`` channel groups, as ``torch.nn.ChannelShuffle``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ChannelShuffle(2)(jnp.arange(4.0).reshape(1, 4, 1))[0, :, 0]
    Array([0., 2., 1., 3.], dtype=float32)
    """

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, input: Any) -> jax.Array:
        return F.channel_shuffle(input, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"
