"""Errors of ``jm.jit``.

The messages that explain an untraceable forward (:class:`TracingError`) live
in ``jmodule/_lowering/errors.py``, shared with ``model.compile()`` and
``jm.compile``; they are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jmodule._lowering.errors import _FIX_OUTPUT, _TEMPLATE, _WHY_OUTPUT, EAGER_SCRIPT
from jmodule._lowering.errors import JitError as JitError
from jmodule._lowering.errors import TracingError as TracingError
from jmodule._lowering.errors import locate as locate
from jmodule._lowering.errors import untraceable as untraceable
from jmodule._lowering.errors import untraceable_types as untraceable_types

__all__ = [
    "IncompatibleVersionError",
    "JitError",
    "NotTracedError",
    "ProgramFileError",
    "TracingError",
]


class NotTracedError(JitError):
    """A view (graph, code, ...) or ``save`` was asked for before anything was traced."""


class ProgramFileError(JitError):
    """A ``jm.jit`` program file is truncated, corrupted or not a program file at all."""


class IncompatibleVersionError(ProgramFileError):
    """A program file was written by a jmodule or jax this installation cannot read."""


#: The message of :class:`NotTracedError` (``what``: "graph", "program to save", ...).
NOT_TRACED = (
    "{name} has not been traced yet, so it has no {what}. Call it once, or create it with "
    "example inputs: jm.jit.trace(model, example_inputs) or "
    "jm.jit.script(model, example_inputs=(x,))."
)


def bad_output(what: str, path: str, named_modules: Sequence[tuple[str, Any]]) -> TracingError:
    """The :class:`TracingError` for a forward that returned a non-array leaf."""
    root = named_modules[0][1] if named_modules else None
    where = f"the root module ({type(root).__name__})" if root is not None else "the module"
    return TracingError(
        _TEMPLATE.format(
            eager=EAGER_SCRIPT,
            where=f"the forward of {where}",
            why=_WHY_OUTPUT.format(what=f"{what} at output{path}"),
            location="",
            fix=_FIX_OUTPUT,
            jax="nothing: jm.jit checked the output before JAX saw it",
        )
    )
