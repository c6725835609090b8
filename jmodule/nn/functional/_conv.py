"""Convolutions and transposed convolutions, as in ``torch.nn.functional``.

Layouts are PyTorch's: input ``(N, C, *spatial)`` (or unbatched
``(C, *spatial)``), weight ``(out, in / groups, *kernel)`` for convolutions
and ``(in, out / groups, *kernel)`` for transposed ones. Everything lowers to
``jax.lax.conv_general_dilated``, except small output maps on the CPU, which
run as im2col + one matmul (``_conv_lowering``: XLA's CPU convolution is up to
50x slower there). bfloat16/float16 convolutions accumulate in
float32 and round once, as PyTorch's CPU and cuDNN kernels do. Inputs and
weights of different float dtypes are promoted (PyTorch raises instead).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jmodule.nn.functional import _conv_lowering as _lowering
from jmodule.nn.functional._utils import autocast, compute_dtype, jit, ntuple, shape_str
from jmodule.nn.parameter import as_array

__all__ = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
]


def _batched(x: jax.Array, nd: int, name: str) -> tuple[jax.Array, bool]:
    """``x`` with a batch dimension, and whether it had one."""
    if x.ndim == nd + 2:
        return x, True
    if x.ndim == nd + 1:
        return x[None], False
    raise RuntimeError(
        f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got "
        f"input of size: {shape_str(x.shape)}"
    )


def _tuple_arg(value: Any, nd: int, what: str, name: str) -> tuple[int, ...]:
    out = ntuple(value, nd)
    if len(out) != nd:
        raise RuntimeError(f"{name}: expected {what} to be a single integer or a list of {nd}")
    return tuple(int(v) for v in out)


def same_padding(kernel: tuple, dilation: tuple) -> list[tuple[int, int]]:
    """PyTorch's ``padding='same'``: total ``d * (k - 1)``, the extra element on the right."""
    pads = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        pads.append((total // 2, total - total // 2))
    return pads


def _resolve_padding(
    padding: Any, nd: int, kernel: tuple, stride: tuple, dilation: tuple, name: str
) -> list[tuple[int, int]]:
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * nd
        if padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            return same_padding(kernel, dilation)
        raise RuntimeError(f"Invalid padding string '{padding}', should be one of 'same', 'valid'")
    return [(p, p) for p in _tuple_arg(padding, nd, "padding", name)]


def _operands(input: Any, weight: Any, bias: Any) -> tuple[jax.Array, jax.Array, Any, Any]:
    x, w = as_array(input), as_array(weight)
    dtype = jnp.result_type(x.dtype, w.dtype)
    b = None if bias is None else as_array(bias)
    return x.astype(dtype), w.astype(dtype), b, dtype


def _finish(out: jax.Array, bias: Any, dtype: Any, batched: bool) -> jax.Array:
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
    out = out.astype(dtype)
    return out if batched else out[0]


@jit("nd", "stride", "padding", "dilation", "groups")
def _conv(
    nd: int,
    input: Any,
    weight: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
) -> jax.Array:
    name = f"conv{nd}d"
    x, w, b, dtype = _operands(input, weight, bias)
    x, batched = _batched(x, nd, name)
    if w.ndim != nd + 2:
        raise RuntimeError(
            f"{name}: expected a {nd + 2}D weight (out_channels, in_channels / groups, *kernel), "
            f"got weight of size {shape_str(w.shape)}"
        )
    stride = _tuple_arg(stride, nd, "stride", name)
    dilation = _tuple_arg(dilation, nd, "dilation", name)
    kernel = tuple(w.shape[2:])
    if x.shape[1] != w.shape[1] * groups:
        raise RuntimeError(
            f"Given groups={groups}, weight of size {shape_str(w.shape)}, expected "
            f"input{shape_str(x.shape)} to have {w.shape[1] * groups} channels, but got "
            f"{x.shape[1]} channels instead"
        )
    if w.shape[0] % groups:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension "
            f"0, but got weight of size {shape_str(w.shape)} instead"
        )
    pads = _resolve_padding(padding, nd, kernel, stride, dilation, name)
    padded = [n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads)]
    effective = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    if any(p < e for p, e in zip(padded, effective)):
        raise RuntimeError(
            f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). "
            f"Kernel size: ({' x '.join(map(str, effective))}). Kernel size can't be greater "
            f"than actual input size (input shape {tuple(x.shape)})"
        )
    out_spatial = _lowering.output_size(x.shape[2:], kernel, stride, pads, dilation)
    if _lowering.use_direct(w.shape[1], kernel):  # and with few input channels
        out = _lowering.conv_direct(
            x, w, stride, pads, dilation, groups, preferred_element_type=compute_dtype(dtype)
        )
        return _finish(out, b, dtype, batched)
    if _lowering.use_matmul(out_spatial):  # XLA:CPU's convolution is slow on small maps
        out = _lowering.conv_matmul(
            x, w, stride, pads, dilation, groups, preferred_element_type=compute_dtype(dtype)
        )
        return _finish(out, b, dtype, batched)
    out = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=stride,
        padding=pads,
        rhs_dilation=dilation,
        dimension_numbers=_lowering.LAYOUTS[nd],
        feature_group_count=groups,
        preferred_element_type=compute_dtype(dtype),
    )
    return _finish(out, b, dtype, batched)


@jit("nd", "stride", "padding", "output_padding", "groups", "dilation")
def _conv_transpose(
    nd: int,
    input: Any,
    weight: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    output_padding: Any,
    groups: int,
    dilation: Any,
) -> jax.Array:
    name = f"conv_transpose{nd}d"
    if isinstance(padding, str):
        raise RuntimeError(f"{name}: padding must be an int or a tuple of ints, got {padding!r}")
    x, w, b, dtype = _operands(input, weight, bias)
    x, batched = _batched(x, nd, name)
    if w.ndim != nd + 2:
        raise RuntimeError(
            f"{name}: expected a {nd + 2}D weight (in_channels, out_channels / groups, *kernel), "
            f"got weight of size {shape_str(w.shape)}"
        )
    stride = _tuple_arg(stride, nd, "stride", name)
    padding = _tuple_arg(padding, nd, "padding", name)
    output_padding = _tuple_arg(output_padding, nd, "output_padding", name)
    dilation = _tuple_arg(dilation, nd, "dilation", name)
    cin, cout_g, kernel = w.shape[0], w.shape[1], tuple(w.shape[2:])
    if x.shape[1] != cin:
        raise RuntimeError(
            f"Given transposed=1, weight of size {shape_str(w.shape)}, expected "
            f"input{shape_str(x.shape)} to have {cin} channels, but got {x.shape[1]} "
            "channels instead"
        )
    if cin % groups:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension "
            f"0, but got weight of size {shape_str(w.shape)} instead"
        )
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise RuntimeError(
                "output padding must be smaller than either stride or dilation, but got "
                f"output_padding={output_padding}, stride={stride}, dilation={dilation}"
            )
    sizes = [
        (n - 1) * s - 2 * p + d * (k - 1) + op + 1
        for n, s, p, d, k, op in zip(x.shape[2:], stride, padding, dilation, kernel, output_padding)
    ]
    if any(n <= 0 for n in sizes):
        raise RuntimeError(
            f"{name}: given input size {tuple(x.shape)}, the calculated output size "
            f"{tuple(sizes)} is too small"
        )
    # A transposed convolution is the convolution of the stride-dilated input
    # with the flipped kernel, its in/out axes swapped within each group.
    k = w.reshape((groups, cin // groups, cout_g, *kernel))
    k = jnp.swapaxes(k, 1, 2).reshape((groups * cout_g, cin // groups, *kernel))
    k = jnp.flip(k, axis=tuple(range(2, nd + 2)))
    pads = [
        (d * (kk - 1) - p, d * (kk - 1) - p + op)
        for kk, d, p, op in zip(kernel, dilation, padding, output_padding)
    ]
    out = jax.lax.conv_general_dilated(
        x,
        k,
        window_strides=(1,) * nd,
        padding=pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        dimension_numbers=_lowering.LAYOUTS[nd],
        feature_group_count=groups,
        preferred_element_type=compute_dtype(dtype),
    )
    return _finish(out, b, dtype, batched)


def conv1d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> jax.Array:
    """1-D convolution over ``(N, C_in, L)`` (or ``(C_in, L)``) input.

    Args:
        input: the input.
        weight: ``(C_out, C_in / groups, k)``.
        bias: optional ``(C_out,)``.
        stride: int or 1-tuple.
        padding: int, 1-tuple, ``'valid'`` or ``'same'`` (stride 1 only; an
            odd total goes on the right, as PyTorch).
        dilation: int or 1-tuple.
        groups: split input and output channels into this many groups.

    Raises:
        RuntimeError: wrong rank, channel count or padding, as PyTorch.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.conv1d(jnp.ones((1, 2, 5)), jnp.ones((3, 2, 3)), padding="same").shape
    (1, 3, 5)
    """
    input, weight, bias = autocast("conv1d", input, weight, bias)
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> jax.Array:
    """2-D convolution over ``(N, C_in, H, W)`` input (arguments as :func:`conv1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.conv2d(jnp.ones((1, 2, 5, 5)), jnp.ones((4, 2, 3, 3)), stride=2).shape
    (1, 4, 2, 2)
    """
    input, weight, bias = autocast("conv2d", input, weight, bias)
    return _conv(2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> jax.Array:
    """3-D convolution over ``(N, C_in, D, H, W)`` input (arguments as :func:`conv1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.conv3d(jnp.ones((1, 2, 4, 4, 4)), jnp.ones((3, 2, 3, 3, 3)), padding=1).shape
    (1, 3, 4, 4, 4)
    """
    input, weight, bias = autocast("conv3d", input, weight, bias)
    return _conv(3, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose1d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> jax.Array:
    """1-D transposed convolution ("deconvolution"), the gradient of :func:`conv1d`.

    Output length ``(L - 1) * stride - 2 * padding + dilation * (k - 1) +
    output_padding + 1``.

    Args:
        input: ``(N, C_in, L)`` or ``(C_in, L)``.
        weight: ``(C_in, C_out / groups, k)``.
        bias: optional ``(C_out,)``.
        stride, padding, output_padding, dilation: ints or 1-tuples.
        groups: channel groups.

    Raises:
        RuntimeError: wrong rank or channels, or ``output_padding`` not
            smaller than ``stride`` or ``dilation``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.conv_transpose1d(jnp.ones((1, 2, 4)), jnp.ones((2, 3, 3)), stride=2).shape
    (1, 3, 9)
    """
    input, weight, bias = autocast("conv_transpose1d", input, weight, bias)
    return _conv_transpose(
        1, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


def conv_transpose2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> jax.Array:
    """2-D transposed convolution (arguments as :func:`conv_transpose1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.conv_transpose2d(jnp.ones((1, 2, 3, 3)), jnp.ones((2, 1, 2, 2)), stride=2).shape
    (1, 1, 6, 6)
    """
    input, weight, bias = autocast("conv_transpose2d", input, weight, bias)
    return _conv_transpose(
        2, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


def conv_transpose3d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> jax.Array:
    """3-D transposed convolution (arguments as :func:`conv_transpose1d`).

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> F.conv_transpose3d(jnp.ones((1, 2, 2, 2, 2)), jnp.ones((2, 1, 2, 2, 2))).shape
    (1, 1, 3, 3, 3)
    """
    input, weight, bias = autocast("conv_transpose3d", input, weight, bias)
    return _conv_transpose(
        3, input, weight, bias, stride, padding, output_padding, groups, dilation
    )
