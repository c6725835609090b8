"""``Upsample`` and its fixed-mode variants, as in ``torch.nn``."""

from __future__ import annotations

from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.modules.module import Module

__all__ = ["Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"]


class Upsample(Module):
    """Resize ``(N, C, *spatial)`` input with ``F.interpolate``, as ``torch.nn.Upsample``.

    Args:
        size: output spatial size.
        scale_factor: multiplier(s) for the spatial size.
        mode: ``'nearest'``, ``'nearest-exact'``, ``'linear'``, ``'bilinear'``,
            ``'bicubic'``, ``'trilinear'`` or ``'area'``.
        align_corners: for the interpolating modes.
        recompute_scale_factor: use the sizes, not ``scale_factor``, in the kernel.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.Upsample(scale_factor=2, mode="bilinear")(jnp.ones((1, 3, 4, 4))).shape
    (1, 3, 8, 8)
    """

    def __init__(
        self,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ) -> None:
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, (tuple, list)):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor is not None else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input: Any) -> jax.Array:
        return F.interpolate(
            input,
            self.size,
            self.scale_factor,
            self.mode,
            self.align_corners,
            recompute_scale_factor=self.recompute_scale_factor,
        )

    def extra_repr(self) -> str:
        if self.scale_factor is not None:
            info = f"scale_factor={self.scale_factor!r}"
        else:
            info = f"size={self.size!r}"
        return f"{info}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour upsampling of ``(N, C, H, W)`` input.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.UpsamplingNearest2d(scale_factor=2)(jnp.ones((1, 1, 2, 2))).shape
    (1, 1, 4, 4)
    """

    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear upsampling with ``align_corners=True`` of ``(N, C, H, W)`` input.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.UpsamplingBilinear2d(size=3)(jnp.ones((1, 1, 2, 2))).shape
    (1, 1, 3, 3)
    """

    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
