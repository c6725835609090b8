"""How a convolution is lowered: ``lax.conv_general_dilated``, or im2col + one matmul.

XLA's CPU convolution is slow on small spatial maps with many channels: a
3x3, 512->512 convolution on a 2x2 map (ResNet's last stage) took 32 ms
forward and 53 ms forward+backward on a 2-core x86 host, where the same
convolution written as im2col (one strided slice of the padded input per
kernel offset, stacked) followed by one matmul took 1.8 ms (PyTorch: 2.6 ms).
On large maps the matmul form loses: it materialises ``prod(kernel)`` copies
of the input (3x3 at 16x16: 0.6x; at 64x64: 0.14x).

With few input channels (a first layer on gray or RGB images, depthwise
convolutions) it is slow too: it vectorises over input channels, so the
MNIST-style 1 -> 8 convolution at 28x28 took 1.26 ms forward, where the sum of
its 9 shifted products took 0.19 ms (PyTorch: ~0.1 ms).

The rule, chosen at trace time (so eager and compiled calls agree) from the
backend and the static shapes: on the CPU, a convolution with at most
:data:`DIRECT_MAX_TERMS` input channels per group times kernel elements runs,
when it is not differentiated, as that sum (:func:`conv_direct`); else one
whose output has at most :data:`MATMUL_MAX_OUTPUT` positions per channel map
runs as im2col + matmul; everything else, and every convolution on an
accelerator, keeps ``lax.conv_general_dilated``. ``benchmarks/conv.py`` measures each of
ResNet-18's convolution shapes both ways (forward+backward) and the whole
training step against PyTorch eager.

Both forms compute the same sums (in different orders: values agree to
rounding, tested against ``lax.conv_general_dilated`` for 1-3-D, groups,
dilation, stride and padding, forward and gradients). Half-precision inputs
accumulate in float32 either way (``preferred_element_type``).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

#: The largest output map (positions per channel, ``prod(out_spatial)``) the CPU
#: lowering computes as im2col + matmul. Measured on 2-core x86 (batch 4,
#: forward+backward, ResNet-18's shapes): matmul/conv time 0.02-0.3 at <= 4x4,
#: ~1.0 at 8x8 (3x3 stride 2) to 0.3 (3x3 stride 1, 128 channels), 1.7 at 16x16.
MATMUL_MAX_OUTPUT = 64

#: The most terms (input channels per group x kernel elements) a CPU convolution
#: that is not differentiated computes as a sum of shifted products
#: (:func:`conv_direct`): 1 -> 8 channels, 3x3, batch 32 at 28x28, forward:
#: 0.19 ms against XLA's convolution's 1.26 ms (2-core x86).
DIRECT_MAX_TERMS = 27


#: ``lax.conv_general_dilated``'s dimension numbers for PyTorch's layouts, by spatial rank.
LAYOUTS = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"), 3: ("NCDHW", "OIDHW", "NCDHW")}


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


def _taps(
    kernel: Sequence[int], dilation: Sequence[int], stride: Sequence[int], out: Sequence[int]
) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """Each kernel offset and the strided slice of the padded input's map it multiplies."""
    for offsets in itertools.product(*(range(k) for k in kernel)):
        index = tuple(
            slice(d * j, d * j + s * (m - 1) + 1, s)
            for j, d, s, m in zip(offsets, dilation, stride, out)
        )
        yield offsets, index


def use_matmul(out_spatial: Sequence[int], backend: str | None = None) -> bool:
    """Whether a convolution with output map ``out_spatial`` lowers to im2col + matmul."""
    backend = jax.default_backend() if backend is None else backend
    return backend == "cpu" and math.prod(out_spatial) <= MATMUL_MAX_OUTPUT


def use_direct(in_per_group: int, kernel: Sequence[int], backend: str | None = None) -> bool:
    """Whether a convolution lowers to a sum of shifted products (:func:`conv_direct`)."""
    backend = jax.default_backend() if backend is None else backend
    return backend == "cpu" and in_per_group * math.prod(kernel) <= DIRECT_MAX_TERMS


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
    cols = [
        xp[(slice(None), slice(None), *index)] for _, index in _taps(kernel, dilation, stride, out)
    ]
    taps = len(cols)
    patches = jnp.stack(cols, axis=2).reshape(n, groups, c // groups, taps, math.prod(out))
    weights = w.reshape(groups, o // groups, c // groups, taps)
    y = jnp.einsum(
        "ngcks,gock->ngos", patches, weights, preferred_element_type=preferred_element_type
    )
    return y.reshape(n, o, *out) if nd else y.reshape(n, o)


def conv_direct(
    x: jax.Array,
    w: jax.Array,
    stride: Sequence[int],
    pads: Sequence[tuple[int, int]],
    dilation: Sequence[int],
    groups: int,
    preferred_element_type: Any = None,
) -> jax.Array:
    """``lax.conv_general_dilated`` in PyTorch's layouts, as a sum of shifted products.

    One term per input channel (of a group) and kernel offset: a strided slice
    of the padded input times that weight, broadcast over the output channels.
    XLA fuses the terms into one pass over the output. For few input channels
    per group (a network's first layer, depthwise convolutions) this is far
    faster than XLA:CPU's convolution (see :data:`DIRECT_MAX_TERMS`).

    Only a value that is not differentiated takes this form (inference, an
    eager forward): under a derivative the value and its derivatives are
    ``lax.conv_general_dilated``'s. The terms' own derivatives would be one
    reduction per term, and XLA repeats an elementwise sum inside every fusion
    that reads it, where two copies may round differently: a ``max`` after it
    (max-pooling by ``jnp.max``) compares its operand with its result to route
    the gradient, and got NaN gradients in a training step.

    Arguments and result as :func:`conv_matmul`'s.

    >>> import jax.numpy as jnp
    >>> x, w = jnp.ones((1, 2, 3, 3)), jnp.ones((4, 2, 3, 3))
    >>> conv_direct(x, w, (1, 1), [(1, 1), (1, 1)], (1, 1), 1)[0, 0].tolist()
    [[8.0, 12.0, 8.0], [12.0, 18.0, 12.0], [8.0, 12.0, 8.0]]
    """
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    return _direct(x, w, tuple(stride), pads, tuple(dilation), groups, preferred_element_type)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5, 6))
def _direct(
    x: jax.Array,
    w: jax.Array,
    stride: tuple[int, ...],
    pads: tuple[tuple[int, int], ...],
    dilation: tuple[int, ...],
    groups: int,
    preferred_element_type: Any,
) -> jax.Array:
    n, c = x.shape[:2]
    o, kernel = w.shape[0], tuple(w.shape[2:])
    cg, og = c // groups, o // groups
    dtype = preferred_element_type or jnp.result_type(x, w)
    xp = jnp.pad(x, ((0, 0), (0, 0), *pads)).astype(dtype)
    out = output_size(x.shape[2:], kernel, stride, pads, dilation)
    xg = xp.reshape(n, groups, 1, cg, *xp.shape[2:])
    wg = w.astype(dtype).reshape(groups, og, cg, *kernel)
    spread = (None,) * len(kernel)  # a weight broadcast over the output map
    terms = []
    for offsets, index in _taps(kernel, dilation, stride, out):
        for ci in range(cg):
            tap = wg[(slice(None), slice(None), ci, *offsets)][(Ellipsis, *spread)]
            terms.append(xg[(slice(None), slice(None), slice(None), ci, *index)] * tap)
    return functools.reduce(jnp.add, terms).reshape(n, o, *out)


@functools.partial(_direct.defjvp, symbolic_zeros=True)
def _direct_jvp(
    stride: tuple, pads: tuple, dilation: tuple, groups: int, dtype: Any, primals: tuple,
    tangents: tuple,
) -> tuple:  # fmt: skip
    (x, w), (dx, dw) = primals, tangents

    def conv(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(
            a, b, stride, pads, rhs_dilation=dilation, dimension_numbers=LAYOUTS[x.ndim - 2],
            feature_group_count=groups, preferred_element_type=dtype,
        )  # fmt: skip

    out = conv(x, w)
    terms = []
    if type(dx) is not SymbolicZero:
        terms.append(conv(dx, w))
    if type(dw) is not SymbolicZero:
        terms.append(conv(x, dw))
    tangent = functools.reduce(jnp.add, terms) if terms else jnp.zeros_like(out)
    return out, tangent
