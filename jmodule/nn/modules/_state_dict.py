"""``state_dict`` / ``load_state_dict`` with PyTorch's keys, hooks and messages.

Loading is all-or-nothing: the module's state is snapshotted first, the load
runs PyTorch's algorithm (hooks included), and if any problem is found the
snapshot is put back before one error listing every problem is raised.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._lowering import state
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.errors import DeletedArrayError
from jmodule._placement import factory as _factory
from jmodule._placement.device import is_meta
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


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _is_meta_value(value: Any) -> bool:
    """Whether ``value`` (a jmodule, jax or torch value) is a meta tensor: no data."""
    src = state.peek(value) if state.is_cell(value) else value
    return isinstance(src, jax.ShapeDtypeStruct) or (_is_torch(src) and src.is_meta)


def _dtype(value: Any) -> Any:
    """``value``'s dtype as a numpy dtype (torch's mapped by name), or None if unknown."""
    if not _is_torch(value):
        return np.dtype(value.dtype)
    try:
        return jnp.dtype(str(value.dtype).removeprefix("torch."))
    except TypeError:
        return None


_NOT_NUMBERS = {"U": "strings", "S": "bytes", "O": "Python objects", "M": "datetimes"}


def _value_problem(value: Any, current: Any, assign: bool) -> str | None:
    """Why ``value`` cannot be loaded into ``current``, or None.

    Checked for every key before anything is kept, so that one error names
    every bad key: a value with no data (a meta tensor, a deleted or donated
    ``jax.Array``), one that is not numbers (a numpy string or object array),
    or integers that the parameter's dtype cannot hold (``int64`` 2**40 into an
    ``int32`` buffer: JAX without ``jax_enable_x64`` has no ``int64``, and
    overflow is not a cast).
    """
    src = state.peek(value) if state.is_cell(value) else value
    if _is_meta_value(value):
        if is_meta(current) and not assign:
            return None  # meta into meta copies nothing, as in PyTorch
        return "Cannot copy out of meta tensor; no data!"
    if isinstance(src, jax.core.Tracer):
        return None  # no value to check; copying it reports what goes wrong
    if isinstance(src, jax.Array) and src.is_deleted():
        return _DELETED_PROBLEM
    dtype = _dtype(src)
    if dtype is None:
        return None
    if not (jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)):
        what = _NOT_NUMBERS.get(dtype.kind, "records")
        return f"the checkpoint holds an array of {what} (dtype {dtype}), not numbers"
    like = state.peek(current) if state.is_cell(current) else current
    target = jax.dtypes.canonicalize_dtype(dtype) if assign else np.dtype(like.dtype)
    if target == dtype or not jnp.issubdtype(target, jnp.integer) or 0 in src.shape:
        return None
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return None  # complex into integer: astype's cast (PyTorch's drops the imaginary part)
    if isinstance(src, jax.Array) and not src.is_fully_addressable:
        return None  # other processes hold part of it; each checks its own
    lo, hi = src.min().item(), src.max().item()
    info = jnp.iinfo(target)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < info.min or hi > info.max:
        bad = lo if not math.isfinite(lo) or lo < info.min else hi
        x64 = "" if jax.config.jax_enable_x64 else " (jax_enable_x64 is off: no 64-bit integers)"
        return (
            f"the checkpoint holds {bad} ({dtype}), which {target}{x64} cannot hold: loading it "
            f"would overflow [{info.min}, {info.max}], not cast"
        )
    return None


_DELETED_PROBLEM = (
    "the jax.Array in the checkpoint has been deleted (by .delete(), or donated to a "
    "compiled step that consumed it): it has no data"
)


class _DeletedKey(str):
    """An ``error_msgs`` entry (PyTorch's message) for a deleted array; ``load_state_dict``
    says all of them in one line."""

    key: str

    def __new__(cls, text: str, key: str) -> _DeletedKey:
        self = super().__new__(cls, text)
        self.key = key
        return self


def _deleted_keys(keys: list[str]) -> str:
    """One line for every deleted array (PyTorch's format would repeat one per key)."""
    shown = ", ".join(f'"{k}"' for k in keys[:4])
    if len(keys) > 4:
        shown += f" and {len(keys) - 4} more"
    return (
        f"The checkpoint's arrays for {shown} were deleted (they have no data). The usual "
        "cause is donation: a jm.compile'd step reuses the memory of the state it rewrites, "
        "so arrays of a state_dict() taken before it can be deleted by it. Copy the snapshot "
        "as you take it ({k: v.copy() for k, v in model.state_dict().items()}), or compile "
        "with jm.compile(fn, donate=False)."
    )


def _copy_error(key: str, current: Any, value: Any, problem: Any) -> str:
    """PyTorch's message for a value that could not be copied (its own words for meta)."""
    return (
        f'While copying the parameter named "{key}", whose dimensions in the model are '
        f"{_shape(current)} and whose dimensions in the checkpoint are {_shape(value)}, an "
        f"exception occurred : {problem}."
    )


def _place_like(value: Any, like: Any) -> jax.Array:
    """``value`` converted to ``like``'s dtype and placed on ``like``'s devices."""
    host = _on_host(value, like)
    if host is not None:
        return _factory.put_like(host, like)
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
    return state.committed(arr, like=like)  # as the value it replaces: no new compile


def _on_host(value: Any, like: Any) -> np.ndarray | None:
    """A new host copy of ``value`` in ``like``'s dtype, where ``like`` lives on one CPU; else
    None.

    Loading through JAX compiled a program per shape (``jnp.asarray`` copies a NumPy or
    torch array with one, ``astype`` and ``copy`` too): a notebook loading PyTorch weights
    into a fresh process paid tens of them. A NumPy copy is as fast and compiles nothing;
    the copy is what PyTorch's ``copy_`` makes (the model shares no memory with the
    checkpoint, which a compiled step's donation would free).
    """
    if not _factory.on_one_cpu(like) or isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, state.Cell) or "_jm_tensor" in type(value).__dict__:
        value = as_array(value)
    if isinstance(value, jax.Array):
        if not _factory.on_one_cpu(value):
            return None
        if value.is_deleted():
            return None  # as_array's path raises the teaching error
        value = np.asarray(value)
    elif type(value).__module__.startswith("torch"):
        value = state.torch_to_numpy(value)
    if not isinstance(value, np.ndarray):
        return None
    kinds = {np.dtype(value.dtype).kind, np.dtype(like.dtype).kind}
    if value.dtype != like.dtype and not (kinds <= {"f", "V"} or kinds <= {"i", "u"}):
        return None  # bool, complex, float <-> int: as JAX converts them
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array(value, dtype=like.dtype, copy=True)


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
            if "_jm_tensor" in type(value).__dict__:  # a jm.Tensor: its array
                value = value.array
            if not _is_loadable(value):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected jax.Array, numpy '
                    f"array or torch.Tensor from checkpoint but received {type(value)}"
                )
                continue
            problem = _value_problem(value, current, assign)
            if problem is _DELETED_PROBLEM:  # said once for all keys (load_state_dict)
                error_msgs.append(_DeletedKey(_copy_error(key, current, value, (problem,)), key))
                continue
            if problem is not None:
                error_msgs.append(_copy_error(key, current, value, (problem,)))
                continue
            if len(current.shape) == 0 and len(value.shape) == 1 and value.shape[0] == 1:
                value = value[0]  # PyTorch's backward-compatibility rule
            if _shape(value) != _shape(current):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {_shape(value)} "
                    f"from checkpoint, the shape in current model is {_shape(current)}."
                )
                continue
            try:
                self._load_one(name, current, value, assign, key)
            except Exception as ex:  # as PyTorch: listed with the other problems, key named
                error_msgs.append(_copy_error(key, current, value, ex.args))
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
            if _is_meta_value(value):
                return  # meta into meta: nothing to copy, as in PyTorch
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

    @_tracebacks.entry
    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict`` into this module.

        Values may be jax arrays, numpy arrays or torch tensors; they are cast
        to each parameter's dtype and placed on its device (``assign=True``
        takes them as they are). Everything is checked before anything is
        kept: on error the module is unchanged and one ``RuntimeError`` lists
        every missing key, unexpected key, size mismatch and value that cannot
        be loaded, naming its key: a meta tensor or a deleted (donated)
        ``jax.Array`` (no data), a numpy string or object array, or integers
        the parameter's dtype cannot hold. Unlike PyTorch, which wraps them,
        out-of-range integers raise: with x64 off (JAX's default) an ``int64``
        ``num_batches_tracked`` becomes ``int32``, and 2**40 does not fit.

        Args:
            state_dict: mapping of PyTorch-style keys to arrays.
            strict: require the keys to match exactly.
            assign: replace parameters/buffers by the given arrays instead of
                copying into them (keeps each parameter's ``requires_grad``).

        Returns:
            ``IncompatibleKeys(missing_keys, unexpected_keys)``.

        Raises:
            RuntimeError: size mismatches, values that cannot be loaded, or
                missing/unexpected keys with strict.

        >>> import numpy as np
        >>> from jmodule import nn
        >>> bn = nn.BatchNorm1d(2)
        >>> try:
        ...     bn.load_state_dict({**bn.state_dict(), "num_batches_tracked": np.array(2**40)})
        ... except RuntimeError as e:
        ...     print(e)
        Error(s) in loading state_dict for BatchNorm1d:
            While copying the parameter named "num_batches_tracked", whose dimensions in the
            model are () and whose dimensions in the checkpoint are (), an exception occurred :
            ('the checkpoint holds 1099511627776 (int64), which int32 (jax_enable_x64 is off: no
            64-bit integers) cannot hold: loading it would overflow [-2147483648, 2147483647],
            not cast',).
        >>> int(bn.num_batches_tracked)  # unchanged
        0
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
            deleted = [e.key for e in errors if isinstance(e, _DeletedKey)]
            kind = RuntimeError
            if deleted:
                errors = [e for e in errors if not isinstance(e, _DeletedKey)]
                kind = RuntimeError if errors else DeletedArrayError
                errors.append(_deleted_keys(deleted))
            raise kind(
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
