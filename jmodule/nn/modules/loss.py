"""Loss modules, as ``torch.nn``'s: thin wrappers over ``jm.nn.functional``.

Class weights (``weight``, ``pos_weight``) are buffers, as in PyTorch, so
they appear in ``state_dict()`` and follow ``.to(...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jmodule.nn import functional as F
from jmodule.nn.functional._loss import legacy_get_string
from jmodule.nn.modules.distance import PairwiseDistance
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import as_array

__all__ = [
    "BCELoss",
    "BCEWithLogitsLoss",
    "CTCLoss",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "GaussianNLLLoss",
    "HingeEmbeddingLoss",
    "HuberLoss",
    "KLDivLoss",
    "L1Loss",
    "MSELoss",
    "MarginRankingLoss",
    "MultiLabelMarginLoss",
    "MultiLabelSoftMarginLoss",
    "MultiMarginLoss",
    "NLLLoss",
    "PoissonNLLLoss",
    "SmoothL1Loss",
    "SoftMarginLoss",
    "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]


def _buffer(value: Any) -> Any:
    return None if value is None else as_array(value)


class _Loss(Module):
    """Base of the losses: holds ``reduction`` (legacy ``size_average``/``reduce`` mapped)."""

    def __init__(
        self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean"
    ) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            self.reduction = legacy_get_string(size_average, reduce)
        else:
            self.reduction = reduction


class _WeightedLoss(_Loss):
    """A loss with a per-class ``weight`` buffer (None when not given)."""

    def __init__(
        self,
        weight: Any = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", _buffer(weight))


class L1Loss(_Loss):
    """Mean absolute error, as ``torch.nn.L1Loss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.L1Loss()(jnp.array([1.0, -1.0]), jnp.zeros(2))
    Array(1., dtype=float32)
    """

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.l1_loss(input, target, reduction=self.reduction)


class MSELoss(_Loss):
    """Mean squared error, as ``torch.nn.MSELoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.MSELoss(reduction="sum")(jnp.array([1.0, 2.0]), jnp.zeros(2))
    Array(5., dtype=float32)
    """

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.mse_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Smooth L1 (quadratic below ``beta``), as ``torch.nn.SmoothL1Loss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.SmoothL1Loss(beta=0.5)(jnp.array([0.25]), jnp.zeros(1))
    Array(0.0625, dtype=float32)
    """

    def __init__(
        self,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
        beta: float = 1.0,
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Huber loss (quadratic below ``delta``), as ``torch.nn.HuberLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.HuberLoss(delta=0.5)(jnp.array([2.0]), jnp.zeros(1))
    Array(0.875, dtype=float32)
    """

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class PoissonNLLLoss(_Loss):
    """Poisson negative log-likelihood, as ``torch.nn.PoissonNLLLoss``.

    See :func:`jmodule.nn.functional.poisson_nll_loss` for ``log_input``,
    ``full`` and ``eps``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.PoissonNLLLoss()(jnp.zeros(2), jnp.array([1.0, 2.0]))
    Array(1., dtype=float32)
    """

    def __init__(
        self,
        log_input: bool = True,
        full: bool = False,
        size_average: bool | None = None,
        eps: float = 1e-8,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_input = log_input
        self.full = full
        self.eps = eps

    def forward(self, log_input: Any, target: Any) -> jax.Array:
        return F.poisson_nll_loss(
            log_input,
            target,
            log_input=self.log_input,
            full=self.full,
            eps=self.eps,
            reduction=self.reduction,
        )


class GaussianNLLLoss(_Loss):
    """Gaussian negative log-likelihood, as ``torch.nn.GaussianNLLLoss``.

    Call: ``loss(input, target, var)``; see
    :func:`jmodule.nn.functional.gaussian_nll_loss` for the shapes ``var`` may take.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.GaussianNLLLoss(reduction="sum")(jnp.zeros(2), jnp.zeros(2), jnp.ones(2))
    Array(0., dtype=float32)
    """

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean") -> None:
        super().__init__(None, None, reduction)
        self.full = full
        self.eps = eps

    def forward(self, input: Any, target: Any, var: Any) -> jax.Array:
        return F.gaussian_nll_loss(
            input, target, var, full=self.full, eps=self.eps, reduction=self.reduction
        )


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of class indices, as ``torch.nn.NLLLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.NLLLoss()(jnp.log(jnp.array([[0.5, 0.5]])), jnp.array([1])).round(4)
    Array(0.6931, dtype=float32)
    """

    def __init__(
        self,
        weight: Any = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.nll_loss(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
        )


class CrossEntropyLoss(_WeightedLoss):
    """Cross-entropy of logits, as ``torch.nn.CrossEntropyLoss``.

    Targets are class indices (integers) or class probabilities (floats
    shaped like the input); see :func:`jmodule.nn.functional.cross_entropy`.

    Args:
        weight: per-class weights ``(C,)`` (a buffer).
        ignore_index: class-index targets to skip.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.
        label_smoothing: in [0, 1].

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.CrossEntropyLoss()(jnp.zeros((2, 4)), jnp.array([0, 3])).round(4)
    Array(1.3863, dtype=float32)
    """

    def __init__(
        self,
        weight: Any = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class MultiLabelSoftMarginLoss(_WeightedLoss):
    """Multi-label one-versus-all logistic loss, as ``torch.nn.MultiLabelSoftMarginLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.MultiLabelSoftMarginLoss()(jnp.zeros((1, 2)), jnp.array([[1.0, 0.0]])).round(4)
    Array(0.6931, dtype=float32)
    """

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.multilabel_soft_margin_loss(
            input, target, weight=self.weight, reduction=self.reduction
        )


class MultiMarginLoss(_WeightedLoss):
    """Multi-class hinge loss, as ``torch.nn.MultiMarginLoss``.

    Args:
        p: 1 or 2.
        margin: the margin.
        weight: per-class weights ``(C,)`` (a buffer).
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.

    Raises:
        ValueError: ``p`` not 1 or 2, or a ``weight`` that is not 1-D.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.MultiMarginLoss(p=2)(jnp.array([[0.1, 0.2, 0.4, 0.8]]), jnp.array([3])).round(4)
    Array(0.1525, dtype=float32)
    """

    def __init__(
        self,
        p: int = 1,
        margin: float = 1.0,
        weight: Any = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if p != 1 and p != 2:
            raise ValueError("only p == 1 and p == 2 supported")
        if weight is not None and self.weight.ndim != 1:
            raise ValueError(
                "MultiMarginLoss: expected weight to be None or 1D tensor, got "
                f"{self.weight.ndim}D instead"
            )
        self.p = p
        self.margin = margin

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.multi_margin_loss(
            input,
            target,
            p=self.p,
            margin=self.margin,
            weight=self.weight,
            reduction=self.reduction,
        )


class MultiLabelMarginLoss(_Loss):
    """Multi-label hinge loss (targets padded with -1), as ``torch.nn.MultiLabelMarginLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> x = jnp.array([[0.1, 0.2, 0.4, 0.8]])
    >>> round(float(nn.MultiLabelMarginLoss()(x, jnp.array([[3, 0, -1, 1]]))), 4)
    0.85
    """

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.multilabel_margin_loss(input, target, reduction=self.reduction)


class BCELoss(_WeightedLoss):
    """Binary cross-entropy of probabilities, as ``torch.nn.BCELoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.BCELoss()(jnp.array([0.5]), jnp.array([1.0])).round(4)
    Array(0.6931, dtype=float32)
    """

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid plus binary cross-entropy, as ``torch.nn.BCEWithLogitsLoss``.

    Args:
        weight: rescales each element's loss (a buffer).
        pos_weight: weight of positive examples per class, broadcast along
            the last axis (a buffer).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> loss = nn.BCEWithLogitsLoss(pos_weight=jnp.array([2.0]))
    >>> loss(jnp.zeros((1, 1)), jnp.ones((1, 1))).round(4)
    Array(1.3863, dtype=float32)
    """

    def __init__(
        self,
        weight: Any = None,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
        pos_weight: Any = None,
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", _buffer(weight))
        self.register_buffer("pos_weight", _buffer(pos_weight))

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.binary_cross_entropy_with_logits(
            input, target, self.weight, pos_weight=self.pos_weight, reduction=self.reduction
        )


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence, as ``torch.nn.KLDivLoss`` (input: log-probabilities).

    ``reduction="mean"`` (the default) warns as PyTorch does; use
    ``"batchmean"`` for the mathematical KL divergence.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> p = jnp.array([[0.5, 0.5]])
    >>> nn.KLDivLoss(reduction="batchmean", log_target=True)(jnp.log(p), jnp.log(p))
    Array(0., dtype=float32)
    """

    def __init__(
        self,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
        log_target: bool = False,
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class HingeEmbeddingLoss(_Loss):
    """``x`` where ``target == 1``, ``max(0, margin - x)`` where ``-1``: ``nn.HingeEmbeddingLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.HingeEmbeddingLoss(margin=2.0)(jnp.array([0.5, 0.5]), jnp.array([1, -1]))
    Array(1., dtype=float32)
    """

    def __init__(
        self,
        margin: float = 1.0,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.hinge_embedding_loss(input, target, margin=self.margin, reduction=self.reduction)


class SoftMarginLoss(_Loss):
    """Two-class logistic loss ``log(1 + exp(-y x))``, as ``torch.nn.SoftMarginLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.SoftMarginLoss(reduction="sum")(jnp.zeros(2), jnp.array([1.0, -1.0])).round(4)
    Array(1.3863, dtype=float32)
    """

    def forward(self, input: Any, target: Any) -> jax.Array:
        return F.soft_margin_loss(input, target, reduction=self.reduction)


class CosineEmbeddingLoss(_Loss):
    """Cosine-similarity embedding loss, as ``torch.nn.CosineEmbeddingLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> x = jnp.array([[1.0, 0.0]])
    >>> nn.CosineEmbeddingLoss()(x, x, jnp.array([1]))
    Array(0., dtype=float32)
    """

    def __init__(
        self,
        margin: float = 0.0,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Any, input2: Any, target: Any) -> jax.Array:
        return F.cosine_embedding_loss(
            input1, input2, target, margin=self.margin, reduction=self.reduction
        )


class MarginRankingLoss(_Loss):
    """``max(0, -y (x1 - x2) + margin)``, as ``torch.nn.MarginRankingLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.MarginRankingLoss(margin=1.0)(jnp.array([2.0]), jnp.array([0.0]), jnp.array([1.0]))
    Array(0., dtype=float32)
    """

    def __init__(
        self,
        margin: float = 0.0,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Any, input2: Any, target: Any) -> jax.Array:
        return F.margin_ranking_loss(
            input1, input2, target, margin=self.margin, reduction=self.reduction
        )


class TripletMarginLoss(_Loss):
    """Triplet loss with a pairwise ``p``-norm distance, as ``torch.nn.TripletMarginLoss``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> a = jnp.zeros((1, 3))
    >>> nn.TripletMarginLoss(margin=0.5)(a, a, a + 1.0)
    Array(0., dtype=float32)
    """

    def __init__(
        self,
        margin: float = 1.0,
        p: float = 2.0,
        eps: float = 1e-6,
        swap: bool = False,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        if margin <= 0:
            raise ValueError(
                f"TripletMarginLoss: expected margin to be greater than 0, got {margin} instead"
            )
        self.margin = margin
        self.p = p
        self.eps = eps
        self.swap = swap

    def forward(self, anchor: Any, positive: Any, negative: Any) -> jax.Array:
        return F.triplet_margin_loss(
            anchor,
            positive,
            negative,
            margin=self.margin,
            p=self.p,
            eps=self.eps,
            swap=self.swap,
            reduction=self.reduction,
        )


class TripletMarginWithDistanceLoss(_Loss):
    """Triplet loss with any distance, as ``torch.nn.TripletMarginWithDistanceLoss``.

    Args:
        distance_function: ``(x1, x2) -> distances``; defaults to a
            :class:`~jmodule.nn.PairwiseDistance` submodule, as in PyTorch
            (a module passed here is registered as a submodule too).
        margin: a positive margin.
        swap: use ``min(d(a, n), d(p, n))`` as the negative distance.
        reduction: ``"none"``, ``"mean"`` or ``"sum"``.

    Raises:
        ValueError: ``margin`` is not positive.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> a = jnp.zeros((1, 3))
    >>> loss = nn.TripletMarginWithDistanceLoss(distance_function=nn.PairwiseDistance(p=1))
    >>> loss(a, a, a + 1.0)
    Array(0., dtype=float32)
    """

    def __init__(
        self,
        *,
        distance_function: Callable[[Any, Any], jax.Array] | None = None,
        margin: float = 1.0,
        swap: bool = False,
        reduction: str = "mean",
    ) -> None:
        super().__init__(None, None, reduction)
        if margin <= 0:
            raise ValueError(
                "TripletMarginWithDistanceLoss: expected margin to be greater than 0, got "
                f"{margin} instead"
            )
        self.distance_function = (
            distance_function if distance_function is not None else PairwiseDistance()
        )
        self.margin = margin
        self.swap = swap

    def forward(self, anchor: Any, positive: Any, negative: Any) -> jax.Array:
        return F.triplet_margin_with_distance_loss(
            anchor,
            positive,
            negative,
            distance_function=self.distance_function,
            margin=self.margin,
            swap=self.swap,
            reduction=self.reduction,
        )


class CTCLoss(_Loss):
    """Connectionist Temporal Classification loss, as ``torch.nn.CTCLoss``.

    Call: ``loss(log_probs (T, N, C), targets, input_lengths, target_lengths)``;
    see :func:`jmodule.nn.functional.ctc_loss` (including its note on gradients).

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> lp = jax.nn.log_softmax(jnp.zeros((4, 1, 3)), axis=-1)
    >>> round(float(nn.CTCLoss()(lp, jnp.array([[1, 2]]), (4,), (2,))), 4)
    0.8432
    """

    def __init__(
        self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False
    ) -> None:
        super().__init__(reduction=reduction)
        self.blank = blank
        self.zero_infinity = zero_infinity

    def forward(
        self, log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any
    ) -> jax.Array:
        return F.ctc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            self.blank,
            self.reduction,
            self.zero_infinity,
        )
