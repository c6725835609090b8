"""Compiled calls: one ``jax.jit`` program per structure, a fast path per call.

A :class:`Program` lowers ``fn(objects, args, kwargs)`` into

    pure(state_values, args, kwargs) -> (output, {slot_index: new_value})

by binding the state values into the objects' slots (``binding.bound``),
and keeps one ``jax.jit`` of it per structure key. The per-call path reads the
slots, calls the jitted function and writes back what changed; it walks the
module tree only when the global structure epoch has moved since last time.

:class:`CompiledForward` is ``model.compile()``; :class:`CompiledFunction` is
``jm.compile(fn)`` over functions whose arguments include stateful objects.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend.core import jaxpr_as_fun

from jmodule import random as _random
from jmodule._lowering import binding, structure
from jmodule._lowering.binding import LOCK, Slot

logger = logging.getLogger("jmodule.compile")

# The concrete array class (a type check on it is the fastest "is a plain array"
# test); imported rather than made from an array, so import starts no backend.
from jax._src.array import ArrayImpl as _ArrayImpl  # noqa: E402

_RNG_NAME = "<rng key>"


class Static:
    """A non-array argument, passed to ``jax.jit`` as part of the tree structure."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Static
            and type(self.value) is type(other.value)
            and bool(self.value == other.value)
        )

    def __hash__(self) -> int:
        return hash((type(self.value), self.value))

    def __repr__(self) -> str:
        return f"Static({self.value!r})"


jax.tree_util.register_pytree_node(Static, lambda s: ((), s.value), lambda v, _: Static(v))


def _is_param(x: Any) -> bool:
    from jmodule.nn.parameter import _ArrayLike

    return isinstance(x, _ArrayLike)


def wrap_leaf(x: Any) -> Any:
    """Arrays stay dynamic; Parameters become their arrays; the rest is static."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return x
    if _is_param(x):
        return x.__dict__["_value"]
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"Compiled calls take arrays (traced) and hashable Python values (compile-time "
            f"constants); got an unhashable {type(x).__name__}. Pass it as an array, a tuple, "
            "or a dict/list of arrays."
        ) from None
    return Static(x)


def unwrap_static(tree: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda x: x.value if type(x) is Static else x,
        tree,
        is_leaf=lambda x: type(x) is Static,
    )


def _describe_args(args: Any, kwargs: Any, arg_names: Sequence[str] | None) -> dict[str, tuple]:
    """Name -> (shape, dtype) or ("value", v) for every argument leaf."""
    out = {}
    flat, _ = jax.tree_util.tree_flatten_with_path(
        (args, kwargs), is_leaf=lambda x: type(x) is Static
    )
    for path, leaf in flat:
        top, *rest = path
        if top.idx == 0 and rest:  # positional: use forward's parameter names
            idx = rest[0].idx
            base = arg_names[idx] if arg_names and idx < len(arg_names) else f"args[{idx}]"
            name = base + jax.tree_util.keystr(tuple(rest[1:]))
        else:
            name = jax.tree_util.keystr(tuple(rest)).strip("[]'")
        if type(leaf) is Static:
            out[name] = ("value", leaf.value)
        else:
            out[name] = (tuple(leaf.shape), str(leaf.dtype))
    return out


def _fmt(sig: tuple) -> str:
    if sig[0] == "none":
        return "None"
    if sig[0] == "value":
        return repr(sig[1])
    return f"{sig[0]} {sig[1]}"


def _diff(kind: str, old: dict[str, tuple], new: dict[str, tuple]) -> str | None:
    """Say how two signatures differ: the first changed, added or removed entry."""
    for name, sig in new.items():
        if name not in old:
            return f"{kind} '{name}' added"
        before = old[name]
        if before == sig:
            continue
        if before[0] in ("value", "none") or sig[0] in ("value", "none"):
            return f"{kind} {name} changed: {_fmt(before)} -> {_fmt(sig)}"
        if before[0] != sig[0]:
            return f"{kind} shape changed: {name} {before[0]} -> {sig[0]}"
        return f"{kind} dtype changed: {name} {before[1]} -> {sig[1]}"
    for name in old:
        if name not in new:
            return f"{kind} '{name}' removed"
    return None


class Changed:
    """The slot values a trace changed: indices are static, values are outputs."""

    __slots__ = ("indices", "values")

    def __init__(self, indices: tuple[int, ...], values: tuple[Any, ...]):
        self.indices = indices
        self.values = values


jax.tree_util.register_pytree_node(
    Changed, lambda c: (c.values, c.indices), lambda idx, vals: Changed(idx, tuple(vals))
)


class _Redonate(Exception):
    """A donating trace found that it would donate slots it does not write back."""

    def __init__(self, changed: tuple[int, ...]):
        super().__init__(changed)
        self.changed = changed


class Program:
    """One Python function lowered to cached ``jax.jit`` programs."""

    def __init__(
        self,
        fn: Callable[[Sequence[Any], tuple, dict], Any],
        name: str,
        jit_options: dict,
        arg_names: Sequence[str] | None = None,
    ):
        self.fn = fn
        self.name = name
        self.jit_options = jit_options
        self.arg_names = arg_names
        self.entries: dict[Any, Any] = {}
        self.donating_entries: dict[Any, tuple[tuple, Callable]] = {}
        #: Per structure key, the ``.grad`` slots the function overwrites unread.
        self.grad_unread: dict[Any, frozenset[int]] = {}
        #: ``(key, donated indices, jitted, kept indices)`` of the last donating call.
        self.last_donating: tuple | None = None
        #: ``(key, jitted, donated slots, kept slots, slots that must still be None)``:
        #: the per-call path of the last settled donating call (see ``_call_fast``).
        self.fast: tuple | None = None
        self._replay: dict[Any, tuple[Any, Any]] = {}
        self.num_traces = 0
        self.reasons: list[str] = []
        # Set before each call: what the pure function binds when it traces.
        self.objects: Sequence[Any] = ()
        self.slots: Sequence[Slot] = ()
        self.names: Sequence[str] = ()
        self.named_modules: Sequence[tuple[str, Any]] = ()
        self._infos: dict | None = None
        self._pending_reason = "first call"
        self._last_sig: dict[Any, tuple[dict, dict]] = {}
        #: Called as ``hook(key, vals, args, kwargs, reason)`` each time the program is
        #: traced (inside the trace; never on the per-call path). Used by ``jm.jit``.
        self.on_trace: list[Callable[[Any, Sequence[Any], Any, Any, str], None]] = []

    def jitted(self, key: Any, infos: dict) -> Callable:
        """The ``jax.jit`` function for structure ``key`` (made on first use)."""
        fn = self.entries.get(key)
        if fn is None:
            self._note_structure(infos)
            fn = self.entries[key] = jax.jit(functools.partial(self._pure, key), **self.jit_options)
        self._infos = infos
        return fn

    def _note_structure(self, infos: dict) -> None:
        if self._infos is not None:
            self._pending_reason = structure.structural_change(self._infos, infos)

    def donating(
        self, key: Any, infos: dict, idx: tuple[int, ...], keep: tuple[int, ...]
    ) -> Callable:
        """A ``jax.jit`` for ``key`` that donates the state slots at ``idx`` and reads ``keep``.

        A traced program that would donate a slot it does not write back
        raises :class:`_Redonate` before anything runs, so the caller can
        retry with the slots it does write back.
        """
        made = self.donating_entries.get(key)
        if made is not None and made[0] == idx and made[1] == keep:
            self._infos = infos
            return made[2]
        if made is None:
            self._note_structure(infos)
        fn = jax.jit(
            functools.partial(self._pure_donating, key, idx, keep),
            donate_argnums=(0,),
            **self.jit_options,
        )
        self.donating_entries[key] = (idx, keep, fn)
        self._infos = infos
        return fn

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
        vals: list[Any] = [None] * len(self.slots)
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
        return Changed(indices, tuple(changed.values[order[i]] for i in indices)), out

    def _note_trace(self, key: Any, vals: Sequence[Any], args: Any, kwargs: Any) -> None:
        state_sig = {
            n: ("none", None) if v is None else (tuple(v.shape), str(v.dtype))
            for n, v in zip(self.names, vals)
        }
        arg_sig = _describe_args(args, kwargs, self.arg_names)
        previous = self._last_sig.get(key)
        if previous is None:
            reason = self._pending_reason
        else:
            reason = (
                _diff("input", previous[1], arg_sig)
                or _diff("state", previous[0], state_sig)
                or "input or state sharding, device or weak type changed"
            )
        self._last_sig[key] = (state_sig, arg_sig)
        self.num_traces += 1
        self.reasons.append(reason)
        logger.info("compiling %s (trace %d): %s", self.name, self.num_traces, reason)
        for hook in self.on_trace:
            hook(key, vals, args, kwargs, reason)

    def _pure(
        self, key: Any, vals: list, args: tuple, kwargs: dict | None = None
    ) -> tuple[Any, Changed]:
        kwargs = {} if kwargs is None else kwargs
        self._note_trace(key, vals, args, kwargs)
        args, kwargs = unwrap_static((args, kwargs))
        slots = self.slots
        watch = binding.GradWatch({id(c): i for i, (c, k) in enumerate(slots) if k == "grad"})
        outer, binding.GRAD_WATCH[0] = binding.GRAD_WATCH[0], watch
        try:
            with binding.bound(slots, vals, self.named_modules):
                out = self.fn(self.objects, args, kwargs)
                idx = tuple(i for i, (c, k) in enumerate(slots) if c[k] is not vals[i])
                changed = Changed(idx, tuple(slots[i][0][slots[i][1]] for i in idx))
        finally:
            binding.GRAD_WATCH[0] = outer
        # Gradient slots the function never read before overwriting: their
        # incoming value is irrelevant, so calls pass None there and the first
        # call (grads None) and later ones (grads set) share one program.
        unread = {i for c_id, i in watch.watched.items() if c_id not in watch.reads}
        previous = self.grad_unread.get(key)
        self.grad_unread[key] = frozenset(unread if previous is None else unread & previous)
        return out, changed

    def set_state(
        self,
        objects: Sequence[Any],
        descs: Sequence[structure.Description],
        with_grads: bool = False,
    ) -> None:
        """Point the program at ``objects``: their slots (each once), plus the RNG key."""
        slots: list[Slot] = []
        names: list[str] = []
        named_modules: list[tuple[str, Any]] = []
        seen: set[tuple[int, str]] = set()
        for i, d in enumerate(descs):
            prefix = "" if len(descs) == 1 else f"[{i}]."
            pairs = list(zip(d.slots, d.names))
            if with_grads:
                pairs += list(zip(d.grad_slots, d.grad_names))
            for slot, name in pairs:
                if (id(slot[0]), slot[1]) not in seen:
                    seen.add((id(slot[0]), slot[1]))
                    slots.append(slot)
                    names.append(prefix + name)
            named_modules += [
                (prefix + p if p else prefix.rstrip("."), m) for p, m in d.named_modules
            ]
        _random.default_generator.materialize()
        slots.append((_random.default_generator.__dict__, "_key"))
        names.append(_RNG_NAME)
        self.objects = objects
        self.fast = None
        self.slots = tuple(slots)
        self.names = tuple(names)
        self.named_modules = tuple(named_modules)


def _check_not_meta(slots: Sequence[Slot], names: Sequence[str]) -> None:
    for (c, k), name in zip(slots, names):
        if isinstance(c.get(k), jax.ShapeDtypeStruct):
            raise RuntimeError(
                f"'{name}' is on the meta device (shape and dtype only, no data), so the module "
                "cannot run. Allocate it with module.to_empty(device=...) and initialise it "
                "(reset_parameters() or load_state_dict) first."
            )


def _read_state(program: Program, key: Any) -> list[Any]:
    """The slot values for a call; ``.grad`` slots the program never reads are None."""
    vals = [c[k] for c, k in program.slots]
    for i in program.grad_unread.get(key, ()):
        vals[i] = None
    return vals


def _call(program: Program, jitted: Callable, args: tuple, kwargs: dict | None) -> Any:
    """Run ``jitted`` on the slots and write back what it changed (``kwargs`` None: none given)."""
    slots = program.slots
    vals = [c[k] for c, k in slots]
    out, changed = jitted(vals, args) if kwargs is None else jitted(vals, args, kwargs)
    for i, v in zip(changed.indices, changed.values):
        c, k = slots[i]
        c[k] = v
    return out


def _call_donating(program: Program, key: Any, infos: dict, args: tuple, kwargs: dict) -> Any:
    """Like :func:`_call`, donating the old value of every slot the program rewrites.

    The first call for a structure offers every slot for donation; its trace
    reports which slots it really writes, and the program is made again
    donating exactly those (one Python trace more, one XLA compile).
    """
    fast = program.fast
    if fast is not None and fast[0] is key:
        out = _call_fast(program, fast, args)
        if out is not _SLOW:
            return out
    slots = program.slots
    vals = _read_state(program, key)
    last = program.last_donating
    if last is not None and last[0] is key:  # no hashing of the key
        wanted = last[1]
    else:
        made = program.donating_entries.get(key)
        wanted, last = (made[0] if made is not None else tuple(range(len(vals)))), None
    tail = (args,) if kwargs is None else (args, kwargs)
    for _ in range(3):
        idx = _unique_buffers(tuple(i for i in wanted if vals[i] is not None), vals)
        keep, nones = _kept_slots(program, key, idx, vals)
        if last is not None and idx == last[1] and keep == last[3]:
            jitted = last[2]
        else:
            jitted = program.donating(key, infos, idx, keep)
        program.last_donating = (key, idx, jitted, keep)
        try:
            changed, out = jitted([vals[i] for i in idx], [vals[i] for i in keep], *tail)
        except _Redonate as redo:
            wanted = redo.changed
            continue
        for i, v in zip(changed.indices, changed.values):
            c, k = slots[i]
            c[k] = v
        if kwargs is None:
            program.fast = (
                key,
                jitted,
                [slots[i] for i in idx],
                [slots[i] for i in keep],
                [slots[i] for i in nones],
            )
        return out
    raise RuntimeError("jm.compile: could not settle which state buffers to donate")


def _kept_slots(
    program: Program, key: Any, idx: tuple[int, ...], vals: Sequence[Any]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(keep, nones)``: the slots a donating call passes undonated, and those it omits as None.

    ``keep`` is every slot that is not donated, not a ``.grad`` the program
    overwrites unread, and not None. ``nones`` are the other None slots:
    inside the program they read None, so a later call where one of them
    holds a value must pass it (a new program, as a None becoming an array
    always is).
    """
    skip = set(idx) | program.grad_unread.get(key, frozenset())
    keep = tuple(i for i in range(len(vals)) if i not in skip and vals[i] is not None)
    nones = tuple(i for i in range(len(vals)) if i not in skip and vals[i] is None)
    return keep, nones


_NONE_ID = id(None)
_SLOW = object()


def _call_fast(program: Program, fast: tuple, args: tuple) -> Any:
    """The per-call path of a settled donating program: read, call, write back.

    Falls back (returns ``_SLOW``) when a donated slot holds None or an array
    that another slot also holds, when a slot left out as None now holds a
    value, or when a new trace would donate otherwise.
    """
    _, jitted, donated_slots, kept_slots, none_slots = fast
    for c, k in none_slots:
        if c[k] is not None:
            return _SLOW
    donated = [c[k] for c, k in donated_slots]
    kept = [c[k] for c, k in kept_slots]
    ids = set(map(id, donated))
    if len(ids) != len(donated) or _NONE_ID in ids or not ids.isdisjoint(map(id, kept)):
        return _SLOW
    traces = program.num_traces
    try:
        changed, out = jitted(donated, kept, args)
    except _Redonate:
        program.fast = None
        return _SLOW
    if program.num_traces != traces:
        program.fast = None  # a new trace may have learned of more unread gradients
    slots = program.slots
    for i, v in zip(changed.indices, changed.values):
        c, k = slots[i]
        c[k] = v
    return out


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


def _forward_arg_names(module: Any) -> list[str] | None:
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


class CompiledForward:
    """``model.compile()``: the module's calls as one cached XLA program."""

    def __init__(self, module: Any, jit_options: dict, options: dict):
        self.module = module
        self.options = options
        self.program = Program(
            lambda objs, args, kwargs: objs[0]._call_impl(*args, **kwargs),
            name=f"forward of {type(module).__name__}",
            jit_options=jit_options,
            arg_names=_forward_arg_names(module),
        )
        self._epoch = -1
        self._jitted: Callable | None = None

    def _refresh(self) -> None:
        from jmodule.nn.modules import _hooks

        desc = structure.describe(self.module)
        key = (desc.key, _hooks.global_hook_key())
        self.program.set_state((self.module,), (desc,))
        _check_not_meta(self.program.slots, self.program.names)
        self._jitted = self.program.jitted(key, desc.infos)
        self._epoch = binding.EPOCH.value

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        with LOCK:
            if self._epoch != binding.EPOCH.value:
                self._refresh()
            if kwargs or not all(type(a) is _ArrayImpl for a in args):
                args, kwargs = jax.tree_util.tree_map(wrap_leaf, (args, kwargs), is_leaf=_is_param)
                return _call(self.program, self._jitted, args, kwargs)
            return _call(self.program, self._jitted, args, None)  # arrays only: no kwargs node


def _is_stateful(x: Any) -> bool:
    return hasattr(type(x), "_jm_describe")


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


class CompiledFunction:
    """``jm.compile(fn)``: ``fn`` and every state change it makes, as one XLA program."""

    def __init__(self, fn: Callable, jit_options: dict, donate: bool = True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.donate = donate
        self._last: tuple | None = None
        #: Where each stateful object stood in this call's arguments (None: as _ObjectRef).
        self._positions: tuple[int, ...] | None = None
        self._epoch = -1
        self.program = Program(
            self._run, name=getattr(fn, "__qualname__", repr(fn)), jit_options=jit_options
        )

    def _run(self, objects: Sequence[Any], args: tuple, kwargs: dict) -> Any:
        positions = self._positions
        if positions is not None:  # the per-call form: only the arrays were passed
            arrays = iter(args)
            return self.fn(*(next(arrays) if i < 0 else objects[i] for i in positions))
        args, kwargs = jax.tree_util.tree_map(
            lambda x: objects[x.index] if type(x) is _ObjectRef else x,
            (args, kwargs),
            is_leaf=lambda x: type(x) is _ObjectRef,
        )
        return self.fn(*args, **kwargs)

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[Any, dict, tuple]:
        """Point the program at this call's objects; return (key, infos, jit arguments).

        The per-call path: when every argument is a stateful object or a
        plain array and the objects' descriptions are the very ones of the
        last call (nothing structural changed), the key, infos and slots of
        the last call are reused without hashing or walking anything.
        """
        last = self._last
        if not kwargs and last is not None and last[4] is not None and len(args) == len(last[4]):
            # The same objects at the same places as the last call (arrays elsewhere):
            # modules cannot have changed within a structure epoch, so only the
            # other stateful objects (optimizers) are asked again.
            arrays: list[Any] = []
            for a, p in zip(args, last[4]):
                if p is None:
                    if type(a) is not _ArrayImpl:
                        break
                    arrays.append(a)
                elif a is not p:
                    break
            else:
                for o, d in last[5]:
                    if o._jm_describe() is not d:
                        break
                else:
                    self._positions = last[3]
                    return last[1], last[2], (tuple(arrays), None)
        objects: list[Any] = []
        if not kwargs:
            # Only the arrays go to jax (no Python pytree node to flatten on
            # every call); where each object stood is part of the key.
            flat: list[Any] = []
            where: list[int] = []
            for a in args:
                if type(a) is _ArrayImpl:
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
                positions = tuple(where)
                self._positions = positions
                descs = [o._jm_describe() for o in objects]
                last = self._last
                if (
                    last is not None
                    and last[3] == positions
                    and len(descs) == len(last[0])
                    and all(a is b for a, b in zip(descs, last[0]))
                    and all(a is b for a, b in zip(objects, self.program.objects))
                ):
                    return last[1], last[2], (tuple(flat), None)
                return self._describe(objects, descs, (tuple(flat), None), positions)
            objects = []
        self._positions = None
        index: dict[int, int] = {}

        def leaf(x: Any) -> Any:
            if _is_stateful(x):
                if id(x) not in index:
                    index[id(x)] = len(objects)
                    objects.append(x)
                return _ObjectRef(index[id(x)])
            return wrap_leaf(x)

        tree = jax.tree_util.tree_map(
            leaf, (args, kwargs), is_leaf=lambda x: _is_stateful(x) or _is_param(x)
        )
        return self._describe(objects, [o._jm_describe() for o in objects], tree, None)

    def _describe(
        self, objects: list[Any], descs: list[Any], tree: tuple, positions: tuple | None
    ) -> tuple:
        from jmodule.nn.modules import _hooks

        key = (tuple(d.key for d in descs), _hooks.global_hook_key(), positions)
        self.program.set_state(tuple(objects), descs, with_grads=True)
        _check_not_meta(self.program.slots, self.program.names)
        infos = _merge_infos(descs)
        pattern = None
        if positions is not None:  # what the next call must look like to skip all this
            pattern = tuple(None if i < 0 else objects[i] for i in positions)
        recheck = tuple(
            (o, d) for o, d in zip(objects, descs) if not getattr(o, "_jm_epoch_stable", False)
        )
        self._last = (tuple(descs), key, infos, positions, pattern, recheck)
        return key, infos, tree

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with LOCK:
            if self._epoch != binding.EPOCH.value:
                self._last = None  # global hooks or structure changed somewhere
                self._epoch = binding.EPOCH.value
            key, infos, tree = self._prepare(args, kwargs)
            if self.donate:
                return _call_donating(self.program, key, infos, *tree)
            jitted = self.program.jitted(key, infos)
            slots = self.program.slots
            out, changed = jitted(_read_state(self.program, key), *tree)
            for i, v in zip(changed.indices, changed.values):
                c, k = slots[i]
                c[k] = v
            return out

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The ``jax.stages.Lowered`` program a call with these arguments runs.

        Call the function once first so donation is settled; then
        ``.compile().memory_analysis()`` / ``.cost_analysis()`` / ``.as_text()``
        describe exactly what runs.
        """
        with LOCK:
            key, infos, (a, k) = self._prepare(args, kwargs)
            vals = _read_state(self.program, key)
            made = self.program.donating_entries.get(key) if self.donate else None
            if made is None:
                return self.program.jitted(key, infos).lower(vals, a, k)
            idx = _unique_buffers(tuple(i for i in made[0] if vals[i] is not None), vals)
            keep, _ = _kept_slots(self.program, key, idx, vals)
            fn = self.program.donating(key, infos, idx, keep)
            tail = (a,) if k is None else (a, k)
            return fn.lower([vals[i] for i in idx], [vals[i] for i in keep], *tail)

    @property
    def num_traces(self) -> int:
        """How many times ``fn`` has been traced (compiled)."""
        return self.program.num_traces


def _merge_infos(descs: Sequence[structure.Description]) -> dict:
    if len(descs) == 1:
        return descs[0].infos
    return {f"[{i}].{p}": info for i, d in enumerate(descs) for p, info in d.infos.items()}


def compile(fn: Callable | None = None, *, donate: bool = True, **jit_options: Any) -> Any:
    """Compile ``fn`` whole, with the state of the modules it is given.

    Arguments that are modules (or other jmodule stateful objects, such as
    optimizers) have their parameters, buffers and the default RNG key
    carried into one ``jax.jit`` program and back out: every in-place change
    the function makes to them is visible afterwards, as if it had run
    eagerly. Array arguments are traced; other Python values are static (a
    new value recompiles). Use as ``jm.compile(fn)`` or ``@jm.compile``.

    Args:
        fn: the function to compile.
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
        return functools.partial(compile, donate=donate, **jit_options)
    return CompiledFunction(fn, jit_options, donate)


@dataclass(frozen=True)
class CompileStats:
    """How often a compiled module or function was traced, and why."""

    num_traces: int
    reasons: tuple[str, ...]


def compile_stats(obj: Any) -> CompileStats:
    """Trace count and recompilation reasons of a compiled module or ``jm.compile`` function.

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
    return CompileStats(program.num_traces, tuple(program.reasons))
