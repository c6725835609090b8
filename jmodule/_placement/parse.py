"""Where arrays go: the placement language of ``Module.to`` and ``map_location``.

``Module.to(...)``, ``Module.to_empty(device=...)``, ``jm.load(...,
map_location=...)`` and ``jm.jit.load(..., map_location=...)`` name where
arrays go in the same words: a device (``"cpu"``, ``"cuda:1"``, an int,
``jm.device``, ``jax.Device``, ``torch.device``), a
``jax.sharding.Sharding``, ``"meta"`` (shape and dtype only), a dtype
(jm, jnp or numpy, a ``torch.dtype``; only floating and complex arrays take
it), or an array (a ``jax.Array`` or a torch tensor: its placement and
dtype). :func:`parse` reads them; :func:`move`, :func:`put` and
:func:`cast_floating` apply the result to one array.

This module imports nothing from ``jmodule.nn`` or ``jmodule.serialization``:
both build on it (``nn/modules/_casting.py``, ``serialization/_map_location.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._placement import device as _device
from jmodule._placement import factory as _factory

__all__ = [
    "Place",
    "Target",
    "cast",
    "cast_floating",
    "default_place",
    "floating_dtype",
    "is_dtype",
    "is_meta",
    "move",
    "one",
    "parse",
    "put",
]

#: A parsed placement; ``jm.device("meta")`` stands for "meta".
Place: TypeAlias = jax.Device | jax.sharding.Sharding | _device.device

#: For each caller: how the x64 error names what is cast, and the error for a
#: dtype that is neither floating nor complex (PyTorch's words for ``to``).
_CALLERS = {
    "to": (
        "the module",
        "nn.Module.to only accepts floating point or complex dtypes, but got desired dtype={dtype}",
    ),
    "map_location": (
        "map_location",
        "map_location dtype must be a floating point or complex dtype (as for Module.to), "
        "got {dtype}; integer arrays keep their dtype.",
    ),
}

_META_COPY = (
    "Cannot copy out of meta tensor; no data! Please use Module.to_empty() to allocate the "
    "module's parameters on a device, then initialise them (for example with "
    "reset_parameters() or load_state_dict)."
)


class Target(NamedTuple):
    """A parsed placement: where arrays go and the dtype their floating ones take.

    Attributes:
        place: a ``jax.Device``, a ``jax.sharding.Sharding``, ``jm.device("meta")``,
            or ``None`` (arrays stay where they are).
        dtype: the dtype floating and complex arrays are cast to, or ``None``.
    """

    place: Place | None = None
    dtype: np.dtype | None = None


def _from_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def is_dtype(x: Any) -> bool:
    """Whether ``x`` names a dtype (rather than a device, a sharding or an array).

    >>> import jax.numpy as jnp
    >>> is_dtype(jnp.bfloat16), is_dtype("cpu"), is_dtype(jnp.ones(2))
    (True, False, False)
    """
    if isinstance(x, (str, bool, int, _device.device, jax.Device, jax.sharding.Sharding)):
        return False
    if isinstance(x, (jax.Array, np.ndarray)):
        return False
    if _from_torch(x):
        return type(x).__name__ == "dtype"
    try:
        jnp.dtype(x)
    except TypeError:
        return False
    return True


def _is_floating(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


def floating_dtype(dtype: Any, *, what: str = "to") -> np.dtype:
    """``dtype`` (jm, jnp, numpy, a name or a ``torch.dtype``) as a floating or complex dtype.

    Args:
        dtype: the dtype asked for.
        what: the caller, ``"to"`` or ``"map_location"``, as errors name it.

    Raises:
        DtypeError: a 64-bit dtype while JAX's x64 mode is off.
        TypeError: a dtype that is neither floating nor complex.
    """
    subject, not_floating = _CALLERS[what]
    if _from_torch(dtype):
        dtype = str(dtype).removeprefix("torch.")
    dt = _device.canonical_dtype(dtype, what=subject)
    if not _is_floating(dt):
        raise TypeError(not_floating.format(dtype=dt))
    return dt


def one(spec: Any) -> tuple[Any, Any]:
    """One argument as ``(device-like or None, dtype-like or None)``."""
    if isinstance(spec, jax.Array):
        return spec.sharding, spec.dtype
    if _from_torch(spec):
        kind = type(spec).__name__
        if kind == "dtype":
            return None, spec
        if kind != "device" and hasattr(spec, "dtype"):  # a tensor
            return str(spec.device), spec.dtype
        return spec, None
    if is_dtype(spec):
        return None, spec
    return spec, None


def parse(
    specs: Iterable[Any], *, device: Any = None, dtype: Any = None, what: str = "to"
) -> Target:
    """Read placement arguments; a later one overrides what an earlier one said.

    Args:
        specs: devices, shardings, dtypes and arrays (``None`` says nothing).
        device: a device or sharding given by keyword (``to(device=...)``);
            ``specs`` override it.
        dtype: a dtype given by keyword (``to(dtype=...)``); ``specs`` override it.
        what: the caller, ``"to"`` or ``"map_location"``, as errors name it.

    Returns:
        The :class:`Target` they name together.

    Raises:
        DeviceError: JAX cannot see the device (the message lists those it can).
        DtypeError: a 64-bit dtype while JAX's x64 mode is off.
        TypeError: a dtype that is neither floating nor complex.

    >>> import jax.numpy as jnp
    >>> parse(["cpu", jnp.bfloat16]).dtype
    dtype(bfloat16)
    >>> parse(["meta"]).place
    device(type='meta')
    """
    place = None if device is None else _device.resolve(device)
    if dtype is not None:
        dtype = floating_dtype(dtype, what=what)
    for spec in specs:
        if spec is None:
            continue
        where, kind = one(spec)
        if where is not None:
            place = _device.resolve(where)
        if kind is not None:
            dtype = floating_dtype(kind, what=what)
    return Target(place, dtype)


def is_meta(place: Any) -> bool:
    """Whether a parsed ``place`` is "meta" (arrays keep only their shape and dtype)."""
    return isinstance(place, _device.device)


def default_place() -> jax.Device | jax.sharding.Sharding:
    """Where new data goes when nothing says: the device of the innermost
    ``with jm.device(...)`` block (a ``"meta"`` block does not count), else JAX's
    default device, else this process's first device."""
    current = _device.default_device()
    if isinstance(current, jax.Device):
        return current
    configured = jax.config.jax_default_device
    if isinstance(configured, jax.Device):
        return configured
    if configured is not None:
        return _device.resolve(configured)
    return jax.local_devices()[0]  # this process's own, in a job of several


def put(value: Any, where: jax.Device | jax.sharding.Sharding) -> jax.Array:
    """``jax.device_put(value, where)``, also onto a mesh spanning several processes.

    Across processes JAX cannot move an array that lives on one of this
    process's devices onto devices of other processes (``jax.device_put``
    refuses a committed one, and checks an uncommitted one against every
    other process's copy with a collective). As in any SPMD program, every
    process holds the same full value here (models are built the same way
    everywhere), so each process places its own shards of it
    (``jax.make_array_from_callback``). An array already spread over
    several processes is resharded by ``jax.device_put``.

    Args:
        value: a ``jax.Array`` or numpy array, the same in every process.
        where: a device or a sharding.

    Returns:
        The placed ``jax.Array``.

    >>> import jax, jax.numpy as jnp
    >>> put(jnp.arange(4.0), jax.sharding.make_single_device_sharding(jax.devices()[0])).shape
    (4,)
    """
    if (
        not isinstance(where, jax.sharding.Sharding)
        or where.is_fully_addressable
        or not isinstance(value, (jax.Array, np.ndarray))
        or (isinstance(value, jax.Array) and not value.is_fully_addressable)
    ):
        return jax.device_put(value, where)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, where, lambda index: host[index])


def move(value: Any, place: Place) -> Any:
    """``value`` (an array or a ``jax.ShapeDtypeStruct``) at a parsed ``place``.

    Raises:
        RuntimeError: ``value`` has no data (meta) and ``place`` is a device.
    """
    if is_meta(place):
        return jax.ShapeDtypeStruct(value.shape, value.dtype)
    if isinstance(value, jax.ShapeDtypeStruct):
        raise RuntimeError(_META_COPY)
    return put(value, place)


_HOST_CAST = 1 << 20


def cast(value: Any, dtype: Any) -> Any:
    """``value`` (an array or a ``jax.ShapeDtypeStruct``) in ``dtype``.

    Complex to real keeps the real part, with PyTorch's warning.
    """
    if isinstance(value, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(value.shape, dtype, sharding=value.sharding)
    if jnp.iscomplexobj(value) and not jnp.issubdtype(dtype, jnp.complexfloating):
        warnings.warn(
            "Casting complex values to real discards the imaginary part", UserWarning, stacklevel=4
        )
        value = jnp.real(value)
    elif value.size <= _HOST_CAST and _factory.on_one_cpu(value):
        # NumPy's conversions round as XLA's do; astype compiles a program per shape
        # (20-30 ms each on a CPU), against at most ~12 ms of NumPy for the largest here
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN, as XLA makes them
            host = np.asarray(value).astype(dtype)
        return _factory.put_like(host, value)
    return value.astype(dtype)


def cast_floating(value: Any, dtype: Any) -> Any:
    """``value`` in ``dtype`` if it is floating or complex (integer arrays keep theirs)."""
    if dtype is None or not _is_floating(value.dtype) or value.dtype == dtype:
        return value
    return cast(value, dtype)
