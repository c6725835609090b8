"""``map_location``: where and in which dtype loaded arrays land.

Accepts what ``Module.to`` accepts: a device (``"cpu"``, ``"cuda:1"``, an
int, ``jm.device``, ``jax.Device``), a ``jax.sharding.Sharding``, a dtype
(floating and complex arrays are cast, integer ones only move), a
``(device, dtype)`` pair, an array (its sharding and dtype), ``"meta"``
(shapes and dtypes only, nothing read), or a callable ``fn(array, key)``
applied to each loaded array.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# ``jmodule.device`` the module (the package re-exports the class under the same name).
_device = importlib.import_module("jmodule.device")

_META = "meta"


def _floating_or_complex(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


def _is_dtype(x: Any) -> bool:
    if isinstance(x, (str, bool, int, _device.device, jax.Device, jax.sharding.Sharding)):
        return False
    if isinstance(x, (jax.Array, np.ndarray)):
        return False
    try:
        jnp.dtype(x)
    except TypeError:
        return False
    return True


def _default_place() -> Any:
    current = _device.default_device()
    if isinstance(current, jax.Device):  # with jm.device("cuda:1"): ...
        return current
    configured = jax.config.jax_default_device
    if isinstance(configured, jax.Device):
        return configured
    if configured is not None:
        return _device.resolve(configured)
    return jax.devices()[0]


class Placement:
    """A parsed ``map_location``.

    Attributes:
        where: a ``jax.Device``, a ``jax.sharding.Sharding`` or ``"meta"``.
        dtype: the dtype floating/complex arrays are cast to, or ``None``.
        fn: the callable applied to each array, or ``None``.
    """

    def __init__(self, map_location: Any = None):
        self.where: Any = None
        self.dtype: Any = None
        self.fn: Callable[[Any, str], Any] | None = None
        specs = map_location if isinstance(map_location, tuple) else (map_location,)
        for spec in specs:
            self._take(spec)
        if self.where is None:
            self.where = _default_place()

    def _take(self, spec: Any) -> None:
        if spec is None:
            return
        if type(spec).__module__ == "torch" and type(spec).__name__ in ("device", "dtype"):
            spec = str(spec).removeprefix("torch.")  # torch.device("cpu"), torch.float16
            if not spec.startswith(("cpu", "cuda", "meta", "mps", "xpu")):
                spec = jnp.dtype(spec)
        if isinstance(spec, dict):
            raise TypeError(
                "map_location does not take a dict (PyTorch's device-to-device remapping): "
                "arrays land on the one device, sharding or dtype given, or pass a callable "
                "fn(array, key) -> array."
            )
        if isinstance(spec, jax.Array):
            self.where, self.dtype = spec.sharding, spec.dtype
        elif _is_dtype(spec):
            dtype = _device.canonical_dtype(spec, what="map_location")
            if not _floating_or_complex(dtype):
                raise TypeError(
                    f"map_location dtype must be a floating point or complex dtype (as for "
                    f"Module.to), got {dtype}; integer arrays keep their dtype."
                )
            self.dtype = dtype
        elif callable(spec) and not isinstance(spec, (jax.Device, jax.sharding.Sharding)):
            self.fn = spec
        else:
            place = _device.resolve(spec)
            self.where = _META if isinstance(place, _device.device) else place

    @property
    def meta(self) -> bool:
        """Whether arrays come back as ``jax.ShapeDtypeStruct`` without being read."""
        return self.where == _META

    def sharding(self, shape: tuple[int, ...], key: str) -> jax.sharding.Sharding:
        """The sharding an array of ``shape`` at ``key`` is restored onto.

        Raises:
            ValueError: a given sharding cannot hold an array of that shape.
        """
        where = self.where
        if isinstance(where, jax.Device):
            return jax.sharding.SingleDeviceSharding(where)
        try:
            where.shard_shape(tuple(shape))
        except (ValueError, IndexError) as e:
            raise ValueError(
                f"map_location sharding {where} cannot hold '{key}' of shape {tuple(shape)}: {e}"
            ) from None
        return where

    def cast(self, x: Any) -> Any:
        """``x`` in the requested dtype if it is floating or complex."""
        if self.dtype is None or not _floating_or_complex(x.dtype) or x.dtype == self.dtype:
            return x
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, self.dtype, sharding=x.sharding)
        return x.astype(self.dtype)

    def finish(self, x: Any, key: str) -> Any:
        """Cast, then apply the callable."""
        x = self.cast(x)
        return self.fn(x, key) if self.fn is not None else x

    def put(self, host: np.ndarray, key: str) -> Any:
        """Place a host array (with JAX's 64-bit rule applied) and finish it."""
        host = narrow(host)
        if self.meta:
            return self.finish(jax.ShapeDtypeStruct(host.shape, host.dtype), key)
        return self.finish(jax.device_put(host, self.sharding(host.shape, key)), key)


def narrow(host: np.ndarray) -> np.ndarray:
    """Apply JAX's rule for 64-bit data while x64 is off (int64 -> int32, ...)."""
    if host.dtype.itemsize == 8 or host.dtype == np.complex128:
        target = jax.dtypes.canonicalize_dtype(host.dtype)
        if target != host.dtype:
            return host.astype(target)
    return host
