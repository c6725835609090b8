"""The old-style spectral normalization, as ``torch.nn.utils.spectral_norm`` (PyTorch
recommends :func:`jmodule.nn.utils.parametrizations.spectral_norm` instead).

``spectral_norm(module)`` moves the parameter ``weight`` to ``weight_orig``,
adds the buffers ``weight_u`` and ``weight_v`` (PyTorch's state-dict keys and
metadata) and registers the :class:`SpectralNorm` forward pre-hook, which in
training mode runs ``n_power_iterations`` of the power method on the buffers,
as PyTorch's.

One difference, forced by JAX: PyTorch stores ``module.weight`` as a plain
attribute that the pre-hook recomputes before each ``forward``; here it is
``weight_orig / sigma`` computed from the buffers whenever it is read (a
traced value cannot be kept in a plain attribute of a compiled module). Inside
``forward`` both give the same values and gradients; outside it PyTorch's
attribute holds the value of the last forward (before the first one, the
unnormalized weight), jmodule's the current value.

>>> import jmodule as jm
>>> m = jm.nn.utils.spectral_norm(jm.nn.Linear(3, 2))
>>> list(m.state_dict())
['bias', 'weight_orig', 'weight_u', 'weight_v']
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from jmodule import random as _random
from jmodule._lowering import state as _state
from jmodule.nn import functional as F
from jmodule.nn.modules.conv import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter
from jmodule.nn.utils.weight_norm import _Computed, _drop_computed, _set_computed

__all__ = [
    "SpectralNorm",
    "SpectralNormLoadStateDictPreHook",
    "SpectralNormStateDictHook",
    "remove_spectral_norm",
    "spectral_norm",
]

T_module = TypeVar("T_module", bound=Module)


class SpectralNorm:
    """The forward pre-hook of :func:`spectral_norm` (PyTorch's class, same attributes)."""

    _version: int = 1
    name: str
    dim: int
    n_power_iterations: int
    eps: float

    def __init__(
        self, name: str = "weight", n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12
    ) -> None:
        self.name = name
        self.dim = dim
        if n_power_iterations <= 0:
            raise ValueError(
                "Expected n_power_iterations to be positive, but "
                f"got n_power_iterations={n_power_iterations}"
            )
        self.n_power_iterations = n_power_iterations
        self.eps = eps

    def reshape_weight_to_matrix(self, weight: Any) -> Any:
        weight_mat = _state.as_array(weight)
        if self.dim != 0:
            weight_mat = jnp.transpose(
                weight_mat, (self.dim, *(d for d in range(weight_mat.ndim) if d != self.dim))
            )
        return weight_mat.reshape(weight_mat.shape[0], -1)

    def _power_iteration(self, module: Module) -> None:
        """Update the ``<name>_u``/``<name>_v`` buffers (PyTorch does it under no_grad)."""
        weight_mat = jax.lax.stop_gradient(
            self.reshape_weight_to_matrix(getattr(module, self.name + "_orig"))
        )
        u = getattr(module, self.name + "_u")
        v = getattr(module, self.name + "_v")
        for _ in range(self.n_power_iterations):
            v = F.normalize(weight_mat.T @ u, dim=0, eps=self.eps)
            u = F.normalize(weight_mat @ v, dim=0, eps=self.eps)
        setattr(module, self.name + "_u", u)
        setattr(module, self.name + "_v", v)

    def compute_weight(self, module: Module, do_power_iteration: bool) -> Any:
        """``weight_orig / sigma``, after a power iteration on the buffers when asked."""
        if do_power_iteration:
            self._power_iteration(module)
        weight = _state.as_array(getattr(module, self.name + "_orig"))
        u = getattr(module, self.name + "_u")
        v = getattr(module, self.name + "_v")
        weight_mat = self.reshape_weight_to_matrix(weight)
        sigma = jnp.dot(u, weight_mat @ v)
        return weight / sigma

    def weight_on_read(self, module: Module) -> Any:
        """What reading ``module.<name>`` gives: no power iteration (the pre-hook ran it)."""
        return self.compute_weight(module, do_power_iteration=False)

    def remove(self, module: Module) -> None:
        weight = jax.lax.stop_gradient(self.compute_weight(module, do_power_iteration=False))
        _drop_computed(module, self.name)
        delattr(module, self.name + "_u")
        delattr(module, self.name + "_v")
        delattr(module, self.name + "_orig")
        module.register_parameter(self.name, Parameter(weight))

    def __call__(self, module: Module, inputs: Any) -> None:
        # PyTorch assigns the recomputed weight here; jmodule computes it on read
        # (from the buffers this power iteration updated).
        module.__dict__.pop(self.name, None)
        if module.training:
            self._power_iteration(module)

    def _solve_v_and_rescale(self, weight_mat: Any, u: Any, target_sigma: Any) -> Any:
        v = jnp.linalg.multi_dot(
            [jnp.linalg.pinv(weight_mat.T @ weight_mat), weight_mat.T, u[:, None]]
        )[:, 0]
        return v * (target_sigma / jnp.dot(u, weight_mat @ v))

    @staticmethod
    def apply(
        module: Module, name: str, n_power_iterations: int, dim: int, eps: float
    ) -> SpectralNorm:
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, SpectralNorm) and hook.name == name:
                raise RuntimeError(
                    f"Cannot register two spectral_norm hooks on the same parameter {name}"
                )
        fn = SpectralNorm(name, n_power_iterations, dim, eps)
        weight = module._parameters[name]
        if weight is None:
            raise ValueError(f"`SpectralNorm` cannot be applied as parameter `{name}` is None")
        weight_mat = fn.reshape_weight_to_matrix(_state.peek(weight))
        h, w = weight_mat.shape
        k_u, k_v = jax.random.split(_random.next_key())
        u = F.normalize(jax.random.normal(k_u, (h,), weight_mat.dtype), dim=0, eps=fn.eps)
        v = F.normalize(jax.random.normal(k_v, (w,), weight_mat.dtype), dim=0, eps=fn.eps)
        delattr(module, fn.name)
        module.register_parameter(fn.name + "_orig", weight)
        _set_computed(module, fn.name, _Computed(fn))
        module.register_buffer(fn.name + "_u", u)
        module.register_buffer(fn.name + "_v", v)
        module.register_forward_pre_hook(fn)
        module.register_state_dict_post_hook(SpectralNormStateDictHook(fn))
        module.register_load_state_dict_pre_hook(SpectralNormLoadStateDictPreHook(fn))
        return fn


class SpectralNormLoadStateDictPreHook:
    """Converts a state dict of spectral norm version 0 (``weight`` saved, no ``weight_v``)
    when loading, as PyTorch's (called with the module first, as jmodule's
    ``register_load_state_dict_pre_hook`` does)."""

    def __init__(self, fn: SpectralNorm) -> None:
        self.fn = fn

    def __call__(
        self,
        module: Module,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        fn = self.fn
        version = local_metadata.get("spectral_norm", {}).get(fn.name + ".version", None)
        if version is None or version < 1:
            weight_key = prefix + fn.name
            if (
                version is None
                and all(weight_key + s in state_dict for s in ("_orig", "_u", "_v"))
                and weight_key not in state_dict
            ):
                return
            has_missing_keys = False
            for suffix in ("_orig", "", "_u"):
                key = weight_key + suffix
                if key not in state_dict:
                    has_missing_keys = True
                    if strict:
                        missing_keys.append(key)
            if has_missing_keys:
                return
            weight_orig = _state.as_array(state_dict[weight_key + "_orig"])
            weight = _state.as_array(state_dict.pop(weight_key))
            sigma = (weight_orig / weight).mean()
            weight_mat = fn.reshape_weight_to_matrix(weight_orig)
            u = _state.as_array(state_dict[weight_key + "_u"])
            state_dict[weight_key + "_v"] = fn._solve_v_and_rescale(weight_mat, u, sigma)


class SpectralNormStateDictHook:
    """Records the spectral norm version in the state dict's metadata, as PyTorch's."""

    def __init__(self, fn: SpectralNorm) -> None:
        self.fn = fn

    def __call__(self, module: Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        if "spectral_norm" not in local_metadata:
            local_metadata["spectral_norm"] = {}
        key = self.fn.name + ".version"
        if key in local_metadata["spectral_norm"]:
            raise RuntimeError(f"Unexpected key in metadata['spectral_norm']: {key}")
        local_metadata["spectral_norm"][key] = self.fn._version


def spectral_norm(
    module: T_module,
    name: str = "weight",
    n_power_iterations: int = 1,
    eps: float = 1e-12,
    dim: int | None = None,
) -> T_module:
    """Spectral normalization with PyTorch's old keys ``<name>_orig``, ``<name>_u``,
    ``<name>_v``, as ``torch.nn.utils.spectral_norm``.

    In training mode each forward first runs ``n_power_iterations`` of the
    power method on the ``_u``/``_v`` buffers (eagerly and inside
    ``jm.compile``, where the updates are part of the program); in eval mode
    it does not. ``module.<name>`` is ``<name>_orig / sigma`` computed from the
    buffers when read (PyTorch keeps a plain attribute: see the module
    docstring). The starting vectors come from jmodule's generator, not
    PyTorch's: load PyTorch's ``state_dict()`` for the same numbers.

    Args:
        module: the module holding the parameter.
        name: the parameter's name. Default ``"weight"``.
        n_power_iterations: power iterations per forward in training mode.
        eps: added for numerical stability in the norms.
        dim: the dimension of the outputs. Default ``0``, ``1`` for
            ``ConvTranspose1d/2d/3d``.

    Returns:
        ``module``.

    Raises:
        RuntimeError: ``name`` already has a spectral norm.
        ValueError: ``n_power_iterations <= 0`` or the parameter is None.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> m = jm.nn.utils.spectral_norm(jm.nn.Linear(4, 3))
    >>> m.weight_orig.shape, m.weight_u.shape, m.weight_v.shape
    ((3, 4), (3,), (4,))
    """
    if dim is None:
        transposed = (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)
        dim = 1 if isinstance(module, transposed) else 0
    SpectralNorm.apply(module, name, n_power_iterations, dim, eps)
    return module


def remove_spectral_norm(module: T_module, name: str = "weight") -> T_module:
    """Undo :func:`spectral_norm`: ``module.<name>`` becomes a Parameter (its current value).

    Raises:
        ValueError: ``module`` has no spectral norm on ``name``.

    >>> import jmodule as jm
    >>> m = jm.nn.utils.spectral_norm(jm.nn.Linear(4, 3))
    >>> list(jm.nn.utils.remove_spectral_norm(m).state_dict())
    ['bias', 'weight']
    """
    for k, hook in module._forward_pre_hooks.items():
        if isinstance(hook, SpectralNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[k]
            break
    else:
        raise ValueError(f"spectral_norm of '{name}' not found in {module}")
    for k, hook in module._state_dict_hooks.items():
        if isinstance(hook, SpectralNormStateDictHook) and hook.fn.name == name:
            del module._state_dict_hooks[k]
            break
    for k, hook in module._load_state_dict_pre_hooks.items():
        if isinstance(hook, SpectralNormLoadStateDictPreHook) and hook.fn.name == name:
            del module._load_state_dict_pre_hooks[k]
            break
    _state.touch(module)
    return module
