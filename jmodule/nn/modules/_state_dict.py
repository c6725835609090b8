"""``state_dict`` / ``load_state_dict`` with PyTorch's keys, hooks and messages.

Loading is all-or-nothing: the module's state is snapshotted first, the load
runs PyTorch's algorithm (hooks included), and if any problem is found the
snapshot is put back before one error listing every problem is raised.
"""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from jmodule._device import is_meta
from jmodule._lowering import state
from jmodule.nn.modules._hooks import RemovableHandle
from jmodule.nn.parameter import Parameter, as_array


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` found missing from, or extra in, the state dict."""

    missing_keys: list[str]
    unexpected_keys: list[str]

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        # PyTorch prints its private subclass' name; print the same text.
        return (
            f"_IncompatibleKeys(missing_keys={self.missing_keys}, "
            f"unexpected_keys={self.unexpected_keys})"
        )

    __str__ = __repr__


def _is_loadable(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, Parameter)) or (
        type(value).__module__.startswith("torch") and hasattr(value, "detach")
    )


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.shape)


def _place_like(value: Any, like: Any) -> jax.Array:
    """``value`` converted to ``like``'s dtype and placed on ``like``'s devices."""
    arr = as_array(value)
    if arr.dtype != like.dtype:
        arr = arr.astype(like.dtype)
    sharding = getattr(like, "sharding", None)
    if sharding is not None and getattr(arr, "sharding", None) != sharding:
        arr = jax.device_put(arr, sharding)
    if arr is value or arr is getattr(value, "data", None):
        # Copy, as PyTorch's copy_ does: two modules must not share one buffer,
        # since a compiled step donates (frees) the buffers it rewrites.
        arr = arr.copy()
    return arr


class StateDictMixin:
    """``state_dict`` and ``load_state_dict`` of :class:`~jmodule.nn.Module`."""

    _version: int

    # ------------------------------------------------------------------ saving

    def get_extra_state(self) -> Any:
        """Return extra state to include in ``state_dict`` (override it, with
        :meth:`set_extra_state`)."""
        raise RuntimeError(
            "Reached a code path in Module.get_extra_state() that should never be called. "
            "Override get_extra_state() in your module to return its extra state."
        )

    def set_extra_state(self, state: Any) -> None:
        """Restore the extra state returned by :meth:`get_extra_state` (override it)."""
        raise RuntimeError(
            "Reached a code path in Module.set_extra_state() that should never be called. "
            "Override set_extra_state() in your module to load its extra state."
        )

    def _has_extra_state(self) -> bool:
        """Saving includes ``_extra_state`` when ``get_extra_state`` is overridden."""
        return type(self).get_extra_state is not StateDictMixin.get_extra_state

    def _takes_extra_state(self) -> bool:
        """Loading expects ``_extra_state`` when ``set_extra_state`` is overridden."""
        return type(self).set_extra_state is not StateDictMixin.set_extra_state

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.data
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf
        if self._has_extra_state():
            destination[prefix + "_extra_state"] = self.get_extra_state()

    def state_dict(
        self,
        *args: Any,
        destination: dict | None = None,
        prefix: str = "",
        keep_vars: bool = False,
    ) -> dict[str, Any]:
        """Parameters and persistent buffers under PyTorch's dotted keys.

        Values are ``jax.Array``s (the Parameters themselves with
        ``keep_vars=True``), in PyTorch's order: each module's parameters,
        then its buffers, then its children.

        >>> from jmodule import nn
        >>> list(nn.BatchNorm1d(3).state_dict())
        ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
        """
        if args:
            warnings.warn(
                "Positional args are being deprecated, use kwargs instead.",
                FutureWarning,
                stacklevel=2,
            )
            names = ("destination", "prefix", "keep_vars")
            given = dict(zip(names, args))
            destination = given.get("destination", destination)
            prefix = given.get("prefix", prefix)
            keep_vars = given.get("keep_vars", keep_vars)
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = {"version": self._version}
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata
        for hook in self._state_dict_pre_hooks.values():
            hook(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(
                    destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars
                )
        for hook in self._state_dict_hooks.values():
            if hook(self, destination, prefix, local_metadata) is not None:
                raise RuntimeError("state_dict post-hook must return None")
        return destination

    # ------------------------------------------------------------------ hooks

    def register_state_dict_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, prefix, keep_vars)`` runs before ``state_dict`` saves."""
        handle = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_state_dict_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata)`` may edit the
        state dict in place after this module saved into it; it must return None."""
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    def register_load_state_dict_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata, strict, missing_keys,
        unexpected_keys, error_msgs)`` runs before this module loads."""
        handle = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_dict_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, incompatible_keys)`` runs after this module loaded; it
        may clear ``incompatible_keys.missing_keys``/``unexpected_keys`` in
        place, and must return None."""
        handle = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[handle.id] = hook
        return handle

    # ------------------------------------------------------------------ loading

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        for hook in self._load_state_dict_pre_hooks.values():
            hook(
                self,
                state_dict,
                prefix,
                local_metadata,
                strict,
                missing_keys,
                unexpected_keys,
                error_msgs,
            )
        persistent = {
            k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set
        }
        local_state = {k: v for k, v in {**self._parameters, **persistent}.items() if v is not None}
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, current in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if not _is_loadable(value):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected jax.Array, numpy '
                    f"array or torch.Tensor from checkpoint but received {type(value)}"
                )
                continue
            if len(current.shape) == 0 and len(value.shape) == 1 and value.shape[0] == 1:
                value = value[0]  # PyTorch's backward-compatibility rule
            if _shape(value) != _shape(current):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {_shape(value)} "
                    f"from checkpoint, the shape in current model is {_shape(current)}."
                )
                continue
            self._load_one(name, current, value, assign, key)
        extra_key = prefix + "_extra_state"
        if self._takes_extra_state():
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key != extra_key:
                    head, *rest = key[len(prefix) :].split(".", 1)
                    if (rest and head not in self._modules) or (
                        not rest and head not in local_state
                    ):
                        unexpected_keys.append(key)

    def _load_one(self, name: str, current: Any, value: Any, assign: bool, key: str) -> None:
        is_param = name in self._parameters
        if assign:
            arr = as_array(value)
            if is_param and isinstance(value, Parameter):  # PyTorch keeps the given Parameter
                value.requires_grad_(current.requires_grad)
                self._parameters[name] = value
                state.touch(self)
            elif is_param:
                self._parameters[name] = Parameter(arr, requires_grad=current.requires_grad)
                state.touch(self)
            else:
                self._buffers[name] = arr
            return
        if is_meta(current):
            warnings.warn(
                f"for {key}: copying from a non-meta parameter in the checkpoint to a meta "
                "parameter in the current model, which is a no-op. (Did you mean to pass "
                "`assign=True` to assign items in the state dictionary to their corresponding "
                "key in the module instead of copying them in place?)",
                UserWarning,
                stacklevel=4,
            )
            return
        if is_param:
            state.assign(current, _place_like(value, state.peek(current)))
        else:
            self._buffers[name] = _place_like(value, current)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict`` into this module.

        Values may be jax arrays, numpy arrays or torch tensors; they are cast
        to each parameter's dtype and placed on its device (``assign=True``
        takes them as they are). Everything is checked before anything is
        kept: on error the module is unchanged and one ``RuntimeError`` lists
        every missing key, unexpected key and size mismatch.

        Args:
            state_dict: mapping of PyTorch-style keys to arrays.
            strict: require the keys to match exactly.
            assign: replace parameters/buffers by the given arrays instead of
                copying into them (keeps each parameter's ``requires_grad``).

        Returns:
            ``IncompatibleKeys(missing_keys, unexpected_keys)``.

        Raises:
            RuntimeError: size mismatches, or missing/unexpected keys with strict.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing: list[str] = []
        unexpected: list[str] = []
        errors: list[str] = []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)
        if metadata is not None:
            state_dict._metadata = metadata
        snapshot = _snapshot(self)

        def load(module: Any, local: dict, prefix: str = "") -> None:
            local_metadata = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                local_metadata["assign_to_params_buffers"] = True
            module._load_from_state_dict(
                local, prefix, local_metadata, True, missing, unexpected, errors
            )
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    child_local = {k: v for k, v in local.items() if k.startswith(child_prefix)}
                    load(child, child_local, child_prefix)
            incompatible = IncompatibleKeys(missing, unexpected)
            for hook in module._load_state_dict_post_hooks.values():
                if hook(module, incompatible) is not None:
                    raise AssertionError(
                        "Hooks registered with ``register_load_state_dict_post_hook`` are not "
                        "expected to return new values, if incompatible_keys need to be "
                        "modified, it should be done inplace."
                    )

        try:
            load(self, state_dict)
        except BaseException:
            _restore(snapshot)
            raise
        if strict:
            if unexpected:
                keys = ", ".join(f'"{k}"' for k in unexpected)
                errors.insert(0, f"Unexpected key(s) in state_dict: {keys}. ")
            if missing:
                keys = ", ".join(f'"{k}"' for k in missing)
                errors.insert(0, f"Missing key(s) in state_dict: {keys}. ")
        if errors:
            _restore(snapshot)
            raise RuntimeError(
                "Error(s) in loading state_dict for {}:\n\t{}".format(
                    type(self).__name__, "\n\t".join(errors)
                )
            )
        if not assign:
            _reshare_buffers(snapshot)
        return IncompatibleKeys(missing, unexpected)


def _snapshot(root: Any) -> list[tuple]:
    snap = []
    for module in root.modules():
        values = {id(p): (p, state.peek(p)) for p in module._parameters.values() if p is not None}
        # Extra state can be put back only when the module can both give and take it.
        restorable = module._has_extra_state() and module._takes_extra_state()
        extra = (copy.deepcopy(module.get_extra_state()),) if restorable else None
        snap.append((module, dict(module._parameters), values, dict(module._buffers), extra))
    return snap


def _restore(snapshot: list[tuple]) -> None:
    for module, params, values, buffers, extra in snapshot:
        module._parameters.clear()
        module._parameters.update(params)
        for p, value in values.values():
            state.assign(p, value)
        module._buffers.clear()
        module._buffers.update(buffers)
        if extra is not None:
            module.set_extra_state(extra[0])
        state.touch(module)


def _reshare_buffers(snapshot: list[tuple]) -> None:
    """Keep a buffer array shared by several modules shared after loading.

    PyTorch copies into the one shared tensor, so every holder sees the last
    value written; jax arrays are replaced instead, so give every module that
    held the same array before the load the last array loaded for it.
    """
    holders: dict[int, list[tuple[Any, str]]] = {}
    latest: dict[int, Any] = {}
    for module, _, _, buffers, _ in snapshot:
        for name, old in buffers.items():
            if old is not None:
                holders.setdefault(id(old), []).append((module, name))
                if module._buffers.get(name) is not old:
                    latest[id(old)] = module._buffers[name]
    for key, group in holders.items():
        if len(group) > 1 and key in latest:
            for module, name in group:
                module._buffers[name] = latest[key]
