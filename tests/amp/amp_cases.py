"""Every functional op of jmodule, called the same way in torch and jmodule (for autocast).

Each case is ``(id, call)`` where ``call(F, A)`` runs the op with ``F`` a
framework's ``nn.functional`` and ``A`` an :class:`Arrays` maker for that
framework; ``tests/amp/test_amp.py`` compares the output dtypes under
``torch.autocast("cpu")`` and ``jm.autocast("cpu")``, op by op.
:data:`FUNCTION_CASES` does the same for the ``torch.*`` functions (``jm.*``):
one :class:`Fn` or more per function, variants named ``name:variant``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from _torch import torch

import jmodule as jm


class Arrays:
    """Arrays of one framework, floats in ``dtype`` (same values on both sides per seed)."""

    def __init__(self, is_torch: bool, dtype: str, nn: Any):
        self.is_torch = is_torch
        self.dtype = dtype
        self.nn = nn
        self.rng = np.random.default_rng(0)

    def _wrap(self, a: np.ndarray, dtype: str) -> Any:
        if self.is_torch:
            return torch.from_numpy(a.astype(np.float32 if dtype == "bfloat16" else a.dtype)).to(
                getattr(torch, dtype)
            )
        return jnp.asarray(a.astype(np.float32 if dtype == "bfloat16" else a.dtype), dtype=dtype)

    def f(self, *shape: int, dtype: str | None = None) -> Any:
        """Standard normal floats (in the case's input dtype unless ``dtype``)."""
        return self._wrap(self.rng.standard_normal(shape).astype(np.float32), dtype or self.dtype)

    def p(self, *shape: int) -> Any:
        """Floats in (0.1, 0.9) (probabilities, positive values)."""
        return self._wrap(self.rng.uniform(0.1, 0.9, shape).astype(np.float32), self.dtype)

    def nn_dtype(self, name: str) -> Any:
        return getattr(torch, name) if self.is_torch else jnp.dtype(name)

    def p32(self, *shape: int) -> Any:
        """Positive float32 (a running variance)."""
        return self._wrap(self.rng.uniform(0.1, 0.9, shape).astype(np.float32), "float32")

    def f32(self, *shape: int) -> Any:
        """float32 whatever the case's dtype (weights and buffers, which autocast never casts)."""
        return self.f(*shape, dtype="float32")

    def i(self, high: int, *shape: int) -> Any:
        """Integers in [0, high): int64 in torch, int32 in jmodule (x64 off)."""
        a = self.rng.integers(0, high, shape)
        return torch.from_numpy(a) if self.is_torch else jnp.asarray(a, dtype=jnp.int32)

    def const(self, value: Any, dtype: str = "int64") -> Any:
        a = np.asarray(value)
        if self.is_torch:
            return torch.from_numpy(a.astype(dtype))
        return jnp.asarray(a, dtype="int32" if dtype == "int64" else dtype)


def _unpool(F: Any, A: Arrays, nd: int) -> Any:
    shape = (1, 2) + (4,) * nd
    x = A.f(*shape)
    pool = getattr(F, f"max_pool{nd}d")
    out, idx = pool(x, 2, return_indices=True)
    return getattr(F, f"max_unpool{nd}d")(out, idx, 2)


def _ctc(F: Any, A: Arrays) -> Any:
    log_probs = F.log_softmax(A.f(6, 2, 4), dim=-1)
    targets = A.const([[1, 2, 1], [3, 1, 0]])
    return F.ctc_loss(log_probs, targets, A.const([6, 6]), A.const([3, 2]))


_UNARY = (
    "celu elu gelu hardshrink hardsigmoid hardswish hardtanh leaky_relu logsigmoid mish relu "
    "relu6 selu sigmoid silu softshrink softsign tanh tanhshrink softplus rrelu"
).split()

CASES: list[tuple[str, Any]] = [
    *[(name, lambda F, A, name=name: getattr(F, name)(A.f(2, 3))) for name in _UNARY],
    ("threshold", lambda F, A: F.threshold(A.f(2, 3), 0.1, 0.0)),
    ("glu", lambda F, A: F.glu(A.f(2, 4))),
    ("softmax", lambda F, A: F.softmax(A.f(2, 3), dim=-1)),
    ("softmax_dtype", lambda F, A: F.softmax(A.f(2, 3), dim=-1, dtype=A.nn_dtype("float16"))),
    ("log_softmax", lambda F, A: F.log_softmax(A.f(2, 3), dim=-1)),
    ("softmin", lambda F, A: F.softmin(A.f(2, 3), dim=-1)),
    ("prelu", lambda F, A: F.prelu(A.f(2, 3, 4), A.f32(3))),
    ("linear", lambda F, A: F.linear(A.f(2, 3), A.f32(4, 3), A.f32(4))),
    ("linear_nobias", lambda F, A: F.linear(A.f(2, 3), A.f32(4, 3))),
    ("bilinear", lambda F, A: F.bilinear(A.f(2, 3), A.f(2, 4), A.f32(5, 3, 4), A.f32(5))),
    ("conv1d", lambda F, A: F.conv1d(A.f(1, 2, 5), A.f32(3, 2, 3), A.f32(3))),
    ("conv2d", lambda F, A: F.conv2d(A.f(1, 2, 5, 5), A.f32(3, 2, 3, 3), A.f32(3))),
    ("conv3d", lambda F, A: F.conv3d(A.f(1, 2, 4, 4, 4), A.f32(3, 2, 2, 2, 2))),
    ("conv_transpose1d", lambda F, A: F.conv_transpose1d(A.f(1, 2, 5), A.f32(2, 3, 3))),
    ("conv_transpose2d", lambda F, A: F.conv_transpose2d(A.f(1, 2, 4, 4), A.f32(2, 3, 3, 3))),
    (
        "conv_transpose3d",
        lambda F, A: F.conv_transpose3d(A.f(1, 2, 3, 3, 3), A.f32(2, 3, 2, 2, 2), A.f32(3)),
    ),
    (
        "scaled_dot_product_attention",
        lambda F, A: F.scaled_dot_product_attention(
            A.f(1, 2, 4, 8), A.f(1, 2, 4, 8), A.f(1, 2, 4, 8)
        ),
    ),
    (
        "scaled_dot_product_attention_causal_mask",
        lambda F, A: F.scaled_dot_product_attention(
            A.f(1, 2, 4, 8), A.f(1, 2, 4, 8), A.f(1, 2, 4, 8), attn_mask=A.f32(4, 4)
        ),
    ),
    ("layer_norm", lambda F, A: F.layer_norm(A.f(2, 3), (3,), A.f32(3), A.f32(3))),
    ("layer_norm_noaffine", lambda F, A: F.layer_norm(A.f(2, 3), (3,))),
    ("group_norm", lambda F, A: F.group_norm(A.f(2, 4, 3), 2, A.f32(4), A.f32(4))),
    ("rms_norm", lambda F, A: F.rms_norm(A.f(2, 3), (3,), A.f32(3))),
    (
        "batch_norm",
        lambda F, A: F.batch_norm(A.f(2, 3, 4), A.f32(3), A.p32(3), A.f32(3), A.f32(3)),
    ),
    ("instance_norm", lambda F, A: F.instance_norm(A.f(2, 3, 4))),
    ("local_response_norm", lambda F, A: F.local_response_norm(A.f(2, 4, 3, 3), 2)),
    ("normalize", lambda F, A: F.normalize(A.f(2, 3))),
    ("cosine_similarity", lambda F, A: F.cosine_similarity(A.f(2, 3), A.f(2, 3))),
    ("pairwise_distance", lambda F, A: F.pairwise_distance(A.f(2, 3), A.f(2, 3))),
    ("pdist", lambda F, A: F.pdist(A.f(3, 4))),
    ("avg_pool1d", lambda F, A: F.avg_pool1d(A.f(1, 2, 4), 2)),
    ("avg_pool2d", lambda F, A: F.avg_pool2d(A.f(1, 2, 4, 4), 2)),
    ("avg_pool3d", lambda F, A: F.avg_pool3d(A.f(1, 2, 4, 4, 4), 2)),
    ("max_pool1d", lambda F, A: F.max_pool1d(A.f(1, 2, 4), 2)),
    ("max_pool2d", lambda F, A: F.max_pool2d(A.f(1, 2, 4, 4), 2)),
    ("max_pool3d", lambda F, A: F.max_pool3d(A.f(1, 2, 4, 4, 4), 2)),
    ("max_pool3d_indices", lambda F, A: F.max_pool3d(A.f(1, 2, 4, 4, 4), 2, return_indices=True)),
    ("adaptive_avg_pool1d", lambda F, A: F.adaptive_avg_pool1d(A.f(1, 2, 5), 2)),
    ("adaptive_avg_pool2d", lambda F, A: F.adaptive_avg_pool2d(A.f(1, 2, 5, 5), 2)),
    ("adaptive_avg_pool3d", lambda F, A: F.adaptive_avg_pool3d(A.f(1, 2, 5, 5, 5), 2)),
    ("adaptive_max_pool1d", lambda F, A: F.adaptive_max_pool1d(A.f(1, 2, 5), 2)),
    ("adaptive_max_pool2d", lambda F, A: F.adaptive_max_pool2d(A.f(1, 2, 5, 5), 2)),
    ("adaptive_max_pool3d", lambda F, A: F.adaptive_max_pool3d(A.f(1, 2, 5, 5, 5), 2)),
    (
        "adaptive_max_pool3d_indices",
        lambda F, A: F.adaptive_max_pool3d(A.f(1, 2, 5, 5, 5), 2, return_indices=True),
    ),
    ("lp_pool1d", lambda F, A: F.lp_pool1d(A.p(1, 2, 4), 2, 2)),
    ("lp_pool2d", lambda F, A: F.lp_pool2d(A.p(1, 2, 4, 4), 2, 2)),
    ("lp_pool3d", lambda F, A: F.lp_pool3d(A.p(1, 2, 4, 4, 4), 2, 2)),
    ("max_unpool1d", lambda F, A: _unpool(F, A, 1)),
    ("max_unpool2d", lambda F, A: _unpool(F, A, 2)),
    ("max_unpool3d", lambda F, A: _unpool(F, A, 3)),
    ("pad_constant", lambda F, A: F.pad(A.f(1, 2, 4), (1, 1))),
    ("pad_reflect1d", lambda F, A: F.pad(A.f(1, 2, 4), (1, 1), mode="reflect")),
    ("pad_reflect2d", lambda F, A: F.pad(A.f(1, 2, 4, 4), (1, 1, 1, 1), mode="reflect")),
    ("pad_reflect3d", lambda F, A: F.pad(A.f(1, 2, 3, 3, 3), (1,) * 6, mode="reflect")),
    ("pad_replicate1d", lambda F, A: F.pad(A.f(1, 2, 4), (1, 1), mode="replicate")),
    ("pad_replicate2d", lambda F, A: F.pad(A.f(1, 2, 4, 4), (1,) * 4, mode="replicate")),
    ("pad_replicate3d", lambda F, A: F.pad(A.f(1, 2, 3, 3, 3), (1,) * 6, mode="replicate")),
    ("pad_circular", lambda F, A: F.pad(A.f(1, 2, 4, 4), (1,) * 4, mode="circular")),
    ("interpolate_nearest", lambda F, A: F.interpolate(A.f(1, 2, 4, 4), scale_factor=2)),
    (
        "interpolate_nearest_exact",
        lambda F, A: F.interpolate(A.f(1, 2, 4), scale_factor=2, mode="nearest-exact"),
    ),
    ("interpolate_linear", lambda F, A: F.interpolate(A.f(1, 2, 4), scale_factor=2, mode="linear")),
    (
        "interpolate_bilinear",
        lambda F, A: F.interpolate(A.f(1, 2, 4, 4), scale_factor=2, mode="bilinear"),
    ),
    (
        "interpolate_bicubic",
        lambda F, A: F.interpolate(A.f(1, 2, 4, 4), scale_factor=2, mode="bicubic"),
    ),
    (
        "interpolate_trilinear",
        lambda F, A: F.interpolate(A.f(1, 2, 3, 3, 3), scale_factor=2, mode="trilinear"),
    ),
    ("interpolate_area", lambda F, A: F.interpolate(A.f(1, 2, 4, 4), size=(2, 2), mode="area")),
    ("pixel_shuffle", lambda F, A: F.pixel_shuffle(A.f(1, 4, 2, 2), 2)),
    ("pixel_unshuffle", lambda F, A: F.pixel_unshuffle(A.f(1, 1, 4, 4), 2)),
    ("channel_shuffle", lambda F, A: F.channel_shuffle(A.f(1, 4, 2, 2), 2)),
    ("dropout_eval", lambda F, A: F.dropout(A.f(2, 3), training=False)),
    ("dropout2d_eval", lambda F, A: F.dropout2d(A.f(1, 2, 3, 3), training=False)),
    ("alpha_dropout_eval", lambda F, A: F.alpha_dropout(A.f(2, 3), training=False)),
    ("embedding", lambda F, A: F.embedding(A.i(5, 2, 3), A.f32(5, 4))),
    ("embedding_bag", lambda F, A: F.embedding_bag(A.i(5, 2, 3), A.f32(5, 4))),
    ("one_hot", lambda F, A: F.one_hot(A.i(4, 3), 4)),
    ("unfold", lambda F, A: F.unfold(A.f(1, 2, 4, 4), 2)),
    ("fold", lambda F, A: F.fold(A.f(1, 8, 9), (4, 4), 2)),
    (
        "grid_sample",
        lambda F, A: F.grid_sample(A.f(1, 2, 4, 4), A.p(1, 3, 3, 2), align_corners=False),
    ),
    (
        "grid_sample_f32_grid",
        lambda F, A: F.grid_sample(A.f(1, 2, 4, 4), A.f32(1, 3, 3, 2), align_corners=False),
    ),
    ("affine_grid", lambda F, A: F.affine_grid(A.f(1, 2, 3), [1, 1, 3, 3], align_corners=False)),
    ("mse_loss", lambda F, A: F.mse_loss(A.f(2, 3), A.f(2, 3))),
    ("l1_loss", lambda F, A: F.l1_loss(A.f(2, 3), A.f(2, 3))),
    ("smooth_l1_loss", lambda F, A: F.smooth_l1_loss(A.f(2, 3), A.f(2, 3))),
    ("huber_loss", lambda F, A: F.huber_loss(A.f(2, 3), A.f(2, 3))),
    ("poisson_nll_loss", lambda F, A: F.poisson_nll_loss(A.f(2, 3), A.p(2, 3))),
    ("gaussian_nll_loss", lambda F, A: F.gaussian_nll_loss(A.f(2, 3), A.f(2, 3), A.p(2, 3))),
    ("nll_loss", lambda F, A: F.nll_loss(A.f(4, 3), A.i(3, 4))),
    ("nll_loss2d", lambda F, A: F.nll_loss(A.f(2, 3, 2, 2), A.i(3, 2, 2, 2))),
    ("cross_entropy", lambda F, A: F.cross_entropy(A.f(4, 3), A.i(3, 4))),
    ("cross_entropy_probs", lambda F, A: F.cross_entropy(A.f(4, 3), A.p(4, 3))),
    ("cross_entropy_none", lambda F, A: F.cross_entropy(A.f(4, 3), A.i(3, 4), reduction="none")),
    ("binary_cross_entropy", lambda F, A: F.binary_cross_entropy(A.p(2, 3), A.p(2, 3))),
    (
        "binary_cross_entropy_with_logits",
        lambda F, A: F.binary_cross_entropy_with_logits(A.f(2, 3), A.p(2, 3)),
    ),
    ("kl_div", lambda F, A: F.kl_div(A.f(2, 3), A.p(2, 3), reduction="batchmean")),
    ("soft_margin_loss", lambda F, A: F.soft_margin_loss(A.f(2, 3), A.f(2, 3))),
    (
        "multilabel_soft_margin_loss",
        lambda F, A: F.multilabel_soft_margin_loss(A.f(2, 3), A.p(2, 3)),
    ),
    ("multi_margin_loss", lambda F, A: F.multi_margin_loss(A.f(4, 3), A.i(3, 4))),
    (
        "multilabel_margin_loss",
        lambda F, A: F.multilabel_margin_loss(A.f(2, 3), A.const([[1, 0, -1], [2, -1, 0]])),
    ),
    ("hinge_embedding_loss", lambda F, A: F.hinge_embedding_loss(A.f(2, 3), A.f(2, 3))),
    (
        "cosine_embedding_loss",
        lambda F, A: F.cosine_embedding_loss(A.f(2, 3), A.f(2, 3), A.const([1, -1])),
    ),
    ("margin_ranking_loss", lambda F, A: F.margin_ranking_loss(A.f(3), A.f(3), A.f(3))),
    ("triplet_margin_loss", lambda F, A: F.triplet_margin_loss(A.f(2, 3), A.f(2, 3), A.f(2, 3))),
    (
        "triplet_margin_with_distance_loss",
        lambda F, A: F.triplet_margin_with_distance_loss(A.f(2, 3), A.f(2, 3), A.f(2, 3)),
    ),
    ("ctc_loss", _ctc),
]


# ----------------------------------------------------------------------------- torch functions


class Fn:
    """One call of a ``torch.*`` function and its ``jm.*`` namesake: ``call(m, A)``, where
    ``m`` is ``torch`` or ``jmodule`` and ``A`` an :class:`Arrays` maker.

    ``values=False``: the values are random draws (or uninitialized memory), so only dtypes
    and shapes compare. ``compiled=False``: the function is eager only (its result's shape
    depends on the values), so it is not run inside ``jm.compile``. ``x64``: the result is
    float64 (``float_power``), which jmodule gives with JAX's x64 mode on.
    """

    def __init__(
        self,
        id: str,
        call: Any,
        *,
        values: bool = True,
        compiled: bool = True,
        x64: bool = False,
    ):
        self.id = id
        self.name = id.split(":")[0]  # the function called (``id`` is ``name`` or ``name:variant``)
        self.call = call
        self.values = values
        self.compiled = compiled
        self.x64 = x64


def _c(A: Arrays) -> Any:
    """A complex64 (2, 3) array (torch's complex parts must be float32)."""
    return (torch if A.is_torch else jm).complex(A.f32(2, 3), A.f32(2, 3))


def _b(A: Arrays, *shape: int) -> Any:
    """A bool mask."""
    return A.f32(*shape) > 0


_FLOAT_UNARY = (
    "absolute acos arccos arcsin arctan arctanh asin atan atanh ceil conj cos cosh deg2rad "
    "digamma erf erfc erfinv exp exp2 expm1 fix floor frac isfinite isinf isnan isneginf "
    "isposinf isreal lgamma log log10 log1p log2 logical_not logit neg negative positive "
    "rad2deg reciprocal relu rsqrt sgn sigmoid sign signbit sin sinc sinh sqrt square tan tanh "
    "trunc abs round nan_to_num clone detach angle real atleast_1d atleast_2d atleast_3d "
    "ravel t fliplr flipud msort argsort median sort nanmean nansum mean sum "
    "prod std var std_mean var_mean amax amin aminmax argmax argmin max min all any "
    "count_nonzero norm logsumexp:1 trace diagonal diag tril triu ones_like zeros_like "
    "asinh acosh:1+ arcsinh arccosh:1+"
).split()

_BINARY = (
    "add arctan2 atan2 copysign div divide eq floor_divide fmax fmin fmod ge greater "
    "greater_equal gt heaviside hypot le less less_equal logaddexp logaddexp2 logical_and "
    "logical_or logical_xor lt maximum minimum mul multiply ne not_equal pow remainder rsub "
    "sub subtract true_divide xlogy dist isclose"
).split()


def _unary(spec: str) -> Fn:
    name, _, arg = spec.partition(":")

    def call(m: Any, A: Arrays) -> Any:
        x = A.p(2, 3)
        x = x + 1 if arg == "1+" else x
        return getattr(m, name)(x, 1) if arg == "1" else getattr(m, name)(x)

    return Fn(name, call)


FUNCTION_CASES: list[Fn] = [
    # creation (no floating inputs, or a floating input's dtype)
    Fn("arange", lambda m, A: m.arange(0.0, 1.0, 0.25)),
    Fn("as_tensor", lambda m, A: m.as_tensor(A.f(2, 3))),
    Fn("empty", lambda m, A: m.empty(2, 3), values=False),
    Fn("empty_like", lambda m, A: m.empty_like(A.f(2, 3)), values=False),
    Fn("eye", lambda m, A: m.eye(3)),
    Fn("from_numpy", lambda m, A: m.from_numpy(np.ones((2, 3), np.float32))),
    Fn("full", lambda m, A: m.full((2, 2), 1.5)),
    Fn("full_like", lambda m, A: m.full_like(A.f(2, 3), 7.0)),
    Fn("linspace", lambda m, A: m.linspace(0.0, 1.0, 5)),
    Fn("logspace", lambda m, A: m.logspace(0.0, 2.0, 3)),
    Fn("meshgrid", lambda m, A: m.meshgrid(A.f(3), A.f(2), indexing="ij")),
    Fn("ones", lambda m, A: m.ones(2, 3)),
    Fn("scalar_tensor", lambda m, A: m.scalar_tensor(2.5)),
    Fn("tensor", lambda m, A: m.tensor([1.0, 2.0])),
    Fn("tril_indices", lambda m, A: m.tril_indices(3, 3)),
    Fn("triu_indices", lambda m, A: m.triu_indices(3, 3)),
    Fn("zeros", lambda m, A: m.zeros(2, 3)),
    # one floating input
    *[_unary(spec) for spec in _FLOAT_UNARY],
    Fn("imag", lambda m, A: m.imag(_c(A))),
    Fn("view_as_real", lambda m, A: m.view_as_real(_c(A))),
    Fn("view_as_complex", lambda m, A: m.view_as_complex(A.f(2, 3, 2))),
    Fn("bitwise_not", lambda m, A: m.bitwise_not(A.i(5, 2, 3))),
    Fn("clamp", lambda m, A: m.clamp(A.f(2, 3), -0.5, 0.5)),
    Fn("clamp:tensors", lambda m, A: m.clamp(A.f(2, 3), A.f(2, 3), A.f(2, 3) + 1)),
    Fn("clamp_max", lambda m, A: m.clamp_max(A.f(2, 3), 0.5)),
    Fn("clamp_min", lambda m, A: m.clamp_min(A.f(2, 3), 0.5)),
    Fn("clip", lambda m, A: m.clip(A.f(2, 3), -0.1, 0.2)),
    Fn("float_power", lambda m, A: m.float_power(A.p(2, 3), 2), x64=True),
    Fn("pow:scalar", lambda m, A: m.pow(A.p(2, 3), 2.5)),
    Fn("pow:scalar_base", lambda m, A: m.pow(2.0, A.f(2, 3))),
    Fn("round:decimals", lambda m, A: m.round(A.f(2, 3) * 10, decimals=1)),
    Fn("softmax", lambda m, A: m.softmax(A.f(2, 3), 1)),
    Fn("softmax:dtype", lambda m, A: m.softmax(A.f(2, 3), 1, dtype=m.float32)),
    Fn("log_softmax", lambda m, A: m.log_softmax(A.f(2, 3), -1)),
    Fn("logcumsumexp", lambda m, A: m.logcumsumexp(A.f(2, 3), 1)),
    Fn("cumsum", lambda m, A: m.cumsum(A.f(2, 3), 1)),
    Fn("cumsum:dtype", lambda m, A: m.cumsum(A.f(2, 3), 1, dtype=m.float32)),
    Fn("cumprod", lambda m, A: m.cumprod(A.f(2, 3), 0)),
    Fn("cummax", lambda m, A: m.cummax(A.f(2, 3), 1)),
    Fn("cummin", lambda m, A: m.cummin(A.f(2, 3), 0)),
    Fn("sum:dtype", lambda m, A: m.sum(A.f(2, 3), dtype=m.float32)),
    Fn("sum:dim", lambda m, A: m.sum(A.f(2, 3), 1)),
    Fn("mean:dim", lambda m, A: m.mean(A.f(2, 3), 0, keepdim=True)),
    Fn("prod:dim", lambda m, A: m.prod(A.f(2, 3), 1)),
    Fn("prod:dtype", lambda m, A: m.prod(A.f(2, 3), dtype=m.float32)),
    Fn("prod:int", lambda m, A: m.prod(A.i(3, 2, 3))),
    Fn("max:dim", lambda m, A: m.max(A.f(2, 3), 1)),
    Fn("min:dim", lambda m, A: m.min(A.f(2, 3), 0)),
    Fn("median:dim", lambda m, A: m.median(A.f(3, 4), 1)),
    Fn("kthvalue", lambda m, A: m.kthvalue(A.f(3, 4), 2, 1)),
    Fn("topk", lambda m, A: m.topk(A.f(3, 4), 2)),
    Fn("quantile", lambda m, A: m.quantile(A.f(3, 4), 0.3, dim=1)),
    Fn("quantile:all", lambda m, A: m.quantile(A.f(3, 4), 0.75)),
    Fn("quantile:tensor_q", lambda m, A: m.quantile(A.f(3, 4), A.const([0.25, 0.5], "float32"))),
    Fn("norm:1", lambda m, A: m.norm(A.f(2, 3), 1)),
    Fn("norm:inf", lambda m, A: m.norm(A.f(2, 3), float("inf"))),
    Fn("norm:dim", lambda m, A: m.norm(A.f(2, 3), 3, dim=1)),
    Fn("norm:fro", lambda m, A: m.norm(A.f(2, 3), "fro")),
    Fn("norm:nuc", lambda m, A: m.norm(A.f(3, 4), "nuc")),
    Fn("norm:dtype", lambda m, A: m.norm(A.f(2, 3), dtype=m.float32)),
    Fn("std:dim", lambda m, A: m.std(A.f(2, 3), 1, correction=0)),
    Fn("logsumexp:dims", lambda m, A: m.logsumexp(A.f(2, 3, 4), (0, 2), keepdim=True)),
    Fn("diff", lambda m, A: m.diff(A.f(3, 4), dim=1)),
    Fn("diag:vector", lambda m, A: m.diag(A.f(3))),
    Fn("diag_embed", lambda m, A: m.diag_embed(A.f(2, 3))),
    Fn("tril:diagonal", lambda m, A: m.tril(A.f(3, 4), -1)),
    Fn("trace:int", lambda m, A: m.trace(A.i(5, 3, 3))),
    Fn("chunk", lambda m, A: m.chunk(A.f(3, 4), 2, 1)),
    Fn("dsplit", lambda m, A: m.dsplit(A.f(2, 2, 4), 2)),
    Fn("hsplit", lambda m, A: m.hsplit(A.f(2, 4), 2)),
    Fn("vsplit", lambda m, A: m.vsplit(A.f(4, 2), 2)),
    Fn("split", lambda m, A: m.split(A.f(3, 4), [1, 3], 1)),
    Fn("tensor_split", lambda m, A: m.tensor_split(A.f(3, 4), 3, 1)),
    Fn("unbind", lambda m, A: m.unbind(A.f(2, 3), 1)),
    Fn("broadcast_to", lambda m, A: m.broadcast_to(A.f(3), (2, 3))),
    Fn("flatten", lambda m, A: m.flatten(A.f(2, 3, 4), 1)),
    Fn("unflatten", lambda m, A: m.unflatten(A.f(3, 4), 1, (2, 2))),
    Fn("flip", lambda m, A: m.flip(A.f(2, 3), (0,))),
    Fn("moveaxis", lambda m, A: m.moveaxis(A.f(2, 3, 4), 1, 0)),
    Fn("movedim", lambda m, A: m.movedim(A.f(2, 3, 4), 0, -1)),
    Fn("narrow", lambda m, A: m.narrow(A.f(3, 4), 1, 1, 2)),
    Fn("permute", lambda m, A: m.permute(A.f(2, 3, 4), (2, 0, 1))),
    Fn("reshape", lambda m, A: m.reshape(A.f(2, 3), (3, 2))),
    Fn("roll", lambda m, A: m.roll(A.f(3, 4), 1, 0)),
    Fn("rot90", lambda m, A: m.rot90(A.f(2, 3))),
    Fn("select", lambda m, A: m.select(A.f(2, 3, 4), 1, -1)),
    Fn("squeeze", lambda m, A: m.squeeze(A.f(2, 1, 3))),
    Fn("unsqueeze", lambda m, A: m.unsqueeze(A.f(2, 3), 1)),
    Fn("swapaxes", lambda m, A: m.swapaxes(A.f(2, 3), 0, 1)),
    Fn("swapdims", lambda m, A: m.swapdims(A.f(2, 3, 4), 1, 2)),
    Fn("transpose", lambda m, A: m.transpose(A.f(2, 3, 4), 0, 2)),
    Fn("tile", lambda m, A: m.tile(A.f(2, 3), (2, 1))),
    Fn("repeat_interleave", lambda m, A: m.repeat_interleave(A.f(2, 3), 2, dim=1)),
    Fn(
        "repeat_interleave:tensor",
        lambda m, A: m.repeat_interleave(A.f(2, 3), A.const([1, 3]), dim=0),
        compiled=False,
    ),
    Fn("masked_select", lambda m, A: m.masked_select(A.f(2, 3), _b(A, 2, 3)), compiled=False),
    Fn("nonzero", lambda m, A: m.nonzero(A.f(2, 3) > 0), compiled=False),
    Fn("argwhere", lambda m, A: m.argwhere(A.f(2, 3) > 0), compiled=False),
    Fn("unique", lambda m, A: m.unique(m.round(A.f(6) * 2)), compiled=False),
    Fn("bincount", lambda m, A: m.bincount(A.i(4, 6), A.f(6)), compiled=False),
    Fn("searchsorted", lambda m, A: m.searchsorted(m.sort(A.f(5)).values, A.f(2, 3))),
    Fn("bucketize", lambda m, A: m.bucketize(A.f(2, 3), m.sort(A.f(5)).values)),
    # two or more floating inputs
    *[Fn(name, lambda m, A, name=name: getattr(m, name)(A.p(2, 3), A.p(2, 3))) for name in _BINARY],
    Fn("add:alpha", lambda m, A: m.add(A.f(2, 3), A.f(2, 3), alpha=2)),
    Fn("add:mixed", lambda m, A: m.add(A.f(2, 3), A.f32(2, 3))),
    Fn("bitwise_and", lambda m, A: m.bitwise_and(A.i(5, 2, 3), A.i(5, 2, 3))),
    Fn("bitwise_or", lambda m, A: m.bitwise_or(A.i(5, 2, 3), A.i(5, 2, 3))),
    Fn("bitwise_xor", lambda m, A: m.bitwise_xor(A.i(5, 2, 3), A.i(5, 2, 3))),
    Fn("complex", lambda m, A: m.complex(A.f(2, 3), A.f(2, 3))),
    Fn("polar", lambda m, A: m.polar(A.p(2, 3), A.f(2, 3))),
    Fn("polar:mixed", lambda m, A: m.polar(A.p(2, 3), A.f32(2, 3))),
    Fn("addcdiv", lambda m, A: m.addcdiv(A.f(2, 3), A.f(2, 3), A.p(2, 3), value=2)),
    Fn("addcmul", lambda m, A: m.addcmul(A.f(2, 3), A.f(2, 3), A.f(2, 3), value=0.5)),
    Fn("lerp", lambda m, A: m.lerp(A.f(2, 3), A.f(2, 3), 0.3)),
    Fn("lerp:tensor", lambda m, A: m.lerp(A.f(2, 3), A.f(2, 3), A.p(2, 3))),
    Fn("where", lambda m, A: m.where(_b(A, 2, 3), A.f(2, 3), A.f(2, 3))),
    Fn("where:mixed", lambda m, A: m.where(_b(A, 2, 3), A.f(2, 3), A.f32(2, 3))),
    Fn("allclose", lambda m, A: m.allclose(A.f(2, 3), A.f(2, 3)), compiled=False),
    Fn("equal", lambda m, A: m.equal(A.f(2, 3), A.f(2, 3)), compiled=False),
    Fn("isin", lambda m, A: m.isin(A.i(5, 2, 3), A.const([1, 3]))),
    Fn("max:binary", lambda m, A: m.max(A.f(2, 3), A.f(2, 3))),
    Fn("min:binary", lambda m, A: m.min(A.f(2, 3), A.f(2, 3))),
    Fn("broadcast_tensors", lambda m, A: m.broadcast_tensors(A.f(2, 1), A.f(3))),
    Fn("cat", lambda m, A: m.cat([A.f(2, 3), A.f(2, 3)], 1)),
    Fn("cat:mixed", lambda m, A: m.cat([A.f(2, 3), A.f32(2, 3)])),
    Fn("cat:int", lambda m, A: m.cat([A.f(2, 3), A.i(5, 2, 3)])),
    Fn("concat", lambda m, A: m.concat([A.f(2, 3), A.f32(2, 3)], 1)),
    Fn("concatenate", lambda m, A: m.concatenate([A.f32(2, 3), A.f(2, 3)], 1)),
    Fn("stack", lambda m, A: m.stack([A.f(2, 3), A.f(2, 3)])),
    Fn("stack:mixed", lambda m, A: m.stack([A.f32(2, 3), A.f(2, 3)], 2)),
    Fn("hstack", lambda m, A: m.hstack([A.f(2, 3), A.f32(2, 3)])),
    Fn("vstack", lambda m, A: m.vstack([A.f(2, 3), A.f32(2, 3)])),
    Fn("dstack", lambda m, A: m.dstack([A.f(2, 3), A.f32(2, 3)])),
    Fn("column_stack", lambda m, A: m.column_stack([A.f(3), A.f32(3, 2)])),
    Fn("gather", lambda m, A: m.gather(A.f(3, 4), 1, A.i(4, 3, 2))),
    Fn("take", lambda m, A: m.take(A.f(3, 4), A.i(12, 2, 2))),
    Fn("take_along_dim", lambda m, A: m.take_along_dim(A.f(3, 4), A.i(4, 3, 2), 1)),
    Fn("index_select", lambda m, A: m.index_select(A.f(3, 4), 0, A.const([2, 0]))),
    Fn("index_add", lambda m, A: m.index_add(A.f(3, 4), 0, A.const([2, 0]), A.f(2, 4))),
    Fn("index_copy", lambda m, A: m.index_copy(A.f(3, 4), 0, A.const([2, 0]), A.f(2, 4))),
    Fn(
        "index_copy:mixed",
        lambda m, A: m.index_copy(A.f(3, 4), 0, A.const([2, 0]), A.f32(2, 4)),
    ),
    Fn(
        "index_copy:mixed_self",
        lambda m, A: m.index_copy(A.f32(3, 4), 1, A.const([2, 0]), A.f(3, 2)),
    ),
    Fn("index_fill", lambda m, A: m.index_fill(A.f(3, 4), 1, A.const([2, 0]), -1.0)),
    Fn("masked_fill", lambda m, A: m.masked_fill(A.f(2, 3), _b(A, 2, 3), 0.5)),
    Fn("masked_scatter", lambda m, A: m.masked_scatter(A.f(2, 3), _b(A, 2, 3), A.f(2, 3))),
    Fn("scatter", lambda m, A: m.scatter(A.f(3, 4), 0, A.const([[0, 1, 2, 0]]), A.f(1, 4))),
    Fn(
        "scatter_add",
        lambda m, A: m.scatter_add(A.f(3, 4), 1, A.const([[0, 2], [1, 0], [2, 2]]), A.f(3, 2)),
    ),
    Fn(
        "scatter_reduce",
        lambda m, A: m.scatter_reduce(
            A.f(3, 4), 1, A.const([[0, 2], [1, 0], [2, 2]]), A.f(3, 2), "amax"
        ),
    ),
    # products and distances
    Fn("matmul", lambda m, A: m.matmul(A.f(3, 4), A.f(4, 5))),
    Fn("matmul:vectors", lambda m, A: m.matmul(A.f(4), A.f(4))),
    Fn("matmul:batched", lambda m, A: m.matmul(A.f(2, 3, 4), A.f(4))),
    Fn("mm", lambda m, A: m.mm(A.f(3, 4), A.f(4, 5))),
    Fn("bmm", lambda m, A: m.bmm(A.f(2, 3, 4), A.f(2, 4, 5))),
    Fn("addmm", lambda m, A: m.addmm(A.f(5), A.f(3, 4), A.f(4, 5), beta=2, alpha=0.5)),
    Fn("addbmm", lambda m, A: m.addbmm(A.f(3, 5), A.f(2, 3, 4), A.f(2, 4, 5))),
    Fn("baddbmm", lambda m, A: m.baddbmm(A.f(2, 3, 5), A.f(2, 3, 4), A.f(2, 4, 5))),
    Fn("addmv", lambda m, A: m.addmv(A.f(3), A.f(3, 4), A.f(4))),
    Fn("mv", lambda m, A: m.mv(A.f(3, 4), A.f(4))),
    Fn("dot", lambda m, A: m.dot(A.f(4), A.f(4))),
    Fn("vdot", lambda m, A: m.vdot(A.f(4), A.f(4))),
    Fn("inner", lambda m, A: m.inner(A.f(2, 4), A.f(3, 4))),
    Fn("inner:vectors", lambda m, A: m.inner(A.f(4), A.f(4))),
    Fn("outer", lambda m, A: m.outer(A.f(3), A.f(2))),
    Fn("ger", lambda m, A: m.ger(A.f(3), A.f(2))),
    Fn("kron", lambda m, A: m.kron(A.f(2, 3), A.f(2, 2))),
    Fn("tensordot", lambda m, A: m.tensordot(A.f(2, 3, 4), A.f(3, 4, 5))),
    Fn("tensordot:dims1", lambda m, A: m.tensordot(A.f(2, 3, 4), A.f(4, 5), dims=1)),
    Fn("tensordot:dims0", lambda m, A: m.tensordot(A.f(2, 3), A.f(4), dims=0)),
    Fn("tensordot:lists", lambda m, A: m.tensordot(A.f(2, 3, 4), A.f(2, 4, 5), ([2], [1]))),
    Fn("einsum", lambda m, A: m.einsum("ij,jk->ik", A.f(3, 4), A.f(4, 5))),
    Fn("einsum:batched", lambda m, A: m.einsum("bij,bjk->bik", [A.f(2, 3, 4), A.f(2, 4, 5)])),
    Fn("einsum:dot", lambda m, A: m.einsum("i,i->", A.f(4), A.f(4))),
    Fn("einsum:elementwise", lambda m, A: m.einsum("ij,ij->ij", A.f(2, 3), A.f(2, 3))),
    Fn("einsum:rowsum", lambda m, A: m.einsum("ij,ij->i", A.f(2, 3), A.f(2, 3))),
    Fn("einsum:one", lambda m, A: m.einsum("ij->j", A.f(2, 3))),
    Fn("einsum:three", lambda m, A: m.einsum("ij,jk,kl->il", A.f(2, 3), A.f(3, 4), A.f(4, 2))),
    Fn("einsum:four", lambda m, A: m.einsum("ab,cd,bc,de->ae", *[A.f(3, 3) for _ in range(4)])),
    Fn("einsum:outer", lambda m, A: m.einsum("i,j->ij", A.f(2), A.f(3))),
    Fn("einsum:size1", lambda m, A: m.einsum("ij,j->i", A.f(2, 1), A.f(1))),
    Fn("einsum:broadcast", lambda m, A: m.einsum("ij,jk", A.f(2, 1), A.f(3, 4))),
    Fn("einsum:diagonal", lambda m, A: m.einsum("ii,i->i", A.f(3, 3), A.f(3))),
    Fn("einsum:ellipsis", lambda m, A: m.einsum("...ij,...jk", A.f(2, 2, 3), A.f(3, 4))),
    Fn("einsum:mul_then_bmm", lambda m, A: m.einsum("i,i,i->", A.f(3), A.f(3), A.f(3))),
    Fn("einsum:bmm_then_mul", lambda m, A: m.einsum("i,j,j->i", A.f(2), A.f(3), A.f(3))),
    Fn("einsum:mixed", lambda m, A: m.einsum("ij,ij->ij", A.f(2, 3), A.f32(2, 3))),
    Fn("tensordot:scalar", lambda m, A: m.tensordot(A.f(2, 3), A.f(2, 3))),
    Fn("tensordot:row_col", lambda m, A: m.tensordot(A.f(1, 3), A.f(3, 1), dims=1)),
    Fn("inner:rows", lambda m, A: m.inner(A.f(1, 4), A.f(1, 4))),
    Fn("inner:scalar", lambda m, A: m.inner(A.f(), A.f(3))),
    Fn("cross", lambda m, A: m.cross(A.f(2, 3), A.f(2, 3), dim=1)),
    Fn("cdist", lambda m, A: m.cdist(A.f(3, 4), A.f(5, 4))),
    Fn("cdist:p1", lambda m, A: m.cdist(A.f(2, 3, 4), A.f(2, 5, 4), p=1.0)),
    Fn("cdist:mixed", lambda m, A: m.cdist(A.f(3, 4), A.f32(5, 4))),
    Fn("cosine_similarity", lambda m, A: m.cosine_similarity(A.f(2, 3), A.f(2, 3))),
    Fn("pairwise_distance", lambda m, A: m.pairwise_distance(A.f(2, 3), A.f(2, 3))),
    # random draws: dtypes and shapes
    Fn("bernoulli", lambda m, A: m.bernoulli(A.p(2, 3)), values=False),
    Fn("multinomial", lambda m, A: m.multinomial(A.p(2, 4), 2), values=False),
    Fn("normal", lambda m, A: m.normal(A.f(2, 3), A.p(2, 3)), values=False),
    Fn("poisson", lambda m, A: m.poisson(A.p(2, 3)), values=False),
    Fn("rand", lambda m, A: m.rand(2, 3), values=False),
    Fn("rand_like", lambda m, A: m.rand_like(A.f(2, 3)), values=False),
    Fn("randint", lambda m, A: m.randint(0, 5, (2, 3)), values=False),
    Fn("randint_like", lambda m, A: m.randint_like(A.f(2, 3), 5), values=False),
    Fn("randn", lambda m, A: m.randn(2, 3), values=False),
    Fn("randn_like", lambda m, A: m.randn_like(A.f(2, 3)), values=False),
    Fn("randperm", lambda m, A: m.randperm(5), values=False),
]
