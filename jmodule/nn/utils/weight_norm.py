"""The old-style weight normalization, as ``torch.nn.utils.weight_norm`` (deprecated there
too, in favour of :func:`jmodule.nn.utils.parametrizations.weight_norm`).

``weight_norm(module)`` replaces the parameter ``weight`` by ``weight_g``
(magnitude) and ``weight_v`` (direction), PyTorch's state-dict keys, and
registers the :class:`WeightNorm` forward pre-hook, as PyTorch does.

One difference, forced by JAX: PyTorch stores ``module.weight`` as a plain
attribute that the pre-hook recomputes before each ``forward``; here
``module.weight`` is computed from ``weight_g`` and ``weight_v`` whenever it
is read (a traced value cannot be kept in a plain attribute of a compiled
module). Inside ``forward`` both give the same values and gradients;
outside it, PyTorch's attribute still holds the value of the last forward
(stale after an optimizer step), jmodule's the current one.

>>> import warnings
>>> import jmodule as jm
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore", FutureWarning)
...     m = jm.nn.utils.weight_norm(jm.nn.Linear(3, 2))
>>> list(m.state_dict())
['bias', 'weight_g', 'weight_v']
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

from jmodule._lowering import state as _state
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter
from jmodule.nn.utils.parametrizations import _norm_except_dim, _weight_norm

__all__ = ["WeightNorm", "remove_weight_norm", "weight_norm"]

T_module = TypeVar("T_module", bound=Module)


def _set_computed(module: Module, name: str, fn: Any) -> None:
    """Make ``module.<name>`` read as ``fn(module)`` (see ``Module.__getattr__``)."""
    d = module.__dict__
    computed = dict(d.get("_computed_attributes") or {})
    computed[name] = fn
    d["_computed_attributes"] = computed
    d["_stamp"] = object()
    _state.touch(module)


def _drop_computed(module: Module, name: str) -> None:
    d = module.__dict__
    computed = dict(d.get("_computed_attributes") or {})
    computed.pop(name, None)
    if computed:
        d["_computed_attributes"] = computed
    else:
        d.pop("_computed_attributes", None)
    d.pop(name, None)
    d["_stamp"] = object()
    _state.touch(module)


class _Computed:
    """``module.<name>``, computed on read by a hook object's ``weight_on_read``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, module: Module) -> Any:
        return self.fn.weight_on_read(module)


class WeightNorm:
    """The forward pre-hook of :func:`weight_norm` (PyTorch's class, same attributes)."""

    name: str
    dim: int

    def __init__(self, name: str, dim: int | None) -> None:
        if dim is None:
            dim = -1
        self.name = name
        self.dim = dim

    def compute_weight(self, module: Module) -> Any:
        g = getattr(module, self.name + "_g")
        v = getattr(module, self.name + "_v")
        return _weight_norm(v, g, self.dim)

    def weight_on_read(self, module: Module) -> Any:
        """What reading ``module.<name>`` gives (PyTorch's pre-hook assigns it)."""
        return self.compute_weight(module)

    @staticmethod
    def apply(module: Module, name: str, dim: int | None) -> WeightNorm:
        warnings.warn(
            "`jm.nn.utils.weight_norm` is deprecated in favor of "
            "`jm.nn.utils.parametrizations.weight_norm`.",
            FutureWarning,
            stacklevel=3,
        )
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                raise RuntimeError(
                    f"Cannot register two weight_norm hooks on the same parameter {name}"
                )
        if dim is None:
            dim = -1
        fn = WeightNorm(name, dim)
        weight = getattr(module, name)
        del module._parameters[name]
        _state.touch(module)
        value = _state.peek(weight) if isinstance(weight, _state.Cell) else weight
        module.register_parameter(name + "_g", Parameter(_norm_except_dim(value, 2, dim)))
        module.register_parameter(name + "_v", Parameter(value))
        _set_computed(module, name, _Computed(fn))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module: Module) -> None:
        weight = _state.as_array(self.compute_weight(module))
        _drop_computed(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        _state.touch(module)
        setattr(module, self.name, Parameter(weight))

    def __call__(self, module: Module, inputs: Any) -> None:
        # PyTorch assigns the recomputed weight here; jmodule computes it on read.
        # A plain value assigned to ``module.<name>`` since lasts until this forward,
        # as PyTorch's (which this hook overwrites).
        module.__dict__.pop(self.name, None)


def weight_norm(module: T_module, name: str = "weight", dim: int | None = 0) -> T_module:
    """Weight normalization ``w = g * v / ||v||`` with PyTorch's old keys ``<name>_g`` and
    ``<name>_v``, as ``torch.nn.utils.weight_norm`` (which warns it is deprecated).

    ``module.<name>`` is computed from ``<name>_g`` and ``<name>_v`` whenever it
    is read (PyTorch recomputes a plain attribute before each forward: see the
    module docstring). Works eagerly and inside ``jm.compile``.

    Args:
        module: the module holding the parameter.
        name: the parameter's name. Default ``"weight"``.
        dim: the dimension that keeps its own norm (``None``: the whole tensor).

    Returns:
        ``module``.

    Raises:
        RuntimeError: ``name`` already has a weight norm.

    >>> import warnings
    >>> import jmodule as jm
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", FutureWarning)
    ...     m = jm.nn.utils.weight_norm(jm.nn.Linear(3, 2))
    >>> m.weight_g.shape, m.weight_v.shape, m.weight.shape
    ((2, 1), (2, 3), (2, 3))
    """
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module: T_module, name: str = "weight") -> T_module:
    """Undo :func:`weight_norm`: ``module.<name>`` becomes a Parameter again (its current value).

    Raises:
        ValueError: ``module`` has no weight norm on ``name``.

    >>> import warnings
    >>> import jmodule as jm
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", FutureWarning)
    ...     m = jm.nn.utils.weight_norm(jm.nn.Linear(3, 2))
    >>> list(jm.nn.utils.remove_weight_norm(m).state_dict())
    ['bias', 'weight']
    """
    for k, hook in module._forward_pre_hooks.items():
        if isinstance(hook, WeightNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[k]
            _state.touch(module)
            return module
    raise ValueError(f"weight_norm of '{name}' not found in {module}")
