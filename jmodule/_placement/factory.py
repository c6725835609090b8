"""Array creation that honours ``with jm.device(...)`` and meta construction."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._placement import device as _device


def placement(device: Any = None) -> Any:
    """The placement for new arrays: ``device`` if given, else the context's default."""
    if device is not None:
        return _device.resolve(device)
    return _device.default_device()


def empty(shape: tuple[int, ...], dtype: Any = None, device: Any = None) -> Any:
    """A new array of ``shape`` (zeros; JAX has no uninitialised memory).

    Under ``jm.device("meta")`` (or ``device="meta"``) it is a
    ``jax.ShapeDtypeStruct``: shape and dtype only, no memory.
    """
    dtype = _device.canonical_dtype(dtype if dtype is not None else _device.get_default_dtype())
    place = placement(device)
    if isinstance(place, _device.device):
        return jax.ShapeDtypeStruct(tuple(shape), dtype)
    if place is None and _default_platform() == "cpu":
        # Host zeros, uncommitted like jnp.zeros: jnp.zeros compiles a program per shape
        # (tens of ms each on a CPU), which dominated building a model of many shapes.
        return jax.device_put(np.zeros(shape, dtype))
    if isinstance(place, jax.Device) and place.platform == "cpu":
        return jax.device_put(np.zeros(shape, dtype), place)
    return jnp.zeros(shape, dtype, device=place)


def _default_platform() -> str:
    configured = jax.config.jax_default_device
    if isinstance(configured, jax.Device):
        return configured.platform
    if isinstance(configured, str):
        return configured
    return jax.devices()[0].platform


def full(shape: tuple[int, ...], value: Any, dtype: Any = None, device: Any = None) -> Any:
    """Like :func:`empty`, filled with ``value``."""
    out = empty(shape, dtype, device)
    if isinstance(out, jax.ShapeDtypeStruct):
        return out
    return filled(out, value)


def on_one_cpu(like: Any) -> bool:
    """Whether ``like`` is a concrete array on a single CPU device (its values are host memory)."""
    sharding = getattr(like, "sharding", None)
    if sharding is None or isinstance(like, jax.core.Tracer) or len(sharding.device_set) != 1:
        return False
    return next(iter(sharding.device_set)).platform == "cpu"


def put_like(host: np.ndarray, like: jax.Array) -> jax.Array:
    """``host`` as a JAX array placed as ``like`` is (its sharding, committed only if it is)."""
    if like.committed:
        return jax.device_put(host, like.sharding)
    return jax.device_put(host)


def filled(like: Any, value: Any) -> Any:
    """An array of ``like``'s shape, dtype and placement, every element ``value``.

    On a CPU it is made with NumPy and put (``jnp.full`` compiles a program per
    shape and placement, tens of ms each: building a model of many shapes paid
    them all).
    """
    if on_one_cpu(like):
        return put_like(np.full(like.shape, value, like.dtype), like)
    return jnp.full(like.shape, value, like.dtype, device=like.sharding)
