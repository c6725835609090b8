"""Options and call wrappers for debugging and falling back: ``DebugOptions``.

The per-call object of a ScriptModule is ``model.compile()``'s
``CompiledForward``; these wrappers go around it only when asked for
(``fallback="eager"``, ``DebugOptions(save_dir=...)``), so the default call
path has nothing added. The ScriptModule hands them the callables they need
(this module sits beneath ``_script`` and does not import it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jmodule.jit._errors import TracingError


@dataclass(frozen=True)
class DebugOptions:
    """What a ScriptModule reports about its compilations, as ORTModule's ``DebugOptions``.

    Args:
        log_level: each (re)compilation is logged on the ``jmodule.jit`` logger
            at this level, with its reason ("input shape changed: x (8, 16) ->
            (4, 16)", "training mode changed on 'bn'", ...). The default,
            ``logging.WARNING``, shows without any logging setup; pass
            ``logging.INFO`` (or ``"INFO"``) to log quietly.
        save_dir: if set, every traced program is written there, as
            ``<prefix>_<n>.jaxpr.txt`` (the jaxpr with named inputs) and
            ``<prefix>_<n>.stablehlo.mlir`` (the lowered StableHLO), ``n``
            counting compilations. The directory is created if needed.
        prefix: file name prefix (default: the module's class name).

    Dumping traces the forward a second time (hooks' Python side effects
    run again); it is a debugging aid.

    >>> import logging
    >>> import jmodule as jm
    >>> opts = jm.jit.DebugOptions(log_level=logging.INFO, save_dir=None)
    >>> opts.level
    20
    """

    log_level: int | str = logging.WARNING
    save_dir: str | os.PathLike | None = None
    prefix: str | None = None

    @property
    def level(self) -> int:
        """``log_level`` as a number."""
        if isinstance(self.log_level, str):
            level = logging.getLevelName(self.log_level.upper())
            if not isinstance(level, int):
                raise ValueError(f"unknown log level {self.log_level!r}")
            return level
        return int(self.log_level)


class WithFallback:
    """The compiled call, or the eager one after the first call failed to trace.

    Args:
        inner: the compiled call, ``inner(args, kwargs)``.
        fall_back: called with the ``TracingError`` when a call fails to trace
            (it warns and sets :attr:`eager`).
        eager_call: the uncompiled call, ``eager_call(*args, **kwargs)``.
    """

    def __init__(
        self,
        inner: Any,
        fall_back: Callable[[TracingError], None],
        eager_call: Callable[..., Any],
    ):
        self.inner = inner
        self.fall_back = fall_back
        self.eager_call = eager_call
        self.eager = False

    @property
    def program(self) -> Any:
        return self.inner.program

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if not self.eager:
            try:
                return self.inner(args, kwargs)
            except TracingError as e:
                self.fall_back(e)
        return self.eager_call(*args, **kwargs)


class WithDumps:
    """The compiled call, then a dump of whatever it traced (``DebugOptions.save_dir``).

    Args:
        inner: the compiled call, ``inner(args, kwargs)``.
        dump: writes the programs traced since it last ran (nothing if none).
    """

    def __init__(self, inner: Any, dump: Callable[[], None]):
        self.inner = inner
        self.dump = dump

    @property
    def program(self) -> Any:
        return self.inner.program

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        out = self.inner(args, kwargs)
        self.dump()
        return out
