"""Parameter initialisation, as ``torch.nn.init``.

Each ``*_`` function gives the Parameter a new value drawn from the default
generator (or ``generator``) and returns the same Parameter, as PyTorch's
in-place functions do. Given a plain ``jax.Array`` (immutable) they return
the new array instead. On a meta parameter (no data) they do nothing, and on
a sharded parameter they generate the value directly with its sharding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _threefry
from jmodule import random as _random
from jmodule._lowering import state
from jmodule._placement import factory as _factory

__all__ = [
    "calculate_gain",
    "constant_",
    "dirac_",
    "eye_",
    "kaiming_normal_",
    "kaiming_uniform_",
    "normal_",
    "ones_",
    "orthogonal_",
    "trunc_normal_",
    "uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
]


def _value(tensor: Any) -> Any:
    return state.peek(tensor) if state.is_cell(tensor) else tensor


def _store(tensor: Any, new: Any) -> Any:
    if state.is_cell(tensor):
        state.assign(tensor, new)
        return tensor
    return new


@functools.lru_cache(maxsize=256)
def _sharded(fn: Callable, shape: tuple, dtype: Any, sharding: Any, n_keys: int) -> Callable:
    return jax.jit(lambda *a: fn(*a, shape, dtype), out_shardings=sharding)


def _bucket(n: int) -> int:
    """``n`` rounded up to a size of the form ``k * 2**e`` with ``4 <= k < 8`` (at least 1024).

    Elementwise initialisers run one program per bucket: a model's many
    parameter shapes share a few programs (within 25% of their size) instead
    of compiling one random-number program per shape (about 0.3 s each on a
    CPU).
    """
    if n <= 1024:
        return 1024
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


@functools.lru_cache(maxsize=256)
def _flat_program(fn: Callable, size: int, dtype: Any, n_args: int) -> Callable:
    return jax.jit(lambda *a: fn(*a, (size,), dtype))


@functools.lru_cache(maxsize=1024)
def _cut_program(size: int, shape: tuple) -> Callable:
    count = math.prod(shape)
    return jax.jit(lambda flat: jnp.reshape(flat[:count], shape))


def _elementwise(fn: Callable, args: tuple, shape: tuple, dtype: Any, like: jax.Array) -> jax.Array:
    """``fn(*args, shape, dtype)`` on ``device``, through the program of its size's bucket.

    The same values: JAX's random bits (and so every elementwise initialiser)
    at a flat position do not depend on the shape asked for, so the first
    ``prod(shape)`` values of the bucket-sized draw are those of the shape.
    That holds for threefry with ``jax_threefry_partitionable`` on (JAX's
    default; :func:`jmodule._threefry.available`): otherwise the shape is
    drawn itself.
    """
    count = math.prod(shape)
    size = _bucket(count)
    flat = _flat_program(fn, size, jnp.dtype(dtype), len(args))(*args)
    if _factory.on_one_cpu(like):  # a view on the host: no program per shape at all
        return _factory.put_like(np.asarray(flat)[:count].reshape(shape), like)
    return _cut_program(size, tuple(shape))(flat)


# Draws at most this large are computed on the host (jmodule._threefry) where the
# parameter lives on a CPU: about 15 ms for the largest, against 0.2-0.3 s to compile
# a bucket's program; larger ones go to XLA, whose programs they amortise.
_HOST_DRAW = 1 << 18


def _host_fill(fn: Callable, args: tuple, shape: tuple, dtype: Any) -> np.ndarray | None:
    """``fn(*args, shape, dtype)`` computed with NumPy, where it can be exactly; else None."""
    if fn is _full:
        (value,) = args
        return np.full(shape, value, dtype=jnp.dtype(dtype))
    count = math.prod(shape)
    if fn is _uniform and count <= _HOST_DRAW and isinstance(args[0], np.ndarray):
        key, low, high = args
        flat = _threefry.uniform(key, low, high, count)
        return flat.astype(jnp.dtype(dtype)).reshape(shape)
    return None


def _fill(
    tensor: Any,
    fn: Callable,
    *args: Any,
    generator: Any = None,
    random: bool = True,
    elementwise: bool = False,
) -> Any:
    """Set ``tensor`` to ``fn(*args, [key,] shape, dtype)`` placed like it.

    ``elementwise``: ``fn``'s value at a flat position does not depend on the
    shape (see :func:`_elementwise`). On a CPU, the key is split and uniform and
    constant values are made on the host (:func:`_host_fill`): no XLA program.
    """
    old = _value(tensor)
    if isinstance(old, jax.ShapeDtypeStruct):
        return tensor
    host = _factory.on_one_cpu(old)
    if random:
        generator = generator or _random.default_generator
        key = generator._next_host_key() if host else None
        args = (generator.next_key() if key is None else key, *args)
    sharding = getattr(old, "sharding", None)
    made = _host_fill(fn, args, tuple(old.shape), old.dtype) if host and elementwise else None
    if made is None and random and isinstance(args[0], np.ndarray):
        args = (jax.device_put(args[0]), *args[1:])  # drawn by a program: a device key
    if made is not None:
        new = _factory.put_like(made, old)
    elif sharding is not None and len(sharding.device_set) > 1:
        new = _sharded(fn, old.shape, old.dtype, sharding, len(args))(*args)
    elif (
        elementwise
        and sharding is not None
        and not isinstance(old, jax.core.Tracer)
        and (not random or _threefry.available())
    ):
        new = _elementwise(fn, args, tuple(old.shape), old.dtype, old)
    else:
        new = fn(*args, old.shape, old.dtype)
    if sharding is not None and new.sharding != sharding:
        new = jax.device_put(new, sharding)
    return _store(tensor, new)


def _uniform(key, low, high, shape, dtype):
    return jax.random.uniform(key, shape, jnp.float32, low, high).astype(dtype)


def _normal(key, mean, std, shape, dtype):
    return (mean + std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def _trunc_normal(key, mean, std, a, b, shape, dtype):
    z = jax.random.truncated_normal(key, (a - mean) / std, (b - mean) / std, shape, jnp.float32)
    return (mean + std * z).astype(dtype)


def _full(value, shape, dtype):
    return jnp.full(shape, value, dtype)


def calculate_fan_in_and_fan_out(shape: tuple[int, ...]) -> tuple[int, int]:
    """PyTorch's fan-in/fan-out of a weight shape (``(out, in, *kernel)``)."""
    if len(shape) < 2:
        raise ValueError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        )
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


_calculate_fan_in_and_fan_out = calculate_fan_in_and_fan_out


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for ``nonlinearity``, as ``torch.nn.init.calculate_gain``.

    >>> from jmodule.nn import init
    >>> round(init.calculate_gain("relu"), 4)
    1.4142
    """
    linear = {
        "linear",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    }
    if nonlinearity in linear or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def uniform_(tensor: Any, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Any:
    """Fill with values drawn from U(a, b)."""
    return _fill(tensor, _uniform, float(a), float(b), generator=generator, elementwise=True)


def normal_(tensor: Any, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Any:
    """Fill with values drawn from N(mean, std²)."""
    return _fill(tensor, _normal, float(mean), float(std), generator=generator, elementwise=True)


def trunc_normal_(
    tensor: Any,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    generator: Any = None,
) -> Any:
    """Fill with N(mean, std²) values truncated to [a, b]."""
    return _fill(
        tensor,
        _trunc_normal,
        float(mean),
        float(std),
        float(a),
        float(b),
        generator=generator,
        elementwise=True,
    )


def constant_(tensor: Any, val: float) -> Any:
    """Fill with ``val``."""
    return _fill(tensor, _full, val, random=False, elementwise=True)


def zeros_(tensor: Any) -> Any:
    """Fill with zeros."""
    return constant_(tensor, 0)


def ones_(tensor: Any) -> Any:
    """Fill with ones."""
    return constant_(tensor, 1)


def eye_(tensor: Any) -> Any:
    """Fill a 2-D tensor with the identity matrix."""
    if len(_value(tensor).shape) != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(tensor, lambda shape, dtype: jnp.eye(*shape, dtype=dtype), random=False)


def dirac_(tensor: Any, groups: int = 1) -> Any:
    """Fill a 3/4/5-D tensor with the Dirac delta (identity convolution)."""
    shape = _value(tensor).shape
    if len(shape) not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    if shape[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_per_group = shape[0] // groups
    min_dim = min(out_per_group, shape[1])

    def make(shape: tuple, dtype: Any) -> jax.Array:
        w = jnp.zeros(shape, dtype)
        centre = tuple(s // 2 for s in shape[2:])
        for g in range(groups):
            for d in range(min_dim):
                w = w.at[(g * out_per_group + d, d, *centre)].set(1)
        return w

    return _fill(tensor, make, random=False)


def xavier_uniform_(tensor: Any, gain: float = 1.0, generator: Any = None) -> Any:
    """Glorot uniform: U(-a, a) with a = gain·sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(_value(tensor).shape)
    bound = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Any, gain: float = 1.0, generator: Any = None) -> Any:
    """Glorot normal: N(0, std²) with std = gain·sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(_value(tensor).shape)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def _kaiming_std(tensor: Any, a: float, mode: str, nonlinearity: str) -> float:
    shape = _value(tensor).shape
    if 0 in shape:
        return 0.0
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = calculate_fan_in_and_fan_out(shape)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(
    tensor: Any,
    a: float = 0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Any:
    """He uniform: U(-b, b) with b = gain·sqrt(3 / fan)."""
    if 0 in _value(tensor).shape:
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Any,
    a: float = 0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Any:
    """He normal: N(0, std²) with std = gain / sqrt(fan)."""
    if 0 in _value(tensor).shape:
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def _orthogonal(key, gain, shape, dtype):
    rows = shape[0]
    cols = math.prod(shape[1:])
    flat = jax.random.normal(key, (rows, cols), jnp.float32)
    if rows < cols:
        flat = flat.T
    q, r = jnp.linalg.qr(flat)
    q = q * jnp.sign(jnp.diagonal(r))
    if rows < cols:
        q = q.T
    return (gain * q).reshape(shape).astype(dtype)


def orthogonal_(tensor: Any, gain: float = 1.0, generator: Any = None) -> Any:
    """Fill with a (semi-)orthogonal matrix, as ``torch.nn.init.orthogonal_``."""
    if len(_value(tensor).shape) < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    return _fill(tensor, _orthogonal, float(gain), generator=generator)
