"""``SyncBatchNorm``: batch statistics averaged over the data-parallel axis."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jmodule._placement import device as _device
from jmodule.nn import functional as F
from jmodule.nn.modules.batchnorm import _BatchNorm
from jmodule.nn.parameter import as_array

__all__ = ["SyncBatchNorm"]


def _bound(axes: tuple[str, ...]) -> tuple[str, ...]:
    """The names in ``axes`` bound as per-device axes here (shard_map, named vmap)."""
    out = []
    for axis in axes:
        try:
            jax.lax.axis_size(axis)
        except NameError:
            continue
        out.append(axis)
    return tuple(out)


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation whose statistics cover the whole data-parallel batch.

    As ``torch.nn.SyncBatchNorm``, with the process group replaced by mesh
    axis names. Two ways to run data parallel in JAX, both covered:

    - Global view (``jm.compile`` or ``jax.jit`` on a batch sharded over
      ``"data"``): the batch is one array, so its mean and variance already
      span every device; XLA inserts the cross-device reduction. Here
      ``SyncBatchNorm`` and ``BatchNorm`` compute the same thing.
    - Per-device view (inside ``jax.shard_map`` or ``jax.vmap(...,
      axis_name=...)`` where ``process_group`` is bound): each device sees
      its local batch, and ``SyncBatchNorm`` averages the mean and the
      variance over the axis with ``lax.pmean`` (equal local batch sizes,
      as SPMD requires), where ``BatchNorm`` would use local statistics.

    Evaluation mode uses the running statistics, as in PyTorch. Inputs are
    ``(N, C, *)`` with at least two dimensions.

    Args:
        num_features: C, the channel count.
        eps, momentum, affine, track_running_stats: as ``BatchNorm``.
        process_group: the mesh axis name (or tuple of names) to average over;
            default ``"data"``. PyTorch's process groups have no JAX
            counterpart: SPMD axes play their role.
        device, dtype: where and in what dtype to create the parameters.
        bias: learn a bias (with ``affine``).

    >>> import jax, jax.numpy as jnp
    >>> import jmodule as jm
    >>> bn = jm.nn.SyncBatchNorm(1)
    >>> x = jnp.array([[[0.0], [2.0]], [[4.0], [6.0]]])  # 2 replicas x local batch (2, 1)
    >>> per_replica = lambda xs: jm.func.functional_call(bn, {}, xs)
    >>> jax.vmap(per_replica, axis_name="data")(x)[:, :, 0].round(4)  # by the global batch
    Array([[-1.3416, -0.4472],
           [ 0.4472,  1.3416]], dtype=float32)
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: str | tuple[str, ...] | None = None,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias
        )
        self.process_group = process_group

    def _axes(self) -> tuple[str, ...]:
        group = "data" if self.process_group is None else self.process_group
        return tuple(group) if isinstance(group, (tuple, list)) else (group,)

    def _check_input_dim(self, input: Any) -> None:
        if input.ndim < 2:
            raise ValueError(f"expected at least 2D input (got {input.ndim}D input)")
        if input.shape[1] != self.num_features:
            raise ValueError(
                f"SyncBatchNorm({self.num_features}) expected input with {self.num_features} "
                f"channels in dimension 1, got shape {tuple(input.shape)}"
            )

    def forward(self, input: Any) -> jax.Array:
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        axes = _bound(self._axes()) if use_batch_stats else ()
        if not axes:
            return super().forward(input)
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked = self.num_batches_tracked + 1
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / self.num_batches_tracked
        x = as_array(input)
        reduce = tuple(i for i in range(x.ndim) if i != 1)
        shape = [1] * x.ndim
        shape[1] = x.shape[1]
        xc = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        mean = jax.lax.pmean(jnp.mean(xc, axis=reduce), axes)
        var = jax.lax.pmean(jnp.mean(jnp.square(xc - mean.reshape(shape)), axis=reduce), axes)
        n = (x.size // x.shape[1]) * jax.lax.psum(1, axes)
        out = F.batch_norm_update(x, mean, var, self.weight, self.bias, False, 0.0, self.eps)[0]
        if self.training and self.track_running_stats:
            m = jnp.asarray(factor, xc.dtype)
            rm, rv = as_array(self.running_mean), as_array(self.running_var)
            unbiased = jax.lax.stop_gradient(var) * (n / (n - 1))
            self.running_mean = ((1 - m) * rm + m * jax.lax.stop_gradient(mean)).astype(rm.dtype)
            self.running_var = ((1 - m) * rv + m * unbiased).astype(rv.dtype)
        return out

    @classmethod
    def convert_sync_batchnorm(
        cls, module: Any, process_group: str | tuple[str, ...] | None = None
    ) -> Any:
        """Replace every ``BatchNorm*`` in ``module`` by a ``SyncBatchNorm`` sharing its state.

        As ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: parameters (the
        same Parameter objects), buffers and training mode carry over;
        returns the converted module (a new one if ``module`` itself is a
        BatchNorm).

        >>> from jmodule import nn
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        >>> nn.SyncBatchNorm.convert_sync_batchnorm(net)[1]
        SyncBatchNorm(4, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)
        """
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            with _device.device("meta"):
                out = cls(
                    module.num_features,
                    module.eps,
                    module.momentum,
                    module.affine,
                    module.track_running_stats,
                    process_group,
                    bias=module._parameters.get("bias") is not None or not module.affine,
                )
            for name in ("weight", "bias"):
                if name in module._parameters:
                    out.register_parameter(name, module._parameters[name])
            for name, value in module._buffers.items():
                out._buffers[name] = value
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out
