"""The global (all-module) forward hooks: the registry and its version.

PyTorch's ``register_module_forward_hook`` hooks are process-wide by
definition, so this registry is too. Compiled programs include
:func:`global_hook_key` in their structure key and compare :func:`version`
(one integer) on each call. It is the only process-wide registry in
``_lowering``: what a call coordinates with otherwise is per thread
(``state.local``) or per object (versions, locks, plans).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

# Global hooks fire for every module, before the module's own hooks.
forward_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
forward_hooks: OrderedDict[int, Callable] = OrderedDict()
forward_hooks_with_kwargs: OrderedDict[int, bool] = OrderedDict()
forward_hooks_always_called: OrderedDict[int, bool] = OrderedDict()


class _Version:
    """How many times a global hook was added or removed."""

    value = 0


_VERSION = _Version()


def changed() -> None:
    """Record that a global hook was added or removed."""
    _VERSION.value += 1


def version() -> int:
    """The global hooks' version: it moves whenever one is added or removed."""
    return _VERSION.value


def global_hook_key() -> tuple:
    """The global hooks' identity, for compiled-program cache keys."""
    return (tuple(forward_pre_hooks), tuple(forward_hooks))
