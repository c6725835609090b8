"""Every functional op of jmodule, called the same way in torch and jmodule (for autocast).

Each case is ``(id, call)`` where ``call(F, A)`` runs the op with ``F`` a
framework's ``nn.functional`` and ``A`` an :class:`Arrays` maker for that
framework; ``tests/test_amp.py`` compares the output dtypes under
``torch.autocast("cpu")`` and ``jm.autocast("cpu")``, op by op.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from _torch import torch


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
