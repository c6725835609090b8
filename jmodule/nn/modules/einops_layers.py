"""``Rearrange`` and ``Reduce``: einops' layers as jmodule modules.

einops ships its layers once per framework (``einops.layers.torch``,
``einops.layers.flax``, ...); each is a module of that framework, so none can
sit in a jmodule container (``Module.add_module`` says to use these). These
are the same layers, with the same arguments and ``repr``, as
:class:`~jmodule.nn.Module` subclasses: ``forward`` is ``einops.rearrange`` /
``einops.reduce``, which compute on jax arrays (and on Parameters,
``jmodule/_einops.py``), eagerly and inside compiled code.

einops is an optional dependency: without it, making a layer raises an
``ImportError`` that says to ``pip install einops``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jmodule.nn.modules.module import Module

__all__ = ["Rearrange", "Reduce"]

MISSING_HELP = (
    "jm.nn.{cls} computes with einops, which is not installed: pip install einops "
    "(einops is an optional dependency of jmodule)."
)


def _einops(cls: str) -> Any:
    try:
        import einops
    except ImportError:
        raise ImportError(MISSING_HELP.format(cls=cls)) from None
    return einops


def _check(layer: Module, mixin: str) -> None:
    """einops' own check of the pattern at construction (its layers fail there too)."""
    try:
        from einops import layers
    except ImportError:  # pragma: no cover (an einops without layers: checked at the call)
        return
    check = getattr(getattr(layers, mixin, None), "multirecipe", None)
    if check is not None:
        check(layer)


def _lengths(axes_lengths: dict) -> str:
    return "".join(f", {axis}={length}" for axis, length in axes_lengths.items())


class Rearrange(Module):
    """``einops.layers.torch.Rearrange`` as a jmodule module: ``einops.rearrange(x, pattern,
    **axes_lengths)``.

    Args:
        pattern: the rearrangement pattern (``"b c h w -> b (c h w)"``).
        **axes_lengths: lengths of axes the pattern cannot infer (``h=2``).

    Raises:
        ImportError: einops is not installed (``pip install einops``).
        EinopsError: an invalid pattern (einops' message, as its layers say it).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> layer = nn.Rearrange("b (h w) c -> b c h w", h=2)
    >>> layer, layer(jnp.ones((1, 6, 5))).shape
    (Rearrange('b (h w) c -> b c h w', h=2), (1, 5, 2, 3))
    """

    def __init__(self, pattern: str, **axes_lengths: Any) -> None:
        _einops("Rearrange")
        super().__init__()
        self.pattern = pattern
        self.axes_lengths = axes_lengths
        _check(self, "RearrangeMixin")

    def forward(self, input: Any) -> jax.Array:
        return _einops("Rearrange").rearrange(input, self.pattern, **self.axes_lengths)

    def extra_repr(self) -> str:
        return repr(self.pattern) + _lengths(self.axes_lengths)


class Reduce(Module):
    """``einops.layers.torch.Reduce`` as a jmodule module: ``einops.reduce(x, pattern,
    reduction, **axes_lengths)``.

    Args:
        pattern: the reduction pattern (``"b c (h h2) (w w2) -> b c h w"``).
        reduction: ``"min"``, ``"max"``, ``"sum"``, ``"mean"``, ``"prod"``, ``"any"``,
            ``"all"``, or a function, as einops accepts.
        **axes_lengths: lengths of axes the pattern cannot infer (``h2=2``).

    Raises:
        ImportError: einops is not installed (``pip install einops``).
        EinopsError: an invalid pattern or reduction (einops' message).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> pool = nn.Reduce("b c (h h2) (w w2) -> b c h w", "max", h2=2, w2=2)
    >>> pool, pool(jnp.ones((1, 3, 4, 4))).shape
    (Reduce('b c (h h2) (w w2) -> b c h w', 'max', h2=2, w2=2), (1, 3, 2, 2))
    """

    def __init__(self, pattern: str, reduction: str | Callable, **axes_lengths: Any) -> None:
        _einops("Reduce")
        super().__init__()
        self.pattern = pattern
        self.reduction = reduction
        self.axes_lengths = axes_lengths
        _check(self, "ReduceMixin")

    def forward(self, input: Any) -> jax.Array:
        einops = _einops("Reduce")
        return einops.reduce(input, self.pattern, self.reduction, **self.axes_lengths)

    def extra_repr(self) -> str:
        return f"{self.pattern!r}, {self.reduction!r}" + _lengths(self.axes_lengths)
