"""Hook handles and the global (all-module) forward hooks."""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from jmodule._lowering import hooks as global_hooks
from jmodule._lowering import state

__all__ = [
    "RemovableHandle",
    "register_module_forward_hook",
    "register_module_forward_pre_hook",
]


class RemovableHandle:
    """Removes the hook it was returned for; also a context manager.

    >>> from jmodule import nn
    >>> m = nn.Identity()
    >>> with m.register_forward_hook(lambda mod, args, out: out * 2):
    ...     pass  # the hook is active only inside the block
    """

    _ids = itertools.count()

    def __init__(self, hooks_dict: OrderedDict, *, extra_dict: Any = None, owner: Any = None):
        self.id: int = next(RemovableHandle._ids)
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        extras = extra_dict if isinstance(extra_dict, (list, tuple)) else [extra_dict]
        self.extra_dict_ref = tuple(weakref.ref(d) for d in extras if d is not None)
        # The module whose hook this is (None: a global hook), told when it goes.
        self.owner_ref = None if owner is None else weakref.ref(owner)

    def remove(self) -> None:
        """Remove the hook (a second call does nothing)."""
        for ref in (self.hooks_dict_ref, *self.extra_dict_ref):
            d = ref()
            if d is not None and self.id in d:
                del d[self.id]
        owner = None if self.owner_ref is None else self.owner_ref()
        if owner is not None:
            state.touch(owner)
        elif self.owner_ref is None:
            _changed()

    def __getstate__(self) -> tuple:
        dicts = [self.hooks_dict_ref(), *(r() for r in self.extra_dict_ref)]
        owner = None if self.owner_ref is None else self.owner_ref()
        return (self.id, dicts, owner)

    def __setstate__(self, saved: tuple) -> None:
        self.id, dicts, *rest = saved
        first = dicts[0] if dicts[0] is not None else OrderedDict()
        self.hooks_dict_ref = weakref.ref(first)
        self.extra_dict_ref = tuple(weakref.ref(d) for d in dicts[1:] if d is not None)
        owner = rest[0] if rest else None
        self.owner_ref = None if owner is None else weakref.ref(owner)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# The registry of global hooks lives with the lowering, which keys programs on it.
_global_forward_pre_hooks = global_hooks.forward_pre_hooks
_global_forward_hooks = global_hooks.forward_hooks
_global_forward_hooks_with_kwargs = global_hooks.forward_hooks_with_kwargs
_global_forward_hooks_always_called = global_hooks.forward_hooks_always_called
_changed = global_hooks.changed


def register_module_forward_pre_hook(hook: Callable) -> RemovableHandle:
    """Register a forward pre-hook common to all modules.

    It is called as ``hook(module, args)`` before every module's own
    pre-hooks and may return replacement args.
    """
    handle = RemovableHandle(_global_forward_pre_hooks)
    _global_forward_pre_hooks[handle.id] = hook
    _changed()
    return handle


def register_module_forward_hook(
    hook: Callable, *, with_kwargs: bool = False, always_call: bool = False
) -> RemovableHandle:
    """Register a forward hook common to all modules.

    It is called as ``hook(module, args, output)`` (or ``hook(module, args,
    kwargs, output)`` with ``with_kwargs``) before every module's own forward
    hooks, and may return a replacement output.
    """
    handle = RemovableHandle(
        _global_forward_hooks,
        extra_dict=[_global_forward_hooks_with_kwargs, _global_forward_hooks_always_called],
    )
    _global_forward_hooks[handle.id] = hook
    if with_kwargs:
        _global_forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        _global_forward_hooks_always_called[handle.id] = True
    _changed()
    return handle
