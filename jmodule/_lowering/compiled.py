"""Compiled calls: ``model.compile()`` and ``jm.compile(fn)``, over ``program.py``.

:class:`CompiledForward` is ``model.compile()``; :class:`CompiledFunction` is
``jm.compile(fn)`` over functions whose arguments include stateful objects
(modules, optimizers). Each keeps the :class:`~program.Plan` of its last call
and reuses it while the objects are the same ones and their versions have not
moved (``state.touch``): the per-call path compares a few integers, reads the
slots, calls ``jax.jit`` and writes back. It holds the locks of the objects
it reads and writes (each object's own), so threads calling different models
never wait for each other, and threads sharing one see the result of some
sequential order.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax

from jmodule import _jax_internals as _jx
from jmodule import random as _random

# The concrete array class (a type check on it is the fastest "is a plain array"
# test); imported rather than made from an array, so import starts no backend.
from jmodule._jax_internals import ArrayImpl as _ArrayImpl
from jmodule._lowering import errors as _errors
from jmodule._lowering import fastcall as _fastcall
from jmodule._lowering import hooks as _hooks
from jmodule._lowering import program as _program
from jmodule._lowering import recorder as _recorder
from jmodule._lowering import state, structure
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.arguments import wrap_leaf
from jmodule._lowering.program import Plan, Program
from jmodule._lowering.state import RNG_NAME as _RNG_NAME
from jmodule._tensor import Tensor as _Tensor

_HOOKS = _hooks._VERSION  # the global hooks' version (``.value``), read once per call
_NO_FAST_CALL = object()  # a match whose plan takes the general path every call

__all__ = [
    "CompileStats",
    "CompiledForward",
    "CompiledFunction",
    "compile_function",
    "compile_stats",
]


def _is_param(x: Any) -> bool:
    return state.is_cell(x)


class _Held:
    """Several locks held together, taken in a fixed order (a context manager)."""

    __slots__ = ("locks",)

    def __init__(self, locks: tuple[Any, ...]):
        self.locks = locks

    def __enter__(self) -> None:
        for held in self.locks:
            held.acquire()

    def __exit__(self, *exc: object) -> None:
        for held in reversed(self.locks):
            held.release()


def _guard(plan: Plan) -> Any:
    """What a call of ``plan`` holds: its objects' locks, and the generator's if it draws."""
    locks = plan.locks if plan.draws is False else (*plan.locks, state.lock(plan.generator))
    return locks[0] if len(locks) == 1 else _Held(locks)


def _learned(program: Program, plan: Plan) -> None:
    """After a call: whether the program draws random numbers (and so which locks it needs)."""
    if plan.draws is None:
        plan.draws = _draws(program, plan)
        plan.guard = _guard(plan)
        if plan.draws is False:
            _stub(plan)


def _stub(plan: Plan) -> None:
    """Leave the default generator out of a plan whose program does not use it.

    Its key stays a program input (the same program), read from a slot of the
    plan's own: a call that does not hold the generator's lock must neither read
    the shared key (another thread's trace may have bound it) nor bind it while
    it traces again. Called holding the generator's lock, so the key is concrete.
    """
    c, k = plan.slots[-1]
    if c is not plan.generator.__dict__:
        return
    stub = ({k: c[k]}, k)
    plan.slots = (*plan.slots[:-1], stub)
    fast = plan.fast
    if fast is not None:
        plan.fast = fast._replace(
            donated=tuple(stub if s[0] is c else s for s in fast.donated),
            kept=tuple(stub if s[0] is c else s for s in fast.kept),
        )


def _unstub(plan: Plan) -> bool:
    """Put the default generator back into ``plan`` (its trace used it); False if it was in."""
    if plan.slots[-1][0] is plan.generator.__dict__:
        return False
    plan.slots = (*plan.slots[:-1], state.rng_slot(plan.generator))
    plan.draws = None
    plan.guard = _guard(plan)
    plan.fast = None
    return True


def _forward_arg_names(module: Any) -> list[str] | None:
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _plan_for(
    key: Any,
    objects: Sequence[Any],
    descs: Sequence[structure.Description],
    with_grads: bool,
    positions: tuple[int, ...] | None = None,
) -> Plan:
    """The plan of a call over ``objects``: their slots (each once), then the RNG key."""
    slots: list = []
    names: list[str] = []
    cells: list[Any] = []
    named_modules: list[tuple[str, Any]] = []
    seen: set[tuple[int, str]] = set()
    for i, d in enumerate(descs):
        prefix = "" if len(descs) == 1 else f"[{i}]."
        pairs = list(zip(d.slots, d.names, d.cells or (None,) * len(d.slots)))
        if with_grads:
            pairs += [(s, n, None) for s, n in zip(d.grad_slots, d.grad_names)]
        for slot, name, cell in pairs:
            if (id(slot[0]), slot[1]) not in seen:
                seen.add((id(slot[0]), slot[1]))
                slots.append(slot)
                names.append(prefix + name)
                cells.append(cell)
        named_modules += [(prefix + p if p else prefix.rstrip("."), m) for p, m in d.named_modules]
    fills = _none_buffers(descs, slots, names, cells, seen)
    one_device = _one_device(slots)
    groups: list[_program.Group] = []
    if with_grads and one_device:
        groups = _groups(named_modules, slots, names, cells)
    generator = _random.default_generator
    slots.append(state.rng_slot(generator))
    names.append(_RNG_NAME)
    cells.append(None)
    _program.check_not_meta(slots, names)
    committed = _commit(slots) if one_device else ()
    infos = descs[0].infos if len(descs) == 1 else _merge_infos(descs)
    plan = Plan(
        key=key,
        infos=infos,
        objects=tuple(objects),
        slots=tuple(slots),
        names=tuple(names),
        named_modules=tuple(named_modules),
        cells=tuple(cells),
        locks=tuple(state.lock(o) for o in sorted({id(o): o for o in objects}.values(), key=id)),
        generator=generator,
        positions=positions,
    )
    plan.guard = _guard(plan)
    plan.pack_grads = with_grads and one_device
    plan.committed = committed
    plan.groups = tuple(groups)
    plan.members = frozenset(m for g in groups for m in g.members)
    plan.fills = fills
    return plan


def _none_buffers(
    descs: Sequence[structure.Description], slots: list, names: list, cells: list, seen: set
) -> tuple[tuple[Any, Any], ...]:
    """Add a slot for each buffer registered as None (``register_buffer("mask", None)``).

    The program reads None there and may write an array (``self.mask = jnp.tril(...)``
    in ``forward``, as PyTorch allows): the write comes back as the slot's new value.
    Giving the buffer a value changes the module's structure (``write_back`` touches
    it: ``Plan.fills``), so the next call describes it again and traces once more, with
    the buffer as ordinary state. The descriptions keep these slots apart
    (``Description.none_slots``): their other slots are state that has values (what
    ``jm.jit`` exports and sharding places).

    Returns:
        ``(slot, module)`` of each slot added.
    """
    fills = []
    for i, d in enumerate(descs):
        if not d.none_slots:
            continue
        prefix = "" if len(descs) == 1 else f"[{i}]."
        owner = {id(m.__dict__["_buffers"]): m for _, m in d.named_modules}
        for slot, name in zip(d.none_slots, d.none_names):
            if (id(slot[0]), slot[1]) not in seen:
                seen.add((id(slot[0]), slot[1]))
                slots.append(slot)
                names.append(prefix + name)
                cells.append(None)
                fills.append((slot, owner[id(slot[0])]))
    return tuple(fills)


def _groups(
    named_modules: Sequence[tuple[str, Any]], slots: list, names: list, cells: list
) -> list[_program.Group]:
    """The stacked groups of the scanned blocks in the plan (see ``program.Group``).

    A module whose class sets ``_jm_stacked`` (``jm.nn.Scan``) has its children
    (the blocks) read and written stacked, one group per parameter kind
    (position in the blocks' state), when the blocks' state has the same names
    and each kind the same shape and dtype in every block, by distinct
    Parameters. The stack slots (in the module's ``_jm_stacks`` store) are
    added to ``slots``.
    """
    where = {id(c): i for i, (c, k) in enumerate(slots) if k == "_value"}
    taken: set[int] = set()
    groups = []
    for path, m in named_modules:
        if not getattr(type(m), "_jm_stacked", False):
            continue
        blocks = [b for b in m.__dict__["_modules"].values() if b is not None]
        if len(blocks) < 2:
            continue
        trees = [state.tree_slots(b) for b in blocks]
        if any(t.names != trees[0].names for t in trees):
            continue
        store = m.__dict__.get("_jm_stacks")
        if store is None:
            store = m.__dict__["_jm_stacks"] = {}
        kinds = [n for n, k in zip(trees[0].names, trees[0].kinds) if k == "param"]
        for j, kind in enumerate(kinds):
            members = [t.params[j] for t in trees]
            ids = [id(p.__dict__) for p in members]
            if len(set(ids)) != len(ids) or any(i in taken or i not in where for i in ids):
                continue
            metas = {(tuple(state.raw(p).shape), str(state.raw(p).dtype)) for p in members}
            if len(metas) != 1:
                continue
            taken.update(ids)
            slots.append((store, kind))
            names.append(f"{path + '.' if path else ''}<{kind}, stacked>")
            cells.append(None)
            groups.append(_program.Group(len(slots) - 1, tuple(where[i] for i in ids)))
    return groups


def _commit(slots: Sequence[Any]) -> tuple[_program.Committed, ...]:
    """Commit the state arrays that are not yet committed to a device (to the one they are on).

    A fresh parameter (from ``jnp`` ops) is uncommitted, while a program's
    outputs are committed, and ``jax.jit`` keys its executables on the
    difference: without this the second call of every program would compile
    it again. Only for state on one device: state spread over several (sharded)
    leaves an uncommitted array (the RNG key) free to follow the others. A
    program that places its values on other devices (a sharding constraint
    over a mesh) gets the uncommitted arrays back (:func:`_uncommit`).

    Returns:
        A :class:`~program.Committed` per slot committed.
    """
    done = []
    for c, k in slots:
        v = c.get(k)
        placed = state.committed(v)
        if placed is not v:
            c[k] = placed
            done.append(_program.Committed(c, k, v, weakref.ref(placed)))
    return tuple(done)


def _uncommit(plan: Plan | None, error: Exception) -> bool:
    """Put back what ``_commit`` committed, if ``error`` is jax refusing it; True if it did."""
    if plan is None or not plan.committed or not _jx.is_incompatible_devices_error(error):
        return False
    put_back = False
    for e in plan.committed:
        if e.container.get(e.key) is e.committed():  # still what _commit put there
            e.container[e.key] = e.uncommitted
            put_back = True
    plan.committed = ()
    return put_back


def _one_device(slots: Sequence[Any]) -> bool:
    """Whether every array in ``slots`` is a concrete array on one and the same device."""
    devices = set()
    for c, k in slots:
        v = c[k]
        if v is None or type(v) is state.PackedGrad:
            continue
        if type(v) is state.StackedValue:
            v = v.stack
        if type(v) is not _ArrayImpl:
            return False
        here = v.devices()
        if len(here) != 1:
            return False
        devices |= here
    return len(devices) <= 1


def _merge_infos(descs: Sequence[structure.Description]) -> dict:
    return {f"[{i}].{p}": info for i, d in enumerate(descs) for p, info in d.infos.items()}


def _traced(tree: Any) -> bool:
    """Whether ``tree`` holds a tracer of some JAX transformation."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def _effects(program: Program, plan: Plan, traces: int) -> None:
    """After a call: what its objects' Python did while tracing, recorded or replayed.

    An object may change itself in Python while a program traces (an optimizer
    making ``state[p]`` visible); a call of the same program for other objects of
    the same structure traces nothing, so their ``_jm_replay`` repeats what the
    trace's objects reported (``_jm_traced_effects``).
    """
    objects = plan.objects
    if program.num_traces != traces:
        program.effects[plan.key] = tuple(
            (i, o._jm_traced_effects())
            for i, o in enumerate(objects)
            if hasattr(type(o), "_jm_traced_effects")
        )
        return
    for i, effects in program.effects.get(plan.key, ()):
        objects[i]._jm_replay(effects)


def _run_plan(program: Program, plan: Plan, donate: bool, args: tuple, kwargs: Any) -> Any:
    """Call the program for ``plan`` (from this thread's context: traced, recorded or locked)."""
    try:
        return _run_plan_once(program, plan, donate, args, kwargs)
    except state.NeedsGenerator:
        if not _unstub(plan):
            raise  # an enclosing trace left the generator out: that call retries
        return _run_plan_once(program, plan, donate, args, kwargs)


def _run_plan_once(program: Program, plan: Plan, donate: bool, args: tuple, kwargs: Any) -> Any:
    local = state.local
    if local.rng_left_out and plan.slots[-1][0] is plan.generator.__dict__:
        # Inside a trace that left the generator out, a call that reads it: the
        # enclosing call puts it back and traces again.
        raise state.NeedsGenerator()
    code = plan.code
    if code is not None and code.changed() is not None:
        program.stale(plan)
        _unstub(plan)  # the Python changed: it may draw now
    run = _program.call_donating if donate else _program.call
    if local.recorder is None and not local.bound:
        if _traced((args, kwargs)):
            # Inside a JAX transformation jm does not manage: a program known to write
            # state refuses now; one not yet traced runs without donating (jax.grad and
            # vmap run it eagerly), so that if it writes, which write_back then refuses,
            # it has deleted nothing.
            if program.writes.get(plan.key):
                raise RuntimeError(
                    _program.FOREIGN_TRACE_HELP.format(count=len(program.writes[plan.key]))
                )
            run = _program.call
        with plan.guard:
            traces = program.num_traces
            out = run(program, plan, args, kwargs)
            _learned(program, plan)
            _effects(program, plan, traces)
        return out
    # Inside a gradient or another program's trace, a program that runs jm.backward is
    # a jm.backward there (an Optimizer.step(closure) trial stops differentiating; an
    # enclosing trace notes it runs one): said before the call once known, and after
    # the call that traced it, its Python having said it inside.
    known = bool(program.backward) and plan.key in program.backward  # no key hashed: none ran one
    if known:
        _recorder.note_backward((args, kwargs), program.name)
    rec = local.recorder
    if rec is not None and rec.nested:
        # A PyTorch-style step closure differentiates nothing: its compiled calls run
        # as they would outside it (the same programs, donating, under its locks).
        with _recorder.outside(rec):
            return _run_plan_once(program, plan, donate, args, kwargs)
    if rec is not None and not local.bound:
        # An eager jm.backward (its tape): the call may trace (its tape node is compiled
        # for each new kind of input), and a trace binds every slot of the objects and
        # of the generator, so it holds all their locks, the generator's whether or not
        # the program draws (another thread must not read its key mid-trace).
        with _Held((*plan.locks, state.lock(plan.generator))):
            out = _program.call_recorded(program, plan, args, kwargs)
            _learned(program, plan)
    elif rec is not None:  # inside jm.backward: differentiate through the program
        out = _program.call_recorded(program, plan, args, kwargs)
    else:  # inside another program's trace, which holds the locks
        out = run(program, plan, args, kwargs)
    if not known and program.backward and plan.key in program.backward:
        _recorder.note_backward((args, kwargs), program.name)
    return out


def _draws(program: Program, plan: Plan) -> bool | None:
    """Whether the program uses the RNG key (the last slot), once it has been traced."""
    writes = program.writes.get(plan.key)
    if writes is None:
        return None
    return len(plan.slots) - 1 in writes or plan.key in program.rng_users


def forward_program(module: Any, jit_options: dict) -> Program:
    """A new :class:`Program` running ``module``'s calls (hooks included).

    Its ``jax.jit`` programs are keyed by the structure of the module it is
    called with, not by the module: given to several modules of one class, it
    compiles once for all those of the same structure, shapes and dtypes.
    """
    return Program(
        lambda objs, args, kwargs: objs[0]._call_impl(*args, **kwargs),
        name=f"forward of {type(module).__name__}",
        jit_options=jit_options,
        arg_names=_forward_arg_names(module),
    )


class CompiledForward:
    """``model.compile()``: the module's calls as one cached XLA program."""

    def __init__(
        self, module: Any, jit_options: dict, options: dict, program: Program | None = None
    ):
        self.module = module
        self.options = options
        #: Its programs, keyed by structure: its own, or one that modules of the same
        #: class share (``forward_program``; the eager calls of library modules).
        self.program = program if program is not None else forward_program(module, jit_options)
        self._plan: Plan | None = None
        self._version = -1
        self._hooks = -1
        self._module_dict = module.__dict__

    def _refresh(self) -> Plan:
        desc = structure.describe(self.module)
        autocast = state.local.autocast
        key = (desc.key, _hooks.global_hook_key(), autocast)
        plan = _plan_for(key, (self.module,), (desc,), with_grads=False)
        plan.autocast = autocast
        self.program.jitted(plan)
        self._plan = plan
        self._version = desc.version
        self._hooks = _hooks.version()
        return plan

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        given = args, kwargs
        try:
            plan = self._plan
            if (
                plan is None
                or self._version != self._module_dict.get("_jm_version", 0)
                or self._hooks != _HOOKS.value
                or plan.autocast != state.local.autocast
            ):
                plan = self._refresh()
            code = plan.code
            if code is not None and code.changed() is not None:  # the Python it traced changed
                self.program.stale(plan)
                _unstub(plan)  # it may draw now
                self.program.jitted(plan)
            if not kwargs:
                for a in args:
                    if type(a) is not _ArrayImpl and type(a) is not _Tensor:
                        break
                else:
                    kwargs = None  # arrays (and jm.Tensors: one-leaf pytrees) only
            if kwargs is not None:
                args, kwargs = jax.tree_util.tree_map(wrap_leaf, (args, kwargs), is_leaf=_is_param)
            local = state.local
            if local.recorder is not None or local.bound:
                if local.recorder is not None:  # a gradient is being taken: it may restore us
                    local.recorder.enter(self.module)
                return _run_plan(self.program, plan, False, args, kwargs)
            with plan.guard:
                slots = plan.slots
                vals = [c[k] for c, k in slots]
                if vals[-1] is None:  # reseeded: the key is made from the seed now
                    vals[-1] = _program.seeded_key(plan)
                outer, local.call = local.call, plan
                jitted = plan.jitted
                try:
                    try:
                        out, changed = (
                            jitted(vals, args) if kwargs is None else jitted(vals, args, kwargs)
                        )
                    except TypeError:  # checked before anything runs: not a JAX type
                        if not state.holds_stacked(vals):
                            raise
                        vals = [state.slot_value(c, k) for c, k in slots]
                        out, changed = (
                            jitted(vals, args) if kwargs is None else jitted(vals, args, kwargs)
                        )
                finally:
                    local.call = outer  # this thread keeps no plan (and model) alive
                _program.write_back(slots, changed, fills=plan.fills)  # refuses foreign tracers
                if plan.draws is None:
                    _learned(self.program, plan)
            return out
        except state.NeedsGenerator:
            if self._plan is None or not _unstub(self._plan):
                raise  # an enclosing trace left the generator out: that call retries
            return self(*given)
        except _errors.untraceable_types() as e:
            raise _errors.untraceable(
                e, tuple(self.module.named_modules()), _errors.EAGER_COMPILE
            ) from _tracebacks.cause(e)
        except RuntimeError as e:
            deleted = _errors.deleted_input(e, given)
            if deleted is None:
                _tracebacks.hide(e)
                raise
            raise deleted from _tracebacks.cause(e)
        except ValueError as e:  # the program spans devices: let uncommitted state follow
            if _uncommit(self._plan, e):
                return self(*given)
            _tracebacks.hide(e)
            raise
        except Exception as e:
            _tracebacks.hide(e)
            raise


class _ObjectRef:
    """Where a stateful object stood in the arguments (static)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __eq__(self, other: object) -> bool:
        return type(other) is _ObjectRef and other.index == self.index

    def __hash__(self) -> int:
        return hash(("_ObjectRef", self.index))


jax.tree_util.register_pytree_node(_ObjectRef, lambda r: ((), r.index), lambda i, _: _ObjectRef(i))


def _is_stateful(x: Any) -> bool:
    return hasattr(type(x), "_jm_describe")


class _Match(NamedTuple):
    """What the next call must look like to reuse the last plan without describing anything."""

    plan: Plan
    #: Per positional argument: the object that stood there, or None for an array.
    pattern: tuple[Any, ...]
    #: ``(object.__dict__, version)`` of each versioned object (modules).
    versions: tuple[tuple[dict, int], ...]
    #: ``(object, description)`` of the others (optimizers): asked again every call.
    others: tuple[tuple[Any, Any], ...]
    hooks: int
    #: This thread's autocast regions when the plan was made (part of its key).
    autocast: tuple | None


class CompiledFunction:
    """``jm.compile(fn)``: ``fn`` and every state change it makes, as one XLA program."""

    def __init__(self, fn: Callable, jit_options: dict, donate: bool = True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.donate = donate
        #: The last call's plan and what a call must match to reuse it (atomic to replace).
        self._last: _Match | None = None
        #: ``(match, fast path, guard, generated call or None)``: the match's per-call
        #: function (``fastcall.make``), made on its second consecutive call with the same
        #: fast path and locks (atomic to replace).
        self._gen: tuple | None = None
        self.program = Program(
            self._run,
            name=getattr(fn, "__qualname__", repr(fn)),
            jit_options=jit_options,
            source=fn,
        )

    def _run(self, objects: Sequence[Any], args: tuple, kwargs: dict) -> Any:
        positions = state.local.call.positions
        if positions is not None:  # the per-call form: only the arrays were passed
            arrays = iter(args)
            return self.fn(*(next(arrays) if i < 0 else objects[i] for i in positions))
        args, kwargs = jax.tree_util.tree_map(
            lambda x: objects[x.index] if type(x) is _ObjectRef else x,
            (args, kwargs),
            is_leaf=lambda x: type(x) is _ObjectRef,
        )
        return self.fn(*args, **kwargs)

    def _match(self, args: tuple) -> tuple[Plan, tuple] | None:
        """The last plan and this call's arrays, if the call has the last one's objects."""
        last = self._last
        if (
            last is None
            or len(args) != len(last.pattern)
            or last.hooks != _HOOKS.value
            or last.autocast != state.local.autocast
        ):
            return None
        arrays = []
        for a, p in zip(args, last.pattern):
            if p is None:
                if type(a) is not _ArrayImpl and type(a) is not _Tensor:
                    return None
                arrays.append(a)
            elif a is not p:
                return None
        for d, v in last.versions:
            if d.get("_jm_version", 0) != v:
                return None
        for o, desc in last.others:
            if o._jm_describe() is not desc:
                return None
        return last.plan, tuple(arrays)

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[Plan, tuple, Any]:
        """This call's plan and what goes to ``jax.jit``: ``(plan, args, kwargs or None)``.

        When every argument is a stateful object or a plain array, only the
        arrays go to jax (no Python pytree node to flatten on every call);
        where each object stood is part of the key.
        """
        if not kwargs:
            matched = self._match(args)
            if matched is not None:
                return matched[0], matched[1], None
            objects: list[Any] = []
            flat: list[Any] = []
            where: list[int] = []
            for a in args:
                if type(a) is _ArrayImpl or type(a) is _Tensor:  # a Tensor: a one-leaf pytree
                    flat.append(a)
                    where.append(-1)
                elif _is_stateful(a):
                    for i, o in enumerate(objects):
                        if o is a:
                            where.append(i)
                            break
                    else:
                        where.append(len(objects))
                        objects.append(a)
                else:
                    break
            else:
                plan = self._describe(objects, tuple(where))
                pattern = tuple(None if i < 0 else objects[i] for i in where)
                self._last = self._matcher(plan, pattern)
                return plan, tuple(flat), None
        objects = []
        index: dict[int, int] = {}

        def leaf(x: Any) -> Any:
            if _is_stateful(x):
                if id(x) not in index:
                    index[id(x)] = len(objects)
                    objects.append(x)
                return _ObjectRef(index[id(x)])
            return wrap_leaf(x)

        tree_args, tree_kwargs = jax.tree_util.tree_map(
            leaf, (args, kwargs), is_leaf=lambda x: _is_stateful(x) or _is_param(x)
        )
        return self._describe(objects, None), tree_args, tree_kwargs

    def _describe(self, objects: list[Any], positions: tuple[int, ...] | None) -> Plan:
        descs = [o._jm_describe() for o in objects]
        autocast = state.local.autocast
        key = (tuple(d.key for d in descs), _hooks.global_hook_key(), positions, autocast)
        plan = _plan_for(key, objects, descs, with_grads=True, positions=positions)
        plan.autocast = autocast
        plan.code = self.program.guards.get(key)
        return plan

    @staticmethod
    def _matcher(plan: Plan, pattern: tuple) -> _Match:
        versions, others = [], []
        for o in plan.objects:
            if getattr(type(o), "_jm_versioned", False):
                versions.append((o.__dict__, o.__dict__.get("_jm_version", 0)))
            else:
                others.append((o, o._jm_describe()))
        return _Match(
            plan, pattern, tuple(versions), tuple(others), _hooks.version(), plan.autocast
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            last = self._last
            if not kwargs and last is not None and last.plan.fast is not None:
                gen, plan = self._gen, last.plan
                if (
                    gen is not None
                    and gen[0] is last
                    and gen[1] is plan.fast
                    and gen[2] is plan.guard
                ):
                    call = gen[3]
                    if call is None:  # the match's second call in a row: write its path
                        call = _fastcall.make(last, self.program) or _NO_FAST_CALL
                        self._gen = (last, plan.fast, plan.guard, call)
                    if call is not _NO_FAST_CALL:
                        try:
                            out = call(args)
                        except state.NeedsGenerator:  # it draws now: the general path
                            _unstub(plan)
                            out = _program.SLOW
                        if out is not _program.SLOW:
                            return out
                else:
                    self._gen = (last, plan.fast, plan.guard, None)
                # The per-call path: the last call's objects in the same places, arrays
                # elsewhere, nothing changed structurally, a settled donating program.
                local = state.local
                matched = self._match(args) if local.recorder is None and not local.bound else None
                if (
                    matched is not None
                    and matched[0].fast is not None  # the generated call may have dropped it
                    and (matched[0].code is None or matched[0].code.changed() is None)
                ):
                    plan, arrays = matched
                    try:
                        with plan.guard:
                            out = _program.call_fast(self.program, plan, plan.fast, arrays)
                            if out is not _program.SLOW:
                                return out
                    except state.NeedsGenerator:  # it draws now: a new plan holds the lock
                        _unstub(plan)
            plan, a, k = self._prepare(args, kwargs)
            return _run_plan(self.program, plan, self.donate, a, k)
        except _errors.untraceable_types() as e:
            plan = state.local.call
            named = plan.named_modules if plan is not None else ()
            raise _errors.untraceable(
                e, named, _errors.EAGER_FUNCTION, getattr(self.fn, "__qualname__", None)
            ) from _tracebacks.cause(e)
        except RuntimeError as e:
            deleted = _errors.deleted_input(e, (args, kwargs))
            if deleted is None:
                _tracebacks.hide(e)
                raise
            raise deleted from _tracebacks.cause(e)
        except ValueError as e:  # the program spans devices: let uncommitted state follow
            if _uncommit(state.local.call, e):
                return self(*args, **kwargs)
            _tracebacks.hide(e)
            raise
        except Exception as e:
            _tracebacks.hide(e)
            raise

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The ``jax.stages.Lowered`` program a call with these arguments runs.

        Call the function once first so donation is settled; then
        ``.compile().memory_analysis()`` / ``.cost_analysis()`` / ``.as_text()``
        describe exactly what runs.
        """
        plan, a, k = self._prepare(args, kwargs)
        with plan.guard:
            return _program.lower(self.program, plan, self.donate, a, k)

    @property
    def num_traces(self) -> int:
        """How many times ``fn`` has been traced (compiled)."""
        return self.program.num_traces


def compile_function(fn: Callable | None = None, *, donate: bool = True, **jit_options: Any) -> Any:
    """``jm.compile``: compile ``fn`` whole, with the state of the modules it is given.

    Arguments that are modules (or other jmodule stateful objects, such as
    optimizers) have their parameters, buffers and the default RNG key
    carried into one ``jax.jit`` program and back out: every in-place change
    the function makes to them is visible afterwards, as if it had run
    eagerly. Array arguments are traced; other Python values are static (a
    new value recompiles). Use as ``jm.compile(fn)`` or ``@jm.compile``.

    A call first checks the Python the last trace ran (see
    ``jmodule/_lowering/guards.py``): a changed global or closure value that
    ``fn``, a module's ``forward`` or a helper they call reads, a redefined
    helper or ``forward``, or code replaced in place, traces again (the
    reason is in :func:`compile_stats`). Values inside mutable containers
    are not seen.

    Args:
        fn: the function to compile.
        donate: donate the old state buffers the program rewrites (the
            default: a training step then holds one copy of the weights).
        **jit_options: passed to ``jax.jit`` (e.g. ``compiler_options``).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Linear(3, 1)
    >>> @jm.compile
    ... def scaled(m, x, scale):
    ...     return m(x) * scale
    >>> scaled(model, jnp.ones((2, 3)), 2.0).shape
    (2, 1)
    """
    if fn is None:
        return functools.partial(compile_function, donate=donate, **jit_options)
    return CompiledFunction(fn, jit_options, donate)


@dataclass(frozen=True)
class CompileStats:
    """How often a compiled module or function was traced, and why."""

    num_traces: int
    reasons: tuple[str, ...]
    #: How many XLA executables were compiled (a trace can compile more than one, e.g.
    #: for inputs placed differently; programs dropped by a retrace still count).
    num_compiles: int = 0


def compile_stats(obj: Any) -> CompileStats:
    """Trace count and recompilation reasons of a compiled module or ``jm.compile`` function.

    ``num_compiles`` counts the XLA executables compiled, which can exceed
    ``num_traces`` (inputs committed to a device where the last call's were
    not make XLA compile the same trace again).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> m = jm.nn.Linear(2, 2)
    >>> m.compile()
    >>> _ = m(jnp.ones((1, 2))); _ = m(jnp.ones((3, 2)))
    >>> jm.compile_stats(m).reasons
    ('first call', 'input shape changed: input (1, 2) -> (3, 2)')

    Raises:
        TypeError: ``obj`` is neither.
    """
    program = getattr(obj, "program", None)
    if program is None:
        compiled = obj.__dict__.get("_compiled") if hasattr(obj, "__dict__") else None
        if compiled is None:
            raise TypeError(
                f"{type(obj).__name__} is not compiled: call model.compile() or use jm.compile"
            )
        program = compiled.program
    return CompileStats(program.num_traces, tuple(program.reasons), program.num_compiles)
