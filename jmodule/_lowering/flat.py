"""Flat arrays of many small pieces, concatenated so that XLA:CPU fuses the gather.

A training step lays many small arrays out in one flat array: the packed
``.grad`` output (``program._pack_grads``) and the optimizer's packed buckets
(``optim._packed.Bucket``). When the pieces are slices of other arrays (the
gradients of scanned blocks are slices of one stacked gradient), XLA:CPU
fuses a ``concatenate`` with its slicing producers only while it has at most
:data:`FUSED_OPERANDS` operands; beyond that every piece becomes a kernel of
its own (measured: one per scanned block parameter, each compiled by LLVM).
Concatenated in chunks of at most that many, each chunk behind an
``optimization_barrier`` (so the simplifier does not flatten the nesting
back), the whole gather compiles into a handful of fused kernels. On other
backends (GPU, TPU: no such limit measured, and barriers there would keep XLA
from fusing) it is one ``concatenate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["FUSED_OPERANDS", "PACK_MAX_TOTAL", "concat", "stack"]

#: The most operands of a ``concatenate`` that XLA:CPU fuses with their producers.
FUSED_OPERANDS = 8

#: Packing (the ``.grad`` outputs, the optimizer's buckets) is for steps over at most
#: this many parameter elements in all. It saves the host a few microseconds per
#: array, which is the cost of a step whose arithmetic is small (MLP 16-32-32-10,
#: Adam: 1.05x plain JAX packed, 1.4x not); in a larger step the gathers and slices
#: it adds cost more than that (measured in ``benchmarks/models.py``: ResNet-18 of
#: the tests, 700k elements, 1.10x plain JAX with its gradients packed, 1.02x not;
#: nanoGPT, 800k, 1.05x with AdamW's state packed, 1.01x not).
PACK_MAX_TOTAL = 1 << 18


def stack(parts: Sequence[Any]) -> Any:
    """``jnp.stack(parts)``, in chunks that XLA:CPU fuses (see :func:`concat`).

    >>> import jax.numpy as jnp
    >>> from jmodule._lowering import flat
    >>> flat.stack([jnp.ones((2, 3))] * 20).shape
    (20, 2, 3)
    """
    return concat([jax.lax.reshape(p, (1, *p.shape)) for p in parts])


def concat(parts: Sequence[Any]) -> Any:
    """``jnp.concatenate(parts)`` (along the first axis), in chunks that XLA:CPU fuses.

    The same values as ``jnp.concatenate``; with more than
    :data:`FUSED_OPERANDS` pieces they are joined in a tree of chunks.

    >>> import jax.numpy as jnp
    >>> from jmodule._lowering import flat
    >>> flat.concat([jnp.full((2,), float(i)) for i in range(20)]).shape
    (40,)
    """
    parts = list(parts)
    if len({p.dtype for p in parts}) > 1:  # promote as jnp.concatenate does
        dtype = jnp.result_type(*parts)
        parts = [p.astype(dtype) for p in parts]
    if jax.default_backend() != "cpu":
        # The limit is XLA:CPU's; elsewhere barriers would only keep XLA from fusing.
        return parts[0] if len(parts) == 1 else jax.lax.concatenate(parts, 0)
    k = FUSED_OPERANDS
    while len(parts) > k:
        parts = [
            parts[i] if i + 1 == len(parts) else _barrier(jax.lax.concatenate(parts[i : i + k], 0))
            for i in range(0, len(parts), k)
        ]
    return parts[0] if len(parts) == 1 else jax.lax.concatenate(parts, 0)


def _barrier(x: Any) -> Any:
    return jax.lax.optimization_barrier(x)
