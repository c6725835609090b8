"""Padding layers, as in ``torch.nn``: zero, constant, reflection, replication and
circular padding of 1-3 trailing dimensions (via ``F.pad``)."""

from __future__ import annotations

from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.functional._utils import ntuple
from jmodule.nn.modules.module import Module

__all__ = [
    "CircularPad1d",
    "CircularPad2d",
    "CircularPad3d",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
    "ZeroPad1d",
    "ZeroPad2d",
    "ZeroPad3d",
]


class _PadNd(Module):
    _nd = 0
    _mode = "constant"

    def __init__(self, padding: Any) -> None:
        super().__init__()
        amounts = ntuple(padding, 2 * self._nd)
        if len(amounts) != 2 * self._nd:
            raise ValueError(
                f"{type(self).__name__}: padding must be an int or a tuple of {2 * self._nd} "
                f"ints, got {padding!r}"
            )
        self.padding = tuple(int(p) for p in amounts)

    def forward(self, input: Any) -> jax.Array:
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding: Any, value: float) -> None:
        super().__init__(padding)
        self.value = value

    def forward(self, input: Any) -> jax.Array:
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    """Pad the last dimension with ``value`` by ``padding`` (int or (left, right)).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ConstantPad1d((1, 0), 9.0)(jnp.zeros((1, 2)))
    Array([[9., 0., 0.]], dtype=float32)
    """

    _nd = 1


class ConstantPad2d(_ConstantPadNd):
    """Pad the last two dimensions with ``value`` (padding: int or (left, right, top, bottom)).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ConstantPad2d(1, 0.5)(jnp.zeros((1, 2, 2))).shape
    (1, 4, 4)
    """

    _nd = 2


class ConstantPad3d(_ConstantPadNd):
    """Pad the last three dimensions with ``value``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ConstantPad3d(1, 0.0)(jnp.zeros((1, 2, 2, 2))).shape
    (1, 4, 4, 4)
    """

    _nd = 3


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding: Any) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad1d(_ZeroPadNd):
    """Pad the last dimension with zeros.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ZeroPad1d(1)(jnp.ones((1, 2)))
    Array([[0., 1., 1., 0.]], dtype=float32)
    """

    _nd = 1


class ZeroPad2d(_ZeroPadNd):
    """Pad the last two dimensions with zeros.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ZeroPad2d((1, 1, 0, 2))(jnp.ones((1, 2, 2))).shape
    (1, 4, 4)
    """

    _nd = 2


class ZeroPad3d(_ZeroPadNd):
    """Pad the last three dimensions with zeros.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ZeroPad3d(1)(jnp.ones((1, 1, 1, 1))).shape
    (1, 3, 3, 3)
    """

    _nd = 3


class ReflectionPad1d(_PadNd):
    """Reflect the last dimension about its edges (padding smaller than the size).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReflectionPad1d(2)(jnp.array([[1.0, 2.0, 3.0]]))
    Array([[3., 2., 1., 2., 3., 2., 1.]], dtype=float32)
    """

    _nd = 1
    _mode = "reflect"


class ReflectionPad2d(_PadNd):
    """Reflect the last two dimensions about their edges.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReflectionPad2d(1)(jnp.ones((1, 3, 3))).shape
    (1, 5, 5)
    """

    _nd = 2
    _mode = "reflect"


class ReflectionPad3d(_PadNd):
    """Reflect the last three dimensions about their edges.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReflectionPad3d(1)(jnp.ones((1, 2, 2, 2))).shape
    (1, 4, 4, 4)
    """

    _nd = 3
    _mode = "reflect"


class ReplicationPad1d(_PadNd):
    """Repeat the edge values of the last dimension.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReplicationPad1d((1, 2))(jnp.array([[1.0, 2.0]]))
    Array([[1., 1., 2., 2., 2.]], dtype=float32)
    """

    _nd = 1
    _mode = "replicate"


class ReplicationPad2d(_PadNd):
    """Repeat the edge values of the last two dimensions.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReplicationPad2d(1)(jnp.ones((1, 2, 2))).shape
    (1, 4, 4)
    """

    _nd = 2
    _mode = "replicate"


class ReplicationPad3d(_PadNd):
    """Repeat the edge values of the last three dimensions.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.ReplicationPad3d(1)(jnp.ones((1, 1, 1, 1))).shape
    (1, 3, 3, 3)
    """

    _nd = 3
    _mode = "replicate"


class CircularPad1d(_PadNd):
    """Wrap the last dimension around (periodic padding).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.CircularPad1d(1)(jnp.array([[1.0, 2.0, 3.0]]))
    Array([[3., 1., 2., 3., 1.]], dtype=float32)
    """

    _nd = 1
    _mode = "circular"


class CircularPad2d(_PadNd):
    """Wrap the last two dimensions around.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.CircularPad2d(1)(jnp.ones((1, 2, 2))).shape
    (1, 4, 4)
    """

    _nd = 2
    _mode = "circular"


class CircularPad3d(_PadNd):
    """Wrap the last three dimensions around.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.CircularPad3d(1)(jnp.ones((1, 2, 2, 2))).shape
    (1, 4, 4, 4)
    """

    _nd = 3
    _mode = "circular"
