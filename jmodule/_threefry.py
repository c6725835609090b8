"""JAX's default random numbers (threefry2x32) computed on the host, bit for bit.

Building a model draws every parameter: through JAX, each draw's size needs
its own XLA program (``jax.random.PRNGKey``'s seeding, ``split`` and one
``uniform`` per size bucket: about 1 s of compiling before a small model
exists). The values are a pure function of the key, so on a CPU they are
computed here with NumPy instead: the same bits ``jax.random`` makes, no
program at all. Used where the key and the result live on the host anyway:
the generator's seeding, the initialisers' key splits and their uniform and
constant fills (:mod:`jmodule.nn.init`). Everything else (dropout's per-call
keys, other devices, traced keys, other PRNG implementations) stays with JAX.

Kept equal to JAX by ``tests/torch_functions/test_random.py`` for the JAX
versions the project supports; :func:`available` turns it off where JAX is
configured to draw differently (another PRNG implementation,
``jax_threefry_partitionable`` off).
"""

from __future__ import annotations

import jax
import numpy as np

_MASK = 0xFFFFFFFF
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
_CHUNK = 1 << 14


def available() -> bool:
    """Whether JAX's current configuration draws what this module computes."""
    config = jax.config
    return (
        config.jax_default_prng_impl == "threefry2x32"
        and bool(config.jax_threefry_partitionable)
        and bool(getattr(config, "jax_legacy_random_uniform", True))
    )


def seed_key(seed: int) -> np.ndarray:
    """``jax.random.PRNGKey(seed)`` for ``0 <= seed < 2**32``: ``[0, seed]`` as uint32.

    >>> seed_key(7)
    array([0, 7], dtype=uint32)
    """
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed {seed} is not a 32-bit unsigned value")
    return np.array([0, seed], np.uint32)


def _hash_ints(k1: int, k2: int, x1: int, x2: int) -> tuple[int, int]:
    """threefry2x32 of one counter pair, in Python integers (a few microseconds)."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1 = (x1 + ks[0]) & _MASK
    x2 = (x2 + ks[1]) & _MASK
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = (x1 + x2) & _MASK
            x2 = (((x2 << r) | (x2 >> (32 - r))) & _MASK) ^ x1
        x1 = (x1 + ks[(i + 1) % 3]) & _MASK
        x2 = (x2 + ks[(i + 2) % 3] + i + 1) & _MASK
    return x1, x2


def _hash_arrays(k1: int, k2: int, x1: np.ndarray, x2: np.ndarray) -> None:
    """threefry2x32 of uint32 counter arrays, in place (wrapping arithmetic)."""
    ks = (np.uint32(k1), np.uint32(k2), np.uint32(k1 ^ k2 ^ _PARITY))
    t = np.empty_like(x2)
    x1 += ks[0]
    x2 += ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 += x2
            np.right_shift(x2, np.uint32(32 - r), out=t)
            np.left_shift(x2, np.uint32(r), out=x2)
            x2 |= t
            x2 ^= x1
        x1 += ks[(i + 1) % 3]
        x2 += ks[(i + 2) % 3]
        x2 += np.uint32(i + 1)


def split(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``jax.random.split(key)``'s two keys (uint32 pairs).

    >>> import jax, numpy as np
    >>> new, sub = split(seed_key(0))
    >>> want = jax.random.split(jax.random.PRNGKey(0))
    >>> bool(np.array_equal(np.stack([new, sub]), np.asarray(want)))
    True
    """
    k1, k2 = int(key[0]), int(key[1])
    a1, a2 = _hash_ints(k1, k2, 0, 0)
    b1, b2 = _hash_ints(k1, k2, 0, 1)
    return np.array([a1, a2], np.uint32), np.array([b1, b2], np.uint32)


def bits(key: np.ndarray, count: int) -> np.ndarray:
    """``jax.random.bits(key, (count,), uint32)``: the flat stream of a draw of ``count`` values."""
    if count >= 1 << 32:
        raise ValueError(f"{count} values: more than this host implementation handles")
    k1, k2 = int(key[0]), int(key[1])
    out = np.empty(count, np.uint32)
    for start in range(0, count, _CHUNK):  # chunks that stay in the CPU's cache
        x2 = np.arange(start, min(start + _CHUNK, count), dtype=np.uint32)
        x1 = np.zeros_like(x2)
        _hash_arrays(k1, k2, x1, x2)
        np.bitwise_xor(x1, x2, out=out[start : start + len(x2)])
    return out


def uniform(key: np.ndarray, low: float, high: float, count: int) -> np.ndarray:
    """``jax.random.uniform(key, (count,), float32, low, high)``.

    The mantissa of ``[1, 2)`` from the top 23 bits, minus one, scaled to
    ``[low, high)`` and clamped below at ``low``, as JAX does. The scaling
    ``u * (high - low) + low`` is exact in float64 and rounded once to
    float32, which is what XLA's fused multiply-add gives on CPUs that have
    one (elsewhere the last bit may differ from ``jax.random.uniform``'s).
    """
    low32, high32 = np.float32(low), np.float32(high)
    floats = ((bits(key, count) >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32)
    floats -= np.float32(1.0)
    scaled = floats.astype(np.float64) * np.float64(high32 - low32) + np.float64(low32)
    return np.maximum(low32, scaled.astype(np.float32))
