"""Products and distances: ``jm.matmul``, ``jm.mm``, ``jm.bmm``, ``jm.addmm``,
``jm.einsum``, ``jm.cdist``, ... with PyTorch's shape checks and messages."""

from __future__ import annotations

import functools
import math
import string
from typing import Any

import jax
import jax.numpy as jnp
import opt_einsum

from jmodule._lowering import state as _state
from jmodule._torch_functions._common import arr, float_input, norm_dim
from jmodule._torch_functions.reduction import vector_norm
from jmodule.amp import _autocast as _amp

__all__ = [
    "addbmm",
    "addmm",
    "addmv",
    "baddbmm",
    "bmm",
    "cdist",
    "cosine_similarity",
    "cross",
    "dot",
    "einsum",
    "ger",
    "inner",
    "kron",
    "matmul",
    "mm",
    "mv",
    "outer",
    "pairwise_distance",
    "tensordot",
    "vdot",
]


def _sizes(ka: int, kb: int) -> RuntimeError:
    return RuntimeError(
        f"inconsistent tensor size, expected tensor [{ka}] and src [{kb}] to have the same "
        f"number of elements, but got {ka} and {kb} elements respectively"
    )


def _cannot(a: tuple, b: tuple) -> RuntimeError:
    return RuntimeError(
        f"mat1 and mat2 shapes cannot be multiplied ({a[0]}x{a[1]} and {b[0]}x{b[1]})"
    )


def matmul(input: Any, other: Any, *, out: Any = None) -> jax.Array:
    """The matrix product with PyTorch's (numpy's) broadcasting rules for 1-d and batched
    operands. Under ``jm.autocast`` it computes in the lower dtype, as PyTorch's
    (``matmul`` is on both autocast lists)."""
    a, b = _amp.cast("matmul", arr(input), arr(other))
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(
            f"both arguments to matmul need to be at least 1D, but they are {a.ndim}D and {b.ndim}D"
        )
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        if a.ndim == 1 and b.ndim == 1:
            raise _sizes(ka, kb)
        rows = a.size // ka if a.ndim > 1 else 1
        raise _cannot((rows, ka), (kb, b.shape[-1] if b.ndim > 1 else 1))
    return jnp.matmul(a, b)


def mm(input: Any, mat2: Any, *, out: Any = None) -> jax.Array:
    """The product of two matrices (2-d only; under ``jm.autocast`` in the lower dtype)."""
    a, b = _amp.cast("mm", arr(input), arr(mat2))
    if a.ndim != 2:
        raise RuntimeError("self must be a matrix")
    if b.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    if a.shape[1] != b.shape[0]:
        raise _cannot(a.shape, b.shape)
    return jnp.matmul(a, b)


def bmm(input: Any, mat2: Any, *, out: Any = None) -> jax.Array:
    """Batched matrix products of two 3-d arrays with the same batch size (under
    ``jm.autocast`` in the lower dtype)."""
    a, b = _amp.cast("bmm", arr(input), arr(mat2))
    if a.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor")
    if b.ndim != 3:
        raise RuntimeError("batch2 must be a 3D tensor")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: "
            f"[{a.shape[0]}, {a.shape[2]}] but got: [{b.shape[0]}, {b.shape[1]}]."
        )
    return jnp.matmul(a, b)


def _scaled(input: Any, product: jax.Array, beta: Any, alpha: Any) -> jax.Array:
    c = arr(input)
    prod = product if alpha == 1 else alpha * product
    if beta == 0:  # PyTorch ignores input (even NaN) when beta is 0
        return jnp.broadcast_to(prod, jnp.broadcast_shapes(c.shape, prod.shape))
    return (c if beta == 1 else beta * c) + prod


def addmm(input: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> jax.Array:
    """``beta * input + alpha * (mat1 @ mat2)`` (under ``jm.autocast`` in the lower dtype)."""
    input, mat1, mat2 = _amp.cast("addmm", arr(input), arr(mat1), arr(mat2))
    return _scaled(input, mm(mat1, mat2), beta, alpha)


def baddbmm(input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> jax.Array:
    """``beta * input + alpha * bmm(batch1, batch2)`` (under ``jm.autocast`` in the lower
    dtype)."""
    input, batch1, batch2 = _amp.cast("baddbmm", arr(input), arr(batch1), arr(batch2))
    return _scaled(input, bmm(batch1, batch2), beta, alpha)


def addbmm(input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> jax.Array:
    """``beta * input + alpha * sum_b(batch1[b] @ batch2[b])`` (under ``jm.autocast`` in
    the lower dtype)."""
    input, batch1, batch2 = _amp.cast("addbmm", arr(input), arr(batch1), arr(batch2))
    return _scaled(input, bmm(batch1, batch2).sum(0), beta, alpha)


def mv(input: Any, vec: Any, *, out: Any = None) -> jax.Array:
    """A matrix times a vector."""
    a, v = arr(input), arr(vec)
    if a.ndim != 2 or v.ndim != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got {a.ndim}, {v.ndim}")
    if a.shape[1] != v.shape[0]:
        raise RuntimeError(
            f"size mismatch, got input ({a.shape[0]}), mat ({a.shape[0]}x{a.shape[1]}), "
            f"vec ({v.shape[0]})"
        )
    return a @ v


def addmv(input: Any, mat: Any, vec: Any, *, beta: Any = 1, alpha: Any = 1) -> jax.Array:
    """``beta * input + alpha * (mat @ vec)``."""
    return _scaled(input, mv(mat, vec), beta, alpha)


def dot(input: Any, tensor: Any, *, out: Any = None) -> jax.Array:
    """The dot product of two 1-d arrays of the same length."""
    a, b = arr(input), arr(tensor)
    if a.ndim != 1 or b.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {a.ndim}D and {b.ndim}D tensors")
    if a.shape != b.shape:
        raise _sizes(a.shape[0], b.shape[0])
    return jnp.dot(a, b)


def vdot(input: Any, other: Any, *, out: Any = None) -> jax.Array:
    """``dot(conj(input), other)`` of two 1-d arrays."""
    return jnp.vdot(arr(input), arr(other))


def inner(input: Any, other: Any, *, out: Any = None) -> jax.Array:
    """Sums of products over the last dims. Under ``jm.autocast`` as PyTorch's: on CPU in
    the lower dtype when both have dims (it runs ``tensordot``, hence ``mm``), except
    when the result is one number (``dot``)."""
    a, b = arr(input), arr(other)
    if _state.local.autocast is not None and a.ndim and b.ndim:
        a, b = _tensordot_cast(a, b, (a.ndim - 1,), (b.ndim - 1,))
    return jnp.inner(a, b)


def outer(input: Any, vec2: Any, *, out: Any = None) -> jax.Array:
    """The outer product of two 1-d arrays."""
    a, b = arr(input), arr(vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise RuntimeError("outer: expected 1D tensors")
    return jnp.outer(a, b)


ger = outer


def kron(input: Any, other: Any, *, out: Any = None) -> jax.Array:
    """The Kronecker product."""
    return jnp.kron(arr(input), arr(other))


def _tensordot_cast(a: jax.Array, b: jax.Array, axes_a: Any, axes_b: Any) -> tuple:
    """``a`` and ``b`` cast as PyTorch's autocast casts ``tensordot``: by its own policy
    (CUDA: promote), else by the op it runs on the operands reshaped to matrices,
    ``dot`` when neither has a free element left over (one number), else ``mm``."""
    free_a = math.prod(n for i, n in enumerate(a.shape) if i not in axes_a)
    free_b = math.prod(n for i, n in enumerate(b.shape) if i not in axes_b)
    return _amp.cast_first(("tensordot", "dot" if free_a == free_b == 1 else "mm"), a, b)


def tensordot(a: Any, b: Any, dims: Any = 2, out: Any = None) -> jax.Array:
    """Sum of products over ``dims`` (a count of trailing/leading dims, or two lists).

    Under ``jm.autocast`` as PyTorch's: on CPU in the lower dtype (it runs ``mm``),
    except when the result is one number (``dot``)."""
    if isinstance(dims, (list, tuple)):
        dims = tuple(tuple(d) if isinstance(d, (list, tuple)) else (d,) for d in dims)
    x, y = arr(a), arr(b)
    if _state.local.autocast is not None:
        if isinstance(dims, tuple):
            axes_a = {int(d) % max(x.ndim, 1) for d in dims[0]}
            axes_b = {int(d) % max(y.ndim, 1) for d in dims[1]}
        else:
            axes_a, axes_b = set(range(x.ndim - int(dims), x.ndim)), set(range(int(dims)))
        x, y = _tensordot_cast(x, y, axes_a, axes_b)
    return jnp.tensordot(x, y, dims)


def einsum(equation: str, *operands: Any) -> jax.Array:
    """Einstein summation, as ``torch.einsum`` (operands as arguments or one list).

    Under ``jm.autocast`` it follows PyTorch's: where einsum itself is listed (CUDA)
    its operands are cast; elsewhere (CPU) each pairwise contraction PyTorch runs as a
    ``bmm`` (one that sums over an index the pair shares) runs in the lower dtype,
    and the ones it runs as a ``mul`` in their inputs' dtypes, in PyTorch's order
    (``opt_einsum``'s path for three or more operands, as ``torch.einsum``'s).
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ops = [arr(o) for o in operands]
    try:
        if _state.local.autocast is not None:
            if _amp.policy("einsum") is not None:
                ops = list(_amp.cast("einsum", *ops))
            elif len(ops) > 1:
                if _amp.lower_dtype("bmm") is not None:
                    return _einsum_pairwise(equation, ops)
        return jnp.einsum(equation, *ops)
    except ValueError as e:  # PyTorch raises RuntimeError for a bad equation or shapes
        raise RuntimeError(f"einsum(): {e}") from e


def _einsum_terms(equation: str, ops: list) -> tuple[list[list[Any]], list[Any]]:
    """Each operand's indices and the output's, an ellipsis spelled out as ``("...", k)``
    (``k`` counting from the right, as ellipsis dims broadcast)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")

    def spell(term: str, ndim: int) -> list[Any]:
        head, dots, tail = term.partition("...")
        if not dots:
            return list(term)
        n = ndim - len(head) - len(tail)
        return [*head, *(("...", k) for k in range(n, 0, -1)), *tail]

    terms = [spell(t, o.ndim) for t, o in zip(lhs.split(","), ops)]
    n_dots = max((sum(isinstance(i, tuple) for i in t) for t in terms), default=0)
    dots = [("...", k) for k in range(n_dots, 0, -1)]
    if arrow:
        head, has_dots, tail = rhs.partition("...")
        out = [*head, *dots, *tail] if has_dots else list(rhs)
    else:
        letters = [i for t in terms for i in t if isinstance(i, str)]
        out = [*dots, *sorted(i for i in set(letters) if letters.count(i) == 1)]
    return terms, out


def _einsum_pairwise(equation: str, ops: list) -> jax.Array:
    """``einsum`` under CPU autocast, contracting pairwise as ``torch.einsum`` does."""
    want = jax.eval_shape(lambda *o: jnp.einsum(equation, *o), *ops)  # checks, as jnp does
    terms, out = _einsum_terms(equation, ops)
    indices = {i: None for t in [*terms, out] for i in t}
    if len(indices) > len(string.ascii_letters):
        return jnp.einsum(equation, *_amp.cast("bmm", *ops))
    letter = dict(zip(indices, string.ascii_letters))

    def contract(src: list[list[Any]], dst: list[Any], *xs: jax.Array) -> jax.Array:
        spec = ",".join("".join(letter[i] for i in t) for t in src)
        return jnp.einsum(spec + "->" + "".join(letter[i] for i in dst), *xs)

    work = []
    for x, t in zip(ops, terms):
        if len(set(t)) < len(t):  # an index twice in one operand: its diagonal first
            x, t = contract([t], list(dict.fromkeys(t)), x), list(dict.fromkeys(t))
        # Size-1 dims only broadcast (PyTorch never contracts over them): dropped.
        keep = [i for i, n in zip(t, x.shape) if n != 1]
        if len(keep) < len(t):
            x = x.reshape([n for n in x.shape if n != 1])
        work.append((x, keep))
    path: list[Any] = [(0, 1)] * (len(ops) - 1)
    if len(ops) > 2:
        shapes = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in ops]
        path = opt_einsum.contract_path(equation, *shapes)[0]
    for step in path:
        i, j = sorted(step)
        (a, ta), (b, tb) = work[i], work[j]
        del work[j], work[i]
        later = set(out).union(*(t for _, t in work))
        # Indices no other operand has and the result does not keep: summed first.
        ta_kept = [k for k in ta if k in tb or k in later]
        tb_kept = [k for k in tb if k in ta or k in later]
        if ta_kept != ta:
            a, ta = contract([ta], ta_kept, a), ta_kept
        if tb_kept != tb:
            b, tb = contract([tb], tb_kept, b), tb_kept
        summed = [k for k in ta if k in tb and k not in later]
        if summed:  # PyTorch runs this product as a bmm: autocast lowers it
            a, b = _amp.cast("bmm", a, b)
        elif a.dtype != b.dtype and all(jnp.issubdtype(x.dtype, jnp.floating) for x in (a, b)):
            # A mul, in the wider type (a bmm's result before it kept rounded).
            wide = jnp.promote_types(a.dtype, b.dtype)
            a, b = _amp.to(a, wide), _amp.to(b, wide)
        result = [k for k in ta if k not in summed] + [k for k in tb if k not in ta]
        work.append((contract([ta, tb], result, a, b), result))
    x, t = work[0]
    present = [i for i in out if i in t]
    if present != t:
        x = contract([t], present, x)
    x = x.reshape([n if i in t else 1 for i, n in zip(out, want.shape)])
    return jnp.broadcast_to(x, want.shape)


def cross(input: Any, other: Any, dim: int | None = None, *, out: Any = None) -> jax.Array:
    """The 3-d cross product along ``dim`` (by default the first dim of size 3, as
    ``torch.cross`` without ``dim``)."""
    a, b = jnp.broadcast_arrays(arr(input), arr(other))
    if dim is None:
        d = next((i for i, n in enumerate(a.shape) if n == 3), None)
        if d is None:
            raise RuntimeError("no dimension of size 3 in input")
    else:
        d = norm_dim(dim, a.ndim)
        if a.shape[d] != 3:
            raise RuntimeError(
                f"linalg.cross: inputs dimension {d} must have length 3. Got {a.shape[d]} and "
                f"{b.shape[d]}"
            )
    return jnp.cross(a, b, axis=d)


@functools.partial(jax.jit, static_argnames=("p",))
def _safe_norm(diff: jax.Array, p: float) -> jax.Array:
    """``p``-norm of the last dim whose gradient is 0 (not NaN) at zero, as PyTorch's."""
    if p in (1.0, 0.0) or p == float("inf"):
        return vector_norm(diff, p, -1, False)
    a = jnp.abs(diff)
    s = jnp.sum(a**p, -1)
    safe = jnp.where(s > 0, s, 1.0)
    return jnp.where(s > 0, safe ** (1.0 / p), 0.0)


def cdist(x1: Any, x2: Any, p: float = 2.0, compute_mode: str | None = None) -> jax.Array:
    """Pairwise ``p``-norm distances between the rows of ``x1`` (``..., P, M``) and ``x2``
    (``..., R, M``): shape ``(..., P, R)``.

    ``compute_mode`` is accepted; distances are computed from differences
    (PyTorch's matrix-product shortcut for large inputs agrees to rounding).
    Under ``jm.autocast`` on CPU it computes in float32, as PyTorch's.
    """
    a, b = _amp.cast("cdist", arr(x1), arr(x2))
    a, b = float_input(a), float_input(b)
    if a.ndim < 2 or b.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {a.ndim}D")
    if a.shape[-1] != b.shape[-1]:
        raise RuntimeError(
            f"X1 and X2 must have the same number of columns. X1: {a.shape[-1]} X2: {b.shape[-1]}"
        )
    if p < 0:
        raise RuntimeError(f"cdist only supports non-negative p values, got {p}")
    return _cdist(a, b, float(p))


@functools.partial(jax.jit, static_argnames=("p",))
def _cdist(a: jax.Array, b: jax.Array, p: float) -> jax.Array:
    return _safe_norm(a[..., :, None, :] - b[..., None, :, :], p)


def pairwise_distance(
    x1: Any, x2: Any, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> jax.Array:
    """``norm(x1 - x2 + eps, p)`` over the last dim, as ``torch.pairwise_distance``."""
    d = _safe_norm(float_input(arr(x1) - arr(x2)) + eps, float(p))
    return d[..., None] if keepdim else d


def cosine_similarity(x1: Any, x2: Any, dim: int = 1, eps: float = 1e-8) -> jax.Array:
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim``."""
    a, b = jnp.broadcast_arrays(float_input(arr(x1)), float_input(arr(x2)))
    d = norm_dim(dim, a.ndim)
    na = jnp.sqrt(jnp.sum(a * a, d))
    nb = jnp.sqrt(jnp.sum(b * b, d))
    return jnp.sum(a * b, d) / (jnp.maximum(na, eps) * jnp.maximum(nb, eps))
