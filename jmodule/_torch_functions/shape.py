"""Shape and indexing functions with PyTorch's meaning: ``jm.cat``, ``jm.split``,
``jm.transpose`` (swap two dims, never numpy's reversal), ``jm.gather``, ...

Dims are checked as PyTorch checks them (``IndexError: Dimension out of
range ...``). Functions whose result shape depends on the data
(``masked_select``, ``nonzero``, one-argument ``where``, ``repeat_interleave``
with an array of repeats and no ``output_size``) run eagerly only: inside a
trace they raise, saying what to use instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._convert import torch_scalar_name
from jmodule._torch_functions._common import arr, as_int, canon_dims, long_dtype, norm_dim
from jmodule.amp import _autocast as _amp

__all__ = [
    "argwhere",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "broadcast_tensors",
    "broadcast_to",
    "cat",
    "chunk",
    "column_stack",
    "concat",
    "concatenate",
    "diag",
    "diag_embed",
    "diagonal",
    "dsplit",
    "dstack",
    "flatten",
    "flip",
    "fliplr",
    "flipud",
    "gather",
    "hsplit",
    "hstack",
    "index_add",
    "index_copy",
    "index_fill",
    "index_select",
    "masked_fill",
    "masked_scatter",
    "masked_select",
    "moveaxis",
    "movedim",
    "narrow",
    "nonzero",
    "permute",
    "ravel",
    "repeat_interleave",
    "reshape",
    "roll",
    "rot90",
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "select",
    "split",
    "squeeze",
    "stack",
    "swapaxes",
    "swapdims",
    "t",
    "take",
    "take_along_dim",
    "tensor_split",
    "tile",
    "transpose",
    "unbind",
    "unflatten",
    "unsqueeze",
    "view_as_complex",
    "view_as_real",
    "vsplit",
    "vstack",
    "where",
]

_EAGER_ONLY = (
    "jm.{name} has a result whose shape depends on the values of its input, which a compiled "
    "program cannot have (its shapes are fixed when it is traced). Call it eagerly, outside "
    "jm.compile / jax.jit, or {instead}."
)


def _eager(name: str, instead: str, *xs: jax.Array) -> None:
    if any(isinstance(x, jax.core.Tracer) for x in xs):
        raise TypeError(_EAGER_ONLY.format(name=name, instead=instead))


def _seq(tensors: Any, name: str, op: str = "cat") -> tuple[jax.Array, ...]:
    """The arrays of ``tensors``, cast as autocast casts aten ``op`` (``cat``/``stack``, on
    CPU's promote list; ``hstack`` and the others run ``cat``)."""
    if isinstance(tensors, jax.Array) or hasattr(tensors, "__jax_array__"):
        raise TypeError(
            f"{name}(): argument 'tensors' must be a tuple or list of arrays, not an array"
        )
    xs = [arr(t) for t in tensors]
    if not xs:
        # PyTorch raises ValueError for cat and RuntimeError for the others.
        error = ValueError if name == "cat" else RuntimeError
        raise error(f"{name}(): expected a non-empty list of Tensors")
    return _amp.cast(op, *xs)


def cat(tensors: Sequence[Any], dim: int = 0, *, out: Any = None) -> jax.Array:
    """Join arrays along an existing dim, as ``torch.cat`` (dtypes are promoted)."""
    xs = _seq(tensors, "cat")
    # PyTorch skips 1-d empty arrays (legacy behaviour), so cat([empty, x]) is x.
    keep = [x for x in xs if not (x.ndim == 1 and x.shape[0] == 0)] or xs[:1]
    ref = max(keep, key=lambda x: x.ndim)
    d = norm_dim(dim, ref.ndim)
    for i, x in enumerate(keep):
        if x.ndim != ref.ndim:
            raise RuntimeError(
                f"Tensors must have same number of dimensions: got {ref.ndim} and {x.ndim}"
            )
        for a in range(x.ndim):
            if a != d and x.shape[a] != ref.shape[a]:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {d}. Expected size "
                    f"{ref.shape[a]} but got size {x.shape[a]} for tensor number {i} in the list."
                )
    dt = jnp.result_type(*xs)
    return jnp.concatenate([x.astype(dt) for x in keep], axis=d)


def concat(tensors: Sequence[Any], dim: int = 0, *, out: Any = None) -> jax.Array:
    """Alias of :func:`cat`."""
    return cat(tensors, dim)


def concatenate(
    tensors: Sequence[Any], dim: int = 0, *, axis: int | None = None, out: Any = None
) -> jax.Array:
    """Alias of :func:`cat`; ``axis`` is another name for ``dim``, as in
    ``torch.concatenate``.

    >>> import jmodule as jm
    >>> a = jm.ones(2, 3)
    >>> jm.concatenate([a, a], dim=0).shape, jm.concatenate([a, a], axis=1).shape
    ((4, 3), (2, 6))
    """
    return cat(tensors, dim if axis is None else axis)


def stack(tensors: Sequence[Any], dim: int = 0, *, out: Any = None) -> jax.Array:
    """Join same-shape arrays along a new dim ``dim``."""
    xs = _seq(tensors, "stack", "stack")
    for i, x in enumerate(xs):
        if x.shape != xs[0].shape:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got {list(xs[0].shape)} at "
                f"entry 0 and {list(x.shape)} at entry {i}"
            )
    d = norm_dim(dim, xs[0].ndim, extra=1)
    dt = jnp.result_type(*xs)
    return jnp.stack([x.astype(dt) for x in xs], axis=d)


def hstack(tensors: Sequence[Any], *, out: Any = None) -> jax.Array:
    """Stack horizontally (dim 1, dim 0 for 1-d arrays)."""
    return jnp.hstack(_seq(tensors, "hstack"))


def vstack(tensors: Sequence[Any], *, out: Any = None) -> jax.Array:
    """Stack vertically (1-d arrays become rows)."""
    return jnp.vstack(_seq(tensors, "vstack"))


def dstack(tensors: Sequence[Any], *, out: Any = None) -> jax.Array:
    """Stack along dim 2 (after making every array at least 3-d)."""
    return jnp.dstack(_seq(tensors, "dstack"))


def column_stack(tensors: Sequence[Any], *, out: Any = None) -> jax.Array:
    """1-d arrays as columns of a matrix, 2-d ones side by side."""
    return jnp.column_stack(_seq(tensors, "column_stack"))


def split(tensor: Any, split_size_or_sections: Any, dim: int = 0) -> tuple[jax.Array, ...]:
    """Split into pieces along ``dim``, as ``torch.split``.

    An int is the size of every piece (the last may be smaller); a list gives
    each piece's size, and they must add up to the dim's size. (numpy's
    ``split`` takes a number of pieces or split points: not this.)
    """
    x = arr(tensor)
    d = norm_dim(dim, x.ndim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [as_int(s, "split size") for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise RuntimeError(
                f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's "
                f"size at dimension {d}), but got split_sizes={sizes}"
            )
    else:
        size = int(split_size_or_sections)
        if size < 0:
            raise RuntimeError(
                f"split expects split_size be non-negative, but got split_size={size}"
            )
        if size == 0:
            if n != 0:
                raise RuntimeError(
                    "split_size can only be 0 if dimension size is 0, but got dimension size "
                    f"of {n}"
                )
            return (x,)
        sizes = [min(size, n - i) for i in range(0, n, size)] or [0]
    cuts = np.cumsum(sizes)[:-1].tolist()
    return tuple(jnp.split(x, cuts, axis=d))


def chunk(input: Any, chunks: int, dim: int = 0) -> tuple[jax.Array, ...]:
    """Split into ``chunks`` pieces of ``ceil(size / chunks)`` (fewer pieces when the size
    does not allow that many), as ``torch.chunk``."""
    x = arr(input)
    chunks = int(chunks)
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = norm_dim(dim, x.ndim)
    size = max(math.ceil(x.shape[d] / chunks), 1) if x.shape[d] else 0
    if size == 0:
        return tuple(jnp.split(x, chunks, axis=d))
    return split(x, size, d)


def tensor_split(input: Any, indices_or_sections: Any, dim: int = 0) -> tuple[jax.Array, ...]:
    """numpy's ``array_split``: a number of near-equal pieces, or split indices."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    spec = indices_or_sections
    if hasattr(spec, "shape") and np.ndim(spec) == 0:
        spec = int(spec)
    elif hasattr(spec, "shape"):
        spec = [int(i) for i in np.asarray(spec)]
    return tuple(jnp.array_split(x, spec, axis=d))


def hsplit(input: Any, indices_or_sections: Any) -> tuple[jax.Array, ...]:
    """``tensor_split`` along dim 1 (dim 0 for 1-d arrays); sections must divide evenly."""
    return tuple(jnp.hsplit(arr(input), indices_or_sections))


def vsplit(input: Any, indices_or_sections: Any) -> tuple[jax.Array, ...]:
    """``tensor_split`` along dim 0; sections must divide evenly."""
    return tuple(jnp.vsplit(arr(input), indices_or_sections))


def dsplit(input: Any, indices_or_sections: Any) -> tuple[jax.Array, ...]:
    """``tensor_split`` along dim 2; sections must divide evenly."""
    return tuple(jnp.dsplit(arr(input), indices_or_sections))


def unbind(input: Any, dim: int = 0) -> tuple[jax.Array, ...]:
    """The slices along ``dim``, each without that dim."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    if x.ndim == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    return tuple(jnp.moveaxis(x, d, 0))


def transpose(input: Any, dim0: int, dim1: int) -> jax.Array:
    """Swap dims ``dim0`` and ``dim1`` (PyTorch's meaning; not numpy's reversal)."""
    x = arr(input)
    return jnp.swapaxes(x, norm_dim(dim0, x.ndim), norm_dim(dim1, x.ndim))


def swapaxes(input: Any, axis0: int, axis1: int) -> jax.Array:
    """Alias of :func:`transpose`."""
    return transpose(input, axis0, axis1)


def swapdims(input: Any, dim0: int, dim1: int) -> jax.Array:
    """Alias of :func:`transpose`."""
    return transpose(input, dim0, dim1)


def t(input: Any) -> jax.Array:
    """Transpose a matrix (0-d and 1-d arrays are returned as they are)."""
    x = arr(input)
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return x.T


def _dims_arg(dims: tuple) -> tuple:
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        return tuple(dims[0])
    return dims


def permute(input: Any, *dims: Any) -> jax.Array:
    """Reorder the dims (``permute(x, (1, 0))`` or ``permute(x, 1, 0)``)."""
    x = arr(input)
    dims = _dims_arg(dims)
    if len(dims) != x.ndim:
        raise RuntimeError(
            "permute(sparse_coo): number of dimensions in the tensor input does not match the "
            f"length of the desired ordering of dimensions i.e. input.dim() = {x.ndim} is not "
            f"equal to len(dims) = {len(dims)}"
        )
    axes = [norm_dim(d, x.ndim) for d in dims]
    if len(set(axes)) != len(axes):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return jnp.transpose(x, axes)


def reshape(input: Any, *shape: Any) -> jax.Array:
    """A new shape with the same elements (one size may be -1)."""
    x = arr(input)
    shape = tuple(as_int(s, "shape") for s in _dims_arg(shape))
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = math.prod(s for s in shape if s != -1)
    if (-1 in shape and (known == 0 or x.size % known)) or (-1 not in shape and known != x.size):
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {x.size}")
    return jnp.reshape(x, shape)


def ravel(input: Any) -> jax.Array:
    """The elements as a 1-d array."""
    return jnp.ravel(arr(input))


def flatten(input: Any, start_dim: int = 0, end_dim: int = -1) -> jax.Array:
    """Merge dims ``start_dim`` .. ``end_dim`` into one (a 0-d array becomes 1-d)."""
    x = arr(input)
    if x.ndim == 0:
        return x.reshape(1)
    s, e = norm_dim(start_dim, x.ndim), norm_dim(end_dim, x.ndim)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    return x.reshape((*x.shape[:s], math.prod(x.shape[s : e + 1]), *x.shape[e + 1 :]))


def unflatten(input: Any, dim: int, sizes: Sequence[int]) -> jax.Array:
    """Split dim ``dim`` into ``sizes`` (one may be -1)."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    sizes = [as_int(s, "sizes") for s in sizes]
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        sizes[sizes.index(-1)] = x.shape[d] // known if known else 0
    if math.prod(sizes) != x.shape[d]:
        raise RuntimeError(
            f"unflatten: Provided sizes {sizes} don't multiply up to the size of dim {dim} "
            f"({x.shape[d]}) in the input tensor"
        )
    return x.reshape(x.shape[:d] + tuple(sizes) + x.shape[d + 1 :])


def squeeze(input: Any, dim: Any = None) -> jax.Array:
    """Drop size-1 dims: all of them, or those of ``dim`` (an int or tuple) that are 1
    (a named dim of another size is kept, as in PyTorch)."""
    x = arr(input)
    if dim is None:
        return jnp.squeeze(x)
    axes = canon_dims(dim, x.ndim) or ()
    return jnp.squeeze(x, tuple(a for a in axes if x.ndim and x.shape[a] == 1))


def unsqueeze(input: Any, dim: int) -> jax.Array:
    """Insert a size-1 dim at ``dim`` (in ``[-ndim-1, ndim]``)."""
    x = arr(input)
    return jnp.expand_dims(x, norm_dim(dim, x.ndim, extra=1))


def atleast_1d(*tensors: Any) -> Any:
    """Arrays with at least 1 dim (one array in, one out)."""
    out = [jnp.atleast_1d(arr(t)) for t in _dims_arg(tensors)]
    return out[0] if len(out) == 1 and not isinstance(tensors[0], (list, tuple)) else tuple(out)


def atleast_2d(*tensors: Any) -> Any:
    """Arrays with at least 2 dims."""
    out = [jnp.atleast_2d(arr(t)) for t in _dims_arg(tensors)]
    return out[0] if len(out) == 1 and not isinstance(tensors[0], (list, tuple)) else tuple(out)


def atleast_3d(*tensors: Any) -> Any:
    """Arrays with at least 3 dims."""
    out = [jnp.atleast_3d(arr(t)) for t in _dims_arg(tensors)]
    return out[0] if len(out) == 1 and not isinstance(tensors[0], (list, tuple)) else tuple(out)


def narrow(input: Any, dim: int, start: Any, length: int) -> jax.Array:
    """``length`` elements of dim ``dim`` from ``start`` (negative ``start`` counts from
    the end)."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    n = x.shape[d]
    start, length = int(start), int(length)
    if not -n <= start <= n:
        raise IndexError(
            f"start out of range (expected to be in range of [{-n}, {n}], but got {start})"
        )
    start %= n if n else 1
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if start + length > n:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({n}).")
    return jax.lax.slice_in_dim(x, start, start + length, axis=d)


def select(input: Any, dim: int, index: int) -> jax.Array:
    """The slice at ``index`` of dim ``dim``, without that dim."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    n = x.shape[d]
    i = int(index)
    if not -n <= i < n:
        raise IndexError(
            f"select(): index {i} out of range for tensor of size {list(x.shape)} at dimension {d}"
        )
    return jnp.take(x, i % n, axis=d)


def _dim_list(dims: Any, ndim: int) -> tuple[int, ...]:
    if isinstance(dims, int):
        dims = (dims,)
    axes = tuple(norm_dim(d, ndim) for d in dims)
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"dims has duplicates, original flip dims size={len(axes)}")
    return axes


def movedim(input: Any, source: Any, destination: Any) -> jax.Array:
    """Move dims ``source`` to positions ``destination`` (ints or sequences)."""
    x = arr(input)
    src, dst = _dim_list(source, x.ndim), _dim_list(destination, x.ndim)
    if len(src) != len(dst):
        raise RuntimeError(
            f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
            f"contain the same number of dims as destination ({list(dst)} dims)"
        )
    return jnp.moveaxis(x, src, dst)


def moveaxis(input: Any, source: Any, destination: Any) -> jax.Array:
    """Alias of :func:`movedim`."""
    return movedim(input, source, destination)


def flip(input: Any, dims: Any) -> jax.Array:
    """Reverse the order of elements along ``dims``."""
    x = arr(input)
    return jnp.flip(x, _dim_list(dims, x.ndim)) if x.ndim else x


def fliplr(input: Any) -> jax.Array:
    """Flip dim 1."""
    return jnp.fliplr(arr(input))


def flipud(input: Any) -> jax.Array:
    """Flip dim 0."""
    return jnp.flipud(arr(input))


def rot90(input: Any, k: int = 1, dims: Sequence[int] = (0, 1)) -> jax.Array:
    """Rotate by 90 degrees ``k`` times in the plane of ``dims``."""
    x = arr(input)
    return jnp.rot90(x, int(k), axes=tuple(norm_dim(d, x.ndim) for d in dims))


def roll(input: Any, shifts: Any, dims: Any = None) -> jax.Array:
    """Roll elements along ``dims`` by ``shifts`` (no ``dims``: the flattened array, same
    shape)."""
    x = arr(input)
    if dims is None:
        return jnp.roll(x.reshape(-1), shifts).reshape(x.shape)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    axes = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(axes):
        raise RuntimeError(
            f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(axes)}"
        )
    return jnp.roll(x, shifts, tuple(norm_dim(d, x.ndim) for d in axes))


def repeat_interleave(
    input: Any, repeats: Any = None, dim: int | None = None, *, output_size: int | None = None
) -> jax.Array:
    """Repeat each element ``repeats`` times (an int or an array, one count per element),
    along ``dim`` or over the flattened array, as ``torch.repeat_interleave``.

    ``repeat_interleave(counts)`` alone repeats ``arange(len(counts))``. With
    an array of repeats the result's length depends on the values: inside a
    trace pass ``output_size`` (their sum).
    """
    if repeats is None:
        counts = arr(input)
        x = jnp.arange(counts.shape[0], dtype=counts.dtype)
        return repeat_interleave(x, counts, 0, output_size=output_size)
    x = arr(input)
    if dim is None:
        x, d = x.reshape(-1), 0
    else:
        d = norm_dim(dim, x.ndim)
    if isinstance(repeats, int):
        return jnp.repeat(x, repeats, axis=d)
    r = arr(repeats)
    if r.ndim == 0 or r.shape == (1,):
        return jnp.repeat(x, int(r.reshape(())), axis=d, total_repeat_length=output_size)
    if output_size is None:
        _eager("repeat_interleave", "pass output_size= (the sum of repeats)", r)
        output_size = int(np.asarray(r).sum())
    if r.shape[0] != x.shape[d]:
        raise RuntimeError("repeats must have the same size as input along dim")
    return jnp.repeat(x, r, axis=d, total_repeat_length=output_size)


def tile(input: Any, dims: Sequence[int]) -> jax.Array:
    """Repeat the whole array ``dims`` times per dim (leading ones added as needed)."""
    return jnp.tile(arr(input), tuple(as_int(d, "dims") for d in dims))


def broadcast_to(input: Any, size: Sequence[int]) -> jax.Array:
    """``input`` broadcast to ``size`` (-1 keeps that dim's size)."""
    x = arr(input)
    size = tuple(as_int(s, "size") for s in size)
    lead = len(size) - x.ndim
    if lead < 0:
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(size)}) must be greater or equal to the "
            f"number of dimensions in the tensor ({x.ndim})"
        )
    shape = tuple(x.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(size))
    for i in range(x.ndim):
        if x.shape[i] != 1 and x.shape[i] != shape[i + lead]:
            raise RuntimeError(
                f"The expanded size of the tensor ({shape[i + lead]}) must match the existing "
                f"size ({x.shape[i]}) at non-singleton dimension {i + lead}.  Target sizes: "
                f"{list(size)}.  Tensor sizes: {list(x.shape)}"
            )
    return jnp.broadcast_to(x, shape)


def broadcast_tensors(*tensors: Any) -> tuple[jax.Array, ...]:
    """The arrays broadcast to their common shape."""
    return tuple(jnp.broadcast_arrays(*[arr(t) for t in tensors]))


def _index_arg(index: Any, name: str) -> jax.Array:
    i = arr(index)
    if not jnp.issubdtype(i.dtype, jnp.integer):
        raise RuntimeError(f"{name}(): Expected dtype int64 for index")
    return i


def _scatter_index(x: jax.Array, d: int, index: jax.Array) -> tuple:
    grids = list(jnp.indices(index.shape, sparse=True))
    grids[d] = index
    return tuple(grids)


def _check_gather(name: str, x: jax.Array, d: int, index: jax.Array) -> None:
    if index.ndim != x.ndim and not (index.ndim <= 1 and x.ndim <= 1):
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    for a in range(index.ndim):
        if a != d and index.shape[a] > x.shape[a]:
            raise RuntimeError(
                f"Size does not match at dimension {a} expected index {list(index.shape)} to be "
                f"no larger than self {list(x.shape)} apart from dimension {d}"
            )


def gather(input: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> jax.Array:
    """``out[i][j] = input[index[i][j]][j]`` (for ``dim=0``), as ``torch.gather``.

    ``index`` has ``input``'s number of dims and may be smaller in the others.
    Out-of-range indices are clamped by XLA rather than raising (checked
    eagerly only).
    """
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "gather")
    _check_gather("gather", x, d, i)
    _check_range(i, x.shape[d] if x.ndim else 1, "gather")
    if x.ndim == 0:
        return x.reshape(i.shape)
    return _gather(x, d, i)


@functools.partial(jax.jit, static_argnames=("d",))
def _gather(x: jax.Array, d: int, i: jax.Array) -> jax.Array:
    return x[_scatter_index(x, d, i)]


def _check_range(i: jax.Array, n: int, name: str) -> None:
    if isinstance(i, jax.core.Tracer) or i.size == 0:
        return
    host = np.asarray(i)
    if host.min() < -n or host.max() >= n:
        bad = host[(host < -n) | (host >= n)].flat[0]
        raise RuntimeError(f"index {bad} is out of bounds for dimension with size {n}")


def take_along_dim(input: Any, indices: Any, dim: int | None = None) -> jax.Array:
    """Values at ``indices`` along ``dim`` (broadcasting the other dims); with no ``dim``,
    of the flattened array."""
    x, i = arr(input), _index_arg(indices, "take_along_dim")
    if dim is None:
        return jnp.take_along_axis(x.reshape(-1), i.reshape(-1), axis=0)
    d = norm_dim(dim, x.ndim)
    return jnp.take_along_axis(x, i, axis=d, mode="clip")


def take(input: Any, index: Any) -> jax.Array:
    """Elements of the flattened ``input`` at ``index`` (the result has ``index``'s shape)."""
    x, i = arr(input), _index_arg(index, "take")
    _check_range(i, x.size, "take")
    return jnp.take(x.reshape(-1), i)


def _src_like(src: Any, x: jax.Array, index: jax.Array) -> jax.Array:
    if hasattr(src, "shape") or hasattr(src, "__jax_array__"):
        s = arr(src)
        if s.ndim:
            return s[tuple(slice(0, n) for n in index.shape)].astype(x.dtype)
        return jnp.broadcast_to(s.astype(x.dtype), index.shape)
    return jnp.full(index.shape, src, x.dtype)


_REDUCE_ALIASES = {"add": "sum", "multiply": "prod"}


@functools.partial(jax.jit, static_argnames=("d", "reduce"))
def _scatter(x: jax.Array, d: int, index: jax.Array, src: jax.Array, reduce: str | None) -> Any:
    at = x.at[_scatter_index(x, d, index)]
    if reduce is None:
        return at.set(src)
    return {
        "sum": at.add,
        "prod": at.multiply,
        "amax": at.max,
        "amin": at.min,
    }[reduce](src)


def scatter(
    input: Any,
    dim: int,
    index: Any,
    src: Any = None,
    *,
    value: Any = None,
    reduce: str | None = None,
) -> jax.Array:
    """A copy of ``input`` with ``out[index[i][j]][j] = src[i][j]`` (for ``dim=0``), as
    ``torch.scatter`` (``src`` an array or a number; ``reduce="add"``/``"multiply"``).

    As in PyTorch, which of several writes to one place wins is unspecified.
    """
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "scatter")
    _check_gather("scatter", x, d, i)
    if src is None:
        src = value
    if reduce is not None and reduce not in _REDUCE_ALIASES:
        raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
    return _scatter(x, d, i, _src_like(src, x, i), reduce=_REDUCE_ALIASES.get(reduce))


def scatter_add(input: Any, dim: int, index: Any, src: Any) -> jax.Array:
    """A copy of ``input`` with ``src`` added at ``index`` along ``dim`` (duplicates add up)."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "scatter_add")
    _check_gather("scatter_add", x, d, i)
    return _scatter(x, d, i, _src_like(src, x, i), reduce="sum")


def scatter_reduce(
    input: Any, dim: int, index: Any, src: Any, reduce: str, *, include_self: bool = True
) -> jax.Array:
    """Reduce ``src`` into ``input`` at ``index`` with ``"sum"``, ``"prod"``, ``"mean"``,
    ``"amax"`` or ``"amin"``, as ``torch.scatter_reduce``."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "scatter_reduce")
    _check_gather("scatter_reduce", x, d, i)
    s = _src_like(src, x, i)
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(
            f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}"
        )
    where = _scatter_index(x, d, i)
    touched = jnp.zeros(x.shape, bool).at[where].set(True)
    if reduce == "mean":
        base = x if include_self else jnp.where(touched, jnp.zeros((), x.dtype), x)
        total = base.at[where].add(s)
        count = jnp.zeros(x.shape, jnp.int32).at[where].add(1) + (1 if include_self else 0)
        count = jnp.maximum(count, 1)
        out = total / count
        return (
            out.astype(x.dtype)
            if jnp.issubdtype(x.dtype, jnp.inexact)
            else (jnp.floor_divide(total, count).astype(x.dtype))
        )
    if not include_self:
        identity = {
            "sum": 0,
            "prod": 1,
            "amax": _extreme(x.dtype, low=True),
            "amin": _extreme(x.dtype, low=False),
        }[reduce]
        base = jnp.where(touched, jnp.asarray(identity, x.dtype), x)
    else:
        base = x
    return _scatter(base, d, i, s, reduce=reduce)


def _extreme(dtype: Any, *, low: bool) -> Any:
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if low else jnp.inf
    info = jnp.iinfo(dtype)
    return info.min if low else info.max


def index_select(input: Any, dim: int, index: Any) -> jax.Array:
    """The entries of ``input`` at ``index`` (1-d) along ``dim``."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "index_select")
    if i.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    _check_range(i, x.shape[d] if x.ndim else 1, "index_select")
    if x.ndim == 0:
        return x.reshape(i.shape)
    return jnp.take(x, i.reshape(-1), axis=d)


def _index_where(x: jax.Array, d: int, i: jax.Array) -> tuple:
    return (slice(None),) * d + (i.reshape(-1),)


def index_add(input: Any, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> jax.Array:
    """A copy of ``input`` with ``alpha * source`` added at rows ``index`` along ``dim``."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "index_add")
    return x.at[_index_where(x, d, i)].add((alpha * arr(source)).astype(x.dtype))


def index_copy(input: Any, dim: int, index: Any, source: Any) -> jax.Array:
    """A copy of ``input`` with the rows ``index`` along ``dim`` replaced by ``source``
    (under ``jm.autocast`` on CPU both in the wider floating dtype, as PyTorch's)."""
    x, src = _amp.cast("index_copy", arr(input), arr(source))
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "index_copy")
    return x.at[_index_where(x, d, i)].set(src.astype(x.dtype))


def index_fill(input: Any, dim: int, index: Any, value: Any) -> jax.Array:
    """A copy of ``input`` with the rows ``index`` along ``dim`` set to ``value``."""
    x = arr(input)
    d = norm_dim(dim, x.ndim)
    i = _index_arg(index, "index_fill")
    return x.at[_index_where(x, d, i)].set(arr(value).astype(x.dtype))


def _mask(mask: Any, name: str) -> jax.Array:
    m = arr(mask)
    if m.dtype != jnp.bool_:
        raise RuntimeError(f"{name} only supports boolean masks, but got mask with dtype {m.dtype}")
    return m


def masked_fill(input: Any, mask: Any, value: Any) -> jax.Array:
    """``input`` with ``value`` where the (broadcast) bool ``mask`` is True; ``input``'s
    dtype."""
    x = arr(input)
    m = _mask(mask, "masked_fill_")
    v = arr(value)
    if v.ndim:
        raise RuntimeError(
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
            f"{v.ndim} dimension(s)."
        )
    return jnp.where(m, v.astype(x.dtype), x)


def masked_scatter(input: Any, mask: Any, source: Any) -> jax.Array:
    """``input`` with the True places of ``mask`` filled, in order, from ``source``."""
    x = arr(input)
    m = jnp.broadcast_to(_mask(mask, "masked_scatter_"), x.shape)
    src = arr(source).reshape(-1)
    pos = jnp.cumsum(m.reshape(-1)) - 1
    take = src[jnp.clip(pos, 0, max(src.shape[0] - 1, 0))].reshape(x.shape)
    return jnp.where(m, take.astype(x.dtype), x)


def masked_select(input: Any, mask: Any) -> jax.Array:
    """The elements of ``input`` where the (broadcast) bool ``mask`` is True, as a 1-d array.

    Eager only: the result's length depends on the mask's values. Inside
    compiled code use ``jm.where(mask, input, 0)`` (same shape) or
    ``input[mask]`` outside the trace.
    """
    x = arr(input)
    m = _mask(mask, "masked_select")
    _eager("masked_select", "use jm.where(mask, input, fill) (it keeps the shape)", x, m)
    x, m = jnp.broadcast_arrays(x, m)
    return x[np.asarray(m)]


def nonzero(input: Any, *, as_tuple: bool = False) -> Any:
    """Indices of the non-zero elements: an ``(n, ndim)`` array, or one 1-d array per dim
    with ``as_tuple=True``. Eager only (the count depends on the values)."""
    x = arr(input)
    _eager("nonzero", "use jm.where(cond, a, b) or pass size= to jnp.nonzero", x)
    idx = np.nonzero(np.asarray(x).reshape(x.shape or (1,)))
    out = tuple(jnp.asarray(i, long_dtype()) for i in idx)
    return out if as_tuple else jnp.stack(out, axis=1) if out else jnp.zeros((0, 0), long_dtype())


def argwhere(input: Any) -> jax.Array:
    """``nonzero(input)``: an ``(n, ndim)`` array of the indices of the non-zero elements.
    Eager only."""
    return nonzero(input)


def view_as_real(input: Any) -> jax.Array:
    """A complex array as real ``(..., 2)`` pairs (real, imaginary); a copy, as every JAX
    array is."""
    x = arr(input)
    if not jnp.iscomplexobj(x):
        raise RuntimeError("view_as_real is only supported for complex tensors")
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


def view_as_complex(input: Any) -> jax.Array:
    """Real ``(..., 2)`` pairs as a complex array (float32 pairs give complex64; under
    ``jm.autocast`` on CPU half-precision pairs too, as PyTorch's)."""
    (x,) = _amp.cast("view_as_complex", arr(input))
    if x.ndim == 0 or x.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if x.dtype not in (jnp.float32, jnp.float64):
        raise RuntimeError(
            "view_as_complex is only supported for float and double tensors, but got a tensor "
            f"of scalar type: {torch_scalar_name(x.dtype)}"
        )
    return jax.lax.complex(x[..., 0], x[..., 1])


def where(condition: Any, input: Any = None, other: Any = None) -> Any:
    """``input`` where ``condition`` is True, else ``other`` (broadcast; numbers keep the
    array's dtype); ``where(condition)`` alone is ``nonzero(condition, as_tuple=True)``."""
    if input is None and other is None:
        return nonzero(condition, as_tuple=True)
    c = arr(condition)
    if c.dtype != jnp.bool_:
        raise RuntimeError(
            "where expected condition to be a boolean tensor, but got a tensor with dtype "
            f"{torch_scalar_name(c.dtype)}"
        )
    return jnp.where(c, arr(input), arr(other))


def diag(input: Any, diagonal: int = 0) -> jax.Array:
    """A 1-d array as a diagonal matrix, or a matrix's ``diagonal``-th diagonal."""
    x = arr(input)
    if x.ndim not in (1, 2):
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {x.ndim}D")
    return jnp.diag(x, int(diagonal))


def diagonal(input: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> jax.Array:
    """The diagonal of the ``dim1``/``dim2`` plane, as a last dim."""
    x = arr(input)
    return jnp.diagonal(x, int(offset), norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim))


def diag_embed(input: Any, offset: int = 0, dim1: int = -2, dim2: int = -1) -> jax.Array:
    """Arrays whose last dim becomes the diagonal of new ``dim1``/``dim2`` planes."""
    x = arr(input)
    n = x.shape[-1] + abs(int(offset))
    vals = jnp.zeros((*x.shape[:-1], n, n), x.dtype)
    i = jnp.arange(x.shape[-1])
    r, c = (i, i + offset) if offset >= 0 else (i - offset, i)
    vals = vals.at[..., r, c].set(x)
    d1, d2 = norm_dim(dim1, x.ndim + 1), norm_dim(dim2, x.ndim + 1)
    return jnp.moveaxis(vals, (-2, -1), (d1, d2))
