"""Batch normalisation layers."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jmodule._placement import factory as _factory
from jmodule.nn import functional as F
from jmodule.nn import init
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]


class _NormBase(Module):
    """Parameters, running-statistics buffers and ``repr`` shared by batch and
    instance normalisation (PyTorch's ``_NormBase``)."""

    _version = 2

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(_factory.empty((num_features,), dtype, device))
            if bias:
                self.bias = Parameter(_factory.empty((num_features,), dtype, device))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", _factory.empty((num_features,), dtype, device))
            self.register_buffer("running_var", _factory.full((num_features,), 1, dtype, device))
            self.register_buffer(
                "num_batches_tracked",
                _factory.empty((), jnp.int64 if _x64() else jnp.int32, device),
            )
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Zero the running mean and batch count; set the running variance to one."""
        if self.track_running_stats:
            self.running_mean = _refill(self.running_mean, 0)
            self.running_var = _refill(self.running_var, 1)
            self.num_batches_tracked = _refill(self.num_batches_tracked, 0)

    def reset_parameters(self) -> None:
        """Reset running statistics, weight to one and bias to zero."""
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

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
        # As PyTorch: ``num_batches_tracked`` came with version 2, so a state_dict whose
        # metadata does not say it is version 2 or later (a plain dict has no metadata)
        # may lack it; the module then keeps its own count (zero for a meta one).
        version = local_metadata.get("version", None)
        if (version is None or version < 2) and self.track_running_stats:
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                current = self._buffers.get("num_batches_tracked")
                if current is None or isinstance(current, jax.ShapeDtypeStruct):
                    current = jnp.zeros((), jnp.int64 if _x64() else jnp.int32)
                state_dict[key] = current
        super()._load_from_state_dict(
            state_dict,
            prefix,
            local_metadata,
            strict,
            missing_keys,
            unexpected_keys,
            error_msgs,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, bias={self.bias is not None}, "
            f"track_running_stats={self.track_running_stats}"
        )


class _BatchNorm(_NormBase):
    _expected_dims: tuple[int, ...] = ()

    def _check_input_dim(self, input: Any) -> None:
        if input.ndim not in self._expected_dims:
            dims = " or ".join(f"{d}D" for d in self._expected_dims)
            raise ValueError(f"expected {dims} input (got {input.ndim}D input)")
        if input.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) expected input with "
                f"{self.num_features} channels in dimension 1, got shape {tuple(input.shape)}"
            )

    def forward(self, input: Any) -> jax.Array:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked = self.num_batches_tracked + 1
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / self.num_batches_tracked
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        out, mean, var = F.batch_norm_update(
            input,
            self.running_mean if tracked else None,
            self.running_var if tracked else None,
            self.weight,
            self.bias,
            use_batch_stats,
            factor,
            self.eps,
        )
        if self.training and self.track_running_stats:
            self.running_mean = mean
            self.running_var = var
        return out


def _x64() -> bool:
    return jax.config.read("jax_enable_x64")


def _refill(value: Any, fill: Any) -> Any:
    if isinstance(value, jax.ShapeDtypeStruct):
        return value
    return _factory.filled(value, fill)


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over (N, C) or (N, C, L) input, as ``torch.nn.BatchNorm1d``.

    Buffers ``running_mean``, ``running_var`` and ``num_batches_tracked``
    (int32 unless JAX's x64 mode is on) update in training mode, eagerly and
    in compiled code alike.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> bn = nn.BatchNorm1d(3)
    >>> _ = bn(jnp.arange(12.0).reshape(4, 3))
    >>> int(bn.num_batches_tracked)
    1
    """

    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over ``(N, C, H, W)`` input, as ``torch.nn.BatchNorm2d``.

    Statistics per channel over the batch and both spatial axes; buffers as
    :class:`BatchNorm1d`.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.BatchNorm2d(3)(jnp.ones((2, 3, 4, 4))).shape
    (2, 3, 4, 4)
    """

    _expected_dims = (4,)


class BatchNorm3d(_BatchNorm):
    """Batch normalisation over ``(N, C, D, H, W)`` input, as ``torch.nn.BatchNorm3d``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> nn.BatchNorm3d(2)(jnp.ones((2, 2, 3, 3, 3))).shape
    (2, 2, 3, 3, 3)
    """

    _expected_dims = (5,)
