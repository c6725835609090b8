"""``Parameter`` and ``Buffer``: PyTorch's markers, holding ``jax.Array`` values.

A :class:`Parameter` is what ``module.weight`` returns. It is usable wherever a
``jax.Array`` is (``jnp``/``jax.nn`` functions, arithmetic, indexing, as a
``jax.jit`` argument) because it is a state cell (``jmodule._lowering.state.Cell``):
a pytree node with one leaf that defines the array operators; ``jax.lax``
primitives need the raw array (``param.data``).
"""

from __future__ import annotations

import copy
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import state
from jmodule._lowering.state import META_HELP as META_HELP
from jmodule._lowering.state import Cell, as_array

__all__ = ["Buffer", "Parameter", "as_array"]

# ``as_array`` is the state module's; it is re-exported here, where PyTorch-facing
# code has always found it.


def _differentiable(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class Parameter(Cell):
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
        state.assign(self, value)
        self.__dict__["_requires_grad"] = bool(requires_grad)
        self.__dict__["grad"] = None

    @property
    def grad(self) -> Any:
        """The accumulated gradient (a ``jax.Array``), or None."""
        d = self.__dict__
        watch = state.local.watch
        if watch is not None and id(d) in watch.watched and id(d) not in watch.written:
            watch.reads.add(id(d))
        return state.grad_value(d)

    @grad.setter
    def grad(self, value: Any) -> None:
        d = self.__dict__
        watch = state.local.watch
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
        if value and not _differentiable(state.peek(self).dtype):
            raise RuntimeError(
                "only Tensors of floating point and complex dtype can require gradients"
            )
        if value != self.__dict__["_requires_grad"]:
            self.__dict__["_requires_grad"] = value
            state.touch(self)  # the modules holding it describe themselves again

    def requires_grad_(self, requires_grad: bool = True) -> Parameter:
        """Set ``requires_grad`` in place and return the parameter.

        Raises:
            RuntimeError: ``requires_grad`` for an integer or boolean parameter.
        """
        if requires_grad and not _differentiable(state.peek(self).dtype):
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return True

    def detach(self) -> jax.Array:
        """The value without gradient tracking: the plain ``jax.Array``."""
        return jax.lax.stop_gradient(state.read(self))

    def __repr__(self) -> str:
        return f"Parameter containing:\n{state.peek(self)!r}"

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        from jmodule._display import parameter_repr

        return parameter_repr(self, path, subtree_renderer)

    def __deepcopy__(self, memo: dict) -> Parameter:
        # As PyTorch, a copy starts without ``.grad``; other attributes are kept.
        out = Parameter.__new__(type(self))
        memo[id(self)] = out
        # A real copy, as PyTorch's clone(): compiled steps donate (free)
        # the buffers they rewrite, so two modules must never share one.
        state.assign(out, _copy_array(state.peek(self)))
        out.__dict__.update(_requires_grad=self.__dict__["_requires_grad"], grad=None)
        for k, v in self.__dict__.items():
            if k not in out.__dict__ and k not in state.PRIVATE:
                out.__dict__[k] = copy.deepcopy(v, memo)
        return out

    def __reduce_ex__(self, protocol: int):
        # As PyTorch, ``.grad`` is not pickled.
        kept = {k: v for k, v in self.__dict__.items() if k not in state.PRIVATE}
        return (_rebuild_parameter, (type(self), {**kept, "grad": None}))


def _copy_array(value: Any) -> Any:
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return value.copy()
    return value


def _rebuild_parameter(cls: type, state: dict) -> Parameter:
    out = cls.__new__(cls)
    out.__dict__.update(state)
    return out


class Buffer(Cell):
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
        state.assign(self, as_array(data))
        self.__dict__["persistent"] = persistent

    def __repr__(self) -> str:
        return f"Buffer containing:\n{state.peek(self)!r}"


jax.tree_util.register_pytree_node(Parameter, state.flatten_cell, lambda _, c: c[0])
jax.tree_util.register_pytree_node(Buffer, state.flatten_cell, lambda _, c: c[0])
