"""``Parameter`` and ``Buffer``: PyTorch's markers, holding ``jax.Array`` values.

A :class:`Parameter` is what ``module.weight`` returns. It is usable wherever a
``jax.Array`` is (``jnp``/``jax.nn`` functions, arithmetic, indexing, as a
``jax.jit`` argument) because it is a pytree node with one leaf and defines
the array operators; ``jax.lax`` primitives need the raw array
(``param.data``). Its value lives in ``param.__dict__["_value"]`` so compiled
code can read and write it without going through attribute lookup.
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._lowering import binding

__all__ = ["Buffer", "Parameter", "as_array"]


def as_array(value: Any) -> Any:
    """``value`` as a ``jax.Array`` (or tracer / ShapeDtypeStruct), unwrapping
    Parameters and converting numpy arrays and torch tensors."""
    if isinstance(value, _ArrayLike):
        inner = value.__dict__["_value"]
        if isinstance(inner, jax.ShapeDtypeStruct):
            raise RuntimeError(META_HELP)
        return inner
    if isinstance(value, (jax.Array, jax.ShapeDtypeStruct)):
        return value
    if type(value).__module__.startswith("torch"):
        from jmodule.utils import torch_to_numpy

        value = torch_to_numpy(value)
    return jnp.asarray(value)


META_HELP = (
    "This parameter is on the meta device: it has a shape and dtype but no data, so it "
    "cannot be computed with. Allocate it with module.to_empty(device=...) and initialise it "
    "(reset_parameters() or load_state_dict) first."
)


def _unwrap(x: Any) -> Any:
    return x.__dict__["_value"] if isinstance(x, _ArrayLike) else x


def _binary(op):
    def forward(self, other):
        return op(self.__dict__["_value"], _unwrap(other))

    def reflected(self, other):
        return op(_unwrap(other), self.__dict__["_value"])

    return forward, reflected


def _unary(op):
    def method(self):
        return op(self.__dict__["_value"])

    return method


class _ArrayLike:
    """Array behaviour shared by Parameter and Buffer, delegating to ``_value``."""

    __array_priority__ = 100

    @property
    def data(self) -> jax.Array:
        """The underlying ``jax.Array`` (assignable, as in PyTorch)."""
        return self.__dict__["_value"]

    @data.setter
    def data(self, value: Any) -> None:
        self.__dict__["_value"] = as_array(value)

    def __getattr__(self, name: str) -> Any:
        # Everything jax.Array has: shape, dtype, ndim, size, T, device,
        # sharding, reshape, sum, astype, ...
        if name.startswith("__") or name == "_value":
            raise AttributeError(name)
        value = self.__dict__["_value"]
        if isinstance(value, jax.ShapeDtypeStruct) and not hasattr(value, name):
            raise RuntimeError(f"{META_HELP} (while looking up .{name})")
        return getattr(value, name)

    def __jax_array__(self) -> jax.Array:
        return as_array(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self.__dict__["_value"])
        return out if dtype is None else out.astype(dtype)

    def __len__(self) -> int:
        return len(self.__dict__["_value"])

    def __iter__(self):
        return iter(self.__dict__["_value"])

    def __getitem__(self, idx: Any) -> jax.Array:
        return self.__dict__["_value"][_unwrap(idx)]

    def __bool__(self) -> bool:
        return bool(self.__dict__["_value"])

    def __float__(self) -> float:
        return float(self.__dict__["_value"])

    def __int__(self) -> int:
        return int(self.__dict__["_value"])

    def __index__(self) -> int:
        return operator.index(self.__dict__["_value"])

    def __complex__(self) -> complex:
        return complex(self.__dict__["_value"])

    __hash__ = object.__hash__

    __add__, __radd__ = _binary(operator.add)
    __sub__, __rsub__ = _binary(operator.sub)
    __mul__, __rmul__ = _binary(operator.mul)
    __truediv__, __rtruediv__ = _binary(operator.truediv)
    __floordiv__, __rfloordiv__ = _binary(operator.floordiv)
    __mod__, __rmod__ = _binary(operator.mod)
    __pow__, __rpow__ = _binary(operator.pow)
    __matmul__, __rmatmul__ = _binary(operator.matmul)
    __and__, __rand__ = _binary(operator.and_)
    __or__, __ror__ = _binary(operator.or_)
    __xor__, __rxor__ = _binary(operator.xor)
    __lshift__, __rlshift__ = _binary(operator.lshift)
    __rshift__, __rrshift__ = _binary(operator.rshift)
    # The reflected form of ``self < other`` is ``other < self``, i.e. ``self > other``.
    __lt__, __gt__ = _binary(operator.lt)
    __le__, __ge__ = _binary(operator.le)
    __eq__, _ = _binary(operator.eq)
    __ne__, _ = _binary(operator.ne)
    __neg__ = _unary(operator.neg)
    __pos__ = _unary(operator.pos)
    __abs__ = _unary(operator.abs)
    __invert__ = _unary(operator.invert)


def _differentiable(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class Parameter(_ArrayLike):
    """A module parameter: a ``jax.Array`` value plus ``requires_grad`` and ``grad``.

    Args:
        data: the initial value (jax/numpy array, torch tensor, or a
            ``jax.ShapeDtypeStruct`` for an abstract "meta" parameter).
            Defaults to an empty float32 array, as in PyTorch.
        requires_grad: whether gradients are computed for it (only floating
            and complex parameters can; integer ones need ``requires_grad=False``).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> w = nn.Parameter(jnp.ones((2, 3)))
    >>> (w * 2).sum(), w.shape, w.requires_grad
    (Array(12., dtype=float32), (2, 3), True)
    """

    def __init__(self, data: Any = None, requires_grad: bool = True):
        if data is None:
            data = jnp.empty((0,), jnp.float32)
        value = as_array(data)
        if requires_grad and not _differentiable(value.dtype):
            raise RuntimeError(
                "Only Tensors of floating point and complex dtype can require gradients"
            )
        self.__dict__["_value"] = value
        self.__dict__["_requires_grad"] = bool(requires_grad)
        self.__dict__["grad"] = None

    @property
    def grad(self) -> Any:
        """The accumulated gradient (a ``jax.Array``), or None."""
        d = self.__dict__
        watch = binding.GRAD_WATCH[0]
        if watch is not None and id(d) in watch.watched and id(d) not in watch.written:
            watch.reads.add(id(d))
        return d["grad"]

    @grad.setter
    def grad(self, value: Any) -> None:
        d = self.__dict__
        watch = binding.GRAD_WATCH[0]
        if watch is not None and id(d) in watch.watched:
            watch.written.add(id(d))
        d["grad"] = value

    @property
    def requires_grad(self) -> bool:
        """Whether gradients are computed for this parameter."""
        return self.__dict__["_requires_grad"]

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        value = bool(value)
        if value and not _differentiable(self.__dict__["_value"].dtype):
            raise RuntimeError(
                "only Tensors of floating point and complex dtype can require gradients"
            )
        if value != self.__dict__["_requires_grad"]:
            self.__dict__["_requires_grad"] = value
            binding.bump()

    def requires_grad_(self, requires_grad: bool = True) -> Parameter:
        """Set ``requires_grad`` in place and return the parameter.

        Raises:
            RuntimeError: ``requires_grad`` for an integer or boolean parameter.
        """
        if requires_grad and not _differentiable(self.__dict__["_value"].dtype):
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return True

    def detach(self) -> jax.Array:
        """The value without gradient tracking: the plain ``jax.Array``."""
        return jax.lax.stop_gradient(self.__dict__["_value"])

    def __repr__(self) -> str:
        return f"Parameter containing:\n{self.__dict__['_value']!r}"

    def __deepcopy__(self, memo: dict) -> Parameter:
        # As PyTorch, a copy starts without ``.grad``; other attributes are kept.
        out = Parameter.__new__(type(self))
        memo[id(self)] = out
        out.__dict__.update(
            # A real copy, as PyTorch's clone(): compiled steps donate (free)
            # the buffers they rewrite, so two modules must never share one.
            _value=_copy_array(self.__dict__["_value"]),
            _requires_grad=self.__dict__["_requires_grad"],
            grad=None,
        )
        for k, v in self.__dict__.items():
            if k not in out.__dict__:
                out.__dict__[k] = copy.deepcopy(v, memo)
        return out

    def __reduce_ex__(self, protocol: int):
        # As PyTorch, ``.grad`` is not pickled.
        return (_rebuild_parameter, (type(self), {**self.__dict__, "grad": None}))


def _copy_array(value: Any) -> Any:
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return value.copy()
    return value


def _rebuild_parameter(cls: type, state: dict) -> Parameter:
    out = cls.__new__(cls)
    out.__dict__.update(state)
    return out


class Buffer(_ArrayLike):
    """Marks an array as a buffer when assigned to a module attribute (PyTorch 2.x).

    ``module.x = nn.Buffer(array, persistent=False)`` registers ``x`` as a
    buffer; reading ``module.x`` afterwards returns the plain ``jax.Array``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> m = nn.Module()
    >>> m.steps = nn.Buffer(jnp.zeros(()), persistent=False)
    >>> list(m.state_dict())
    []
    """

    def __init__(self, data: Any = None, *, persistent: bool = True):
        if data is None:
            data = jnp.empty((0,), jnp.float32)
        self.__dict__["_value"] = as_array(data)
        self.__dict__["persistent"] = persistent

    def __repr__(self) -> str:
        return f"Buffer containing:\n{self.__dict__['_value']!r}"


def _flatten(p: _ArrayLike):
    return (p.__dict__["_value"],), None


jax.tree_util.register_pytree_node(Parameter, _flatten, lambda _, c: c[0])
jax.tree_util.register_pytree_node(Buffer, _flatten, lambda _, c: c[0])
