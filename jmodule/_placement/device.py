"""Devices and dtypes with PyTorch's names, mapped onto JAX.

``jm.device("cuda:1")`` names a device the way PyTorch does and resolves to a
``jax.Device``; used as a context manager it sets the default device for
parameters created inside it. ``jm.device("meta")`` builds abstract
parameters (shape and dtype only, no memory).

This module is private: users reach its names from the package (``jm.device``,
``jm.float32``, ``jm.DeviceError``, ...), and ``jm.device`` is the class, as
``torch.device`` is.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._lowering import state

__all__ = [
    "DeviceError",
    "DtypeError",
    "bfloat16",
    "bool_",
    "canonical_dtype",
    "cdouble",
    "cfloat",
    "channels_last",
    "channels_last_3d",
    "check_memory_format",
    "complex64",
    "complex128",
    "contiguous_format",
    "default_device",
    "device",
    "double",
    "float16",
    "float32",
    "float64",
    "float_",
    "get_default_dtype",
    "half",
    "int8",
    "int16",
    "int32",
    "int64",
    "int_",
    "is_memory_format",
    "is_meta",
    "long",
    "memory_format",
    "preserve_format",
    "resolve",
    "set_default_dtype",
    "short",
    "uint8",
]

float32 = jnp.float32
float16 = half = jnp.float16
bfloat16 = jnp.bfloat16
float64 = double = jnp.float64
int8 = jnp.int8
int16 = short = jnp.int16
int32 = jnp.int32
int64 = long = jnp.int64
uint8 = jnp.uint8
bool_ = jnp.bool_  # ``jm.bool``; named as numpy does so that this module keeps the builtin
# ``jm.float`` and ``jm.int`` (``torch.float``, ``torch.int``: float32 and int32, whatever
# the default dtype), named with an underscore for the same reason.
float_ = jnp.float32
int_ = jnp.int32
complex64 = cfloat = jnp.complex64
complex128 = cdouble = jnp.complex128


class DeviceError(RuntimeError):
    """A device was asked for that JAX cannot see."""


class DtypeError(TypeError):
    """A dtype was asked for that JAX cannot provide in its current mode."""


# PyTorch device type -> JAX platform names to try, in order.
_PLATFORMS = {
    "cpu": ("cpu",),
    "cuda": ("cuda", "gpu", "rocm"),
    "gpu": ("cuda", "gpu", "rocm"),
    "tpu": ("tpu",),
    "ipu": ("ipu",),
    "xpu": ("xpu",),
    "mtia": ("mtia",),
    "mps": ("METAL", "mps"),
}


def _x64_enabled() -> bool:
    return jax.config.read("jax_enable_x64")


def _visible_devices() -> str:
    return ", ".join(f"{d.platform}:{d.id}" for d in jax.devices()) or "none"


class device:
    """A PyTorch-style device name (``"cpu"``, ``"cuda:1"``, ``"meta"``).

    Resolves to a ``jax.Device`` with :meth:`jax_device`. Used as a context
    manager it becomes the default device for parameters and buffers created
    inside it, as ``torch.device`` does.

    Args:
        type: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"meta"``, ``"tpu"``, ...,
            or a ``jax.Device``.
        index: optional device index.

    >>> import jmodule as jm
    >>> jm.device("cuda:1")
    device(type='cuda', index=1)
    >>> with jm.device("meta"):
    ...     layer = jm.nn.Linear(4, 2)
    >>> layer.weight.shape, jm.is_meta(layer.weight)
    ((2, 4), True)
    """

    def __init__(self, type: str | device | jax.Device, index: int | None = None):
        self._jax_device = None
        if isinstance(type, device):
            type, index, self._jax_device = type.type, type.index, type._jax_device
        elif isinstance(type, jax.Device):
            self._jax_device = type
            type, index = _torch_type(type.platform), type.id
        elif isinstance(type, str):
            if ":" in type:
                if index is not None:
                    raise RuntimeError(f"device string {type!r} already has an index")
                type, _, idx = type.partition(":")
                try:
                    index = int(idx)
                except ValueError:
                    raise RuntimeError(f"Invalid device string: '{type}:{idx}'") from None
            if type not in _PLATFORMS and type != "meta":
                raise RuntimeError(
                    f"Expected one of {', '.join([*_PLATFORMS, 'meta'])} device type at start "
                    f"of device string: {type}"
                )
        else:
            raise TypeError(f"device() expects a str or jax.Device, got {type!r}")
        if index is not None and index < 0:
            raise RuntimeError(f"Device index must not be negative, got {index}")
        self.type: str = type
        self.index: int | None = index
        self._prev: list = []

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = device(other)
        if not isinstance(other, device):
            return NotImplemented
        return (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def jax_device(self) -> jax.Device | None:
        """The ``jax.Device`` this names (``None`` for ``"meta"``).

        Raises:
            DeviceError: JAX sees no such device; the message lists those it sees.
        """
        if self._jax_device is not None:
            return self._jax_device
        if self.type == "meta":
            return None
        devices = []
        for platform in _PLATFORMS[self.type]:
            try:
                devices = jax.local_devices(backend=platform)  # this process's, as in PyTorch
            except RuntimeError:
                continue
            if devices:
                break
        if not devices:
            hint = (
                " Install a CUDA build of JAX (pip install 'jax[cuda13]') on a machine with an"
                " NVIDIA GPU, or use 'cpu'."
                if self.type in ("cuda", "gpu")
                else ""
            )
            raise DeviceError(
                f"device '{self}' is not available: JAX sees {_visible_devices()}.{hint}"
            )
        index = self.index or 0
        if index >= len(devices):
            raise DeviceError(
                f"device '{self}' is not available: JAX sees {len(devices)} "
                f"{self.type} device(s) ({_visible_devices()})."
            )
        return devices[index]

    def __enter__(self) -> device:
        stack = _default_stack()
        stack.append(self if self.type == "meta" else self.jax_device())
        return self

    def __exit__(self, *exc: object) -> None:
        _default_stack().pop()


def _torch_type(platform: str) -> str:
    return {"gpu": "cuda", "rocm": "cuda", "METAL": "mps"}.get(platform, platform)


_local = threading.local()


def _default_stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def default_device() -> jax.Device | device | None:
    """The device set by the innermost ``with jm.device(...)`` block, if any."""
    stack = _default_stack()
    return stack[-1] if stack else None


def out_dtype(dtype: Any, *, what: str = "the result") -> Any:
    """A requested ``dtype=`` as the dtype JAX will use.

    64-bit integers become 32-bit ones when JAX's x64 mode is off (section 2
    of the contract: PyTorch's int64 results are int32 here); float64 and
    complex128 without x64 raise ``jm.DtypeError`` saying how to turn it on.
    """
    if dtype is None:
        return None
    if type(dtype).__module__ == "torch":  # a torch.dtype, for convenience
        dtype = str(dtype).replace("torch.", "")
    dt = jnp.dtype(dtype)
    if dt.kind in "iu":
        return jax.dtypes.canonicalize_dtype(dt)
    return canonical_dtype(dt, what=what)


def is_meta(x: Any) -> bool:
    """True when ``x`` (an array, Parameter or ShapeDtypeStruct) has no data."""
    x = state.peek(x) if state.is_cell(x) else x
    return isinstance(x, jax.ShapeDtypeStruct)


def resolve(spec: Any) -> jax.Device | jax.sharding.Sharding | device:
    """Turn anything ``Module.to`` accepts as a device into a JAX placement.

    Accepts ``"cpu"``, ``"cuda:N"``, an int (a CUDA index, as in PyTorch),
    ``jm.device``, ``jax.Device`` or ``jax.sharding.Sharding``. ``"meta"``
    comes back as the ``jm.device("meta")`` object.

    Raises:
        DeviceError: the device is not visible to JAX.
    """
    if isinstance(spec, (jax.Device, jax.sharding.Sharding)):
        return spec
    if type(spec).__module__ == "torch":  # a torch.device
        spec = str(spec)
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = device("cuda", spec)
    d = spec if isinstance(spec, device) else device(spec)
    if d.type == "meta":
        return d
    return d.jax_device()


_X64_HELP = (
    "JAX's 64-bit mode is off, so {what} cannot be float64/int64. Turn it on at the start "
    "of your program, before any array is created: `jax.config.update('jax_enable_x64', "
    "True)` (or set the environment variable JAX_ENABLE_X64=1)."
)


def canonical_dtype(dtype: Any, *, what: str = "the module", strict: bool = True):
    """``jnp.dtype`` of ``dtype``, refusing 64-bit types when x64 mode is off.

    Args:
        dtype: a jm/jnp/numpy dtype, a Python type, or a dtype name.
        what: how to name the thing being cast in the error message.
        strict: raise ``DtypeError`` for 64-bit types without x64 instead of
            letting JAX narrow them.
    """
    dt = jnp.dtype(dtype)
    if strict and dt.itemsize == 8 and dt.kind in "fiuc" and dt.kind != "c":
        if not _x64_enabled():
            raise DtypeError(_X64_HELP.format(what=what))
    if strict and dt == np.complex128 and not _x64_enabled():
        raise DtypeError(_X64_HELP.format(what=what).replace("float64/int64", "complex128"))
    return dt


class _Defaults:
    """Process-wide configuration, as PyTorch's default dtype is process-wide (it is read
    when arrays and parameters are made, never used to coordinate calls)."""

    dtype: Any = jnp.float32


def get_default_dtype() -> Any:
    """The dtype of new floating arrays and parameters, as ``torch.get_default_dtype``.

    >>> import jmodule as jm
    >>> jm.get_default_dtype()
    <class 'jax.numpy.float32'>
    """
    return _Defaults.dtype


def set_default_dtype(d: Any) -> None:
    """Set the dtype of new floating arrays and parameters, as ``torch.set_default_dtype``.

    Like PyTorch's, the setting is process-wide and applies to ``jm.tensor``
    of Python floats, ``jm.zeros``/``jm.rand``/... without ``dtype=``, and the
    parameters of layers built afterwards.

    Args:
        d: ``jm.float32``, ``jm.float16``, ``jm.bfloat16`` or ``jm.float64``
            (the last needs JAX's x64 mode).

    Raises:
        TypeError: ``d`` is not a floating dtype.
        DtypeError: ``float64`` while JAX's x64 mode is off.
    """
    dt = jnp.dtype(d)
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError("only floating-point types are supported as the default type")
    canonical_dtype(dt, what="the default dtype")
    _Defaults.dtype = {"float16": float16, "bfloat16": bfloat16, "float32": float32}.get(
        dt.name, float64
    )


class memory_format:
    """A PyTorch memory format. Accepted everywhere PyTorch accepts one, and a
    no-op: XLA chooses array layouts itself."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"jmodule.{self.name}"


preserve_format = memory_format("preserve_format")
contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
_FORMAT_NAMES = {"preserve_format", "contiguous_format", "channels_last", "channels_last_3d"}


def is_memory_format(x: Any) -> bool:
    """True for a jm (or torch) memory format object."""
    if isinstance(x, memory_format):
        return True
    return type(x).__name__ == "memory_format" and str(x).split(".")[-1] in _FORMAT_NAMES


def check_memory_format(x: Any) -> None:
    """Accept None or a memory format; anything else is a TypeError."""
    if x is not None and not is_memory_format(x):
        raise TypeError(
            f"memory_format must be a memory format such as jm.channels_last, got {x!r}"
        )


def single_device_sharding(device: jax.Device) -> jax.sharding.Sharding:
    """The sharding that holds a whole array on ``device``.

    JAX 0.12.1 deprecates naming ``jax.sharding.SingleDeviceSharding`` (its
    factory may later return a ``NamedSharding``): every single-device sharding
    jmodule makes comes from here, JAX's factory where it has one.

    >>> single_device_sharding(jax.devices()[0]).device_set == {jax.devices()[0]}
    True
    """
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    if make is None:  # JAX before the factory
        return jax.sharding.SingleDeviceSharding(device)
    return make(device)


def on_one_device(sharding: jax.sharding.Sharding) -> bool:
    """Whether ``sharding`` places a whole array on one device (whatever its class).

    >>> on_one_device(single_device_sharding(jax.devices()[0]))
    True
    """
    return len(sharding.device_set) == 1
