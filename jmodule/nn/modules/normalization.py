"""Normalisation layers, as in ``torch.nn``: LayerNorm, GroupNorm, RMSNorm,
LocalResponseNorm and InstanceNorm1d/2d/3d.

Parameters start at one (``weight``) and zero (``bias``), as PyTorch's;
statistics are computed in float32 for half-precision inputs.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax

from jmodule._placement import factory as _factory
from jmodule.nn import functional as F
from jmodule.nn import init
from jmodule.nn.modules.batchnorm import _NormBase
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = [
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm",
    "LocalResponseNorm",
    "RMSNorm",
]


def _shape(normalized_shape: Any) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dimensions, as ``torch.nn.LayerNorm``.

    Args:
        normalized_shape: int or shape of the trailing dimensions.
        eps: added to the variance.
        elementwise_affine: learn ``weight`` (and ``bias``) of ``normalized_shape``.
        bias: learn ``bias`` (with ``elementwise_affine``).
        device, dtype: where and how to allocate the parameters.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LayerNorm(4)(jnp.ones((2, 4))).shape
    (2, 4)
    """

    def __init__(
        self,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_factory.empty(self.normalized_shape, dtype, device))
            if bias:
                self.bias = Parameter(_factory.empty(self.normalized_shape, dtype, device))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to one, bias to zero."""
        if self.elementwise_affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input: Any) -> jax.Array:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"
        )


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing dimensions, as ``torch.nn.RMSNorm``.

    Args:
        normalized_shape: int or shape of the trailing dimensions.
        eps: added to the mean square; None means the machine epsilon of the
            compute dtype (float32 for half-precision inputs), as PyTorch.
        elementwise_affine: learn a ``weight`` of ``normalized_shape``.
        device, dtype: where and how to allocate the parameters.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.RMSNorm(2, eps=0.0)(jnp.array([[1.0, 1.0]])).round(4)
    Array([[1., 1.]], dtype=float32)
    """

    def __init__(
        self,
        normalized_shape: Any,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_factory.empty(self.normalized_shape, dtype, device))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to one."""
        if self.elementwise_affine:
            init.ones_(self.weight)

    def forward(self, input: Any) -> jax.Array:
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class GroupNorm(Module):
    """Normalise each of ``num_groups`` channel groups, as ``torch.nn.GroupNorm``.

    Args:
        num_groups: groups to split the channels into.
        num_channels: channels expected in dimension 1.
        eps: added to the variance.
        affine: learn per-channel ``weight`` and ``bias``.
        device, dtype: where and how to allocate the parameters.
        bias: learn ``bias`` (with ``affine``).

    Raises:
        ValueError: ``num_channels`` is not divisible by ``num_groups``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.GroupNorm(2, 4)(jnp.ones((3, 4, 5))).shape
    (3, 4, 5)
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(
                f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
            )
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = Parameter(_factory.empty((num_channels,), dtype, device))
            if bias:
                self.bias = Parameter(_factory.empty((num_channels,), dtype, device))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to one, bias to zero."""
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input: Any) -> jax.Array:
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )


class LocalResponseNorm(Module):
    """Local response normalisation across channels, as ``torch.nn.LocalResponseNorm``.

    Args:
        size: channels in the window.
        alpha: multiplicative factor.
        beta: exponent.
        k: additive factor.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.LocalResponseNorm(2)(jnp.ones((1, 4, 3))).shape
    (1, 4, 3)
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    def forward(self, input: Any) -> jax.Array:
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class _InstanceNorm(_NormBase):
    _no_batch_dim = 0

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(
            num_features,
            eps,
            momentum,
            affine,
            track_running_stats,
            device,
            dtype,
            bias=bias,
        )

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # As PyTorch: before version 1 instance norms kept running statistics by
        # default; such keys for a module that tracks none are an error, listed
        # with the others.
        if local_metadata.get("version", None) is None and not self.track_running_stats:
            found = [
                prefix + n for n in ("running_mean", "running_var") if prefix + n in state_dict
            ]
            if found:
                klass = type(self).__name__
                error_msgs.append(
                    "Unexpected running stats buffer(s) {names} for {klass} "
                    "with track_running_stats=False. If state_dict is a "
                    "checkpoint saved before 0.4.0, this may be expected "
                    "because {klass} does not track running stats by default "
                    "since 0.4.0. Please remove these keys from state_dict. If "
                    "the running stats are actually needed, instead set "
                    "track_running_stats=True in {klass} to enable them. See "
                    "the documentation of {klass} for details.".format(
                        names=" and ".join(f'"{k}"' for k in found), klass=klass
                    )
                )
                for key in found:
                    state_dict.pop(key)
        super()._load_from_state_dict(
            state_dict,
            prefix,
            local_metadata,
            strict,
            missing_keys,
            unexpected_keys,
            error_msgs,
        )

    def _check_input_dim(self, input: Any) -> None:
        nb = self._no_batch_dim
        if input.ndim not in (nb, nb + 1):
            raise ValueError(
                f"expected {nb}D or {nb + 1}D input (got {input.ndim}D input, shape "
                f"{tuple(input.shape)})"
            )

    def forward(self, input: Any) -> jax.Array:
        self._check_input_dim(input)
        feature_dim = input.ndim - self._no_batch_dim
        if input.shape[feature_dim] != self.num_features:
            if self.affine:
                raise ValueError(
                    f"expected input's size at dim={feature_dim} to match num_features "
                    f"({self.num_features}), but got: {input.shape[feature_dim]}."
                )
            warnings.warn(
                f"input's size at dim={feature_dim} does not match num_features. You can "
                "silence this warning by not passing in num_features, which is not used "
                "because affine=False",
                UserWarning,
                stacklevel=4,
            )
        batched = input.ndim == self._no_batch_dim + 1
        x = input if batched else input[None]
        use_input_stats = self.training or not self.track_running_stats
        if use_input_stats and x.size // (x.shape[0] * x.shape[1]) <= 1:
            raise ValueError(
                "Expected more than 1 spatial element when training, got input size "
                f"{tuple(input.shape)}"
            )
        momentum = self.momentum if self.momentum is not None else 0.0
        out, mean, var = F.instance_norm_update(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            use_input_stats,
            momentum,
            self.eps,
        )
        if use_input_stats and self.running_mean is not None:
            self.running_mean = mean
            self.running_var = var
        return out if batched else out[0]


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation of ``(N, C, L)`` or ``(C, L)`` input, as PyTorch's.

    Each sample and channel is normalised over its length. Defaults differ
    from BatchNorm: no affine parameters, no running statistics.

    Args:
        num_features: channels ``C``.
        eps: added to the variance.
        momentum: running-statistics factor (None: no update, as PyTorch).
        affine: learn per-channel ``weight`` and ``bias``.
        track_running_stats: keep running statistics and use them in eval mode.
        device, dtype: where and how to allocate.
        bias: learn ``bias`` (with ``affine``).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.InstanceNorm1d(3)(jnp.array([[1.0, 3.0]] * 3)).round(3)
    Array([[-1.,  1.],
           [-1.,  1.],
           [-1.,  1.]], dtype=float32)
    """

    _no_batch_dim = 2


class InstanceNorm2d(_InstanceNorm):
    """Instance normalisation over ``(N, C, H, W)`` or ``(C, H, W)`` input.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.InstanceNorm2d(3, affine=True)(jnp.ones((2, 3, 4, 4))).shape
    (2, 3, 4, 4)
    """

    _no_batch_dim = 3


class InstanceNorm3d(_InstanceNorm):
    """Instance normalisation over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.InstanceNorm3d(2)(jnp.ones((1, 2, 2, 2, 2))).shape
    (1, 2, 2, 2, 2)
    """

    _no_batch_dim = 4
