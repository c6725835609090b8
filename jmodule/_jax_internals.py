"""Every use of JAX's private API in jmodule, in one place.

This is the only module that imports ``jax._src``, reads a private attribute of
JAX's objects (a tracer's ``_trace``, a trace's ``parent_trace``, a jitted
function's ``_cache_size``, a key dtype's ``_impl``) or matches the text of a
JAX error (``tests/project/test_jax_internals.py`` fails on a ``jax._src`` import
anywhere else). Each name it exports has its entry in :data:`INTERNALS`: why
jmodule needs it, and which public API would replace it. The differences
between the JAX versions jmodule runs on (0.10 and 0.12) are handled here too.

What JAX has made public is used as public, elsewhere, not through here:
``jax.typeof``, ``jax.core.Trace``/``Tracer`` (the classes ``tape.py``
subclasses), ``jax.extend.core.set_current_trace``,
``jax.interpreters.partial_eval.dce_jaxpr``, ``jax.interpreters.ad.JVPTrace``,
``jax.interpreters.mlir.make_ir_context``,
``jax.errors.InconclusiveDimensionOperation`` (the public base of the class
``jax.export``'s shape polymorphism raises) and ``jnp.linalg.qr(mode="raw")``
(LAPACK's ``geqrf``, transposed as NumPy gives it).

Nothing here imports jmodule: any module of the package may import it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.interpreters.ad as _public_ad
import jax.interpreters.partial_eval as _public_pe
from jax._src import core as _core
from jax._src.array import ArrayImpl
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import partial_eval as _pe

__all__ = [
    "HAS_QDD",
    "INTERNALS",
    "QUICK_COMPILE_OPTIONS",
    "ArrayImpl",
    "DynamicJaxprTrace",
    "EvalTrace",
    "bind_with_trace",
    "convert_constvars_jaxpr",
    "cur_qdd",
    "current_trace",
    "forward_mode",
    "get_referent",
    "is_backend_started_error",
    "is_deleted_array_error",
    "is_donation_error",
    "is_incompatible_devices_error",
    "jit_cache_size",
    "parent_trace",
    "pretty_jaxpr",
    "prng_impl",
    "serialization_version",
    "to_concrete_value",
    "trace_of",
]

#: Each exported name but this one: ``(why jmodule needs it, the public API that would
#: replace it)``, "none as of JAX 0.12" where JAX has none yet.
INTERNALS: dict[str, tuple[str, str]] = {
    "ArrayImpl": (
        "the concrete class of jax arrays: `type(v) is ArrayImpl` is the hot-path test for a "
        "plain (not traced) array in compiled calls; isinstance(v, jax.Array) is an ABC check, "
        "slower, and true for tracers too; taken from jax._src so that importing jmodule "
        "starts no backend (type(jnp.zeros(())) would)",
        "none as of JAX 0.12 (jax.Array is the abstract base)",
    ),
    "EvalTrace": (
        "the class of JAX's eager trace: 'no transformation is running' is "
        "`type(current_trace()) is EvalTrace` (tape.eager, scan's staging test)",
        "none as of JAX 0.12",
    ),
    "DynamicJaxprTrace": (
        "the class of the trace that stages a jaxpr (jax.jit, make_jaxpr, scan, checkpoint): "
        "whether a value is being staged into a program (scan, parametrize's cache)",
        "none as of JAX 0.12 (jax.extend.core.unsafe_am_i_under_a_jit_DO_NOT_USE is no API)",
    ),
    "current_trace": (
        "the trace JAX runs operations on now (trace_ctx.trace): the eager tape installs its "
        "own and tells it from JAX's",
        "none as of JAX 0.12 (jax.extend.core.take_current_trace also replaces it, with "
        "eval_trace on 0.10 and None on 0.12; find_top_trace needs arguments)",
    ),
    "parent_trace": (
        "the trace a transformation's trace runs its values on (JVP, linearize, batching, "
        "jmodule's tape): walking out to the nearest staging or eager trace",
        "none as of JAX 0.12",
    ),
    "trace_of": (
        "a tracer's trace (its `_trace`): whether a value belongs to a gradient recorder",
        "none as of JAX 0.12",
    ),
    "forward_mode": (
        "whether a trace is forward-mode autodiff (jax.jvp, jacfwd, linearize): "
        "utils.checkpoint's custom_vjp has no forward rule; needs ad.LinearizeTrace and its "
        "is_vjp flag, private (ad.JVPTrace is public)",
        "none as of JAX 0.12",
    ),
    "to_concrete_value": (
        "the Tracer protocol: TapeTracer.to_concrete_value gives its array's concrete value",
        "none as of JAX 0.12",
    ),
    "get_referent": (
        "the Tracer protocol: TapeTracer.get_referent gives its array's referent",
        "none as of JAX 0.12",
    ),
    "QUICK_COMPILE_OPTIONS": (
        "jax.jit compiler_options that compile small eager programs faster "
        "(jmodule/_lowering/quick.py): XLA:CPU's older loop emitters "
        "(xla_cpu_use_fusion_emitters=False) in the XLA of jaxlib 0.10 and 0.11; 0.12's has "
        "only the newer ones, and there 128-bit vectors (xla_cpu_prefer_vector_width=128)",
        "none as of JAX 0.12 (compiler_options are XLA DebugOptions; JAX lists none of them)",
    ),
    "HAS_QDD": (
        "whether this JAX has quasi-dynamic data (JAX 0.10: Tracer.cur_qdd; gone in 0.12): "
        "TapeTracer and TapeTrace define cur_qdd only then",
        "none as of JAX 0.12 (the protocol itself is private)",
    ),
    "cur_qdd": (
        "the Tracer protocol of JAX 0.10 (None on 0.12): TapeTracer.cur_qdd gives its "
        "array's quasi-dynamic data",
        "none as of JAX 0.12",
    ),
    "bind_with_trace": (
        "binding a primitive on a given trace (the eager tape binds on its parent trace); "
        "Primitive.bind_with_trace takes the argument types since JAX 0.10, not before",
        "none as of JAX 0.12 (jax.extend.core.Primitive is public, bind_with_trace is not "
        "documented)",
    ),
    "convert_constvars_jaxpr": (
        "a jaxpr's constants made leading inputs (utils.checkpoint passes them explicitly: a "
        "custom_vjp may not close over differentiated values)",
        "jax.interpreters.partial_eval.convert_constvars_jaxpr on JAX 0.12 (used there); "
        "private on 0.10",
    ),
    "pretty_jaxpr": (
        "jaxpr text with jmodule's names for inputs and outputs (jm.jit's graph): JAX's "
        "printer seeded with names (JaxprPpContext, JaxprPpSettings, pp_jaxpr)",
        "none as of JAX 0.12 (Jaxpr.pretty_print takes no names)",
    ),
    "jit_cache_size": (
        "how many executables a jax.jit function holds (the `_cache_size` method), for "
        "jm.compile's recompilation report",
        "none as of JAX 0.12",
    ),
    "prng_impl": (
        "the PRNG implementation of a typed key dtype (its `_impl`), as the random_wrap "
        "primitive takes it, for jm.jit's generated code",
        "none as of JAX 0.12 (jax.extend.random.threefry_prng_impl and the other built-ins "
        "only, not by dtype)",
    ),
    "serialization_version": (
        "the jax.export serialization schema version of this JAX "
        "(jax._src.export.serialization._SERIALIZATION_VERSION), written into jm.jit's files",
        "none as of JAX 0.12 (jax.export gives only the calling convention versions)",
    ),
    "is_deleted_array_error": (
        "JAX's error for using a deleted (donated) array is a plain RuntimeError: told by its "
        "text 'has been deleted', to raise jm.DeletedArrayError",
        "none as of JAX 0.12 (no exception class of its own)",
    ),
    "is_incompatible_devices_error": (
        "jax.jit refusing arguments committed to different devices is a plain ValueError: told "
        "by its text 'incompatible devices', to undo jm.compile's own committing",
        "none as of JAX 0.12 (no exception class of its own)",
    ),
    "is_donation_error": (
        "XLA refusing a donation (one buffer donated twice) is a generic JaxRuntimeError: told "
        "by 'donat' in its text, to rerun without the fast path",
        "none as of JAX 0.12 (JaxRuntimeError carries no status code)",
    ),
    "is_backend_started_error": (
        "jax.distributed.initialize after the backend started is a plain RuntimeError: told "
        "by its text, to say what jm.distributed.init needs",
        "none as of JAX 0.12 (jax._src.xla_bridge.backends_are_initialized is private too)",
    ),
}

# ----------------------------------------------------------------------------- arrays, traces

EvalTrace = _core.EvalTrace
DynamicJaxprTrace = _pe.DynamicJaxprTrace
_trace_ctx = _core.trace_ctx


def current_trace() -> Any:
    """The trace JAX binds operations on now, in this thread."""
    return _trace_ctx.trace


def parent_trace(trace: Any) -> Any:
    """The trace ``trace`` computes its values on, or None (JAX's eager and staging traces)."""
    return getattr(trace, "parent_trace", None)


def trace_of(tracer: Any) -> Any:
    """The trace ``tracer`` belongs to (None for what has none)."""
    return getattr(tracer, "_trace", None)


def forward_mode(trace: Any) -> bool:
    """Whether ``trace`` is forward-mode autodiff: jax.jvp, jax.jacfwd, jax.linearize.

    ``jax.vjp`` and ``jax.grad`` trace with a ``LinearizeTrace`` marked ``is_vjp``;
    ``jax.linearize`` with one that is not.
    """
    return isinstance(trace, _public_ad.JVPTrace) or (
        isinstance(trace, _ad.LinearizeTrace) and not trace.is_vjp
    )


# ----------------------------------------------------------------------------- the Tracer protocol

to_concrete_value = _core.to_concrete_value
get_referent = _core.get_referent
cur_qdd: Callable[[Any], Any] | None = getattr(_core, "cur_qdd", None)
HAS_QDD = cur_qdd is not None

QUICK_COMPILE_OPTIONS: dict[str, Any] = (
    {"xla_cpu_use_fusion_emitters": False}
    if tuple(int(p) for p in jax.lib.__version__.split(".")[:2]) < (0, 12)
    else {"xla_cpu_prefer_vector_width": 128}
)


def bind_with_trace(prim: Any, trace: Any, args: Sequence[Any], params: dict) -> Any:
    """``prim.bind`` of ``args`` on ``trace`` (JAX 0.10+ passes the argument types too)."""
    return prim.bind_with_trace(trace, args, [jax.typeof(a) for a in args], params)


if len(inspect.signature(_core.Primitive.bind_with_trace).parameters) == 4:  # before 0.10

    def bind_with_trace(prim: Any, trace: Any, args: Sequence[Any], params: dict) -> Any:
        return prim.bind_with_trace(trace, args, params)


# ----------------------------------------------------------------------------- jaxprs

# Public (jax.interpreters.partial_eval) from JAX 0.12, private on 0.10.
convert_constvars_jaxpr = getattr(
    _public_pe, "convert_constvars_jaxpr", _pe.convert_constvars_jaxpr
)


def pretty_jaxpr(jaxpr: Any, names: dict[Any, str]) -> str:
    """``jaxpr``'s text with ``names`` for its variables (fresh names skip them).

    Raises:
        AttributeError, TypeError: this JAX's printer is not the one expected.
    """
    context = _core.JaxprPpContext(dict(names))
    context.shared_jaxpr_names.update(names.values())
    settings = _core.JaxprPpSettings(print_shapes=True)
    return _core.pp_jaxpr(jaxpr, context, settings).format()


# ----------------------------------------------------------------------------- jit, keys, export


def jit_cache_size(fn: Any) -> int:
    """Executables in a ``jax.jit`` function's cache (0 where jax does not say)."""
    size = getattr(fn, "_cache_size", None)
    return size() if size is not None else 0


def prng_impl(key_dtype: Any) -> Any:
    """The PRNG implementation of the typed key dtype ``key_dtype``."""
    return key_dtype._impl


def serialization_version() -> int | None:
    """The ``jax.export`` serialization schema version of this jax (None if unknown)."""
    try:
        from jax._src.export import serialization
    except ImportError:  # pragma: no cover - future jax
        return None
    return getattr(serialization, "_SERIALIZATION_VERSION", None)


# ----------------------------------------------------------------------------- JAX's error texts


def is_deleted_array_error(exc: BaseException) -> bool:
    """Whether ``exc`` is JAX's "Array has been deleted" (a deleted or donated array)."""
    return "has been deleted" in str(exc)


def is_incompatible_devices_error(exc: BaseException) -> bool:
    """Whether ``exc`` is jax.jit's "Received incompatible devices" for its arguments."""
    return "incompatible devices" in str(exc)


def is_donation_error(exc: BaseException) -> bool:
    """Whether the ``JaxRuntimeError`` ``exc`` is XLA refusing a donation (a buffer twice)."""
    return "donat" in str(exc)


def is_backend_started_error(exc: BaseException) -> bool:
    """Whether ``jax.distributed.initialize``'s ``exc`` says the backend already started."""
    text = str(exc)
    return "before any JAX calls" in text or "backend" in text.lower()
