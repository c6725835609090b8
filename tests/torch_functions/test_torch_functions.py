"""The ``torch.*`` functions of ``jm`` against PyTorch, live.

One registry of cases (function name, arguments, keyword arguments) runs
through ``torch.<name>`` and ``jm.<name>``; the same check compares values
(to a tolerance), dtypes (torch's int64 is int32 while JAX's x64 mode is off,
section 2), shapes, named-tuple fields, and, for bad arguments, the exception
type (and, for bad dims, PyTorch's message). A subset runs again inside
``jax.jit`` and ``jm.compile``. Random functions are checked separately: JAX's
streams are not PyTorch's, so their values are compared as distributions
(fixed seeds), their shapes and dtypes against torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm

LONG = jnp.dtype(jnp.int64 if jax.config.read("jax_enable_x64") else jnp.int32).name

# ---------------------------------------------------------------------------- inputs

_rng = np.random.default_rng(0)


def _f(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


X = _f(2, 3)
Y = _f(2, 3)
X34 = _f(3, 4)
X234 = _f(2, 3, 4)
A = _f(2, 3, 4)
B = _f(2, 4, 5)
C = _f(2, 3, 5)
V2, V3, V5 = _f(2), _f(3), np.array([3.0, -1.0, 4.0, 1.5, 5.0], np.float32)
P = np.abs(X) + 0.1
X1 = _f(2, 1, 3)
I = np.array([[1, -2, 3], [4, 5, -6]], np.int64)  # noqa: E741
I2 = np.array([[2, 3, -2], [3, 2, 4]], np.int64)
BM = np.array([[True, False, True], [False, False, True]])
IDX = np.array([[0, 2], [1, 0], [2, 2]], np.int64)  # for a (3, 4) input along dim 1
SIDX = np.array([[0, 1, 2, 0], [2, 0, 1, 1]], np.int64)  # unique per column, dim 0 of (3, 4)
I1 = np.array([2, 0], np.int64)
XN = np.array([[np.nan, 1.0, np.inf], [-np.inf, 0.5, -2.0]], np.float32)
W = np.full((2, 3), 0.7, np.float32)
E0 = np.zeros((0,), np.float32)


@dataclass(frozen=True)
class D:
    """A dtype, by name, given as an argument (``torch.float16`` / ``jm.float16``)."""

    name: str


@dataclass(frozen=True)
class N:
    """A numpy array passed as it is to both frameworks (``from_numpy``, ``tensor``)."""

    value: Any


def _convert(v: Any, side: str) -> Any:
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v.copy()) if side == "torch" else jnp.asarray(v)
    if isinstance(v, D):
        return getattr(torch if side == "torch" else jm, v.name)
    if isinstance(v, N):
        return v.value.copy()
    if isinstance(v, dict):
        return {k: _convert(x, side) for k, x in v.items()}
    if isinstance(v, list):
        return [_convert(x, side) for x in v]
    if isinstance(v, tuple):
        return tuple(_convert(x, side) for x in v)
    return v


@dataclass
class Case:
    name: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-6
    values: bool = True  # False: compare shapes and dtypes only (``empty``)
    jit: bool = True  # also run inside jax.jit (array arguments traced)
    raises: bool = False  # bad arguments: both must raise the same exception type

    @property
    def id(self) -> str:
        parts = [_short(a) for a in self.args] + [
            f"{k}={_short(v)}" for k, v in self.kwargs.items()
        ]
        return f"{self.name}({', '.join(parts)})"


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype.name}{list(v.shape)}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_short(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner})"
    if isinstance(v, D):
        return v.name
    if isinstance(v, N):
        return f"np:{_short(v.value)}"
    return repr(v)


def c(name: str, *args: Any, **kwargs: Any) -> Case:
    return Case(name, args, kwargs)


def opt(case: Case, **changes: Any) -> Case:
    for k, v in changes.items():
        setattr(case, k, v)
    return case


def bad(name: str, *args: Any, **kwargs: Any) -> Case:
    return Case(name, args, kwargs, raises=True, jit=False)


# ---------------------------------------------------------------------------- the registry

CREATION = [
    c("tensor", [1, 2, 3]),
    c("tensor", [1.0, 2]),
    c("tensor", True),
    c("tensor", [[1, 2], [3, 4]], dtype=D("float32")),
    c("tensor", 2.5),
    c("tensor", N(X)),
    c("tensor", N(I)),
    c("tensor", [1, 2], dtype=D("int64")),
    c("tensor", [X[0, 0], X[0, 1]]),
    c("tensor", [[1.5, 2], [3, 4]], dtype=D("int32")),
    c("as_tensor", N(X)),
    c("as_tensor", [1, 2]),
    c("as_tensor", X, dtype=D("float16")),
    c("from_numpy", N(X)),
    c("from_numpy", N(I)),
    c("from_numpy", N(BM)),
    c("zeros", 2, 3),
    c("zeros", (2, 3)),
    c("zeros", [4], dtype=D("int32")),
    c("ones", 2, 1),
    c("ones", (3,), dtype=D("bool")),
    c("full", (2, 2), 3),
    c("full", (2,), 1.5),
    c("full", (1, 2), True),
    c("full", (2,), 7, dtype=D("float32")),
    opt(c("empty", 2, 3), values=False),
    opt(c("empty", (4,), dtype=D("int32")), values=False),
    c("zeros_like", X),
    c("zeros_like", X, dtype=D("int32")),
    c("ones_like", I),
    c("full_like", X, 7),
    c("full_like", I, 2.7),
    opt(c("empty_like", X), values=False),
    c("arange", 5),
    c("arange", 1, 4),
    c("arange", 0, 1, 0.1),
    c("arange", 5.0),
    c("arange", 10, 0, -3),
    c("arange", 3, dtype=D("float32")),
    c("arange", -1.5, 2.5, 0.5),
    c("linspace", 0, 1, 5),
    c("linspace", -2.0, 3.0, 7),
    c("linspace", 0, 1, 1),
    c("logspace", 0, 2, 3),
    c("logspace", 0, 1, 4, base=2.0),
    c("eye", 3),
    c("eye", 2, 4),
    c("eye", 2, dtype=D("int32")),
    c("tril", X34),
    c("tril", X34, -1),
    c("triu", X34, 1),
    c("triu", X234),
    c("tril_indices", 3, 3),
    c("tril_indices", 4, 3, 1),
    c("triu_indices", 3, 4, -1),
    c("meshgrid", V3, V2, indexing="ij"),
    c("meshgrid", V3, V2, indexing="xy"),
    c("meshgrid", [V3, V2], indexing="ij"),
]

SHAPE = [
    c("cat", [X, Y]),
    c("cat", [X, Y], dim=1),
    c("cat", (X, Y), -1),
    c("cat", [X, I]),
    c("concat", [X, Y], 1),
    c("concatenate", [X, Y], axis=1),
    c("stack", [X, Y]),
    c("stack", [X, Y], 2),
    c("stack", [X, Y], dim=-1),
    c("split", X34, 1),
    c("split", X34, 3, dim=1),
    c("split", X34, [1, 3], 1),
    c("split", X34, [2, 1]),
    c("chunk", X34, 2, 1),
    c("chunk", np.arange(5.0, dtype=np.float32), 3),
    c("chunk", np.arange(6.0, dtype=np.float32), 4),
    c("unbind", X, 1),
    c("unbind", X234),
    c("transpose", X234, 0, 2),
    c("transpose", X, -1, -2),
    c("swapaxes", X, 0, 1),
    c("swapdims", X234, 1, 2),
    c("permute", X234, (2, 0, 1)),
    c("permute", X234, (-1, 0, 1)),
    c("reshape", X, (3, 2)),
    c("reshape", X234, (-1,)),
    c("reshape", X234, (4, -1)),
    c("flatten", X234),
    c("flatten", X234, 1),
    c("flatten", X234, 0, 1),
    c("flatten", np.array(3.0, np.float32)),
    c("unflatten", X34, 1, (2, 2)),
    c("unflatten", X34, 1, (-1, 2)),
    c("squeeze", X1),
    c("squeeze", X1, 1),
    c("squeeze", X1, 0),
    c("squeeze", X1, (0, 1)),
    c("unsqueeze", X, 0),
    c("unsqueeze", X, -1),
    c("unsqueeze", X, 2),
    c("narrow", X34, 1, 1, 2),
    c("narrow", X34, 0, -2, 2),
    c("movedim", X234, 0, -1),
    c("movedim", X234, (0, 1), (2, 0)),
    c("moveaxis", X234, 1, 0),
    c("flip", X, (0,)),
    c("flip", X, [0, 1]),
    c("fliplr", X),
    c("roll", X34, 1),
    c("roll", X34, (1, 2), (0, 1)),
    c("roll", X34, -1, 1),
    c("repeat_interleave", X, 2),
    c("repeat_interleave", X, 2, dim=1),
    opt(c("repeat_interleave", X, np.array([1, 3], np.int64), dim=0), jit=False),
    c("repeat_interleave", X, np.array([1, 3], np.int64), dim=0, output_size=4),
    c("tile", X, (2, 1)),
    c("tile", V3, (2, 2)),
    c("broadcast_to", V3, (2, 3)),
    c("broadcast_to", X1, (-1, 2, 3)),
    c("gather", X34, 1, IDX),
    c("gather", X34, 0, np.array([[0, 2, 1, 0]], np.int64)),
    c("scatter", np.zeros((3, 4), np.float32), 0, SIDX, X34),
    c("scatter", np.zeros((3, 4), np.float32), 1, IDX[:, :1], 1.5),
    c("scatter_add", np.zeros((3, 4), np.float32), 1, IDX, X34),
    c("scatter_reduce", np.ones((3, 4), np.float32), 1, IDX, X34, "amax"),
    c("scatter_reduce", np.ones((3, 4), np.float32), 1, IDX, X34, "sum", include_self=False),
    c("scatter_reduce", np.ones((3, 4), np.float32), 1, IDX, X34, "mean"),
    c("index_select", X34, 1, I1),
    c("index_select", X34, 0, I1),
    c("masked_fill", X, BM, 0.5),
    c("masked_fill", I, BM, -1),
    c("masked_fill", X234, np.array([True, False, True, False]), -np.inf),
    opt(c("masked_select", X, BM), jit=False),
    opt(c("masked_select", X234, np.array([True, False, True, False])), jit=False),
    c("where", BM, X, Y),
    c("where", BM, X, 0.0),
    c("where", BM, I, 0),
    opt(c("where", BM), jit=False),
    opt(c("nonzero", I), jit=False),
    c("take_along_dim", X34, IDX, 1),
    c("take_along_dim", X34, np.array([0, 5, 11], np.int64)),
    c("take", X34, np.array([[0, 5], [11, 3]], np.int64)),
    c("select", X234, 1, -1),
    c("diag", V3),
    c("diag", X34, 1),
    c("diagonal", X234, 0, 1, 2),
    c("t", X),
    c("hstack", [X, Y]),
    c("vstack", [X, Y]),
    c("atleast_2d", V3),
    c("tensor_split", X34, 3, 1),
    c("index_add", np.zeros((3, 4), np.float32), 0, I1, np.ones((2, 4), np.float32)),
    c("rot90", X),
    opt(c("argwhere", BM), jit=False),
    c("view_as_real", (X + 1j * Y).astype(np.complex64)),
    c("view_as_complex", X234[..., :2].copy()),
    c("polar", P, X),
    c("complex", X, Y),
    c("isin", I, np.array([1, 5, 7], np.int64)),
    c("bucketize", X, np.sort(V5)),
    c("bucketize", X, np.sort(V5), right=True),
]

ELEMENTWISE_FLOAT = [
    "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf", "erfc", "sin", "cos", "tan",
    "expm1", "log1p", "log2", "log10", "exp2", "atan", "sinh", "cosh", "asinh", "reciprocal",
]  # fmt: skip
ELEMENTWISE_SAME = [
    "abs", "sign", "neg", "floor", "ceil", "trunc", "frac", "square", "round", "relu",
    "sgn", "signbit", "negative", "absolute", "positive",
]  # fmt: skip
BINARY = [
    "add", "sub", "mul", "div", "maximum", "minimum", "fmax", "fmin", "atan2", "hypot",
    "eq", "ne", "lt", "le", "gt", "ge", "remainder", "fmod", "floor_divide", "logaddexp",
    "copysign", "greater", "less_equal", "not_equal", "multiply", "subtract", "true_divide",
]  # fmt: skip

MATH = [
    *[c(n, P) for n in ELEMENTWISE_FLOAT],
    *[c(n, X) for n in ELEMENTWISE_SAME],
    *[c(n, X, Y) for n in BINARY],
    c("exp", I),
    c("sqrt", np.array([1, 4, 9], np.int64)),
    c("abs", I),
    c("asin", np.clip(X, -0.9, 0.9)),
    c("acos", np.clip(X, -0.9, 0.9)),
    c("atanh", np.clip(X, -0.9, 0.9)),
    c("acosh", P + 1),
    c("erfinv", np.clip(X, -0.9, 0.9)),
    c("logit", np.clip(P, 0.1, 0.9)),
    c("round", X * 10, decimals=1),
    c("add", X, Y, alpha=2),
    c("add", X, 2.0),
    c("add", I, 2),
    c("add", I, 2.5),
    c("sub", X, Y, alpha=0.5),
    c("mul", I, X),
    c("div", I, I2),
    c("div", I, I2, rounding_mode="trunc"),
    c("div", I, I2, rounding_mode="floor"),
    c("div", X, Y, rounding_mode="floor"),
    c("floor_divide", I, I2),
    c("remainder", I, I2),
    c("fmod", I, I2),
    c("pow", X, 2),
    c("pow", P, Y),
    c("pow", I, 2),
    c("pow", 2.0, X),
    c("pow", P, 0.5),
    c("logical_and", BM, BM[::-1].copy()),
    c("logical_or", BM, np.zeros(3, bool)),
    c("logical_not", BM),
    c("logical_xor", I, BM),
    c("bitwise_and", I, I2),
    c("isnan", XN),
    c("isinf", XN),
    c("isfinite", XN),
    c("isposinf", XN),
    c("nan_to_num", XN),
    c("nan_to_num", XN, nan=1.0, posinf=2.0, neginf=-3.0),
    c("clamp", X, -0.5, 0.5),
    c("clamp", X, min=0.0),
    c("clamp", X, max=Y),
    c("clamp", I, min=-1, max=2),
    c("clamp", X, Y, X + 0.5),
    c("clip", X, -0.1, 0.2),
    c("clamp_min", X, 0.1),
    c("lerp", X, Y, 0.3),
    c("lerp", X, Y, 0.8),
    c("lerp", X, Y, W),
    c("addcmul", X, Y, P, value=0.5),
    c("addcdiv", X, Y, P, value=2),
    opt(c("allclose", X, X + 1e-7), jit=False),
    opt(c("allclose", X, Y), jit=False),
    opt(c("allclose", XN, XN, equal_nan=True), jit=False),
    c("isclose", X, X + 1e-6),
    c("isclose", X, Y, rtol=1.0, atol=0.5),
    c("isclose", XN, XN, equal_nan=True),
    opt(c("equal", X, X), jit=False),
    opt(c("equal", X, Y), jit=False),
    # products
    c("matmul", X, X34),
    c("matmul", V3, X34),
    c("matmul", A, B),
    c("matmul", X34, np.ones(4, np.float32)),
    c("mm", X, X34),
    c("bmm", A, B),
    c("baddbmm", C, A, B),
    c("baddbmm", C, A, B, beta=0.5, alpha=2),
    c("addmm", np.ones(4, np.float32), X, X34, beta=2, alpha=0.5),
    c("addmv", V2, X, V3),
    c("mv", X, V3),
    c("dot", V3, V3),
    c("outer", V3, V2),
    c("ger", V3, V2),
    c("inner", X, Y),
    c("kron", X, Y),
    c("einsum", "ij,jk->ik", X, X34),
    c("einsum", "bij,bjk->bik", [A, B]),
    c("einsum", "...j,...j->...", X, Y),
    c("tensordot", A, B, dims=([2], [1])),
    c("cross", _f(2, 3), _f(2, 3), dim=1),
    c("cdist", X34, _f(5, 4)),
    c("cdist", X34, _f(5, 4), p=1.0),
    opt(c("cdist", A, _f(2, 5, 4), p=3.0), rtol=1e-4),
    c("cdist", X34, _f(2, 4), p=float("inf")),
    c("cosine_similarity", X, Y),
    c("pairwise_distance", X, Y),
    c("dist", X, Y),
    c("dist", X, Y, 1),
    # softmax and reductions
    c("softmax", X, 1),
    c("softmax", X, dim=0),
    c("log_softmax", X, -1),
    c("softmax", X, 1, dtype=D("float32")),
    c("sum", X),
    c("sum", X, 1),
    c("sum", X, (0, 1)),
    c("sum", X234, [0, 2]),
    c("sum", X, dim=1, keepdim=True),
    c("sum", I),
    c("sum", BM),
    c("sum", X, dtype=D("float16")),
    c("sum", I, dim=0, dtype=D("float32")),
    c("nansum", XN[:, :2]),
    c("mean", X),
    c("mean", X, 0),
    c("mean", X234, (0, 2), keepdim=True),
    c("mean", I, dtype=D("float32")),
    c("nanmean", XN[:, :2], 1),
    c("prod", X),
    c("prod", X, 1),
    c("prod", I),
    c("prod", I, 0, keepdim=True),
    c("std", X),
    c("std", X, 1),
    c("std", X, dim=1, correction=0),
    c("std", X, 1, unbiased=False),
    c("std", X, False),
    c("std", X, 0, keepdim=True),
    c("std", X234, (0, 2), correction=2),
    c("var", X),
    c("var", X, 1),
    c("var", X, 1, False, True),
    c("var", X, correction=0),
    c("var_mean", X, 1),
    c("std_mean", X, dim=0, correction=0),
    c("max", X),
    c("max", X, 1),
    c("max", X, dim=0, keepdim=True),
    c("max", X, Y),
    c("max", I, 1),
    c("min", X),
    c("min", X, 1),
    c("min", X, -1, True),
    c("min", X, Y),
    c("amax", X, 1),
    c("amax", X234, (0, 2)),
    c("amax", X),
    c("amin", X, 0, keepdim=True),
    c("aminmax", X),
    c("aminmax", X, dim=1),
    c("argmax", X),
    c("argmax", X, 1),
    c("argmax", X, dim=1, keepdim=True),
    c("argmin", X),
    c("argmin", X, 0),
    c("all", BM),
    c("all", BM, 1),
    c("any", BM, dim=0, keepdim=True),
    c("any", I),
    c("count_nonzero", I),
    c("count_nonzero", BM, 1),
    c("topk", V5, 2),
    c("topk", X34, 2, dim=0),
    c("topk", X34, 2, largest=False),
    c("topk", X34, 3, 1, True, True),
    c("sort", X34),
    c("sort", X34, 0, descending=True),
    c("sort", I, 1),
    c("sort", V5, stable=True, descending=True),
    c("argsort", X34, 1),
    c("argsort", X34, descending=True),
    c("msort", X34),
    c("kthvalue", V5, 2),
    c("kthvalue", X34, 2, 0, True),
    c("median", X34),
    c("median", X34, 1),
    c("quantile", X34, 0.3, dim=1),
    c("cumsum", X, 1),
    c("cumsum", I, 0),
    c("cumsum", BM, 1),
    c("cumsum", X, dim=0, dtype=D("float16")),
    c("cumprod", X, 0),
    c("cumprod", I, 1),
    c("cummax", X34, 1),
    c("cummin", X34, 0),
    c("logcumsumexp", X, 1),
    c("logsumexp", X, 1),
    c("logsumexp", X234, (0, 2), keepdim=True),
    c("logsumexp", I, 1),
    c("norm", X),
    c("norm", X, 1),
    c("norm", X, float("inf")),
    c("norm", X, -float("inf")),
    c("norm", X, 0),
    c("norm", X, 3, dim=1),
    c("norm", X, dim=1),
    c("norm", X, p=2, dim=0, keepdim=True),
    c("norm", X, "fro"),
    c("norm", X234, "fro", dim=(1, 2)),
    opt(c("norm", X34, "nuc"), rtol=1e-4),
    c("trace", X34),
    c("trace", I[:, :2]),
    c("diff", X34, dim=1),
    c("diff", X34, 2, 0),
    c("searchsorted", np.sort(V5), X),
    c("searchsorted", np.sort(V5), X, right=True),
    opt(c("unique", np.array([3, 1, 3, 2], np.int64)), jit=False),
    opt(
        c("unique", np.array([3, 1, 3, 2], np.int64), return_inverse=True, return_counts=True),
        jit=False,
    ),
    opt(c("bincount", np.array([0, 2, 2, 5], np.int64)), jit=False),
    # facts
    opt(c("is_tensor", X), jit=False),
    opt(c("is_tensor", [1.0]), jit=False),
    opt(c("numel", X234), jit=False),
    opt(c("is_floating_point", X), jit=False),
    opt(c("is_floating_point", I), jit=False),
    opt(c("is_complex", X), jit=False),
    opt(c("is_nonzero", np.ones(1, np.float32)), jit=False),
    c("clone", X),
]

XNAN = np.array([[1.0, np.nan, 3.0], [2.0, 0.5, -1.0]], np.float32)
HALVES = np.array([0.5, 1.5, 2.5, -0.5, -1.5], np.float32)
S0 = np.array(2.0, np.float32)  # 0-d

# Edge cases: NaN, empty and 0-d inputs, promotion, rounding, legacy forms.
EDGES = [
    c("chunk", X34, 5, 1),
    c("split", X34, 5),
    c("squeeze", S0),
    c("flatten", V5),
    c("topk", V5, 0),
    c("sort", XNAN, 1),
    c("sort", XNAN, 1, descending=True),
    c("argsort", XNAN, 1),
    c("max", XNAN, 1),
    c("max", XNAN),
    c("argmax", XNAN, 1),
    c("min", XNAN, 0),
    c("cummax", XNAN, 1),
    c("cummin", np.array([3, 1, 1, 2], np.int64), 0),
    c("cumsum", BM, 0),
    c("prod", BM),
    c("std", XNAN),
    c("std", X, 1, keepdim=True),
    c("clamp", X, 0.5, -0.5),
    c("clamp", I, 0.5),
    c("clamp", X, np.zeros(3, np.float32)),
    c("round", HALVES),
    c("div", -I, I2, rounding_mode="trunc"),
    c("remainder", -X, Y),
    c("fmod", -X, Y),
    c("floor_divide", -I, I2),
    c("sign", np.array([-0.0, 0.0, -2.0], np.float32)),
    c("logsumexp", np.full((2, 3), -np.inf, np.float32), 1),
    c("softmax", np.array([[-np.inf, -np.inf]], np.float32), 1),
    c("log_softmax", X, 0, dtype=D("float16")),
    c("where", BM, I, X),
    c("cat", [I, X]),
    c("stack", [I, X]),
    c("eye", 0),
    c("arange", 0),
    c("arange", 0.0, 1.0, 0.3),
    c("arange", 1, 2.5, 0.5),
    c("linspace", 0, 1, 0),
    c("tril_indices", 0, 0),
    c("meshgrid", V5, indexing="ij"),
    c("repeat_interleave", np.array([1, 2, 0], np.int64), output_size=3),
    c("gather", S0, 0, np.array(0, np.int64)),
    c("index_select", X34, 0, np.array(1, np.int64)),
    c("narrow", X34, 0, 3, 0),
    c("unbind", np.zeros((0, 2), np.float32)),
    c("mean", XNAN),
    c("nanmean", XNAN),
    c("median", np.array([1.0, 3.0, 2.0, 4.0], np.float32)),
    c("kthvalue", X34, 1, 1),
    c("amax", I),
    c("logit", X),
    c("erfinv", np.array([1.0, -1.0], np.float32)),
    c("sqrt", -np.abs(X)),
    c("log", np.zeros(2, np.float32)),
    c("pow", np.zeros(2, np.float32), -1.0),
    c("pow", I, 0),
    c("all", X),
    c("any", np.zeros(3, np.float32)),
    c("count_nonzero", X34, (0, 1)),
    c("diff", np.array([1, 4, 9], np.int64)),
    c(
        "searchsorted",
        np.array([[1.0, 2.0, 3.0], [0.0, 5.0, 6.0]], np.float32),
        np.array([[2.5], [5.0]], np.float32),
    ),
    c("flip", S0, ()),
    c("roll", E0, 1),
    c("amax", E0.reshape(0, 1), 1),
    c("sum", E0),
    c("prod", E0),
    c("mean", E0),
    c("logsumexp", E0, 0),
    c(
        "isclose",
        np.array([np.inf, -np.inf, 1.0], np.float32),
        np.array([np.inf, np.inf, 1.0], np.float32),
    ),
    c("nan_to_num", XN.astype(np.float16)),
    c("lerp", X, Y, np.array(1.5, np.float32)),
    c("matmul", V5, V5),
    c("einsum", "i,i->", V5, V5),
    c("einsum", "ii->i", X34[:3, :3].copy()),
    c("cdist", X34, X34),
    c("scatter_reduce", np.ones((3, 4), np.float32), 1, IDX, X34, "prod", include_self=False),
    c("scatter_reduce", np.ones((3, 4), np.float32), 1, IDX, X34, "amin"),
    c("scatter_reduce", np.ones((3, 4), np.float32), 1, IDX, X34, "mean", include_self=False),
    c("scatter_reduce", np.ones((3, 4), np.int64), 1, IDX, np.arange(12).reshape(3, 4), "mean"),
    c("masked_fill", X, BM, np.array(2.0, np.float32)),
    opt(c("multinomial", np.array([1.0, 0.0], np.float32), 2), jit=False),
]

ERRORS = [
    bad("sum", X, 5),
    bad("sum", X, (0, -3)),
    bad("mean", X, 2),
    bad("max", X, 5),
    bad("min", X, -3),
    bad("argmax", X, 2),
    bad("amax", X, 4),
    bad("unsqueeze", X, 4),
    bad("unsqueeze", X, -4),
    bad("squeeze", X, 3),
    bad("cat", [X, Y], 5),
    bad("cat", [X, X34]),
    bad("stack", [X, Y], 4),
    bad("stack", [X, X34]),
    bad("softmax", X, 3),
    bad("log_softmax", X, -3),
    bad("transpose", X, 0, 2),
    bad("flatten", X, 0, 3),
    bad("flatten", X, 1, 0),
    bad("gather", X34, 2, IDX),
    bad("std", X, 2),
    bad("var", X, -3),
    bad("std", I),
    bad("mean", I),
    bad("cumsum", X, 2),
    bad("cumprod", X, -3),
    bad("logsumexp", X, 3),
    bad("index_select", X34, 2, I1),
    bad("movedim", X, 2, 0),
    bad("flip", X, (2,)),
    bad("roll", X, 1, 2),
    bad("norm", X, dim=3),
    bad("sort", X, 2),
    bad("argsort", X, -3),
    bad("topk", X, 5),
    bad("topk", X, 1, dim=2),
    bad("narrow", X, 0, 1, 5),
    bad("narrow", X, 2, 0, 1),
    bad("split", X, [1, 1], 1),
    bad("split", X, 1, 2),
    bad("chunk", X, 2, 2),
    bad("unbind", X, 2),
    bad("permute", X234, (0, 0, 1)),
    bad("permute", X234, (0, 1)),
    bad("clamp", X),
    bad("mm", X, X),
    bad("mm", X, V3),
    bad("bmm", X, X),
    bad("matmul", X, X),
    bad("max", E0),
    bad("tril", V3),
    bad("from_numpy", [1.0, 2.0]),
    bad("reshape", X, (4, 2)),
    bad("broadcast_to", X, (3, 3)),
    bad("arange", 0, 5, 0),
    bad("arange", 0, 5, -1),
    bad("multinomial", np.ones((2, 2, 2), np.float32), 1),
    bad("multinomial", V3, 5),
    bad("randint", 5, 3, (2,)),
    bad("zeros", 2, -1),
    bad("kthvalue", V5, 6),
    bad("select", X, 2, 0),
    bad("select", X, 1, 3),
    bad("diagonal", X, 0, 0, 2),
    bad("pow", I, -1),
    bad("where", X, X, Y),
    bad("complex", X, I),
    bad("squeeze", S0, 1),
    bad("topk", V5, 6),
    bad("mean", BM),
    bad("unsqueeze", S0, 2),
    bad("sum", S0, 1),
    bad("norm", I),
    bad("softmax", I, 1),
    bad("cumsum", X),
    bad("logsumexp", X),
    bad("stack", []),
    bad("cat", []),
    bad("transpose", S0, 0, 1),
    bad("gather", X, 0, np.zeros((2, 3), np.float32)),
    bad("index_select", X, 0, np.zeros((1, 1), np.int64)),
    bad("masked_fill", X, I, 0.0),
    bad("repeat_interleave", X, np.array([1, 2, 3], np.int64), 0),
    bad("eye", -1),
    bad("randperm", -1),
    bad("linspace", 0, 1, -1),
    bad("multinomial", np.array([0.0, 0.0], np.float32), 1),
    bad("multinomial", np.array([-1.0, 2.0], np.float32), 1),
    bad("normal", np.zeros(2, np.float32), -1.0),
    bad("bernoulli", np.array([1.5], np.float32)),
    bad("chunk", X, 0),
    bad("diag", X34[None]),
    bad("dot", X, Y),
    bad("outer", X, V5),
    bad("einsum", "ij,jk", X, X),
    bad("unflatten", X34, 1, (3, 2)),
    bad("reshape", X, (-1, -1)),
    bad("tile", X, (2.5,)),
    bad("zeros", 2.5),
    bad("narrow", X, 0, 3, 0),
    bad("cdist", X, X34),
    bad("bmm", np.ones((2, 2, 3), np.float32), np.ones((3, 3, 2), np.float32)),
    bad("view_as_complex", X),
    bad("set_default_dtype", D("int32")),
]

CASES = CREATION + SHAPE + MATH + EDGES + ERRORS


# ---------------------------------------------------------------------------- comparison

# torch.return_types has no ``_fields``: the field names of each, by PyTorch's documentation.
FIELDS = {
    "max": ("values", "indices"),
    "min": ("values", "indices"),
    "sort": ("values", "indices"),
    "topk": ("values", "indices"),
    "kthvalue": ("values", "indices"),
    "median": ("values", "indices"),
    "cummax": ("values", "indices"),
    "cummin": ("values", "indices"),
    "aminmax": ("min", "max"),
}


def _dtype_name(x: Any) -> str:
    """The dtype jmodule should give for ``x``'s (torch's int64 is LONG under the x64 rule)."""
    if isinstance(x, torch.Tensor):
        name = str(x.dtype).replace("torch.", "")
        return LONG if name == "int64" else name
    return jnp.dtype(x.dtype).name


def canon(x: Any) -> Any:
    """Framework-neutral data: arrays as (shape, dtype, float64 values), tuples (named
    tuples by their fields), Python scalars as (type, value)."""
    if isinstance(x, (torch.Tensor, jax.Array)):
        values = np.asarray(x)
        values = values.astype(np.complex128 if np.iscomplexobj(values) else np.float64)
        return ("array", tuple(x.shape), _dtype_name(x), values)
    if isinstance(x, tuple):
        name = type(x).__name__
        if name in FIELDS:
            return ("named", name, {f: canon(getattr(x, f)) for f in FIELDS[name]})
        return ("tuple", [canon(v) for v in x])
    if isinstance(x, list):
        return ("tuple", [canon(v) for v in x])
    if isinstance(x, (bool, int, float)):
        return (type(x).__name__, x)
    raise TypeError(f"unexpected result type {type(x)}")


def assert_same(t: Any, j: Any, case: Case, path: str = "") -> None:
    assert t[0] == j[0], f"{path}: {t[0]} vs {j[0]}"
    if t[0] == "array":
        assert j[1] == t[1], f"{path}: shape {j[1]} vs torch {t[1]}"
        assert j[2] == t[2], f"{path}: dtype {j[2]} vs torch {t[2]}"
        if case.values:
            np.testing.assert_allclose(
                j[3], t[3], rtol=case.rtol, atol=case.atol, equal_nan=True, err_msg=path
            )
    elif t[0] == "named":
        assert j[1] == t[1]
        for f in t[2]:
            assert_same(t[2][f], j[2][f], case, f"{path}.{f}")
    elif t[0] == "tuple":
        assert len(j[1]) == len(t[1]), path
        for i, (a, b) in enumerate(zip(t[1], j[1], strict=True)):
            assert_same(a, b, case, f"{path}[{i}]")
    else:
        assert j == t, f"{path}: {j} vs torch {t}"


def _jm_fn(name: str) -> Callable:
    return getattr(jm, name)


def _torch_call(case: Case) -> Any:
    return getattr(torch, case.name)(
        *_convert(case.args, "torch"), **_convert(case.kwargs, "torch")
    )


def _jm_call(case: Case) -> Any:
    return _jm_fn(case.name)(*_convert(case.args, "jm"), **_convert(case.kwargs, "jm"))


@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_matches_torch(case: Case) -> None:
    if case.raises:
        with pytest.raises(Exception) as torch_error:
            _torch_call(case)
        with pytest.raises(Exception) as jm_error:
            _jm_call(case)
        assert jm_error.type is torch_error.type, (jm_error.value, torch_error.value)
        message = str(torch_error.value)
        if message.startswith("Dimension out of range"):
            assert str(jm_error.value) == message
        return
    with torch.no_grad():
        expected = _torch_call(case)
    got = _jm_call(case)
    assert_same(canon(expected), canon(got), case, case.name)


def _traced_call(case: Case) -> tuple[Any, Any]:
    """jm's result eagerly, and inside ``jax.jit`` with every array argument traced."""
    args, kwargs = _convert(case.args, "jm"), _convert(case.kwargs, "jm")
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

    def run(*arrays: jax.Array) -> Any:
        filled = list(leaves)
        for i, a in zip(where, arrays, strict=True):
            filled[i] = a
        a, k = jax.tree_util.tree_unflatten(tree, filled)
        return _jm_fn(case.name)(*a, **k)

    return run(*[leaves[i] for i in where]), jax.jit(run)(*[leaves[i] for i in where])


JIT_CASES = [k for k in CASES if k.jit and not k.raises]


@pytest.mark.torch
@pytest.mark.parametrize("case", JIT_CASES[::4], ids=lambda case: case.id)
def test_inside_jit_gives_the_eager_result(case: Case) -> None:
    eager, traced = _traced_call(case)
    assert_same(canon(eager), canon(traced), case, case.name)


@pytest.mark.torch
def test_inside_jm_compile_with_a_module_and_parameters() -> None:
    model = jm.nn.Linear(4, 4)
    tmodel = torch.nn.Linear(4, 4)
    model.load_state_dict(tmodel.state_dict())

    def step(m: Any, x: jax.Array) -> Any:
        h = m(x)
        top = jm.topk(h, 2, dim=1)
        s = jm.sort(h, dim=0, descending=True)
        return (
            jm.std(h, dim=1, correction=0),
            jm.max(h, dim=1).indices,
            top.values,
            s.indices,
            jm.cat([jm.split(h, [1, 2], 0)[1], jm.unsqueeze(jm.sum(m.weight, 1), 0)], 0),
            jm.cdist(h, jm.transpose(m.weight, 0, 1)),
        )

    def ref(m: Any, x: torch.Tensor) -> Any:
        h = m(x)
        return (
            torch.std(h, dim=1, correction=0),
            torch.max(h, dim=1).indices,
            torch.topk(h, 2, dim=1).values,
            torch.sort(h, dim=0, descending=True).indices,
            torch.cat([torch.split(h, [1, 2], 0)[1], torch.unsqueeze(torch.sum(m.weight, 1), 0)]),
            torch.cdist(h, torch.transpose(m.weight, 0, 1)),
        )

    compiled = jm.compile(step)
    case = Case("step", ())
    with torch.no_grad():
        expected = ref(tmodel, torch.from_numpy(X34.copy()))
    for _ in range(2):
        assert_same(canon(expected), canon(compiled(model, jnp.asarray(X34))), case, "step")


@pytest.mark.slow
@pytest.mark.torch
def test_parameters_are_read_so_gradients_flow() -> None:
    """A Parameter passed to jm functions inside jm.backward gets torch's gradient."""
    wj = jm.nn.Parameter(jnp.asarray(X34))
    wt = torch.nn.Parameter(torch.from_numpy(X34.copy()))

    def loss(lib: Any, w: Any) -> Any:
        top = lib.topk(w, 2, dim=1).values
        m = lib.max(w, dim=0).values
        g = lib.gather(w, 1, _convert(IDX, "torch" if lib is torch else "jm"))
        return (
            (lib.sum(lib.exp(top)) + lib.std(w) + lib.sum(m * m) + lib.logsumexp(w, 1).sum())
            + lib.norm(g)
            + lib.sum(lib.clamp(w, -0.5, 0.5) ** 2)
        )

    loss(torch, wt).backward()
    jm.backward(lambda: loss(jm, wj))
    np.testing.assert_allclose(np.asarray(wj.grad), wt.grad.numpy(), rtol=1e-5, atol=1e-6)
    # and the same function compiled (the parameter reaches it through a module argument)
    wj.grad = None
    holder = jm.nn.Module()
    holder.w = wj

    @jm.compile
    def step(m: Any) -> jax.Array:
        return jm.backward(lambda: loss(jm, m.w))

    step(holder)
    np.testing.assert_allclose(np.asarray(wj.grad), wt.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_cdist_gradient_at_zero_distance_is_zero_like_torch() -> None:
    xt = torch.tensor(X34, requires_grad=True)
    torch.cdist(xt, xt).sum().backward()
    g = jax.grad(lambda x: jm.cdist(x, x).sum())(jnp.asarray(X34))
    np.testing.assert_allclose(np.asarray(g), xt.grad.numpy(), atol=1e-5)


# ---------------------------------------------------------------------------- eager-only functions


@pytest.mark.parametrize(
    ("fn", "needle"),
    [
        (lambda x: jm.masked_select(x, x > 0), "masked_select"),
        (lambda x: jm.nonzero(x), "nonzero"),
        (lambda x: jm.where(x > 0), "nonzero"),
        (
            lambda x: jm.repeat_interleave(x, (x > 0).astype(jnp.int32).reshape(-1), 0),
            "output_size",
        ),
        (lambda x: jm.allclose(x, x), "isclose"),
        (lambda x: jm.unique(x), "unique"),
    ],
)
def test_eager_only_functions_explain_themselves_inside_a_trace(fn: Callable, needle: str) -> None:
    with pytest.raises(TypeError, match=needle):
        jax.jit(fn)(jnp.asarray(X[0]))


# ---------------------------------------------------------------------------- random functions


def _random_cases() -> list[tuple[str, Callable]]:
    """(id, ``lib -> draw``): the same code draws with ``torch`` and with ``jm``."""
    x = lambda lib: _convert(X, "torch" if lib is torch else "jm")
    p = lambda lib: lib.tensor([0.1, 0.0, 0.6, 0.3])
    return [
        ("rand", lambda L: L.rand(2, 3)),
        ("rand16", lambda L: L.rand((4,), dtype=L.float16)),
        ("randn", lambda L: L.randn([3, 1])),
        ("randint", lambda L: L.randint(5, (3,))),
        ("randint3", lambda L: L.randint(2, 9, (2, 2))),
        ("randint_f", lambda L: L.randint(0, 3, (4,), dtype=L.float32)),
        ("randperm", lambda L: L.randperm(6)),
        ("rand_like", lambda L: L.rand_like(x(L))),
        ("randn_like", lambda L: L.randn_like(x(L))),
        ("randint_like", lambda L: L.randint_like(x(L), 4)),
        ("normal_tt", lambda L: L.normal(x(L), L.abs(x(L)))),
        ("normal_tf", lambda L: L.normal(x(L), 2.0)),
        ("normal_ft", lambda L: L.normal(1.0, L.abs(x(L)))),
        ("normal_ff", lambda L: L.normal(0.0, 1.0, (2, 2))),
        ("bernoulli", lambda L: L.bernoulli(L.clamp(L.abs(x(L)), 0, 1))),
        ("bernoulli_p", lambda L: L.bernoulli(x(L), 0.3)),
        ("multinomial", lambda L: L.multinomial(p(L), 2)),
        ("multinomial_r", lambda L: L.multinomial(p(L), 6, True)),
        ("multinomial_2d", lambda L: L.multinomial(L.tile(p(L), (3, 1)), 3)),
        ("poisson", lambda L: L.poisson(L.abs(x(L)))),
    ]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "draw"), _random_cases(), ids=[n for n, _ in _random_cases()])
def test_random_shapes_and_dtypes_match_torch(name: str, draw: Callable) -> None:
    t, j = draw(torch), draw(jm)
    assert tuple(j.shape) == tuple(t.shape)
    assert _dtype_name(j) == _dtype_name(t)


@pytest.mark.slow
def test_random_distributions() -> None:
    """Fixed seeds, statistics within a few standard errors (JAX's streams differ from
    torch's, so values are not compared to torch's)."""
    jm.manual_seed(1)
    u = np.asarray(jm.rand(20000))
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01
    z = np.asarray(jm.randn(20000))
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03
    n = np.asarray(jm.normal(jnp.full((20000,), 3.0), 2.0))
    assert abs(n.mean() - 3) < 0.06 and abs(n.std() - 2) < 0.06
    r = np.asarray(jm.randint(2, 7, (20000,)))
    assert set(np.unique(r)) == {2, 3, 4, 5, 6}
    assert sorted(np.asarray(jm.randperm(50)).tolist()) == list(range(50))
    b = np.asarray(jm.bernoulli(jnp.full((20000,), 0.3)))
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.015
    w = jnp.asarray([1.0, 0.0, 3.0, 4.0])
    draws = np.asarray(jm.multinomial(w, 20000, replacement=True))
    freq = np.bincount(draws, minlength=4) / 20000
    np.testing.assert_allclose(freq, np.asarray(w) / 8, atol=0.015)
    rows = np.asarray(jm.multinomial(jnp.tile(w, (2000, 1)), 3))
    assert all(len(set(row)) == 3 and 1 not in row for row in rows.tolist())
    # the first draw without replacement follows the weights too
    np.testing.assert_allclose(
        np.bincount(rows[:, 0], minlength=4) / 2000, np.asarray(w) / 8, atol=0.04
    )


def test_seeding_and_generators() -> None:
    jm.manual_seed(5)
    a = jm.randn(4)
    jm.manual_seed(5)
    np.testing.assert_array_equal(np.asarray(jm.randn(4)), np.asarray(a))
    assert not np.array_equal(np.asarray(jm.randn(4)), np.asarray(a))
    g1, g2 = jm.Generator().manual_seed(3), jm.Generator().manual_seed(3)
    np.testing.assert_array_equal(
        np.asarray(jm.rand(3, generator=g1)), np.asarray(jm.rand(3, generator=g2))
    )
    before = jm.random.default_generator.get_state()
    jm.randint(0, 4, (2,), generator=g1)
    np.testing.assert_array_equal(np.asarray(jm.random.default_generator.get_state()), before)


def test_compiled_draws_thread_the_generator() -> None:
    draw = jm.compile(lambda: (jm.rand(3), jm.randn(2, 2), jm.multinomial(jnp.ones(5), 2)))
    jm.manual_seed(7)
    first, second = draw(), draw()
    assert not np.array_equal(np.asarray(first[0]), np.asarray(second[0]))
    assert not np.array_equal(np.asarray(first[1]), np.asarray(second[1]))
    jm.manual_seed(7)
    again = draw()
    for x, y in zip(first, again, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the compiled draws are the eager ones
    jm.manual_seed(7)
    eager = (jm.rand(3), jm.randn(2, 2), jm.multinomial(jnp.ones(5), 2))
    for x, y in zip(first, eager, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_explicit_generator_inside_compiled_code_raises() -> None:
    g = jm.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match=r"explicit jm\.Generator"):
        jm.compile(lambda: jm.rand(2, generator=g))()


# ---------------------------------------------------------------------------- namespace


# Every torch function jm promises (the API contract's list, embedded: not read at test time).
SECTION_11 = """
tensor as_tensor from_numpy zeros ones full empty zeros_like ones_like full_like empty_like
rand_like randn_like arange linspace logspace eye tril triu tril_indices triu_indices meshgrid
rand randn randint randperm normal bernoulli multinomial
cat concat concatenate stack split chunk unbind transpose swapaxes permute reshape flatten
unflatten squeeze unsqueeze narrow movedim flip roll repeat_interleave tile broadcast_to gather
scatter scatter_add index_select masked_fill masked_select where take_along_dim
matmul mm bmm baddbmm addmm einsum outer softmax log_softmax sum mean prod std var max min
amax amin argmax argmin topk sort argsort cumsum cumprod logsumexp norm cdist clamp clip lerp
allclose isclose isnan isinf isfinite nan_to_num exp log sqrt rsqrt sigmoid tanh erf abs sign
sin cos pow
no_grad enable_grad inference_mode is_tensor numel get_default_dtype set_default_dtype
""".split()

BUILTINS = ["abs", "all", "any", "complex", "max", "min", "pow", "round", "sum"]


@pytest.mark.torch
def test_every_listed_function_exists() -> None:
    missing = [n for n in SECTION_11 if not callable(getattr(jm, n, None))]
    assert not missing, missing
    torch_missing = [n for n in SECTION_11 if not hasattr(torch, n)]
    assert not torch_missing  # the list names torch's functions


def test_builtin_names_are_served_not_bound() -> None:
    import builtins

    import jmodule

    for name in BUILTINS:
        assert name not in vars(jmodule), name
        assert name in dir(jm), name
        assert getattr(jm, name).__name__ == name
        assert getattr(builtins, name) is not getattr(jm, name)
    assert jm.return_types.max(1, 2).indices == 2
    assert jm.max(jnp.asarray(X), 1)._fields == ("values", "indices")


@pytest.mark.torch
def test_grad_mode_helpers_are_context_managers_and_decorators() -> None:
    def f(x: Any) -> Any:
        return x + 1

    for helper in (jm.no_grad, jm.enable_grad, jm.inference_mode):
        assert helper(f)(1) == 2  # @helper
        assert helper()(f)(1) == 2  # @helper()
        with helper():
            assert f(1) == 2
    assert jm.inference_mode(False)(f)(1) == 2
    with jm.set_grad_enabled(False):
        assert f(1) == 2
    assert jm.set_grad_enabled(True)(f)(1) == 2
    # torch accepts the same forms
    for helper in (torch.no_grad, torch.enable_grad, torch.inference_mode):
        assert helper(f)(1) == 2 and helper()(f)(1) == 2


@pytest.mark.torch
def test_default_dtype_like_torch() -> None:
    assert jm.get_default_dtype() is jm.float32
    try:
        jm.set_default_dtype(jm.float16)
        torch.set_default_dtype(torch.float16)
        pairs = [
            (torch.tensor([1.5]), jm.tensor([1.5])),
            (torch.zeros(2), jm.zeros(2)),
            (torch.arange(0.0, 1.0, 0.25), jm.arange(0.0, 1.0, 0.25)),
            (torch.full((2,), 0.5), jm.full((2,), 0.5)),
            (torch.exp(torch.ones(2, dtype=torch.int32)), jm.exp(jnp.ones(2, jnp.int32))),
            (torch.nn.Linear(2, 3).weight.detach(), jm.nn.Linear(2, 3).weight),
            (torch.tensor([1]), jm.tensor([1])),
        ]
        for t, j in pairs:
            assert _dtype_name(j) == _dtype_name(t)
        assert jm.get_default_dtype() is jm.float16
    finally:
        jm.set_default_dtype(jm.float32)
        torch.set_default_dtype(torch.float32)
    with pytest.raises(jm.DtypeError, match="jax_enable_x64"):
        jm.set_default_dtype(jm.float64)


def test_device_and_meta_placement() -> None:
    cpu = jax.devices("cpu")[0]
    assert jm.zeros(2, 3, device="cpu").devices() == {cpu}
    assert jm.arange(3, device=cpu).devices() == {cpu}
    assert jm.randn(2, device="cpu").devices() == {cpu}
    state = np.asarray(jm.get_rng_state())
    with jm.device("meta"):
        abstract = [jm.zeros(3), jm.full((2,), 1.5), jm.randn(2, 2), jm.randint(3, (4,))]
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in abstract)
    assert [a.shape for a in abstract] == [(3,), (2,), (2, 2), (4,)]
    np.testing.assert_array_equal(np.asarray(jm.get_rng_state()), state)  # nothing drawn


def test_refused_arguments_say_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"jm\.nn\.Parameter"):
        jm.tensor([1.0], requires_grad=True)
    with pytest.raises(TypeError, match="immutable"):
        jm.zeros(2, out=jnp.ones(2))
    with pytest.raises(jm.DtypeError, match="jax_enable_x64"):
        jm.zeros(2, dtype=jm.float64)
    assert jm.zeros(2, dtype=jm.long).dtype == LONG  # int64 is int32 without x64


def test_accepts_parameters_numpy_and_scalars() -> None:
    p = jm.nn.Parameter(jnp.asarray(X))
    np.testing.assert_allclose(np.asarray(jm.sum(p, 1)), X.sum(1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jm.cat([p, X])), np.concatenate([X, X]))
    assert jm.numel(p) == 6 and jm.is_tensor(p) and not jm.is_tensor(X)
    assert jm.maximum(jnp.asarray(X, jnp.bfloat16), 0.0).dtype == jnp.bfloat16
    assert jm.exp(1.0).dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.torch  # its script compares with torch
def test_with_x64_int64_results_are_int64() -> None:
    script = textwrap.dedent(
        """
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import torch
        import jmodule as jm
        x = jnp.ones((2, 3), jnp.int32)
        for t, j in [
            (torch.arange(3), jm.arange(3)),
            (torch.tensor([1, 2]), jm.tensor([1, 2])),
            (torch.tensor([1.0]), jm.tensor([1.0])),
            (torch.arange(3.0), jm.arange(3.0)),
            (torch.sum(torch.ones(2, 3, dtype=torch.int32)), jm.sum(x)),
            (torch.cumsum(torch.ones(2, dtype=torch.int32), 0), jm.cumsum(x[0], 0)),
            (torch.argmax(torch.ones(3)), jm.argmax(jnp.ones(3))),
            (torch.div(torch.ones(2, dtype=torch.int32), 2), jm.div(x[0, :2], 2)),
            (torch.zeros(2, dtype=torch.float64), jm.zeros(2, dtype=jm.float64)),
        ]:
            assert str(t.dtype).replace("torch.", "") == j.dtype.name, (t.dtype, j.dtype)
        print("ok")
        """
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.torch
@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_the_legacy_reduce_argument(reduce: str) -> None:
    case = Case("scatter", (np.ones((3, 4), np.float32), 0, SIDX, X34), {"reduce": reduce})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch deprecates reduce= here
        expected = _torch_call(case)
    assert_same(canon(expected), canon(_jm_call(case)), case, "scatter")


@pytest.mark.torch
def test_concatenate_takes_torchs_dim_and_axis():
    a, b = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    for kwargs in ({}, {"dim": 0}, {"dim": 1}, {"axis": 1}, {"dim": -1}):
        want = torch.concatenate([torch.from_numpy(a), torch.from_numpy(b)], **kwargs)
        got = jm.concatenate([jnp.asarray(a), jnp.asarray(b)], **kwargs)
        np.testing.assert_array_equal(np.asarray(got), want.numpy())
    np.testing.assert_array_equal(
        np.asarray(jm.concatenate([a, b], 1)),
        torch.concatenate([torch.ones(2, 3), torch.zeros(2, 3)], 1),
    )


@pytest.mark.torch
def test_jm_functions_named_as_jnp_and_torch_take_torchs_dim_arguments():
    """A ``jm`` function that is also a ``jax.numpy`` name is torch's: ``dim``/``keepdim``
    (``axis`` at most as torch's alias), never only NumPy's ``axis``/``keepdims``."""
    import inspect

    numpy_only = []
    for name in dir(jm):
        fn = getattr(jm, name, None)
        if name.startswith("_") or not callable(fn) or isinstance(fn, type):
            continue
        if not (hasattr(jnp, name) and hasattr(torch, name)):
            continue
        try:
            params = inspect.signature(inspect.unwrap(fn)).parameters
        except (TypeError, ValueError):
            continue
        if ({"axis", "axes", "keepdims"} & set(params)) and "dim" not in params:
            numpy_only.append(name)
    assert numpy_only == []
