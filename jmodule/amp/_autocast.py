"""``jm.autocast``: PyTorch's automatic mixed precision, op by op.

An autocast region is per-thread state (``state.local.autocast``, as PyTorch's
is thread-local): a sorted tuple of ``(device_type, dtype name)`` pairs, one
per device type with autocast on. The functional ops call :func:`cast` on
their floating-point operands; it looks up the op's policy for the device
type the computation runs on (JAX's default backend: ``"cpu"``, or
``"cuda"`` on GPU) and casts as PyTorch's autocast kernel for that op would:

* ``lower``: every floating operand that is not float64 to the autocast dtype
  (matmuls, convolutions, attention);
* ``fp32``: every floating operand that is not float64 to float32 (losses,
  and on CUDA norms, softmax's relatives, ``exp``/``log``/``pow``, ...);
* ``fp32_set_opt_dtype``: the op runs and returns float32 when its first
  operand is floating and no ``dtype`` was asked for (CUDA's softmax,
  log_softmax, sum, prod, cumsum, norms);
* ``promote``: every floating operand that is not float64 to the widest
  floating type among them (float32 when any is float32; a half type other
  than the autocast dtype before any float32 one is PyTorch's RuntimeError);
* ops on neither list run in the dtype of their inputs.

A function PyTorch runs as a composite of listed ops follows the ops it runs
(:func:`cast_first`): on CPU ``jm.tensordot`` and ``jm.inner`` lower the
``mm`` they run, and ``jm.einsum`` each pairwise contraction it runs as a
``bmm`` (``jmodule/_torch_functions/linalg.py``).

The tables are PyTorch 2.13's: ``CUDA`` is ``AT_FORALL_LOWER_PRECISION_FP``,
``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``,
``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`` and ``AT_FORALL_PROMOTE`` of
``ATen/autocast_mode.h`` (the header in the torch wheel); ``CPU`` is the set
of ops with an ``AutocastCPU`` kernel in torch's dispatcher, each classified
by running it under ``torch.autocast("cpu")``. ``tests/amp/test_amp.py`` checks
both against the installed torch.

Compiled programs include the region in their key (``jmodule/_lowering``):
a function traced outside autocast and called inside traces again.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from jmodule._lowering import state as _state

__all__ = [
    "CPU",
    "CUDA",
    "autocast",
    "cast",
    "cast_first",
    "cast_given_dtype",
    "get_autocast_dtype",
    "is_autocast_available",
    "is_autocast_enabled",
    "lower_dtype",
    "to",
]

F = TypeVar("F", bound=Callable[..., Any])

LOWER, FP32, FP32_SET_OPT_DTYPE, PROMOTE = "lower", "fp32", "fp32_set_opt_dtype", "promote"


def _table(**policies: str) -> dict[str, str]:
    return {op: policy for policy, ops in policies.items() for op in ops.split()}


#: PyTorch's CUDA autocast policy per aten op (``ATen/autocast_mode.h``).
CUDA: dict[str, str] = _table(
    lower="_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d "
    "conv_transpose3d convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot "
    "linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell "
    "_thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention",
    fp32="acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow "
    "softplus layer_norm native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm "
    "cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss "
    "margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss "
    "multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp "
    "upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d "
    "_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d "
    "upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d "
    "upsample_bicubic2d _upsample_bicubic2d_aa",
    fp32_set_opt_dtype="prod softmax log_softmax cumprod cumsum linalg_vector_norm "
    "linalg_matrix_norm sum norm",
    promote="addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot "
    "scatter_add",
)

#: PyTorch's CPU autocast policy per aten op (the ops with an ``AutocastCPU`` kernel).
CPU: dict[str, str] = _table(
    lower="conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear "
    "_convolution matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d "
    "conv_transpose3d prelu scaled_dot_product_attention _native_multi_head_attention "
    "_addmm_activation",
    fp32="avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft "
    "cdist trace view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve "
    "orgqr ormqr pinverse max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d "
    "reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d replication_pad3d "
    "mse_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss "
    "poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss huber_loss "
    "margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss ctc_loss "
    "kl_div multilabel_margin_loss multilabel_margin_loss_forward "
    "binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn "
    "fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft "
    "fft_ihfft linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals "
    "linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv "
    "linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd "
    "triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d "
    "linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh linalg_lstsq "
    "linalg_inv_ex grid_sampler_2d grid_sampler_3d _grid_sampler_2d_cpu_fallback",
    promote="stack cat index_copy",
)

_POLICIES = {"cpu": CPU, "cuda": CUDA}
_DEFAULT_DTYPE = {"cpu": "bfloat16", "cuda": "float16"}
_SUPPORTED = {"cpu": ("bfloat16", "float16"), "cuda": ("bfloat16", "float16")}


def _platform() -> str:
    """The PyTorch device type the computation runs on (JAX's default backend)."""
    backend = jax.default_backend()
    return "cuda" if backend in ("gpu", "cuda", "rocm") else backend


def _cuda_available() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def is_autocast_available(device_type: str) -> bool:
    """Whether ``jm.autocast`` has op lists for ``device_type`` (``"cpu"`` or ``"cuda"``).

    >>> import jmodule as jm
    >>> jm.amp.is_autocast_available("cpu")
    True
    """
    return device_type in _POLICIES


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether an autocast region for ``device_type`` is active in this thread.

    >>> import jmodule as jm
    >>> with jm.autocast("cpu"):
    ...     jm.amp.is_autocast_enabled("cpu")
    True
    """
    return dict(_state.local.autocast or ()).get(device_type) is not None


def get_autocast_dtype(device_type: str) -> Any:
    """The dtype autocast casts to for ``device_type`` (its default outside a region).

    >>> import jmodule as jm
    >>> jm.amp.get_autocast_dtype("cpu")
    dtype(bfloat16)
    """
    name = dict(_state.local.autocast or ()).get(device_type, _DEFAULT_DTYPE.get(device_type))
    if name is None:
        raise ValueError(f"autocast has no dtype for device type {device_type!r}")
    return jnp.dtype(name)


class autocast:
    """Automatic mixed precision for a region, as ``torch.autocast``.

    Inside the region, jmodule's functional ops (and the layers built on
    them) cast their floating-point inputs as PyTorch's autocast does for
    ``device_type``: matmuls, convolutions and attention run in ``dtype``;
    losses run in float32; on CUDA also softmax, log_softmax, layer_norm,
    group_norm, norms, exp/log/pow; everything else follows its inputs.
    Parameters keep their dtype (ops cast copies), and gradients come back in
    the parameters' dtype. A nested ``autocast(..., enabled=False)`` turns it
    off; the state is per thread. It works eagerly and inside ``jm.compile``
    (the region is part of the compiled program's key: a function traced
    outside autocast and called inside traces again).

    Differences JAX forces: only jmodule's ops are autocast; plain ``jnp``
    operations (``x @ w`` on ``jax.Array``s) follow their inputs' dtypes.
    ``cache_enabled`` is accepted and has no effect (XLA removes repeated
    casts itself). The device type an op uses is the one JAX computes on
    (its default backend).

    Args:
        device_type: ``"cpu"`` or ``"cuda"``.
        dtype: the low-precision dtype; default bfloat16 on CPU, float16 on CUDA.
        enabled: False turns autocast off for ``device_type`` in the region.
        cache_enabled: accepted, as PyTorch's (no effect).

    Raises:
        ValueError: an unknown device type.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> import jmodule.nn.functional as F
    >>> x, w = jnp.ones((2, 3)), jnp.ones((4, 3))
    >>> with jm.autocast("cpu"):
    ...     y = F.linear(x, w)
    ...     loss = F.mse_loss(y, jnp.zeros((2, 4)))
    >>> y.dtype, loss.dtype
    (dtype(bfloat16), dtype('float32'))
    """

    def __init__(
        self,
        device_type: str,
        dtype: Any = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if device_type not in _POLICIES:
            raise ValueError(
                f"jm.autocast has op lists for 'cpu' and 'cuda', got device_type {device_type!r}"
            )
        self.device = device_type
        name = _DEFAULT_DTYPE[device_type] if dtype is None else jnp.dtype(dtype).name
        self.fast_dtype = jnp.dtype(name)
        self._enabled = bool(enabled)
        self._cache_enabled = cache_enabled
        if self._enabled and device_type == "cuda" and not _cuda_available():
            warnings.warn(
                "CUDA is not available or torch_xla is imported. Disabling autocast.",
                stacklevel=2,
            )
            self._enabled = False
        if self._enabled and name not in _SUPPORTED[device_type]:
            kind = "CPU" if device_type == "cpu" else "CUDA"
            warnings.warn(
                f"In {kind} autocast, but the target dtype is not supported. Disabling "
                "autocast.\n"
                f"{kind} Autocast only supports dtype of "
                + " and ".join(f"torch.{d}" for d in _SUPPORTED[device_type])
                + " currently.",
                stacklevel=2,
            )
            self._enabled = False
        self._name = name
        self._previous: list[tuple | None] = []

    def __enter__(self) -> autocast:
        local = _state.local
        before = local.autocast
        self._previous.append(before)
        regions = dict(before or ())
        if self._enabled:
            regions[self.device] = self._name
        else:
            regions.pop(self.device, None)
        local.autocast = tuple(sorted(regions.items())) or None
        return self

    def __exit__(self, *exc: object) -> None:
        _state.local.autocast = self._previous.pop()

    def __call__(self, func: F) -> F:
        """Use as a decorator: each call of ``func`` runs in a region of its own."""

        @functools.wraps(func)
        def decorate_autocast(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.device, self.fast_dtype, self._enabled, self._cache_enabled):
                return func(*args, **kwargs)

        return decorate_autocast  # type: ignore[return-value]


def _floating(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def to(x: Any, dtype: Any) -> Any:
    """``x`` as ``dtype``, a traced half-precision value widened with its rounding kept."""
    if x.dtype == dtype:
        return x
    out = jnp.asarray(x).astype(dtype)
    if isinstance(x, jax.core.Tracer) and jnp.finfo(x.dtype).bits < jnp.finfo(dtype).bits:
        # Widening a half-precision value: XLA may fold the convert into the op that
        # made it and keep that op's float32 result ("excess precision"), where
        # PyTorch's op rounded to the half type. Keep the rounding.
        info = jnp.finfo(x.dtype)
        out = jax.lax.reduce_precision(out, info.nexp, info.nmant)
    return out


def cast(op: str, *args: Any) -> tuple[Any, ...]:
    """``args`` cast for aten op ``op`` under this thread's autocast region (as given without one).

    Arrays that are not floating point, and everything that is not an array
    (None, Python numbers), pass unchanged.
    """
    regions = _state.local.autocast
    if regions is None:
        return args
    device = _platform()
    name = dict(regions).get(device)
    policy = _POLICIES[device].get(op) if name is not None else None
    if policy is None:
        return args
    low = jnp.dtype(name)
    if policy == LOWER:
        return tuple(to(a, low) if _floating(a) and a.dtype != jnp.float64 else a for a in args)
    if policy == FP32:
        f32 = jnp.dtype(jnp.float32)
        return tuple(to(a, f32) if _floating(a) and a.dtype != jnp.float64 else a for a in args)
    if policy == FP32_SET_OPT_DTYPE:
        if not args or not _floating(args[0]):
            return args
        return (to(args[0], jnp.dtype(jnp.float32)), *args[1:])
    # PROMOTE: the widest floating type among the operands that are not float64, found
    # as PyTorch's ``prioritize`` does (from the autocast dtype, operand by operand).
    wide = low
    for a in args:
        if not _floating(a) or a.dtype == jnp.float64:
            continue
        if wide == jnp.float32 or a.dtype == jnp.float32:
            wide = jnp.dtype(jnp.float32)
        elif a.dtype != low:
            raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return tuple(to(a, wide) if _floating(a) and a.dtype != jnp.float64 else a for a in args)


def cast_first(ops: tuple[str, ...], *args: Any) -> tuple[Any, ...]:
    """``args`` cast by the policy of the first of ``ops`` that has one (as given without).

    For a function PyTorch runs as a composite: its own op first (autocast casts at
    the outermost listed op; the ops it calls then run in the dtypes it gave them),
    then the op its decomposition calls (``("tensordot", "mm")``: CUDA promotes
    tensordot, CPU has no policy for it but lowers the ``mm`` it runs).
    """
    regions = _state.local.autocast
    if regions is None:
        return args
    table = _POLICIES[_platform()]
    for op in ops:
        if op in table:
            return cast(op, *args)
    return args


def cast_given_dtype(op: str, *args: Any) -> tuple[Any, ...]:
    """``args`` of a reduction called with ``dtype=``, cast for aten op ``op``.

    ``fp32_set_opt_dtype`` ops (CUDA's sum, prod, cumsum, ...) run in the dtype asked
    for, as given; other policies (CPU's fp32 ``prod``) cast as :func:`cast` does.
    """
    if _state.local.autocast is None or policy(op) == FP32_SET_OPT_DTYPE:
        return args
    return cast(op, *args)


def lower_dtype(op: str) -> Any:
    """The dtype this thread's autocast region runs aten op ``op`` in when ``op`` is on
    the lower-precision list for the platform; None otherwise (and outside a region)."""
    regions = _state.local.autocast
    if regions is None:
        return None
    device = _platform()
    name = dict(regions).get(device)
    if name is None or _POLICIES[device].get(op) != LOWER:
        return None
    return jnp.dtype(name)


def policy(op: str, device_type: str | None = None) -> str | None:
    """The policy of aten op ``op`` for ``device_type`` (default: where JAX computes), or None."""
    return _POLICIES[device_type or _platform()].get(op)
