"""``skip_init``: build a module without running its parameter initialisation."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

import jax

from jmodule._placement import factory as _factory
from jmodule.nn.modules.module import Module

__all__ = ["skip_init"]

T = TypeVar("T", bound=Module)


def skip_init(module_cls: type[T], *args: Any, **kwargs: Any) -> T:
    """Build ``module_cls(*args, **kwargs)`` without initialising its parameters.

    As ``torch.nn.utils.skip_init``: the module is built on the meta device
    (shapes only, so no initialiser runs) and then allocated with
    ``to_empty``. JAX has no uninitialised memory, so the values are zeros
    (PyTorch's are whatever the memory held); fill them with
    ``reset_parameters()`` or ``load_state_dict``. Without ``device=`` the
    module lands where a module built without ``device=`` would (the current
    default device; PyTorch's default is its CPU).

    Args:
        module_cls: a ``jm.nn.Module`` subclass whose constructor takes ``device``.
        *args: positional arguments for the constructor.
        **kwargs: keyword arguments for the constructor (``device`` included).

    Returns:
        The allocated, uninitialised module.

    Raises:
        RuntimeError: ``module_cls`` is not a Module class, or its constructor
            has no ``device`` argument.

    >>> import jmodule as jm
    >>> layer = jm.nn.utils.skip_init(jm.nn.Linear, 5, 1)
    >>> layer.weight.shape, float(abs(layer.weight).sum())
    ((1, 5), 0.0)
    """
    if not (isinstance(module_cls, type) and issubclass(module_cls, Module)):
        raise RuntimeError(f"Expected a Module; got {module_cls}")
    if "device" not in inspect.signature(module_cls).parameters:
        raise RuntimeError("Module must support a 'device' arg to skip initialization")
    final = kwargs.pop("device", None)
    if final is None:  # where a module built without device= lives
        final = _factory.placement(None) or jax.config.jax_default_device or jax.devices()[0]
    kwargs["device"] = "meta"
    return module_cls(*args, **kwargs).to_empty(device=final)
