"""How a convolution is lowered: ``lax.conv_general_dilated``, or im2col + one matmul.

XLA's CPU convolution is slow on small spatial maps with many channels: a
3x3, 512->512 convolution on a 2x2 map (ResNet's last stage) took 32 ms
forward and 53 ms forward+backward on a 2-core x86 host, where the same
convolution written as im2col (one strided slice of the padded input per
kernel offset, stacked) followed by one matmul took 1.8 ms (PyTorch: 2.6 ms).
On large maps the matmul form loses: it materialises ``prod(kernel)`` copies
of the input (3x3 at 16x16: 0.6x; at 64x64: 0.14x).

The rule, chosen at trace time (so eager and compiled calls agree) from the
backend and the static shapes: on the CPU, a convolution whose output has at
most :data:`MATMUL_MAX_OUTPUT` positions per channel map runs as im2col +
matmul; everything else, and every convolution on an accelerator, keeps
``lax.conv_general_dilated``. ``benchmarks/conv.py`` measures each of
ResNet-18's convolution shapes both ways (forward+backward) and the whole
training step against PyTorch eager.

Both forms compute the same sums (in different orders: values agree to
rounding, tested against ``lax.conv_general_dilated`` for 1-3-D, groups,
dilation, stride and padding, forward and gradients). Half-precision inputs
accumulate in float32 either way (``preferred_element_type``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

#: The largest output map (positions per channel, ``prod(out_spatial)``) the CPU
#: lowering computes as im2col + matmul. Measured on 2-core x86 (batch 4,
#: forward+backward, ResNet-18's shapes): matmul/conv time 0.02-0.3 at <= 4x4,
#: ~1.0 at 8x8 (3x3 stride 2) to 0.3 (3x3 stride 1, 128 channels), 1.7 at 16x16.
MATMUL_MAX_OUTPUT = 64


def output_size(
    spatial: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    pads: Sequence[tuple[int, int]],
    dilation: Sequence[int],
) -> tuple[int, ...]:
    """The output map of a convolution with these (static) sizes."""
    return tuple(
        (n + lo + hi - d * (k - 1) - 1) // s + 1
        for n, k, s, (lo, hi), d in zip(spatial, kernel, stride, pads, dilation)
    )


def use_matmul(out_spatial: Sequence[int], backend: str | None = None) -> bool:
    """Whether a convolution with output map ``out_spatial`` lowers to im2col + matmul."""
    backend = jax.default_backend() if backend is None else backend
    return backend == "cpu" and math.prod(out_spatial) <= MATMUL_MAX_OUTPUT


def conv_matmul(
    x: jax.Array,
    w: jax.Array,
    stride: Sequence[int],
    pads: Sequence[tuple[int, int]],
    dilation: Sequence[int],
    groups: int,
    preferred_element_type: Any = None,
) -> jax.Array:
    """``lax.conv_general_dilated`` in PyTorch's layouts (N, C, *spatial), as im2col + matmul.

    Args:
        x: input ``(N, C, *spatial)``.
        w: weight ``(O, C / groups, *kernel)``.
        stride: per spatial dimension.
        pads: ``(low, high)`` zero padding per spatial dimension.
        dilation: kernel dilation per spatial dimension.
        groups: feature groups.
        preferred_element_type: the accumulation (and result) dtype.

    Returns:
        ``(N, O, *out_spatial)``.

    >>> import jax.numpy as jnp
    >>> x, w = jnp.ones((1, 2, 3, 3)), jnp.ones((4, 2, 3, 3))
    >>> conv_matmul(x, w, (1, 1), [(1, 1), (1, 1)], (1, 1), 1)[0, 0].tolist()
    [[8.0, 12.0, 8.0], [12.0, 18.0, 12.0], [8.0, 12.0, 8.0]]
    """
    nd = x.ndim - 2
    n, c = x.shape[:2]
    o, kernel = w.shape[0], tuple(w.shape[2:])
    xp = jnp.pad(x, ((0, 0), (0, 0), *[(lo, hi) for lo, hi in pads]))
    out = output_size(x.shape[2:], kernel, stride, pads, dilation)
    cols = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        index = tuple(
            slice(d * j, d * j + s * (m - 1) + 1, s)
            for j, d, s, m in zip(offsets, dilation, stride, out)
        )
        cols.append(xp[(slice(None), slice(None), *index)])
    taps = len(cols)
    patches = jnp.stack(cols, axis=2).reshape(n, groups, c // groups, taps, math.prod(out))
    weights = w.reshape(groups, o // groups, c // groups, taps)
    y = jnp.einsum(
        "ngcks,gock->ngos", patches, weights, preferred_element_type=preferred_element_type
    )
    return y.reshape(n, o, *out) if nd else y.reshape(n, o)
