"""Tracebacks that open with the user's line: jmodule's internal frames hidden.

JAX removes its own frames from the tracebacks of errors that pass through
its API (``jax.jit``, ``jax.vjp``); jmodule does the same for its frames at
its entry points (a module call, a ``jm.compile``'d call, ``jm.backward``,
``Optimizer.step``, ``load_state_dict``, ``jm.save`` and ``jm.load``), so
that an error shows the user's code and jmodule's message, not up to 17 frames
of ``jmodule/_lowering``.
It follows JAX's setting, ``JAX_TRACEBACK_FILTERING`` (``jax.config``):

- ``off``: nothing is hidden, and jmodule's explanations chain the JAX error
  they explain as ``__cause__`` (its full traceback printed first);
- ``tracebackhide`` (the default under IPython): frames are marked with
  ``__tracebackhide__``, which IPython and pytest honour;
- anything else (the default in scripts): the frames are removed, and a note
  says so.

Only the exception's traceback changes, and only when it is raised: the
error path, never the call path.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any, TypeVar

import jax

__all__ = ["cause", "entry", "hide", "user_stacklevel"]

_F = TypeVar("_F", bound=Callable[..., Any])

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_JAX_NOTE = "For simplicity, JAX has removed its internal frames"
_NOTE = (
    "--------------------\n"
    "For simplicity, jmodule (and JAX) removed their internal frames from this traceback. "
    "Set JAX_TRACEBACK_FILTERING=off to include these."
)


def _mode() -> str:
    mode = jax.config.jax_traceback_filtering
    if mode in (None, "auto"):
        ipython = _ipython()
        return "tracebackhide" if ipython else "remove_frames"
    return mode


def _ipython() -> bool:
    module = sys.modules.get("IPython")
    return module is not None and module.get_ipython() is not None


def _internal(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_ROOT)


def hide(exc: BaseException) -> None:
    """Remove (or mark hidden) jmodule's frames in ``exc``'s traceback.

    Called in an ``except`` block of an entry point, before a bare ``raise``
    (which keeps the traceback set here).
    """
    tb = exc.__traceback__
    if tb is None:
        return
    mode = _mode()
    if mode == "off":
        return
    frames = list(traceback.walk_tb(tb))
    if not any(_internal(f) for f, _ in frames):
        return
    if mode == "tracebackhide":
        for f, _ in frames:
            if _internal(f):
                f.f_locals["__tracebackhide__"] = True
        return
    kept = None
    for f, lineno in reversed(frames):
        if not _internal(f):
            kept = types.TracebackType(kept, f, f.f_lasti, lineno)
    exc.with_traceback(kept)
    notes = getattr(exc, "__notes__", None)
    if notes is not None:
        notes[:] = [n for n in notes if _JAX_NOTE not in n and n != _NOTE]
    exc.add_note(_NOTE)


def entry(fn: _F) -> _F:
    """``fn`` as an entry point: an error raised inside shows the user's frames only
    (``Optimizer.step``, ``load_state_dict``, ``jm.save``, ``jm.load``)."""

    @functools.wraps(fn)
    def entered(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            hide(e)
            raise

    return entered  # type: ignore[return-value]


def cause(exc: BaseException) -> BaseException | None:
    """What an explanation of ``exc`` chains as ``__cause__``: ``exc`` only when unfiltered.

    A chained cause prints first, with its own traceback, so the explanation
    would come last; jmodule's explanations quote the JAX error's first line
    and keep it as an attribute instead (``TracingError.jax_error``).
    """
    return exc if _mode() == "off" else None


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called here that names the user's line.

    (Python 3.12's ``skip_file_prefixes``, for 3.11 too: the first frame outside jmodule.)
    """
    frame = sys._getframe(1)  # the caller of warnings.warn: stacklevel 1
    level = 1
    while frame is not None and _internal(frame):
        frame = frame.f_back
        level += 1
    return level
