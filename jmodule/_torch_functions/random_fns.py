"""Random functions: ``jm.rand``, ``jm.randn``, ``jm.randint``, ``jm.multinomial``, ...

Each draw takes a fresh key from ``generator=`` or, by default, from the jm
default generator (``jm.manual_seed``), exactly as dropout does, so inside
``jm.compile`` / ``model.compile()`` the key is threaded in and out of the
program: two calls of a compiled function draw different numbers, and a
re-seeded run repeats exactly. An explicit ``jm.Generator`` works eagerly;
inside compiled code only the default generator can be used (it raises
otherwise). The streams are JAX's (threefry), not PyTorch's: the same seed
gives other numbers than torch, with the same distributions, shapes and dtypes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import random as _random
from jmodule._placement import device as _device
from jmodule._placement import factory as _factory
from jmodule._torch_functions._common import (
    arr,
    default_float,
    long_dtype,
    out_dtype,
    place,
    shape_arg,
)
from jmodule._torch_functions.creation import check_torch_only

__all__ = [
    "bernoulli",
    "get_rng_state",
    "multinomial",
    "normal",
    "poisson",
    "rand",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "randperm",
    "set_rng_state",
]


def get_rng_state() -> jax.Array:
    """The default generator's state (its JAX key, a uint32 array), as
    ``torch.get_rng_state``; the layout is JAX's, not PyTorch's."""
    return _random.default_generator.get_state()


def set_rng_state(new_state: Any) -> None:
    """Restore a state returned by :func:`get_rng_state`."""
    _random.default_generator.set_state(new_state)


def _meta(device: Any) -> bool:
    """Whether new arrays go to the meta device (then nothing is drawn: the stream keeps
    its place)."""
    return isinstance(_factory.placement(device), _device.device)


def _key(generator: Any) -> jax.Array:
    return _random.next_key(generator)


def _float_dtype(name: str, dtype: Any) -> Any:
    dt = out_dtype(dtype) or default_float()
    if not jnp.issubdtype(dt, jnp.floating):
        raise RuntimeError(f"\"{name}\" not implemented for '{jnp.dtype(dt).name}'")
    return dt


def rand(
    *size: Any,
    generator: Any = None,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> jax.Array:
    """Uniform samples on ``[0, 1)`` of shape ``size``."""
    check_torch_only("rand", out, requires_grad)
    dt = _float_dtype("check_uniform_bounds", dtype)
    shape = shape_arg(size)
    if _meta(device):
        return jax.ShapeDtypeStruct(shape, dt)
    return place(jax.random.uniform(_key(generator), shape, dt), device)


def randn(
    *size: Any,
    generator: Any = None,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> jax.Array:
    """Standard normal samples of shape ``size``."""
    check_torch_only("randn", out, requires_grad)
    dt = _float_dtype("normal_kernel_cpu", dtype)
    shape = shape_arg(size)
    if _meta(device):
        return jax.ShapeDtypeStruct(shape, dt)
    return place(jax.random.normal(_key(generator), shape, dt), device)


def _randint(low: int, high: int, shape: tuple, dt: Any, generator: Any) -> jax.Array:
    low, high = int(low), int(high)
    if low >= high:
        raise RuntimeError(
            f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"
        )
    if jnp.issubdtype(dt, jnp.inexact):
        draw = jax.random.randint(_key(generator), shape, low, high, long_dtype())
        return draw.astype(dt)
    return jax.random.randint(_key(generator), shape, low, high, dt)


def randint(
    *args: Any,
    size: Any = None,
    generator: Any = None,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """Integers uniform on ``[low, high)``: ``randint(high, size)`` or
    ``randint(low, high, size)``, int64 (int32 without x64) unless ``dtype`` is given."""
    check_torch_only("randint", out, requires_grad)
    args = list(args)
    if size is None:
        if not args:
            raise TypeError("randint() missing required argument 'size'")
        size = args.pop()
    if len(args) == 1:
        low, high = 0, args[0]
    elif len(args) == 2:
        low, high = args
    else:
        raise TypeError("randint() takes (high, size) or (low, high, size)")
    dt = out_dtype(dtype) or long_dtype()
    shape = shape_arg((size,))
    if _meta(device):
        return jax.ShapeDtypeStruct(shape, dt)
    return place(_randint(low, high, shape, dt, generator), device)


def randperm(
    n: int,
    *,
    generator: Any = None,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> jax.Array:
    """A random permutation of ``0 .. n-1`` (int64, int32 without x64)."""
    check_torch_only("randperm", out, requires_grad)
    (n,) = shape_arg((n,))
    dt = out_dtype(dtype) or long_dtype()
    if _meta(device):
        return jax.ShapeDtypeStruct((n,), dt)
    return place(jax.random.permutation(_key(generator), n).astype(dt), device)


def rand_like(
    input: Any,
    *,
    generator: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """Uniform samples on ``[0, 1)`` of ``input``'s shape and dtype."""
    x = arr(input)
    return rand(
        x.shape,
        generator=generator,
        dtype=dtype or x.dtype,
        device=device,
        requires_grad=requires_grad,
    )


def randn_like(
    input: Any,
    *,
    generator: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """Standard normal samples of ``input``'s shape and dtype."""
    x = arr(input)
    return randn(
        x.shape,
        generator=generator,
        dtype=dtype or x.dtype,
        device=device,
        requires_grad=requires_grad,
    )


def randint_like(
    input: Any,
    low: int = 0,
    high: int | None = None,
    *,
    generator: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    memory_format: Any = None,
) -> jax.Array:
    """Integers on ``[low, high)`` of ``input``'s shape and dtype (``randint_like(x, high)``
    too)."""
    check_torch_only("randint_like", requires_grad=requires_grad)
    if high is None:
        low, high = 0, low
    x = arr(input)
    dt = out_dtype(dtype) or x.dtype
    return place(_randint(low, high, x.shape, dt, generator), device)


def _concrete_check(x: jax.Array, bad: Any, message: str) -> None:
    if not isinstance(x, jax.core.Tracer) and bool(np.any(bad(np.asarray(x)))):
        raise RuntimeError(message)


def normal(
    mean: Any = 0.0,
    std: Any = 1.0,
    size: Any = None,
    *,
    generator: Any = None,
    out: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    requires_grad: bool = False,
) -> jax.Array:
    """Normal samples with elementwise ``mean`` and ``std``, as ``torch.normal``.

    Either is an array (the result has their broadcast shape) or a number;
    with two numbers, ``size`` gives the shape.

    Raises:
        RuntimeError: a negative ``std`` (checked eagerly), or two numbers without ``size``.
    """
    check_torch_only("normal", out, requires_grad)
    tensors = [v for v in (mean, std) if hasattr(v, "dtype") or hasattr(v, "shape")]
    if tensors:
        xs = [arr(v) for v in tensors]
        dt = out_dtype(dtype) or jnp.result_type(*xs)
        if not jnp.issubdtype(dt, jnp.floating):
            raise RuntimeError(f"\"normal_kernel_cpu\" not implemented for '{jnp.dtype(dt).name}'")
        shape = jnp.broadcast_shapes(*(x.shape for x in xs)) if size is None else shape_arg((size,))
    else:
        if size is None:
            raise TypeError("normal() with a float mean and std needs size=")
        dt = _float_dtype("normal_kernel_cpu", dtype)
        shape = shape_arg((size,))
    m, s = arr(mean).astype(dt), arr(std).astype(dt)
    _concrete_check(s, lambda v: v < 0, f"normal expects std >= 0.0, but found std {std}")
    z = jax.random.normal(_key(generator), shape, dt)
    return place(m + s * z, device)


def bernoulli(input: Any, p: Any = None, *, generator: Any = None, out: Any = None) -> jax.Array:
    """0/1 samples, 1 with probability ``input`` (elementwise), or with probability ``p``
    for every element of ``input``'s shape when ``p`` is given; ``input``'s dtype."""
    check_torch_only("bernoulli", out)
    x = arr(input)
    prob = x if p is None else jnp.broadcast_to(arr(p), x.shape)
    if not jnp.issubdtype(prob.dtype, jnp.floating):
        prob = prob.astype(default_float())
    _concrete_check(
        prob,
        lambda v: (v < 0) | (v > 1),
        "Expected p_in >= 0 && p_in <= 1 to be true, but got false.",
    )
    u = jax.random.uniform(_key(generator), x.shape, jnp.promote_types(prob.dtype, jnp.float32))
    return (u < prob).astype(x.dtype)


def poisson(input: Any, generator: Any = None) -> jax.Array:
    """Poisson samples with rates ``input``, in ``input``'s dtype."""
    x = arr(input)
    return jax.random.poisson(_key(generator), x, x.shape).astype(x.dtype)


def multinomial(
    input: Any,
    num_samples: int,
    replacement: bool = False,
    *,
    generator: Any = None,
    out: Any = None,
) -> jax.Array:
    """Category indices drawn with probabilities proportional to the rows of ``input``
    (1-d or 2-d, non-negative weights), as ``torch.multinomial``.

    Without replacement each row gives ``num_samples`` distinct categories
    (drawn by the Gumbel-top-k trick, which has the same law as PyTorch's
    sequential draws). The result is int64 (int32 without x64).

    Raises:
        RuntimeError: a bad shape or ``num_samples``; weights that are negative,
            non-finite or sum to zero (value checks are eager only). As in
            PyTorch, zero-weight categories are drawn last when a row has fewer
            non-zero ones than ``num_samples``.
    """
    check_torch_only("multinomial", out)
    w = arr(input)
    if w.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    num_samples = int(num_samples)
    n = w.shape[-1]
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > n:
        raise RuntimeError(
            "cannot sample n_sample > prob_dist.size(-1) samples without replacement"
        )
    rows = w.reshape(-1, n).astype(jnp.promote_types(w.dtype, jnp.float32))
    if not isinstance(rows, jax.core.Tracer):
        host = np.asarray(rows)
        if not np.all(np.isfinite(host)) or np.any(host < 0):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        if np.any(host.sum(-1) <= 0):
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    logits = jnp.log(rows)
    key = _key(generator)
    if replacement:
        draws = jax.random.categorical(
            key, logits[:, None, :], axis=-1, shape=(rows.shape[0], num_samples)
        )
    else:
        g = jax.random.gumbel(key, rows.shape, rows.dtype)
        _, draws = jax.lax.top_k(logits + g, num_samples)
    draws = draws.astype(long_dtype())
    return draws if w.ndim == 2 else draws[0]
