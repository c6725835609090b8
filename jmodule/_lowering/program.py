"""A Python function over stateful objects, lowered to cached ``jax.jit`` programs.

A :class:`Program` lowers ``fn(objects, args, kwargs)`` into

    pure(state_values, args, kwargs) -> (output, Changed(slot indices, new values))

by binding the state values into the objects' slots (``binding.bound``), and
keeps one ``jax.jit`` of it per structure key. What a call binds (its
objects, their slots and names) is a :class:`Plan`, made by the caller and
handed to the trace through this thread's context (``state.local.call``), so
a program shared by threads never mixes their objects.

The per-call paths:

* :func:`call` reads every slot, calls the jitted function, writes back what
  changed (``model.compile()``'s forward).
* :func:`call_donating` also donates the old value of every slot the program
  rewrites (``jm.compile``: a training step holds one copy of the weights).
  Its first call for a structure learns which slots the program writes; the
  settled result is the plan's :class:`FastPath`, which reads, calls and
  writes back with no hashing and no tree walk.
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.extend.core import jaxpr_as_fun

from jmodule import _jax_internals as _jx
from jmodule._lowering import binding, guards, state, structure
from jmodule._lowering import flat as _flat
from jmodule._lowering import tape as _tape
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.arguments import describe_args, diff, unwrap_static
from jmodule._lowering.state import Slot

__all__ = ["Changed", "Committed", "Donation", "FastPath", "PackedSlice", "Plan", "Program"]

logger = logging.getLogger("jmodule.compile")


# ----------------------------------------------------------------------------- records


class PackedSlice(NamedTuple):
    """Where a gradient written packed lies in its pack's flat array (``Changed.packs``)."""

    slot: int
    start: int
    size: int
    shape: tuple[int, ...]


class Committed(NamedTuple):
    """A state slot ``compiled._commit`` committed to its device (``Plan.committed``).

    ``committed`` is a weak reference: a plan holds no state array, so that a donating
    call can tell arrays the user holds by their reference counts.
    """

    container: dict
    key: Any
    uncommitted: Any
    committed: Callable[[], Any]


class Changed:
    """The slot values a trace changed: indices and packs are static, values are outputs.

    ``values[i]`` is the new value of slot ``indices[i]``; after those come
    one flat array per pack: ``packs[j]`` lists the :class:`PackedSlice` of the
    gradients written as slices of the ``j``-th (see ``_pack_grads``).
    ``stacks`` lists ``(stack slot, member slots)`` of the groups (see
    :class:`Group`) whose stacked value was written: each member's slot gets
    its block of it.
    """

    __slots__ = ("indices", "packs", "stacks", "values")

    def __init__(
        self,
        indices: tuple[int, ...],
        values: tuple[Any, ...],
        packs: tuple[tuple[PackedSlice, ...], ...] = (),
        stacks: tuple = (),
    ):
        self.indices = indices
        self.values = values
        self.packs = packs
        self.stacks = stacks


jax.tree_util.register_pytree_node(
    Changed,
    lambda c: (c.values, (c.indices, c.packs, c.stacks)),
    lambda aux, vals: Changed(aux[0], tuple(vals), aux[1], aux[2]),
)


class Group(NamedTuple):
    """Parameters of scanned blocks (one kind, block by block) read and written stacked.

    A compiled step over ``jm.nn.scan`` blocks takes the blocks' parameters of
    one kind as one stacked input (the slot ``stack``, in the Scan module's
    store) and writes them as one stacked output: one array in and out per
    kind, however deep the stack, instead of one per block (each a kernel of
    its own in XLA:CPU). The ``members`` (the blocks' value slots, in block
    order) are not program inputs: inside the trace each holds its block's
    slice of the stack; after the call, a :class:`~state.StackedValue` of the
    new stack.
    """

    stack: int
    members: tuple[int, ...]


#: Gradients of at most this many elements are written packed (as the optimizer's
#: small parameters are): one output array instead of one per parameter.
PACK_GRAD_MAX_ELEMENTS = 1 << 16


def _pack_grads(
    slots: Sequence[Slot],
    idx: tuple[int, ...],
    values: tuple[Any, ...],
    unread: set[int],
    stacks: tuple = (),
) -> Changed:
    """``Changed`` with the small gradients it writes unread packed, one flat array per dtype.

    A training step writes every parameter's ``.grad``; as separate outputs,
    each costs the call an output array and, on the next call, freeing the
    old one. Packed, the step writes one array per dtype, and each ``.grad``
    is a :class:`~state.PackedGrad` slice of it until read. A step with more
    than :data:`~jmodule._lowering.flat.PACK_MAX_TOTAL` gradient elements writes
    them unpacked.
    """
    grads = [v for i, v in zip(idx, values) if slots[i][1] == "grad" and v is not None]
    if sum(v.size for v in grads) > _flat.PACK_MAX_TOTAL:
        return Changed(idx, values, (), stacks)
    groups: dict[Any, list[tuple[int, Any]]] = {}
    for i, v in zip(idx, values):
        if (
            slots[i][1] == "grad"
            and i in unread
            and v is not None
            and v.size <= PACK_GRAD_MAX_ELEMENTS
        ):
            groups.setdefault(v.dtype, []).append((i, v))
    groups = {d: m for d, m in groups.items() if len(m) > 1}
    if not groups:
        return Changed(idx, values, (), stacks)
    packed = {i for members in groups.values() for i, _ in members}
    kept = [(i, v) for i, v in zip(idx, values) if i not in packed]
    flats, packs = [], []
    for members in groups.values():
        meta, start = [], 0
        for i, v in members:
            meta.append(PackedSlice(i, start, int(v.size), tuple(v.shape)))
            start += int(v.size)
        flats.append(_flat.concat([v.reshape(-1) for _, v in members]))
        packs.append(tuple(meta))
    return Changed(
        tuple(i for i, _ in kept), tuple(v for _, v in kept) + tuple(flats), tuple(packs), stacks
    )


class Donation(NamedTuple):
    """A donating program: which slots it donates, which it reads undonated."""

    donated: tuple[int, ...]
    kept: tuple[int, ...]
    jitted: Callable


class FastPath(NamedTuple):
    """The per-call path of a plan whose donating program is settled."""

    jitted: Callable
    donated: tuple[Slot, ...]
    kept: tuple[Slot, ...]
    #: Slots the program reads as None: a value there needs another program.
    nones: tuple[Slot, ...]
    #: The ``.grad`` slots among ``donated`` and ``kept`` (a packed one must be sliced).
    grads: tuple[Slot, ...]
    #: ``{position in donated: slot index}`` of the donated parameters and buffers, whose
    #: arrays a user may hold (``_check_held``).
    held: dict[int, int]


@dataclass(eq=False)
class Plan:
    """What one call binds: its objects, their slots (each once) and the program key."""

    key: Any
    infos: dict
    objects: tuple
    slots: tuple[Slot, ...]
    names: tuple[str, ...]
    named_modules: tuple[tuple[str, Any], ...]
    #: Per slot: the Parameter whose value it holds (read under a gradient recorder), or None.
    cells: tuple[Any, ...]
    #: The non-donating ``jax.jit`` function for ``key``, once made.
    jitted: Callable | None = None
    #: The settled per-call path (``call_donating``), once known.
    fast: FastPath | None = None
    #: The donating program used last (no hashing of the key to find it again).
    last: Donation | None = None
    #: Locks to hold while the call reads, runs and writes (the objects', in id order).
    locks: tuple[Any, ...] = field(default=())
    #: The generator whose key is the last slot, and whether the program draws from
    #: it (None: not known yet). Its lock is taken only by programs that draw.
    generator: Any = None
    draws: bool | None = None
    #: Write gradients packed (``_pack_grads``): every state array is on one device.
    pack_grads: bool = False
    #: Ids of the arrays the last donating call wrote to its donated slots: when the
    #: slots still hold them, they are distinct fresh arrays and need no check.
    fresh: tuple[int, ...] | None = None
    #: The lock (or ``_Held`` locks) a call holds, from ``locks`` and ``draws``.
    guard: Any = None
    #: ``jm.compile``'s per-call form: where each object stood among the arguments
    #: (-1: an array argument), or None when the whole argument tree is passed.
    positions: tuple[int, ...] | None = None
    #: What the trace of ``key`` read from Python (``guards.Guards``; None: not traced
    #: yet, or nothing to guard). A call whose guards changed traces again.
    code: Any = None
    #: The slots ``_plan_for`` committed to their device: put back if the program turns
    #: out to span other devices.
    committed: tuple[Committed, ...] = ()
    #: The thread's ``jm.autocast`` regions the plan was made under (in ``key`` too).
    autocast: tuple | None = None
    #: Whether a call already said that it deletes donated arrays the user holds, and
    #: how often a suspected holder was only garbage (``_check_held``).
    warned_held: bool = False
    held_collections: int = 0
    #: Scanned blocks' parameters read and written stacked (:class:`Group`).
    groups: tuple[Group, ...] = ()
    #: The groups' member slots: not program inputs.
    members: frozenset[int] = frozenset()
    #: ``(slot, module)`` of the buffers registered as None that the program may give a
    #: value (``compiled._none_buffers``): when one does, ``write_back`` touches the module.
    fills: tuple = ()


class _Reread(Exception):
    """A first trace read a ``.grad`` it was passed as None on a guess: pass it, trace again."""


class _Redonate(Exception):
    """A donating trace found that it would donate slots it does not write back."""

    def __init__(self, changed: tuple[int, ...]):
        super().__init__(changed)
        self.changed = changed


# ----------------------------------------------------------------------------- the program


class Program:
    """One Python function lowered to cached ``jax.jit`` programs (one per structure key)."""

    def __init__(
        self,
        fn: Callable[[Sequence[Any], tuple, dict], Any],
        name: str,
        jit_options: dict,
        arg_names: Sequence[str] | None = None,
        source: Callable | None = None,
    ):
        self.fn = fn
        #: The user's function the program runs (``jm.compile``), for its guards.
        self.source = source
        #: Per structure key: the guards of its latest trace (``guards.collect``).
        self.guards: dict[Any, guards.Guards | None] = {}
        #: XLA compiles of programs dropped (stale or superseded), for ``num_compiles``.
        self._dropped_compiles = 0
        self.name = name
        self.jit_options = jit_options
        self.arg_names = arg_names
        self.entries: dict[Any, Callable] = {}
        self.donations: dict[Any, Donation] = {}
        #: Structure keys whose traces read or wrote the default generator's key.
        self.rng_users: set[Any] = set()
        #: Per structure key, the ``.grad`` slots the function overwrites unread.
        self.grad_unread: dict[Any, frozenset[int]] = {}
        #: Per structure key, every slot a trace of it has written.
        self.writes: dict[Any, frozenset[int]] = {}
        #: Per key: ``(object position, effects)`` its objects' Python made while tracing,
        #: replayed for other objects a call reuses the program for (``compiled._effects``).
        self.effects: dict[Any, tuple] = {}
        #: The structure keys whose trace ran a ``jm.backward``: to a gradient or trace
        #: around a call, the call is one (``recorder.note_backward``), traced or not.
        self.backward: set[Any] = set()
        #: ``(id(container), "grad")`` of the gradient slots the latest trace overwrote
        #: unread: the guess for a new structure key (a training step whose structure
        #: changed still zeroes its gradients first), checked by its first trace.
        self.unread_slots: frozenset[tuple[int, str]] = frozenset()
        self._replay: dict[Any, tuple[Any, Any]] = {}
        self.num_traces = 0
        self.reasons: list[str] = []
        self._infos: dict | None = None
        #: The autocast regions of the last key made (a new one names the change).
        self._autocast: tuple | None = None
        self._pending_reason = "first call"
        self._last_sig: dict[Any, tuple[dict, dict]] = {}
        #: Called as ``hook(key, vals, args, kwargs, reason)`` each time the program is
        #: traced (inside the trace; never on the per-call path). Used by ``jm.jit``.
        self.on_trace: list[Callable[[Any, Sequence[Any], Any, Any, str], None]] = []

    def unread(self, plan: Plan) -> frozenset[int]:
        """The ``.grad`` slots a call passes as None (known, or guessed for a new key)."""
        known = self.grad_unread.get(plan.key)
        if known is not None:
            return known
        guess = self.unread_slots
        if not guess:
            return frozenset()
        return frozenset(
            i for i, (c, k) in enumerate(plan.slots) if k == "grad" and (id(c), k) in guess
        )

    def _note_structure(self, plan: Plan) -> None:
        infos = plan.infos
        if self._infos is not None and self._infos is not infos:
            self._pending_reason = structure.structural_change(self._infos, infos)
        elif self._infos is not None and plan.autocast != self._autocast:
            self._pending_reason = (
                f"autocast changed: {_regions(self._autocast)} -> {_regions(plan.autocast)}"
            )
        self._autocast = plan.autocast

    def jitted(self, plan: Plan) -> Callable:
        """The ``jax.jit`` function for ``plan``'s structure key (made on first use)."""
        fn = plan.jitted
        if fn is not None:
            return fn
        fn = self.entries.get(plan.key)
        if fn is None:
            self._note_structure(plan)
            fn = self.entries[plan.key] = jax.jit(
                functools.partial(self._pure, plan.key, compact=True), **self.jit_options
            )
        self._infos = plan.infos
        plan.jitted = fn
        plan.code = self.guards.get(plan.key)
        return fn

    @property
    def num_compiles(self) -> int:
        """How many XLA executables the program's ``jax.jit`` functions have compiled."""
        fns = [*self.entries.values(), *(d.jitted for d in self.donations.values())]
        return self._dropped_compiles + sum(_compiles(f) for f in fns)

    def stale(self, plan: Plan) -> None:
        """Forget the program of ``plan``'s key: its guards changed (the next call traces)."""
        code, key = plan.code, plan.key
        if code is not None and self.guards.get(key) is code:
            del self.guards[key]
            dropped = [self.entries.pop(key, None), self.donations.pop(key, None)]
            self._dropped_compiles += sum(
                _compiles(f if not isinstance(f, Donation) else f.jitted)
                for f in dropped
                if f is not None
            )
            self._last_sig.pop(key, None)
            self.backward.discard(key)
            self.rng_users.discard(key)
            self._replay = {s: r for s, r in self._replay.items() if s[0] != key}
            self._pending_reason = code.reason or "the Python the program ran changed"
            self._infos = None
        plan.jitted = plan.fast = plan.last = plan.fresh = None
        plan.code = None

    def donating(self, plan: Plan, donated: tuple[int, ...], kept: tuple[int, ...]) -> Donation:
        """A ``jax.jit`` for ``plan``'s key that donates the slots ``donated`` and reads ``kept``.

        A traced program that would donate a slot it does not write back
        raises :class:`_Redonate` before anything runs, so the caller can
        retry with the slots it does write back.
        """
        made = self.donations.get(plan.key)
        if made is not None and made.donated == donated and made.kept == kept:
            self._infos = plan.infos
            return made
        if made is None:
            self._note_structure(plan)
        else:
            self._dropped_compiles += _compiles(made.jitted)
        fn = jax.jit(
            functools.partial(self._pure_donating, plan.key, donated, kept),
            donate_argnums=(0,),
            **self.jit_options,
        )
        made = self.donations[plan.key] = Donation(donated, kept, fn)
        self._infos = plan.infos
        return made

    def _pure_donating(
        self,
        key: Any,
        idx: tuple,
        keep: tuple,
        donated: list,
        kept: list,
        args: tuple,
        kwargs: dict | None = None,
    ) -> tuple[Changed, Any]:
        """``_pure`` for a donating program, running the user's Python once per trace.

        Only the slots at ``idx`` (donated) and ``keep`` come in; every other
        slot reads None (a ``.grad`` the program overwrites unread).
        ``kwargs`` is left out by calls whose arguments are all arrays and
        stateful objects (the per-call form: fewer pytree nodes to flatten).

        The Python function is staged to a jaxpr first; if the program would
        donate a slot it does not write back, the jaxpr is kept and
        :class:`_Redonate` raised, and the retry replays the jaxpr instead of
        running the Python (and its side effects) a second time.
        """
        kwargs = {} if kwargs is None else kwargs
        plan = state.local.call
        vals: list[Any] = [None] * len(plan.slots)
        for j, i in enumerate(keep):
            vals[i] = kept[j]
        for j, i in enumerate(idx):
            vals[i] = donated[j]
        leaves, treedef = jax.tree_util.tree_flatten((vals, args, kwargs))
        sig = (key, treedef, tuple((v.shape, v.dtype, v.aval.weak_type) for v in leaves))
        recorded = self._replay.pop(sig, None)
        if recorded is None:
            closed, shapes = jax.make_jaxpr(functools.partial(self._pure, key), return_shape=True)(
                vals, args, kwargs
            )
            recorded = (closed, jax.tree_util.tree_structure(shapes))
            if not set(idx) <= set(shapes[1].indices):
                self._replay[sig] = recorded
                raise _Redonate(shapes[1].indices)
        closed, out_tree = recorded
        flat = jaxpr_as_fun(closed)(*leaves)
        out, changed = jax.tree_util.tree_unflatten(out_tree, flat)
        # jax pairs each donated input with the first unclaimed output of the
        # same shape and dtype, in order. Put the donated slots' new values
        # first, in the order they were donated, so every buffer is reused for
        # its own slot; otherwise (e.g. an Adam moment landing in a ``.grad``
        # output of the same shape) XLA inserts a copy of each moved buffer.
        order = {i: n for n, i in enumerate(changed.indices)}
        first = [i for i in idx if i in order]
        placed = set(first)
        rest = [i for i in changed.indices if i not in placed]
        indices = tuple(first + rest)
        flats = changed.values[len(changed.indices) :]  # packed gradients last
        values = tuple(changed.values[order[i]] for i in indices) + flats
        return Changed(indices, values, changed.packs, changed.stacks), out

    def _note_trace(
        self, plan: Plan, key: Any, vals: Sequence[Any], args: Any, kwargs: Any
    ) -> None:
        state_sig = {
            n: ("none", None) if v is None else (tuple(v.shape), str(v.dtype))
            for n, v in zip(plan.names, vals)
        }
        arg_sig = describe_args(args, kwargs, self.arg_names)
        previous = self._last_sig.get(key)
        if previous is None:
            reason = self._pending_reason
        else:
            reason = (
                diff("input", previous[1], arg_sig)
                or diff("state", previous[0], state_sig)
                or "input or state sharding, device or weak type changed"
            )
        self._last_sig[key] = (state_sig, arg_sig)
        plan.code = self.guards[key] = guards.collect(
            self.source, plan.named_modules, guards.hook_functions
        )
        self.num_traces += 1
        self.reasons.append(reason)
        logger.info("compiling %s (trace %d): %s", self.name, self.num_traces, reason)
        for hook in self.on_trace:
            hook(key, vals, args, kwargs, reason)

    def _pure(
        self, key: Any, vals: list, args: tuple, kwargs: dict | None = None, compact: bool = False
    ) -> tuple[Any, Changed | None]:
        """Bind ``vals``, run the function, return ``(output, what it changed)``.

        With ``compact`` (the non-donating programs), a trace that changed no
        slot returns None for it: no pytree node to rebuild on every call.
        """
        kwargs = {} if kwargs is None else kwargs
        plan = state.local.call
        self._note_trace(plan, key, vals, args, kwargs)
        args, kwargs = unwrap_static((args, kwargs))
        slots = plan.slots
        if plan.groups:  # each member holds its block of the stacked input, sliced if read
            vals = list(vals)
            for g in plan.groups:
                stacked = vals[g.stack]
                for b, m in enumerate(g.members):
                    vals[m] = state.StackedValue(stacked, b)
        # Gradient slots given as None although they hold an array (a guess, see unread()).
        guessed = {i for i, (c, k) in enumerate(slots) if vals[i] is None and c.get(k) is not None}
        watch = binding.GradWatch({id(c): i for i, (c, k) in enumerate(slots) if k == "grad"})
        local = state.local
        outer, local.watch = local.watch, watch
        # Whether this trace left the generator out (its slot is the plan's own stub), and
        # whether it used the generator (set by the generator; an enclosing trace uses
        # what this one uses).
        outer_left_out, outer_used = local.rng_left_out, local.rng_used
        local.rng_left_out = slots[-1][0] is not plan.generator.__dict__
        local.rng_used = False
        try:
            with binding.bound(slots, vals, plan.named_modules, compiled=True):
                out = self.fn(plan.objects, args, kwargs)
                idx = tuple(i for i, (c, k) in enumerate(slots) if c[k] is not vals[i])
                new = tuple(slots[i][0][slots[i][1]] for i in idx)
        finally:
            local.watch = outer
            used = local.rng_used
            local.rng_left_out, local.rng_used = outer_left_out, outer_used or used
        if used:
            self.rng_users.add(key)
        self.writes[key] = self.writes.get(key, frozenset()) | frozenset(idx)
        if watch.backward:
            self.backward.add(key)
        # Gradient slots the function never read before overwriting: their
        # incoming value is irrelevant, so calls pass None there and the first
        # call (grads None) and later ones (grads set) share one program.
        unread = {i for c_id, i in watch.watched.items() if c_id not in watch.reads}
        previous = self.grad_unread.get(key)
        self.grad_unread[key] = frozenset(unread if previous is None else unread & previous)
        if guessed - unread:  # it read a gradient it was given as None on a guess
            raise _Reread()
        self.unread_slots = frozenset((id(slots[i][0]), "grad") for i in unread)
        stacks: tuple = ()
        if plan.groups:
            idx, new, stacks = _stack_changes(plan, vals, idx, new)
        if plan.pack_grads:
            return out, _pack_grads(slots, idx, new, unread, stacks)
        if compact and not idx and not stacks:
            return out, None
        return out, Changed(idx, new, (), stacks)


def _stack_changes(
    plan: Plan, vals: Sequence[Any], idx: tuple[int, ...], new: tuple[Any, ...]
) -> tuple[tuple[int, ...], tuple[Any, ...], tuple]:
    """A trace's changes with each group's members written as one stacked value.

    A group whose members the trace changed writes its stack slot (the
    members' values stacked, the unchanged ones as they came in); the members
    themselves are no outputs.
    """
    changed = dict(zip(idx, new))
    for g in plan.groups:
        for m in g.members:  # a member only read holds its slice: unchanged
            if m in changed and changed[m] is vals[m].cache:
                del changed[m]
    stacks = []
    for g in plan.groups:
        if any(m in changed for m in g.members):
            whole = _one_stack([changed.get(m) for m in g.members], vals[g.stack])
            if whole is not None:  # updated as a whole (the optimizer's stacked update)
                changed[g.stack] = whole
                stacks.append((g.stack, g.members))
                for m in g.members:
                    changed.pop(m, None)
                continue
            parts = [
                (changed[m].materialize() if type(changed[m]) is state.StackedValue else changed[m])
                if m in changed
                else vals[m].materialize()
                for m in g.members
            ]
            for m, part, given in zip(g.members, parts, (vals[m] for m in g.members)):
                if (
                    getattr(part, "shape", None) != given.shape
                    or getattr(part, "dtype", None) != given.dtype
                ):
                    raise RuntimeError(
                        f"'{plan.names[m]}' is a parameter of a scanned block (jm.nn.scan), "
                        f"which a compiled step reads and writes stacked with the other "
                        f"blocks' ({given.shape} {given.dtype}), but the step set it to "
                        f"{getattr(part, 'shape', type(part).__name__)} "
                        f"{getattr(part, 'dtype', '')}. Change a scanned block's parameter "
                        "to another shape or dtype outside the compiled step (or replace "
                        "the Parameter), where the blocks are laid out again."
                    )
            changed[g.stack] = _flat.stack(parts)
            stacks.append((g.stack, g.members))
        for m in g.members:
            changed.pop(m, None)
    order = tuple(sorted(changed))
    return order, tuple(changed[i] for i in order), tuple(stacks)


def _one_stack(values: Sequence[Any], like: Any) -> Any:
    """The array whose blocks ``values`` are, in order, shaped like ``like``; else None."""
    whole = getattr(values[0], "stack", None)
    if whole is None or whole.shape != like.shape or whole.dtype != like.dtype:
        return None
    for b, v in enumerate(values):
        if type(v) is not state.StackedValue or v.stack is not whole or v.index != b:
            return None
    return whole


def restack(plan: Plan) -> bool:
    """Make each group's stack slot hold its members' values; False when it cannot here.

    After a compiled call every member holds a :class:`~state.StackedValue` of
    its stack, so this only compares identities. A member read, changed or
    replaced outside the program since then holds an array of its own: the
    group is stacked again from the members' values (one dispatch). Inside
    another trace (the members hold its tracers) nothing is written: False.
    """
    slots = plan.slots
    done = True
    for g in plan.groups:
        c, k = slots[g.stack]
        stacked = c.get(k)
        if stacked is not None:
            for m in g.members:
                mc, mk = slots[m]
                v = mc[mk]
                if type(v) is not state.StackedValue or v.stack is not stacked:
                    break
            else:
                continue
        held = [slots[m][0][slots[m][1]] for m in g.members]
        whole = getattr(held[0], "stack", None)
        if (
            whole is not None
            and not isinstance(whole, jax.core.Tracer)
            and whole.shape[0] == len(held)
            and _one_stack(held, whole) is not None
        ):  # stacked elsewhere (an eager optimizer step on the stack): adopt it
            c[k] = whole
            continue
        values = [state.slot_value(*slots[m]) for m in g.members]
        if any(isinstance(v, jax.core.Tracer) for v in values) or state.local.bound:
            done = False
            continue
        first = values[0]
        for m, v in zip(g.members, values):
            if v.shape != first.shape or v.dtype != first.dtype:
                raise RuntimeError(
                    f"'{plan.names[m]}' has shape {tuple(v.shape)} and dtype {v.dtype} where "
                    f"'{plan.names[g.members[0]]}' has {tuple(first.shape)} and {first.dtype}: "
                    "the parameters of scanned blocks (jm.nn.scan) must match. Replace the "
                    "Parameter (module.weight = Parameter(...)) rather than its data to "
                    "change its shape."
                )
        with jax.ensure_compile_time_eval():  # concrete even under a jax.jit around the call
            stacked = jax.numpy.stack(values)
        if not stacked.committed:
            stacked = jax.device_put(stacked, next(iter(stacked.devices())))
        c[k] = stacked
        for b, m in enumerate(g.members):
            mc, mk = slots[m]
            mc[mk] = state.StackedValue(stacked, b)
    return done


def _regions(autocast: tuple | None) -> str:
    """``jm.autocast`` regions in words: ``off`` or ``cpu bfloat16``."""
    return ", ".join(f"{d} {t}" for d, t in autocast) if autocast else "off"


def _compiles(fn: Any) -> int:
    """Executables in a ``jax.jit`` function's cache (0 where jax does not say)."""
    return _jx.jit_cache_size(fn)


# ----------------------------------------------------------------------------- per call


def check_not_meta(slots: Sequence[Slot], names: Sequence[str]) -> None:
    """Raise :data:`state.META_HELP`, naming the slot, if a slot holds a meta value."""
    for (c, k), name in zip(slots, names):
        if isinstance(c.get(k), jax.ShapeDtypeStruct):
            raise RuntimeError(f"{state.META_HELP} ('{name}': the module cannot run)")


def seeded_key(plan: Plan) -> Any:
    """The generator's key where its slot holds None: made now from the seed last set.

    ``jm.manual_seed`` leaves the key to be made on first use. A program given None
    there would make it while tracing, from the seed of that moment, and keep it as a
    constant for every later call that passes None (every call after a reseed): the
    masks of the first seed again, whatever the seed.
    """
    c, k = plan.slots[-1]
    generator = plan.generator
    if generator is None or c is not generator.__dict__:
        return None
    return state.rng_slot(generator)[0][k]


def read_state(program: Program, plan: Plan) -> list[Any]:
    """The slot values for a call; ``.grad`` slots the program never reads are None, and so
    are the members of groups (read stacked)."""
    if plan.groups and not restack(plan):
        raise RuntimeError(NESTED_SCAN_HELP)
    vals = [c[k] for c, k in plan.slots]
    if vals[-1] is None:
        vals[-1] = seeded_key(plan)
    for i in program.unread(plan):
        vals[i] = None
    for i in plan.members:
        vals[i] = None
    for i, v in enumerate(vals):
        if type(v) is state.PackedGrad:  # a gradient the program reads: slice it out
            vals[i] = state.grad_value(plan.slots[i][0])
        elif type(v) is state.StackedValue:  # a block of a stack another program wrote
            vals[i] = state.slot_value(*plan.slots[i])
    return vals


NESTED_SCAN_HELP = (
    "A compiled step over scanned blocks (jm.nn.scan) was called inside another compiled "
    "function or gradient, which holds the blocks' parameters as traced values: it reads "
    "them stacked, as one input, and cannot stack them here. Call the step at the top "
    "level, or compile the outer function only."
)


FOREIGN_TRACE_HELP = (
    "A compiled function (jm.compile, model.compile()) that changes module or optimizer "
    "state ({count} value(s): parameters, buffers, .grad, optimizer state or the RNG key) "
    "was called inside a JAX transformation jmodule does not manage "
    "(jax.jit, jax.grad, jax.vmap, ... around the call): its new state would be that "
    "transformation's traced values, which must not escape it, so nothing was changed. "
    "Call it outside the transformation, or compile the outer function with jm.compile, "
    "which carries the modules' state through (use jm.func.functional_call for a pure "
    "function of the parameters)."
)


def write_back(
    slots: Sequence[Slot], changed: Changed | None, recorder: Any = None, fills: tuple = ()
) -> None:
    """Put a call's new values into their slots (``recorder``: note those of its trace).

    ``fills`` (:attr:`Plan.fills`): a buffer that was None and now holds a value changed
    its module's structure, which is touched, as ``Module._set_buffer`` touches it when
    Python assigns one (a call whose trace was cached ran no Python to do it), so the
    next call describes it again.
    """
    if changed is None:  # a compact program that changed nothing
        return
    indices, values = changed.indices, changed.values
    if recorder is None:
        # Called inside a JAX transformation jm does not own (jax.jit, jax.grad, vmap
        # around the call): every output is that trace's tracer. Writing them into the
        # modules would leak them (the next call fails with UnexpectedTracerError).
        first = values[0] if values else None
        if isinstance(first, jax.core.Tracer) and not state.local.bound:
            raise RuntimeError(FOREIGN_TRACE_HELP.format(count=len(indices) or "some"))
        for i, v in zip(indices, values):
            c, k = slots[i]
            c[k] = v
    else:  # restored when the gradient is done, written back as primal values
        for i, v in zip(indices, values):
            c, k = slots[i]
            if recorder.owns(v):
                recorder.note_write(c, k)
            c[k] = v
    if changed.packs:
        n = len(indices)
        for j, members in enumerate(changed.packs):
            flat = values[n + j]
            owned = recorder is not None and recorder.owns(flat)
            for m in members:
                c, k = slots[m.slot]
                packed = state.PackedGrad(flat, m.start, m.size, m.shape)
                if owned:  # sliced now: the gradient returns its primal value, an array
                    recorder.note_write(c, k)
                    c[k] = packed.materialize()
                else:
                    c[k] = packed
    for si, members in changed.stacks:
        c, k = slots[si]
        stacked = c[k]
        owned = recorder is not None and recorder.owns(stacked)
        for b, m in enumerate(members):
            mc, mk = slots[m]
            if owned:
                recorder.note_write(mc, mk)
                mc[mk] = stacked[b]
            else:
                mc[mk] = state.StackedValue(stacked, b)
    for (c, k), module in fills:
        if c.get(k) is not None:
            state.touch(module)


def _run_jitted(
    program: Program, plan: Plan, args: tuple, kwargs: dict | None, read: Callable
) -> tuple[Any, Changed]:
    """``jitted(read(program, plan), args[, kwargs])``, traced again once on ``_Reread``."""
    jitted = program.jitted(plan)
    tape = _tape.active_tape()
    local = state.local
    for attempt in range(2):
        vals = read(program, plan)
        outer, local.call = local.call, plan
        try:
            if tape is not None:  # an eager jm.backward: one node of its tape
                return _taped(
                    tape, jitted, (vals, args) if kwargs is None else (vals, args, kwargs)
                )
            return jitted(vals, args) if kwargs is None else jitted(vals, args, kwargs)
        except _Reread:
            if attempt:
                raise
        finally:
            local.call = outer  # this thread keeps no plan (and model) alive
    raise AssertionError("unreachable")


def _taped(tape: Any, jitted: Callable, tree: tuple) -> Any:
    """``jitted(*tree)`` as one operation on an eager ``jm.backward``'s tape.

    Called with the tape's tracers, ``jax.jit`` would parse its arguments in Python
    on every call (its C++ fast path takes arrays only) before the tape saw the
    call; keyed by the program and the argument structure, the tape runs its
    cached forward directly.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)

    def fn(*leaves: Any) -> Any:
        return jitted(*jax.tree_util.tree_unflatten(treedef, leaves))

    try:
        key = (jitted, treedef)
        hash(key)
    except TypeError:  # an unhashable static argument: jax.jit's own path
        return jitted(*tree)
    return tape.call(key, fn, leaves, fn)


def call(program: Program, plan: Plan, args: tuple, kwargs: dict | None) -> Any:
    """Run the program on the slots and write back what it changed (``kwargs`` None: none)."""
    out, changed = _run_jitted(program, plan, args, kwargs, read_state)
    write_back(plan.slots, changed, fills=plan.fills)
    return out


def call_recorded(program: Program, plan: Plan, args: tuple, kwargs: dict | None) -> Any:
    """:func:`call` inside a gradient computation (``jm.backward`` around a compiled call).

    Parameters are read as the recorder sees them (so they are differentiated
    through the program) and writes of values that depend on them are
    recorded, to be restored when the gradient is done.
    """
    recorder = state.local.recorder

    def read(program: Program, plan: Plan) -> list[Any]:
        vals = read_state(program, plan)
        for i, cell in enumerate(plan.cells):
            if cell is not None and i not in plan.members:
                vals[i] = recorder.read(cell, vals[i])
        for g in plan.groups:  # stacked from the members as the recorder sees them
            vals[g.stack] = jax.numpy.stack(
                [recorder.read(plan.cells[m], state.slot_value(*plan.slots[m])) for m in g.members]
            )
        return vals

    out, changed = _run_jitted(program, plan, args, kwargs, read)
    write_back(plan.slots, changed, recorder, plan.fills)
    return out


def _kept_slots(
    program: Program, plan: Plan, idx: tuple[int, ...], vals: Sequence[Any]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(keep, nones)``: the slots a donating call passes undonated, and those it omits as None.

    ``keep`` is every slot that is not donated, not a ``.grad`` the program
    overwrites unread, and not None. ``nones`` are the other None slots:
    inside the program they read None, so a later call where one of them
    holds a value must pass it (a new program, as a None becoming an array
    always is).
    """
    skip = set(idx) | program.unread(plan) | plan.members
    keep = tuple(i for i in range(len(vals)) if i not in skip and vals[i] is not None)
    nones = tuple(i for i in range(len(vals)) if i not in skip and vals[i] is None)
    return keep, nones


def _unique_buffers(idx: tuple[int, ...], vals: list) -> tuple[int, ...]:
    """Drop slots whose array also sits in another slot: donating it would free both."""
    ids = [id(v) for v in vals if v is not None]
    if len(set(ids)) == len(ids):
        return idx
    counts: dict[int, int] = {}
    for v in vals:
        if v is not None:
            counts[id(v)] = counts.get(id(v), 0) + 1
    return tuple(i for i in idx if counts[id(vals[i])] == 1)


_NONE_ID = id(None)
SLOW = object()


def call_fast(program: Program, plan: Plan, fast: FastPath, args: tuple) -> Any:
    """The per-call path of a settled donating program: read, call, write back.

    Falls back (returns ``SLOW``) when a donated slot holds None or an array
    that another slot also holds, when a slot left out as None now holds a
    value, or when a new trace would donate otherwise. When the donated slots
    still hold exactly what the last call wrote there (the usual case), those
    are distinct fresh arrays and the checks are skipped.
    """
    if plan.groups and not restack(plan):
        return SLOW
    for c, k in fast.nones:
        if c[k] is not None:
            return SLOW
    for c, k in fast.grads:
        if type(c[k]) is state.PackedGrad:
            return SLOW  # read_state slices it out
    donated = [c[k] for c, k in fast.donated]
    if fast.held and not plan.warned_held:
        picked = [donated[j] for j in fast.held]  # its slot, donated, picked, the argument
        if max(map(sys.getrefcount, picked)) > _HELD + 1:
            _check_held(plan, [(j, fast.held[j], donated[j]) for j in fast.held], _HELD)
        del picked
    kept = [c[k] for c, k in fast.kept]
    donated_ids = tuple(map(id, donated))
    if donated_ids != plan.fresh:
        ids = set(donated_ids)
        if len(ids) != len(donated) or _NONE_ID in ids or not ids.isdisjoint(map(id, kept)):
            return SLOW
    traces = program.num_traces
    local = state.local
    outer, local.call = local.call, plan
    try:
        changed, out = fast.jitted(donated, kept, args)
    except TypeError:  # raised checking the arguments, before anything ran or was donated
        if state.holds_stacked(kept, donated):
            return SLOW  # read_state slices the blocks a compiled step wrote out
        raise
    except _Redonate:
        plan.fast = None
        return SLOW
    except jax.errors.JaxRuntimeError as e:  # a buffer shared with another slot
        if not _jx.is_donation_error(e):
            raise
        plan.fresh = None
        return SLOW
    finally:
        local.call = outer  # this thread keeps no plan (and model) alive
    if program.num_traces != traces:
        plan.fast = None  # a new trace may have learned of more unread gradients
    write_back(plan.slots, changed, fills=plan.fills)
    plan.fresh = _fresh(changed, len(donated))
    return out


#: References to a donated value inside jmodule as a donating call reads it: its slot, the
#: list of donated values, and ``sys.getrefcount``'s argument. More: the user holds it too.
_HELD = 3

DONATED_HELD_HELP = (
    "This jm.compile'd step donates (reuses the memory of) {what}, and the array is also "
    "held outside the model: a variable (w = model.fc1.weight.data), a model.state_dict() "
    "snapshot, a list of parameter values. The step deletes it: reading that array "
    "afterwards raises JAX's 'Array has been deleted', and load_state_dict of such a "
    "snapshot fails. Copy what you keep (w = model.fc1.weight.data.copy(), "
    "{{k: v.copy() for k, v in model.state_dict().items()}}), or compile with "
    "jm.compile(fn, donate=False)."
)


class DonatedHeldWarning(UserWarning):
    """A donating step deletes a parameter's array that the user also holds.

    Said once per compiled call signature, before the step runs, with the fixes
    (copy what you keep, or ``jm.compile(fn, donate=False)``).
    """


DonatedHeldWarning.__module__ = "jmodule"


def _held_slots(plan: Plan, idx: Sequence[int]) -> dict[int, int]:
    """``{position in idx: slot index}`` of the donated parameters.

    Only theirs are checked (``w = model.fc1.weight.data``, ``state_dict()``): other
    state (buffers, gradients, optimizer state, the random key, stacked blocks) has
    holders inside jmodule that a count cannot tell from the user's.
    """
    skip = set(plan.members) | {g.stack for g in plan.groups}
    return {j: i for j, i in enumerate(idx) if i not in skip and plan.cells[i] is not None}


def _held_names(
    plan: Plan, candidates: list[tuple[int, int, Any]], counts: list[int], held: int, shared: set
) -> list[str]:
    """The slot names of the candidates referenced more than ``held`` times, or shared."""
    return [
        plan.names[i]
        for (_, i, v), n in zip(candidates, counts)
        if n > held or (shared and id(v) in shared)
    ]


def _not_held(v: Any) -> int:
    """How many references to ``v`` are not the user's to read: NumPy arrays or buffer
    exports (``np.asarray`` of it: zero-copy views, which keep its buffer alive whether
    donated or not) and live eager graphs' saved inputs (``tape.Saved``: a backward
    through such a graph after the step raises ``tape.STALE_GRAPH_HELP``, as PyTorch's
    does after an in-place update)."""
    return sum(
        isinstance(r, (np.ndarray, memoryview, _tape.Saved)) or type(r).__name__ == "managedbuffer"
        for r in gc.get_referrers(v)
    )


def _check_held(plan: Plan, candidates: list[tuple[int, int, Any]], held: int | None) -> None:
    """Warn once if a donated parameter's array has more references than jmodule's.

    ``candidates``: ``(position, slot index, value)``; ``held``: the references
    the caller holds to each value (its slot, its list, ``getrefcount``'s argument;
    this function's tuple and loop add two, counted here), or None where that is
    not exactly known (the first calls, which trace). A value referenced more than
    that and than the least referenced candidate is held elsewhere. An array that
    ``_commit`` committed shares its buffer with the uncommitted one the user may
    hold (``plan.committed`` holds that one too). References left in garbage
    cycles (an exception's frames) are collected before anything is said, at most
    a few times per plan.
    """
    counts = [sys.getrefcount(v) - 2 for _, _, v in candidates]
    # Never below the least referenced candidate: some paths hold one more reference
    # to each (JAX's Python dispatch under a changed config), and a warning must not
    # be a false alarm; missing a held array only leaves JAX's own error.
    held = max(held or 0, min(counts, default=0))
    shared = {id(e.committed()) for e in plan.committed if sys.getrefcount(e.uncommitted) > 2}
    names = _held_names(plan, candidates, counts, held, shared)
    if not names:
        return
    if plan.held_collections >= 3:
        return  # checked often enough: what holds them is not the user's
    # Maybe only a garbage cycle, NumPy views of the arrays (np.asarray: they keep the
    # buffer alive, donated or not) or a live graph's saved inputs: collect, and count
    # again without those.
    plan.held_collections += 1
    gc.collect()
    counts = [sys.getrefcount(v) - 2 - _not_held(v) for _, _, v in candidates]
    shared = {
        id(e.committed())
        for e in plan.committed
        if sys.getrefcount(e.uncommitted) - _not_held(e.uncommitted) > 2  # the record, the arg
    }
    names = _held_names(plan, candidates, counts, held, shared)
    if not names:
        return
    plan.warned_held = True
    first = structure.describe_path(names[0])
    what = first if len(names) == 1 else f"{first} (and {len(names) - 1} more)"
    warnings.warn(
        DONATED_HELD_HELP.format(what=what),
        DonatedHeldWarning,
        stacklevel=_tracebacks.user_stacklevel(),
    )


def _clear_frames(exc: BaseException) -> None:
    """Free the frames of a trace that stopped by raising ``exc`` (a retry follows).

    They hold the state values the trace was called with; left to the garbage
    collector, they would count as references held by the user (``_check_held``).
    """
    tb = exc.__traceback__
    while tb is not None:
        try:
            tb.tb_frame.clear()
        except RuntimeError:  # the frame catching it, still running
            pass
        tb = tb.tb_next
    exc.__traceback__ = None


def _fresh(changed: Changed, n: int) -> tuple[int, ...]:
    """Ids of what a donating call wrote to its ``n`` donated slots (their values come first)."""
    return tuple(map(id, changed.values[:n]))


#: Traces ``call_donating`` may start before its donation set is settled. A restart
#: narrows the set to what the trace writes (``_Redonate``) or passes gradients a trace
#: read (``_Reread``); each happens at most once per structure, so two or three traces
#: settle it, and a fourth failure is a bug, reported as such.
SETTLE_ATTEMPTS = 4


def call_donating(program: Program, plan: Plan, args: tuple, kwargs: dict | None) -> Any:
    """Like :func:`call`, donating the old value of every slot the program rewrites.

    The first call for a structure offers every slot for donation; its trace
    reports which slots it really writes, and the program is made again
    donating exactly those (one Python trace more, one XLA compile).
    """
    fast = plan.fast
    if fast is not None:
        out = call_fast(program, plan, fast, args)
        if out is not SLOW:
            return out
    slots = plan.slots
    vals = read_state(program, plan)
    last = plan.last
    if last is not None:
        wanted = last.donated
    else:
        made = program.donations.get(plan.key)
        wanted = made.donated if made is not None else tuple(range(len(vals)))
    tail = (args,) if kwargs is None else (args, kwargs)
    for _ in range(SETTLE_ATTEMPTS):
        idx = _unique_buffers(tuple(i for i in wanted if vals[i] is not None), vals)
        keep, nones = _kept_slots(program, plan, idx, vals)
        if last is not None and idx == last.donated and keep == last.kept:
            made = last
        else:
            made = program.donating(plan, idx, keep)
        plan.last = last = made
        donated = [vals[i] for i in idx]
        if not plan.warned_held:
            held = _held_slots(plan, idx)
            _check_held(plan, [(j, held[j], donated[j]) for j in held], None)
        local = state.local
        outer, local.call = local.call, plan
        try:
            changed, out = made.jitted(donated, [vals[i] for i in keep], *tail)
        except _Redonate as redo:
            wanted = redo.changed
            _clear_frames(redo)
            if program.donations.get(plan.key) is made:  # traced, never compiled
                del program.donations[plan.key]
            continue
        except _Reread as reread:  # pass the gradients it reads, and trace again
            _clear_frames(reread)
            vals = read_state(program, plan)
            last = plan.last = None
            continue
        finally:
            local.call = outer  # this thread keeps no plan (and model) alive
        write_back(slots, changed, fills=plan.fills)
        plan.fresh = _fresh(changed, len(idx))
        if kwargs is None:
            plan.fast = FastPath(
                made.jitted,
                tuple(slots[i] for i in idx),
                tuple(slots[i] for i in keep),
                tuple(slots[i] for i in nones),
                tuple(slots[i] for i in (*idx, *keep) if slots[i][1] == "grad"),
                _held_slots(plan, idx),
            )
        return out
    raise RuntimeError("jm.compile: could not settle which state buffers to donate")


def lower(program: Program, plan: Plan, donate: bool, args: tuple, kwargs: dict | None) -> Any:
    """The ``jax.stages.Lowered`` program a call with this plan runs."""
    vals = read_state(program, plan)
    local = state.local
    outer, local.call = local.call, plan
    try:
        made = program.donations.get(plan.key) if donate else None
        if made is None:
            return program.jitted(plan).lower(vals, args, kwargs)
        idx = _unique_buffers(tuple(i for i in made.donated if vals[i] is not None), vals)
        keep, _ = _kept_slots(program, plan, idx, vals)
        fn = program.donating(plan, idx, keep).jitted
        tail = (args,) if kwargs is None else (args, kwargs)
        return fn.lower([vals[i] for i in idx], [vals[i] for i in keep], *tail)
    finally:
        local.call = outer  # this thread keeps no plan (and model) alive
