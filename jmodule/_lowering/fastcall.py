"""A ``jm.compile``'d function's per-call path, generated as straight-line Python.

A settled training step is called thousands of times with the same objects.
Each call checks what the last call's plan assumed (the same objects in the
same places, arrays elsewhere, no structural change, no changed Python, no
donated array held elsewhere), reads the state slots, runs the program and
writes the new state back: :meth:`CompiledFunction._match` and
:func:`program.call_fast`, loops over per-call tuples. Timed call by call
against plain ``jax.jit`` (the MLP 784-128-10 step, ~0.3 ms), every Python
object that path touches costs, since the program just ran over the caches:
the whole path came to ~9% of the step, each piece ~1-2%.

:func:`make` writes that path for one :class:`~compiled._Match` as one
function: every slot read, identity check and lock unrolled, every object it
needs bound as a default argument (a fast local). It answers ``SLOW`` where
any check fails, before anything runs or is donated, and the caller takes the
general path, which handles the case (and may settle a new plan). It is made
for a match on its second consecutive call, so a step alternating between two
models makes none.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax

from jmodule import _jax_internals as _jx
from jmodule._jax_internals import ArrayImpl as _ArrayImpl
from jmodule._lowering import hooks as _hooks
from jmodule._lowering import program as _program
from jmodule._lowering import state
from jmodule._tensor import Tensor as _Tensor

__all__ = ["make"]

#: References to a donated value while the generated code counts them: its slot, the
#: local variable holding it, and ``sys.getrefcount``'s argument. More: held elsewhere.
_HELD = 3

#: Plans with more slots take the general path: the step's own work dwarfs the checks.
MAX_SLOTS = 1024


def _failed(plan: Any, error: BaseException, kept: list, donated: list) -> Any:
    """What :func:`program.call_fast` does when the program call raises (it raises or
    answers ``SLOW``: nothing ran or was donated)."""
    if isinstance(error, TypeError):  # raised checking the arguments
        if state.holds_stacked(kept, donated):
            return _program.SLOW
        raise error
    if isinstance(error, _program._Redonate):
        plan.fast = None
        return _program.SLOW
    if isinstance(error, jax.errors.JaxRuntimeError) and _jx.is_donation_error(error):
        plan.fresh = None  # a buffer shared with another slot
        return _program.SLOW
    raise error


def _per_slot(bound: dict[str, Any], name: str, slots: Any, template: str) -> list[str]:
    """One line per slot: ``template`` with ``{c}`` its container (bound as ``name<j>``),
    ``{k}`` its key and ``{j}`` its position."""
    lines = []
    for j, (c, k) in enumerate(slots):
        bound[f"{name}{j}"] = c
        lines.append(template.format(c=f"{name}{j}", k=repr(k), j=j))
    return lines


def make(match: Any, program: Any) -> Callable[[tuple], Any] | None:
    """The per-call function of ``match`` (a ``_Match`` whose plan has a settled
    ``fast`` path), or None where the plan needs the general path every call
    (scanned blocks' stacks, buffers registered as None)."""
    plan = match.plan
    fast = plan.fast
    if (
        fast is None
        or plan.guard is None
        or plan.groups
        or plan.fills
        or len(plan.slots) > MAX_SLOTS
    ):
        return None
    bound: dict[str, Any] = {
        "SLOW": _program.SLOW,
        "ArrayImpl": _ArrayImpl,
        "Tensor": _Tensor,
        "HOOKS": _hooks._VERSION,
        "local": state.local,
        "getrefcount": sys.getrefcount,
        "PackedGrad": state.PackedGrad,
        "plan": plan,
        "program": program,
        "jitted": fast.jitted,
        "write_back": _program.write_back,
        "failed": _failed,
        "slots": plan.slots,
    }
    body: list[str] = [f"if len(args) != {len(match.pattern)}: return SLOW"]
    arrays = []
    for i, p in enumerate(match.pattern):
        if p is None:
            body.append(f"a{i} = args[{i}]")
            body.append(f"if type(a{i}) is not ArrayImpl and type(a{i}) is not Tensor: return SLOW")
            arrays.append(f"a{i}")
        else:
            bound[f"o{i}"] = p
            body.append(f"if args[{i}] is not o{i}: return SLOW")
    for j, (d, v) in enumerate(match.versions):
        bound[f"vd{j}"] = d
        body.append(f"if vd{j}.get('_jm_version', 0) != {v!r}: return SLOW")
    for j, (o, desc) in enumerate(match.others):
        bound[f"x{j}"], bound[f"xd{j}"] = o, desc
        body.append(f"if x{j}._jm_describe() is not xd{j}: return SLOW")
    bound["autocast"] = match.autocast
    body.append(f"if HOOKS.value != {match.hooks!r} or local.autocast != autocast: return SLOW")
    body.append("if local.recorder is not None or local.bound: return SLOW")
    if plan.code is not None:
        bound["code"], bound["ok"] = plan.code, plan.code.ok
        body += [
            "try:",
            "    if code.reason is not None or not ok(): return SLOW",
            "except Exception:",  # a name deleted, a cell emptied: the general path says why
            "    return SLOW",
        ]
    guard = plan.guard  # the objects' locks, and the generator's if the program draws
    locks = getattr(guard, "locks", None) or (guard,)
    for j, lock in enumerate(locks):
        bound[f"l{j}"] = lock
        body.append(f"l{j}.acquire()")
    inner = [
        *_per_slot(bound, "nc", fast.nones, "if {c}[{k}] is not None: return SLOW"),
        *_per_slot(bound, "gc", fast.grads, "if type({c}[{k}]) is PackedGrad: return SLOW"),
        *_per_slot(bound, "dc", fast.donated, "d{j} = {c}[{k}]"),
        *_per_slot(bound, "kc", fast.kept, "k{j} = {c}[{k}]"),
    ]
    if fast.held:  # a donated parameter held elsewhere: the general path warns once
        held = " or ".join(f"getrefcount(d{j}) > {_HELD}" for j in fast.held)
        inner.append(f"if not plan.warned_held and ({held}): return SLOW")
    n = len(fast.donated)
    donated = ", ".join(f"d{j}" for j in range(n))
    kept = ", ".join(f"k{j}" for j in range(len(fast.kept)))
    # The donated slots hold what the last call wrote: distinct fresh arrays.
    ids = "".join(f"id(d{j}), " for j in range(n))
    inner.append(f"if ({ids}) != plan.fresh: return SLOW")
    arrays_tuple = "".join(f"{a}, " for a in arrays)
    inner += [
        f"donated = [{donated}]",
        f"kept = [{kept}]",
        "traces = program.num_traces",
        "outer = local.call",
        "local.call = plan",
        "try:",
        f"    changed, out = jitted(donated, kept, ({arrays_tuple}))",
        "except BaseException as e:",
        "    local.call = outer",
        "    return failed(plan, e, kept, donated)",
        "local.call = outer",
        "if program.num_traces != traces:",
        "    plan.fast = None",  # a new trace may have learned of more unread gradients
        "write_back(slots, changed)",
        f"plan.fresh = tuple(map(id, changed.values[:{n}]))",
        "return out",
    ]
    body.append("try:")
    body += ["    " + line for line in inner]
    body.append("finally:")
    body += [f"    l{j}.release()" for j in reversed(range(len(locks)))]
    params = ", ".join(f"{name}={name}" for name in bound)
    source = f"def fast_call(args, {params}):\n" + "".join(f"    {line}\n" for line in body)
    namespace: dict[str, Any] = {}
    exec(compile(source, "<jmodule fast call>", "exec"), dict(bound), namespace)
    return namespace["fast_call"]
