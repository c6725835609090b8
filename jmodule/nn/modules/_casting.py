"""Moving and casting modules: ``to``, ``cuda``, ``half``, ``type``, ``to_empty``.

Every parameter keeps its identity (optimizers holding it stay valid): only
its value is replaced. What the arguments mean, and putting one array where
they say, is ``jmodule/_placement/parse.py``'s (``jm.load``'s ``map_location``
reads the same words); checks of a sharding against every array, and
``to_empty(device=(mesh, rules))``, are ``jmodule/_placement/sharding.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from jmodule import _placement
from jmodule._lowering import state
from jmodule._placement import device as _device
from jmodule._placement import sharding as _sharding
from jmodule.nn.parameter import Parameter

T = TypeVar("T")


def _parse_to(args: tuple, kwargs: dict) -> tuple[_placement.Target, bool]:
    """PyTorch's ``to`` overloads -> (where and in which dtype, non_blocking)."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", False)
    memory_format = kwargs.pop("memory_format", None)
    kwargs.pop("copy", False)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword argument(s) {sorted(kwargs)}")
    _device.check_memory_format(memory_format)
    positional = list(args)
    if positional and isinstance(positional[-1], bool):
        non_blocking = positional.pop()
    specs = [
        arg.data if isinstance(arg, Parameter) else arg
        for arg in positional
        if not _device.is_memory_format(arg)
    ]
    target = _placement.parse(specs, device=device, dtype=dtype, what="to")
    return target, bool(non_blocking)


class CastingMixin:
    """Device and dtype conversions of :class:`~jmodule.nn.Module`."""

    def _apply(self: T, fn: Callable[[Any], Any], recurse: bool = True) -> T:
        """Replace every parameter value, grad and buffer by ``fn(value)``."""
        if recurse:
            for module in self.children():
                module._apply(fn)
        for param in self._parameters.values():
            if param is not None:
                state.assign(param, fn(state.peek(param)))
                if param.grad is not None:
                    param.grad = fn(param.grad)
        for name, buf in self._buffers.items():
            if buf is not None:
                self._buffers[name] = fn(buf)
        state.touch(self)  # dtypes or devices may change what the program is
        return self

    def to(self: T, *args: Any, **kwargs: Any) -> T:
        """Move and/or cast parameters and buffers, as ``torch.nn.Module.to``.

        Forms: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``,
        ``to(array)`` (its dtype and sharding), ``to(memory_format=...)``,
        each with ``non_blocking``. A device is ``"cpu"``, ``"cuda:N"``, an
        int, a ``jm.device``, a ``jax.Device`` or a ``jax.sharding.Sharding``.
        Only floating and complex values change dtype; integer ones only
        move. ``memory_format`` is accepted and does nothing (XLA chooses
        layouts); ``non_blocking`` too (JAX transfers are asynchronous).

        Raises:
            DeviceError: JAX cannot see the device (the message lists those it can).
            DtypeError: a 64-bit dtype while JAX's x64 mode is off.
            ShardingRuleError: a ``NamedSharding`` that cannot hold some array
                (each is listed; nothing moves).

        >>> import jmodule as jm
        >>> m = jm.nn.Linear(2, 2).to(jm.bfloat16)
        >>> m.weight.dtype
        dtype(bfloat16)
        """
        (place, dtype), _ = _parse_to(args, dict(kwargs))
        _sharding.check_fits(self, place)  # every array it cannot hold, before any moves

        def convert(value: Any) -> Any:
            value = _placement.cast_floating(value, dtype)
            if place is not None:
                value = _placement.move(value, place)
            return value

        return self._apply(convert)

    def _to_device(self: T, kind: str, index: Any) -> T:
        if isinstance(index, (_device.device, str, jax.Device)):
            return self.to(index)
        return self.to(_device.device(kind, index))

    def cpu(self: T) -> T:
        """Move everything to the CPU."""
        return self.to("cpu")

    def cuda(self: T, device: Any = None) -> T:
        """Move everything to CUDA device ``device`` (an index; default 0)."""
        return self._to_device("cuda", device)

    def ipu(self: T, device: Any = None) -> T:
        """Move to an IPU (a JAX platform named ``ipu`` must exist)."""
        return self._to_device("ipu", device)

    def xpu(self: T, device: Any = None) -> T:
        """Move to an XPU (a JAX platform named ``xpu`` must exist)."""
        return self._to_device("xpu", device)

    def mtia(self: T, device: Any = None) -> T:
        """Move to an MTIA device (a JAX platform named ``mtia`` must exist)."""
        return self._to_device("mtia", device)

    def _cast_floating(self: T, dtype: Any) -> T:
        dtype = _device.canonical_dtype(dtype)
        return self._apply(
            lambda v: _placement.cast(v, dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
        )

    def half(self: T) -> T:
        """Cast floating-point parameters and buffers to float16."""
        return self._cast_floating(jnp.float16)

    def float(self: T) -> T:
        """Cast floating-point parameters and buffers to float32."""
        return self._cast_floating(jnp.float32)

    def double(self: T) -> T:
        """Cast floating-point parameters and buffers to float64 (needs JAX's x64 mode).

        Raises:
            DtypeError: x64 mode is off; the message says how to turn it on.
        """
        return self._cast_floating(jnp.float64)

    def bfloat16(self: T) -> T:
        """Cast floating-point parameters and buffers to bfloat16."""
        return self._cast_floating(jnp.bfloat16)

    def type(self: T, dst_type: Any) -> T:
        """Cast every parameter and buffer, integer ones included, to ``dst_type``."""
        dtype = _device.canonical_dtype(dst_type)
        return self._apply(lambda v: _placement.cast(v, dtype))

    def to_empty(self: T, *, device: Any, recurse: bool = True) -> T:
        """Allocate every parameter and buffer on ``device`` without initialising them.

        The values are zeros (JAX has no uninitialised memory). Use it after
        building under ``jm.device("meta")``, then call ``reset_parameters()``
        or ``load_state_dict``. ``device`` may be a ``jax.sharding.Sharding``
        (every array allocated with it), or ``(mesh, rules)`` with the rules of
        :func:`jmodule.distributed.shard`: each array is then created directly
        with its own sharding, so every device allocates only its shard, and
        ``reset_parameters()`` fills the shards in place.

        Raises:
            ShardingRuleError: a rule cannot apply (see ``jm.distributed.shard``),
                or a ``NamedSharding`` cannot hold some array.

        >>> import jmodule as jm
        >>> with jm.device("meta"):
        ...     layer = jm.nn.Linear(4, 2)
        >>> layer.to_empty(device="cpu").weight.shape
        (2, 4)
        """
        if (
            isinstance(device, tuple)
            and len(device) == 2
            and isinstance(device[0], jax.sharding.Mesh)
        ):
            return _sharding.allocate(self, device[0], device[1], recurse)
        place = _device.resolve(device)
        _sharding.check_fits(self, place, recurse)
        if _placement.is_meta(place):
            return self._apply(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), recurse)
        return self._apply(lambda v: jnp.zeros(v.shape, v.dtype, device=place), recurse)
