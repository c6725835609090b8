"""Flax NNX interop, both ways.

* An NNX module assigned to a jmodule module (``self.block = nnx.Linear(...)``)
  becomes a :class:`FlaxModule` submodule: its ``nnx.Param``s are jmodule
  Parameters (in ``named_parameters()``, ``state_dict()``, optimizers,
  gradients), its other variables (BatchNorm statistics, RNG keys and
  counts) are buffers, and it compiles with the rest of the model.
* :func:`to_flax` wraps a jmodule model as an ``nnx.Module`` whose parameters
  are ``nnx.Param``s, so ``nnx.jit``, ``nnx.grad`` and ``nnx.Optimizer`` work
  on it.

jmodule owns the state in both cases: the wrapped object is rebuilt from it
on every call (``nnx.merge``), so reading the original object afterwards
shows its old values; use :meth:`FlaxModule.to_nnx` for an up-to-date copy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jmodule import random as _random
from jmodule._lowering import binding, state
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = ["FlaxModule", "is_nnx_module", "to_flax"]


def is_nnx_module(value: Any) -> bool:
    """True for a Flax NNX module (checked without importing flax)."""
    return any(
        c.__module__.startswith("flax.nnx") and c.__name__ == "Module" for c in type(value).__mro__
    )


class _FlaxNode(Module):
    """Holds the variables under one path prefix of an NNX module."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("parts of a FlaxModule are not callable on their own")


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(getattr(x, "dtype", jnp.float32), jax.dtypes.prng_key)


class FlaxModule(Module):
    """A Flax NNX module living inside a jmodule model.

    Args:
        module: the ``nnx.Module``.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import jmodule as jm
    >>> class Net(jm.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.flax_block = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    ...         self.head = jm.nn.Linear(3, 1)
    ...
    ...     def forward(self, x):
    ...         return self.head(self.flax_block(x))
    >>> [name for name, _ in Net().named_parameters()]
    ['flax_block.bias', 'flax_block.kernel', 'head.weight', 'head.bias']
    """

    def __init__(self, module: Any):
        super().__init__()
        from flax import nnx

        graphdef, state = nnx.split(module)
        leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(state)
        flat = nnx.to_flat_state(state)
        if len(flat) != len(leaves_with_paths):
            raise TypeError(
                f"{type(module).__name__}: every NNX variable must hold one array to live "
                "inside a jmodule model"
            )
        places: list[tuple[Module, str, bool, Any]] = []
        for (path, var), (_, leaf) in zip(flat, leaves_with_paths):
            owner: Module = self
            for part in path[:-1]:
                name = str(part)
                if name not in owner._modules:
                    owner.add_module(name, _FlaxNode())
                owner = owner._modules[name]
            name = str(path[-1])
            impl = jax.random.key_impl(leaf) if _is_key(leaf) else None
            value = jax.random.key_data(leaf) if impl is not None else leaf
            is_param = isinstance(var, nnx.Param)
            if is_param:
                owner.register_parameter(name, Parameter(value))
            else:
                owner.register_buffer(name, value)
            places.append((owner, name, is_param, impl))
        self.__dict__["_graphdef"] = graphdef
        self.__dict__["_treedef"] = treedef
        self.__dict__["_places"] = places
        self.__dict__["_nnx_type"] = type(module).__name__

    def _leaves(self) -> list[Any]:
        out = []
        for owner, name, is_param, impl in self._places:
            value = owner._parameters[name].data if is_param else owner._buffers[name]
            out.append(jax.random.wrap_key_data(value, impl=impl) if impl is not None else value)
        return out

    def to_nnx(self) -> Any:
        """A new NNX module holding the current values."""
        from flax import nnx

        state = jax.tree_util.tree_unflatten(self._treedef, self._leaves())
        return nnx.merge(self._graphdef, state)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from flax import nnx

        module = self.to_nnx()
        out = module(*args, **kwargs)
        _, new_state = nnx.split(module)
        new = jax.tree_util.tree_leaves(new_state)
        for (owner, name, is_param, impl), old, value in zip(self._places, self._leaves(), new):
            if value is old:
                continue
            if impl is not None:
                value = jax.random.key_data(value)
            if is_param:
                state.assign(owner._parameters[name], value)
            else:
                setattr(owner, name, value)
        return out

    def extra_repr(self) -> str:
        return self._nnx_type


def to_flax(model: Module) -> Any:
    """Wrap a jmodule model as an ``nnx.Module``.

    Parameters become ``nnx.Param`` (trained by ``nnx.grad``/``nnx.Optimizer``),
    buffers and the dropout key become non-trainable NNX variables updated by
    each call, so ``nnx.jit`` threads them.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import jmodule as jm
    >>> flax_model = jm.nn.to_flax(jm.nn.Linear(3, 2))
    >>> nnx.jit(lambda m, x: m(x))(flax_model, jnp.ones((1, 3))).shape
    (1, 2)
    """
    from flax import nnx

    class JModuleState(nnx.Variable):
        """A jmodule buffer or RNG key held by NNX (not trainable)."""

    class JModule(nnx.Module):
        def __init__(self, inner: Module):
            self.inner = inner
            self.params = nnx.Dict(
                {name: nnx.Param(p.data) for name, p in inner.named_parameters()}
            )
            self.buffers = nnx.Dict({name: JModuleState(b) for name, b in inner.named_buffers()})
            self.rng = JModuleState(_random.default_generator.next_key())

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            inner = self.inner
            tree = state.tree_slots(inner, rng=_random.default_generator)
            holders = {"param": self.params, "buffer": self.buffers}
            variables = [
                self.rng if kind == "rng" else holders[kind][name]
                for name, kind in zip(tree.names, tree.kinds)
            ]
            values = [v[...] for v in variables]
            with binding.bound(tree.slots, values, tree.named_modules):
                out = inner(*args, **kwargs)
                after = [c[k] for c, k in tree.slots]
            for kind, variable, old, new in zip(tree.kinds, variables, values, after):
                if kind != "param" and new is not old:
                    variable[...] = new
            return out

    return JModule(model)


# An NNX module assigned to a jmodule module's attribute becomes a FlaxModule.
Module._nnx_adapter = FlaxModule
