"""What every ``jm.*`` torch function shares: reading inputs, dims, dtypes, errors."""

from __future__ import annotations

import collections
import numbers
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._lowering import state
from jmodule._lowering.state import as_array
from jmodule._placement import device as _device
from jmodule._placement import factory as _factory
from jmodule._placement.device import out_dtype as out_dtype  # the dtype rule's owner is _device

__all__ = [
    "arr",
    "as_int",
    "canon_dims",
    "compute_dtype",
    "default_float",
    "dim_error",
    "float_input",
    "long_dtype",
    "norm_dim",
    "out_dtype",
    "place",
    "return_type",
    "shape_arg",
]


def arr(x: Any) -> jax.Array:
    """``x`` as a ``jax.Array``.

    Parameters and Buffers are read as the functional layers read them (an
    active ``jm.backward`` sees the read); numpy arrays, torch tensors and
    Python scalars are converted (Python scalars stay weakly typed, so that
    ``jm.maximum(x, 0.0)`` keeps ``x``'s dtype, as a torch scalar does).
    """
    if isinstance(x, jax.Array):
        return x
    return as_array(x)


def default_float() -> Any:
    """The default floating dtype (``jm.get_default_dtype()``)."""
    return _device.get_default_dtype()


def long_dtype() -> Any:
    """PyTorch's int64 under the x64 rule: int64 with x64 on, else int32."""
    return jnp.int64 if jax.config.read("jax_enable_x64") else jnp.int32


def float_input(x: jax.Array) -> jax.Array:
    """Integer and bool inputs as the default float dtype (what torch's floating
    functions compute integers in); floating and complex inputs unchanged."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return x.astype(default_float())


def compute_dtype(x: jax.Array, dtype: Any) -> jax.Array:
    """``x`` cast to ``dtype=`` when one is given (the reductions' ``dtype`` argument)."""
    dt = out_dtype(dtype)
    return x if dt is None else x.astype(dt)


def dim_error(dim: int, ndim: int) -> IndexError:
    """PyTorch's error for a dim outside ``[-ndim, ndim - 1]`` (0-d counts as 1-d)."""
    n = max(ndim, 1)
    return IndexError(
        f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
    )


def norm_dim(dim: Any, ndim: int, *, extra: int = 0) -> int:
    """``dim`` as a non-negative axis of an ``ndim``-d array (``extra`` widens the range,
    as ``unsqueeze``'s ``ndim + 1``); raises PyTorch's ``IndexError``."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        dim = _index(dim)
    dim = int(dim)
    n = ndim + extra
    lo, hi = (-1, 0) if n == 0 else (-n, n - 1)
    if not lo <= dim <= hi:
        raise dim_error(dim, n)
    return dim % n if n else 0


def canon_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """``dim`` (None, an int, or a sequence of ints) as a tuple of distinct axes, or None
    for "all of them"; an empty sequence means all, as in PyTorch's reductions."""
    if dim is None:
        return None
    if isinstance(dim, Sequence) and not isinstance(dim, str):
        if len(dim) == 0:
            return None
        axes = tuple(norm_dim(d, ndim) for d in dim)
        if len(set(axes)) != len(axes):
            dup = next(d for d in axes if axes.count(d) > 1)
            raise RuntimeError(f"dim {dup} appears multiple times in the list of dims")
        return axes
    return (norm_dim(dim, ndim),)


def _index(x: Any) -> int:
    try:
        return int(x)
    except TypeError:
        raise TypeError(f"dim must be an int, got {type(x).__name__}") from None


def shape_arg(size: tuple) -> tuple[int, ...]:
    """PyTorch's ``*size``: ``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` are one shape."""
    if (
        len(size) == 1
        and isinstance(size[0], (Sequence, np.ndarray))
        and not isinstance(size[0], str)
    ):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, jax.core.Tracer):
            raise TypeError(
                "a size must be a Python int, not a traced value: shapes are fixed when a "
                "program is compiled. Pass the size as a static (non-array) argument."
            )
        n = as_int(s, "size")
        if n < 0:
            raise RuntimeError(
                f"Trying to create tensor with negative dimension {n}: {list(map(int, size))}"
            )
        out.append(n)
    return tuple(out)


def as_int(v: Any, what: str = "argument") -> int:
    """``v`` as a Python int (ints, numpy ints, concrete integer arrays); floats are a
    ``TypeError``, as in PyTorch."""
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(v).__name__} ({v!r})") from None


def place(x: Any, device: Any) -> Any:
    """A new array ``x`` placed where ``device=`` (or the ``with jm.device`` context) says;
    under the meta device, a ``jax.ShapeDtypeStruct``."""
    where = _factory.placement(device)
    if where is None:
        return x
    if isinstance(where, _device.device):  # meta
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    if isinstance(x, jax.core.Tracer):
        return x
    return jax.device_put(x, where)


def return_type(name: str, fields: tuple[str, ...]) -> type:
    """The named tuple class PyTorch returns from ``torch.<name>``
    (``torch.return_types.<name>``), with its field names. Made once, at import."""
    cls = collections.namedtuple(name, fields)
    cls.__module__ = "jmodule.return_types"
    cls.__qualname__ = name
    return cls


def is_traced(*xs: Any) -> bool:
    """Whether any of ``xs`` is a traced value (inside ``jax.jit``/``jm.compile``)."""
    return any(isinstance(x, jax.core.Tracer) for x in xs) or state.tracing()
