"""The runtime of the code that ``ScriptModule.code`` renders.

Rendered code is plain Python: each statement binds one JAX primitive through
:data:`prim` (``prim.dot_general(x, w, dimension_numbers=...)``), reads and
writes the module's state with :func:`get` and ``ops.set`` (:func:`set_state`,
which this module's ``__getattr__`` serves under that name so that the builtin
``set`` stays unshadowed here), and names dtypes as ``ops.float32``. Running it
op by op (eagerly) or under ``jax.jit`` computes what the module's forward
computes.

>>> import jax.numpy as jnp
>>> from jmodule.jit import ops
>>> ops.prim.add(jnp.ones(2), jnp.ones(2))
Array([2., 2.], dtype=float32)
"""

from __future__ import annotations

import importlib
import keyword
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from jmodule import _jax_internals as _jx
from jmodule import random as _random
from jmodule._lowering import state as _state

__all__ = [
    "RNG_KEY",
    "closed_jaxpr",
    "get",
    "key_dtype",
    "load",
    "prim",
    "prng_impl",
    "scalar",
    "set",
    "set_state",
    "spec",
]

#: The name rendered code uses for the default generator's key.
RNG_KEY = "<rng key>"

_lock = threading.Lock()
_registry: dict[str, Any] = {}


def _scan_primitives() -> dict[str, Any]:
    """Every JAX primitive reachable from an imported ``jax`` module, by name."""
    with _lock:
        if not _registry:
            for name, module in list(sys.modules.items()):
                if module is None or not (name == "jax" or name.startswith("jax.")):
                    continue
                for value in list(vars(module).values()):
                    if isinstance(value, jex_core.Primitive):
                        _registry.setdefault(value.name, value)
        return _registry


def lookup_primitive(name: str) -> Any:
    """The primitive called ``name``, or None."""
    found = _scan_primitives().get(name)
    if found is None:  # a module imported since the last scan may define it
        _registry.clear()
        found = _scan_primitives().get(name)
    return found


def bind(primitive: Any, *args: Any, **params: Any) -> Any:
    """Bind ``primitive`` to ``args`` with the parameters a jaxpr equation stores."""
    args = tuple(_raw(a) for a in args)
    return primitive.bind(*args, **primitive.get_bind_params(params))


class _Primitives:
    """``prim.<name>(*args, **params)`` binds the JAX primitive called ``name``.

    Names that are not identifiers are looked up by item (``prim["scatter-add"]``)
    and Python keywords take a trailing underscore (``prim.while_``).
    """

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        key = name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name
        return self[key]

    def __getitem__(self, name: str) -> Callable[..., Any]:
        primitive = lookup_primitive(name)
        if primitive is None:
            raise AttributeError(f"no JAX primitive named {name!r} in this jax ({jax.__version__})")
        return lambda *args, **params: bind(primitive, *args, **params)

    def __repr__(self) -> str:
        return "<JAX primitives by name>"


#: The primitives, by name: ``prim.add(a, b)``.
prim = _Primitives()


def attribute_for(name: str) -> str:
    """How rendered code spells primitive ``name``: ``prim.add`` or ``prim["scatter-add"]``."""
    if keyword.iskeyword(name):
        return f"prim.{name}_"
    if name.isidentifier() and not name.startswith("__"):
        return f"prim.{name}"
    return f"prim[{name!r}]"


def _raw(x: Any) -> Any:
    return _state.value(x)


def get(state: Any, name: str) -> Any:
    """The array called ``name`` (a ``state_dict`` key) in a module or a mapping.

    ``RNG_KEY`` is the default generator's key, unless ``state`` is a mapping
    that holds one (then the code is a pure function of the mapping).
    """
    if isinstance(state, Mapping) and (name != RNG_KEY or RNG_KEY in state):
        return _raw(state[name])
    if name == RNG_KEY:
        return _random.default_generator.materialize()
    owner, _, attr = name.rpartition(".")
    module = state.get_submodule(owner)
    if attr in module._parameters:
        return _state.read(module._parameters[attr])
    if attr in module._buffers:
        return module._buffers[attr]
    raise AttributeError(f"{type(module).__name__} has no parameter or buffer {attr!r}")


def set_state(state: Any, name: str, value: Any) -> None:
    """Write ``value`` to the buffer (or parameter) ``name`` of a module or a mapping.

    Rendered code calls it as ``ops.set(self, name, value)``.
    """
    if isinstance(state, MutableMapping) and (name != RNG_KEY or RNG_KEY in state):
        state[name] = value
        return
    if name == RNG_KEY:
        _random.default_generator.__dict__["_key"] = value
        return
    owner, _, attr = name.rpartition(".")
    module = state.get_submodule(owner)
    if attr in module._parameters:
        _state.assign(module._parameters[attr], value)
    else:
        setattr(module, attr, value)


def _dtype(name: str) -> np.dtype:
    return np.dtype(jnp.dtype(name))


def scalar(dtype: str, value: Any) -> Any:
    """A numpy scalar of a dtype numpy lacks a name for (``scalar("bfloat16", 1.0)``)."""
    return _dtype(dtype).type(value)


def key_dtype(impl: str) -> Any:
    """The dtype of typed PRNG keys of implementation ``impl`` (e.g. ``"threefry2x32"``)."""
    return jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype


def prng_impl(name: str) -> Any:
    """The PRNG implementation called ``name``, as ``random_wrap`` takes it."""
    return _jx.prng_impl(key_dtype(name))


def spec(shape: Sequence[int], dtype: Any, weak_type: bool = False) -> jax.ShapeDtypeStruct:
    """An abstract array: the type of an input of a nested program."""
    return jax.ShapeDtypeStruct(tuple(shape), dtype, weak_type=weak_type)


def closed_jaxpr(fn: Callable[..., Sequence[Any]], in_specs: Sequence[Any]) -> Any:
    """Trace ``fn`` (which returns a list of arrays) to the ClosedJaxpr a primitive takes."""
    return jax.make_jaxpr(lambda *a: list(fn(*a)))(*in_specs)


def load(path: str) -> Any:
    """The object at ``"module:qualified.name"``."""
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def __getattr__(name: str) -> Any:
    if name == "set":  # what rendered code calls set_state
        return set_state
    # dtypes by name: ops.float32, ops.bfloat16, ops.int8, ...
    try:
        return _dtype(name)
    except TypeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def is_dtype_name(name: str) -> bool:
    """True when ``ops.<name>`` is the numpy dtype called ``name``."""
    if not name.isidentifier() or name in globals() or name == "set":
        return False
    try:
        return _dtype(name).name == name
    except TypeError:
        return False
