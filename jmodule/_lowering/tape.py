"""Eager gradients: a tape of cached compiled programs (``jm.backward`` outside any trace).

PyTorch eager records each operation and its backward on a tape as it runs;
``jm.backward`` run eagerly does the same with a JAX trace of its own,
:class:`TapeTrace`. While the closure runs, every value computed from a
parameter being differentiated is a :class:`TapeTracer`: its concrete array
(``.val``, so printing it, ``float()`` and Python control flow on it work, as
eagerly) and the tape node that made it. Each primitive JAX binds on such a
value (a ``jnp`` function, or one call of a ``jax.jit``-compiled function, as
every library layer of ``jm.nn.functional`` is) becomes one node:

* its forward runs as one cached compiled program returning the outputs and
  the residuals of ``jax.vjp`` (keyed by the primitive, its parameters, the
  input types and which inputs are differentiated);
* its backward is one cached compiled program of the pullback, called with
  the residuals when ``backward`` walks the tape in reverse.

So an eager step is two dispatches per layer, with programs compiled on the
first step of a shape and reused after, where ``jax.vjp`` run eagerly
interprets every primitive of forward and backward in Python. Values that do
not depend on a differentiated parameter are never wrapped: they are computed
by the enclosing trace as usual. ``jax.custom_vjp``/``custom_jvp`` functions
called directly (backward hooks, activation checkpointing) are differentiated
by ``jax.vjp`` of that one call, their own rules honoured; nothing is cached
for them, as their Python may differ from call to call.

This file is the only one that subclasses JAX's ``Trace``/``Tracer``
(``jax.core``): no public JAX API lets a library add an autodiff mode, so
what the subclasses need of JAX's private protocol comes from
``jmodule/_jax_internals.py``. A :class:`TapeTracer` keeps its trace in
``_trace``, the slot JAX's ``Tracer`` declares and JAX reads; this file
reads it only on its own tracers. ``TapeTrace.parent_trace`` is this
file's own attribute (named as JAX's traces name theirs). The compiled
programs are plain ``jax.jit`` programs (XLA caches them; a persistent
compilation cache keeps them across processes).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun as _jaxpr_as_fun
from jax.extend.core import set_current_trace as _set_current_trace

from jmodule import _jax_internals as _jx
from jmodule._jax_internals import ArrayImpl as _ArrayImpl
from jmodule._jax_internals import EvalTrace as _EvalTrace
from jmodule._jax_internals import bind_with_trace as _bind_with_trace
from jmodule._jax_internals import current_trace as _current_trace
from jmodule._lowering import jaxprs as _jaxprs
from jmodule._lowering import quick as _quick

__all__ = ["TapeTrace", "TapeTracer", "active_tape", "concrete", "eager", "untaped", "usable"]

_float0 = jax.dtypes.float0


# ----------------------------------------------------------------------------- values


class _Node:
    """One tape entry: the program that made some values, what it kept, where its inputs came
    from, and the cotangents its outputs have received so far (during ``backward``).

    A leaf (``op`` None) is a parameter being differentiated: ``sinks`` are the
    recorder's tap indices its cotangent goes to (several for a stacked
    value: block ``b``'s slice to ``sinks[b]``), and ``kept`` that recorder.
    ``seq`` orders the nodes of a tape as they were made (every input of a
    node was made before it).
    """

    __slots__ = ("cts", "inputs", "kept", "n_out", "op", "seq", "sinks")

    def __init__(self, op: Any, kept: Any, inputs: list, n_out: int, seq: int, sinks: tuple = ()):
        self.op = op
        self.kept = kept
        self.inputs = inputs
        self.n_out = n_out
        self.seq = seq
        self.sinks = sinks
        self.cts: list | None = None


#: What a node's ``op`` becomes once a backward pass freed what it kept.
_FREED = object()


class Saved(list):
    """The inputs a node keeps for its backward (a weight, a loss's labels), by reference.

    Its own type, so that a donating step's check for arrays held elsewhere
    (``program._check_held``) can tell a graph's references from the user's: a
    step that donates a parameter a live graph saved makes that graph unusable, as
    an in-place update does in PyTorch, and the backward through it then says so
    (:data:`STALE_GRAPH_HELP`).
    """

    __slots__ = ()


STALE_GRAPH_HELP = (
    "One of the arrays needed for gradient computation was deleted after the forward that "
    "saved it: a donating jm.compile'd step reused its memory to update a parameter, as "
    "PyTorch raises 'one of the variables needed for gradient "
    "computation has been modified by an inplace operation'. Call backward before the "
    "step, or run the forward again after it."
)

SECOND_BACKWARD_HELP = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward(). Specify retain_graph=True if you need to backward through "
    "the graph a second time, or .detach() the values carried from one step to the next "
    "(an RNN's hidden state)."
)


class TapeTracer(jax.core.Tracer):
    """A value computed from differentiated parameters during an eager ``jm.backward``.

    It is its array (``.val``) for everything that reads values: ``print``,
    ``float``, ``bool`` and Python control flow see the concrete result, as in
    PyTorch eager. Once its ``jm.backward`` is over it lowers to that array
    wherever JAX computes with it (a value kept from the closure is usable).
    """

    __slots__ = ("index", "node", "val")

    def __init__(self, trace: TapeTrace, val: Any, node: _Node, index: int):
        self._trace = trace
        self.aval = val.aval if type(val) is _ArrayImpl else jax.typeof(val)
        self.val = val
        self.node = node
        self.index = index

    def to_concrete_value(self) -> Any:
        return _jx.to_concrete_value(self.val)

    def full_lower(self) -> Any:
        return self.val if self._trace.done else self

    def live(self) -> bool:
        """Whether this is a value of a graph (``Tensor.backward``'s tape) and can still be
        differentiated: computing with it outside its tape's trace enters that trace."""
        trace = self._trace
        return trace.graph and _current_trace() is not trace

    def get_referent(self) -> Any:
        return _jx.get_referent(self.val)

    if _jx.HAS_QDD:  # JAX 0.10's protocol (0.12 has no quasi-dynamic data)

        def cur_qdd(self) -> Any:
            return _jx.cur_qdd(self.val)

    def __repr__(self) -> str:
        return repr(self.val)

    # Python numbers from the value, as torch's ``float(loss)`` and ``loss.item()``.
    def __float__(self) -> float:
        return float(self.val)

    def __int__(self) -> int:
        return int(self.val)

    def __complex__(self) -> complex:
        return complex(self.val)

    def __index__(self) -> int:
        return self.val.__index__()

    def item(self, *args: Any) -> Any:
        return self.val.item(*args)

    def tolist(self) -> Any:
        return self.val.tolist()

    __str__ = __repr__

    # jax.Array's placement, answered from the value (a plain Tracer has none).
    @property
    def sharding(self) -> Any:
        return self.val.sharding

    @property
    def device(self) -> Any:
        return self.val.device

    def devices(self) -> Any:
        return self.val.devices()

    @property
    def committed(self) -> bool:
        return self.val.committed

    def block_until_ready(self) -> TapeTracer:
        self.val.block_until_ready()
        return self

    def is_deleted(self) -> bool:
        return self.val.is_deleted()


def concrete(x: Any) -> Any:
    """``x``'s array if it is a :class:`TapeTracer` (of any tape), else ``x``."""
    while type(x) is TapeTracer:
        x = x.val
    return x


def usable(tree: Any) -> Any:
    """``tree`` with every :class:`TapeTracer` leaf replaced by its array."""
    return jax.tree_util.tree_map(concrete, tree, is_leaf=lambda x: type(x) is TapeTracer)


def active_tape() -> TapeTrace | None:
    """The tape this thread is recording into now, or None."""
    trace = _current_trace()
    return trace if type(trace) is TapeTrace else None


def untaped(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` computed beneath the active tape, if any (for values no gradient
    flows through: a ``jax.jit`` call then takes JAX's fast path, which a tape's trace
    would turn off)."""
    trace = _current_trace()
    if type(trace) is TapeTrace:
        with _set_current_trace(trace.parent_trace):
            return fn(*args)
    return fn(*args)


def eager() -> bool:
    """Whether this thread runs eagerly now (no JAX trace active, or only a tape's)."""
    trace = _current_trace()
    return type(trace) is _EvalTrace or type(trace) is TapeTrace


# ----------------------------------------------------------------------------- programs

#: Compiled forward/backward pairs by ``(primitive, parameters, input types, mask)``.
#: Like JAX's own caches of compiled programs (bounded, least recently used out);
#: nothing in it coordinates callers: two threads building one entry both work.
_OPS: OrderedDict[Any, _Compiled] = OrderedDict()
_MAX_OPS = 4096


class _Compiled:
    """The forward and backward programs of one operation (see :func:`_compiled`).

    ``fn`` takes every argument positionally: ``kinds[i]`` says whether
    argument ``i`` is None (fixed, not passed), a value not differentiated,
    or a differentiated one. The forward program returns the flat outputs
    and the residuals the pullback needs, except residuals that are inputs
    (the node keeps those; they are not copied out) and residuals that cheap
    operations make from inputs not differentiated, or from nothing, or that
    rearrange inputs no larger than themselves (``_REDO``, found by
    ``jaxprs.recomputable``): the backward program computes those again, where XLA
    fuses them into their consumers. The constants are the zeros of
    ``select(x > 0, g, 0)`` in ReLU's and max-pooling's derivatives, which the
    forward would write and the node hold as arrays of zeros as large as the
    activations; those made from inputs, a loss's gather indices, ignore-index mask
    and count, made from its labels, and the transposed weight that the derivative
    of ``x @ w.T`` needs, which the forward would copy out of every weight (the node
    keeps the weight itself, as PyTorch saves it).
    """

    __slots__ = (
        "bwd",
        "from_inputs",
        "fwd",
        "inexact",
        "out_avals",
        "out_tree",
        "redo",
        "small",
        "tree",
        "where",
    )

    def __init__(self, fn: Callable, kinds: tuple[int, ...]):
        self.tree: Any = None
        self.out_tree: Any = None
        #: Per residual: the input it is (an index into the passed values), ``_KEPT``
        #: (an output of the forward program) or ``_REDO`` (made by the backward).
        self.where: tuple[int, ...] = ()
        #: The passed values the node keeps: the residuals that are inputs, in order, then
        #: the inputs of ``redo``.
        self.from_inputs: tuple[int, ...] = ()
        #: ``(number of residual inputs in from_inputs, fn)``: ``fn(*the other inputs)``
        #: computes the ``_REDO`` residuals, in order; None when there are none.
        self.redo: tuple[int, Callable] | None = None
        self.out_avals: tuple[Any, ...] = ()
        #: Per flat output: whether it is floating (differentiable).
        self.inexact: tuple[bool, ...] = ()
        self.bwd: dict[tuple[bool, ...], Callable] = {}
        #: Whether its backward programs compile quick (every array small: ``quick.py``).
        self.small = False
        tracked_at = [i for i, k in enumerate(kinds) if k == _TRACKED]

        def forward(found: dict, *vals: Any) -> tuple[list, list]:
            given = iter(vals)
            full = [None if k == _NONE else next(given) for k in kinds]

            def f(*t: Any) -> Any:
                args = list(full)
                for i, v in zip(tracked_at, t):
                    args[i] = v
                return fn(*args)

            out, pullback = jax.vjp(f, *[full[i] for i in tracked_at])
            outs, found["out_tree"] = jax.tree_util.tree_flatten(out)
            res, found["tree"] = jax.tree_util.tree_flatten(pullback)
            pos = {id(v): i for i, v in enumerate(vals)}
            found["where"] = where = tuple(pos.get(id(r), _KEPT) for r in res)
            found["outs"] = outs
            return outs, [r for r, w in zip(res, where) if w == _KEPT]

        def first(*given: Any) -> tuple[list, list]:
            # Traced once, to find the residuals the backward makes again; the program
            # evaluates that jaxpr (``fn`` is not traced again) and leaves them out.
            found: dict[str, Any] = {}  # what this trace of ``forward`` learns
            closed = jax.make_jaxpr(functools.partial(forward, found))(*map(_abstract, given))
            outs, where = found["outs"], list(found["where"])
            n = len(outs)
            kept_at = [j for j, w in enumerate(where) if w == _KEPT]  # residual -> output n + t
            passed = [k for k in kinds if k != _NONE]
            redo = _jaxprs.recomputable(
                closed,
                [i for i, k in enumerate(passed) if k == _TRACKED],
                range(n, n + len(kept_at)),
            )
            dropped = set()
            if redo is not None:
                for o in redo[0]:
                    where[kept_at[o - n]] = _REDO
                    dropped.add(o - n)
            evaluate = _jaxpr_as_fun(closed)

            def program(*vals: Any) -> tuple[list, list]:
                flat = evaluate(*vals)
                return flat[:n], [r for t, r in enumerate(flat[n:]) if t not in dropped]

            # Set together, once known (another thread may be building the same entry).
            self.out_tree, self.tree = found["out_tree"], found["tree"]
            self.where = tuple(where)
            direct = tuple(w for w in where if w >= 0)
            self.from_inputs = direct if redo is None else direct + redo[1]
            self.redo = None if redo is None else (len(direct), redo[2])
            self.out_avals = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs)
            self.inexact = tuple(_inexact(o.dtype) for o in outs)
            arrays = (*closed.in_avals, *closed.out_avals)  # the residuals are outputs too
            few = _jaxprs.largest_product(closed) <= _quick.PRODUCT_LIMIT
            self.small = few and _quick.fits(arrays, _quick.BACKWARD_LIMIT)
            self.fwd = _quick.Jit(program, few and _quick.fits(arrays, _quick.FORWARD_LIMIT))
            return self.fwd(*given)

        self.fwd = first

    def backward_program(self, present: tuple[bool, ...]) -> Callable:
        """The compiled pullback for outputs whose cotangents are ``present`` (others zero)."""
        program = self.bwd.get(present)
        if program is None:

            def backward(kept: list, inputs: list, cts: list) -> Any:
                i = iter(inputs)
                made = () if self.redo is None else self.redo[1](*inputs[self.redo[0] :])
                other = {_KEPT: iter(kept), _REDO: iter(made)}
                res = [next(i) if w >= 0 else next(other[w]) for w in self.where]
                pullback = jax.tree_util.tree_unflatten(self.tree, res)
                given = iter(cts)
                full = [next(given) if p else _zero(a) for p, a in zip(present, self.out_avals)]
                return pullback(jax.tree_util.tree_unflatten(self.out_tree, full))

            program = self.bwd[present] = _quick.Jit(backward, self.small)
        return program

    def run_backward(self, node: _Node, cts: list) -> Sequence[Any]:
        present = tuple(c is not None for c in cts)
        given = [c for c in cts if c is not None]
        kept, inputs = node.kept
        try:
            return self.backward_program(present)(kept, list(inputs), given)
        except (RuntimeError, ValueError) as e:  # JAX's error for a deleted buffer varies
            if any(a.is_deleted() for a in (*kept, *inputs) if type(a) is _ArrayImpl):
                raise RuntimeError(STALE_GRAPH_HELP) from e
            raise


def _abstract(value: Any) -> Any:
    """``value``'s type, to trace with (tracing with an array stages it: a program per shape)."""
    aval = value.aval if type(value) is _ArrayImpl else jax.typeof(value)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


#: Where a residual comes from besides an input (``_Compiled.where``).
_KEPT, _REDO = -1, -2

_NONE, _GIVEN, _TRACKED = 0, 1, 2


def _inexact(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _zero(aval: Any) -> Any:
    """The cotangent of an output that received none: zeros (float0 for integer outputs)."""
    if _inexact(aval.dtype):
        return jnp.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, _float0)


def _compiled(key: Any, make: Callable[[], Callable], kinds: tuple[int, ...]) -> _Compiled:
    op = _OPS.get(key)
    if op is None:
        op = _Compiled(make(), kinds)
        _OPS[key] = op
        if len(_OPS) > _MAX_OPS:
            try:
                _OPS.popitem(last=False)
            except KeyError:  # another thread emptied it first
                pass
    return op


class _Pullback:
    """A node's backward as the pullback ``jax.vjp`` returned for that one call (not cached)."""

    __slots__ = ("inexact", "out_avals", "out_tree")

    def __init__(self, outs: Sequence[Any], out_tree: Any):
        self.out_tree = out_tree
        self.out_avals = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs)
        self.inexact = tuple(_inexact(a.dtype) for a in self.out_avals)

    def run_backward(self, node: _Node, cts: list) -> Sequence[Any]:
        full = [_zero(a) if c is None else c for c, a in zip(cts, self.out_avals)]
        return node.kept(jax.tree_util.tree_unflatten(self.out_tree, full))


# ----------------------------------------------------------------------------- the trace


#: Primitives whose outputs are constants of the gradient (``jax.lax.stop_gradient``).
_CONSTANT = frozenset({"stop_gradient"})


def _params_key(params: dict) -> Any:
    items = tuple(params.items())
    hash(items)  # TypeError: a parameter JAX does not hash (then nothing is cached)
    return items


class TapeTrace(jax.core.Trace):
    """The trace of one eager ``jm.backward``: runs each operation and records it on the tape.

    Args:
        parent_trace: the trace that computes values (JAX's eager one, or the tape of
            an enclosing gradient computation).
        graph: this is a thread's graph tape (``Tensor.backward``, see
            ``recorder.in_graph``): it is never done, and its nodes live as long as
            the values that need them, as PyTorch's autograd graph does.

    The tape keeps no list of its nodes: each value holds the node that made it,
    and each node the nodes of its inputs, so a backward pass walks what its loss
    depends on and what no value needs any more is freed.
    """

    def __init__(self, parent_trace: Any, graph: bool = False):
        super().__init__()
        self.parent_trace = parent_trace
        self.graph = graph
        #: Nodes made so far (their ``seq``).
        self.count = 0
        #: The gradient computation is over: its values lower to their arrays.
        self.done = False
        self.requires_low = False

    # -------------------------------------------------------------- making values

    def leaf(self, value: Any, sinks: tuple[int, ...], owner: Any = None) -> TapeTracer:
        """``value`` as a differentiated input whose cotangent goes to tap ``sinks`` of
        ``owner`` (the recorder that tapped it)."""
        self.count += 1
        node = _Node(None, owner, [], 1, self.count, sinks)
        return TapeTracer(self, value, node, 0)

    def _split(self, tracers: Sequence[Any]) -> tuple[list, list, bool]:
        vals: list = []
        srcs: list = []
        tracked = False
        for t in tracers:
            if type(t) is TapeTracer:
                if t._trace is self:
                    vals.append(t.val)
                    srcs.append(t)
                    tracked = True
                    continue
                if t._trace.done:  # kept from an earlier gradient computation: its value
                    t = concrete(t)
            vals.append(t)
            srcs.append(None)
        return vals, srcs, tracked

    def _wrap(self, op: Any, kept: Any, srcs: list, outs: Sequence[Any]) -> list:
        """The outputs of a node: a tracer for each floating one (others have no gradient)."""
        self.count += 1
        inputs = [(s.node, s.index) for s in srcs if s is not None]
        node = _Node(op, kept, inputs, len(outs), self.count)
        return [
            TapeTracer(self, o, node, i) if inexact else o
            for i, (o, inexact) in enumerate(zip(outs, op.inexact))
        ]

    # -------------------------------------------------------------- JAX's protocol

    def process_primitive(self, primitive: Any, tracers: Sequence[Any], params: dict) -> Any:
        vals, srcs, tracked = self._split(tracers)
        if not tracked or primitive.name in _CONSTANT:
            return _bind_with_trace(primitive, self.parent_trace, vals, params)
        make = lambda: functools.partial(primitive.bind, **params)
        try:
            key = (primitive, _params_key(params))
            hash(key)
        except TypeError:  # an unhashable parameter: differentiate this one call
            return self._uncached(make(), vals, srcs)
        return self._run(key, make, vals, srcs)

    def call(self, key: Any, fn: Callable, args: Sequence[Any], direct: Callable) -> Any:
        """``fn(*args)`` as one operation on the tape (a library function called eagerly).

        ``key`` names ``fn`` and everything it closes over (a function and its
        static arguments); ``args`` are arrays, tracers, Python scalars or None.
        When none of them is differentiated, ``direct(*args)`` computes the
        result instead (a compiled call, outside the tape).
        """
        vals, srcs, tracked = self._split(args)
        if not tracked:
            with _set_current_trace(self.parent_trace):
                return direct(*vals)
        return self._run(key, lambda: fn, vals, srcs)

    def _run(self, key: Any, make: Callable[[], Callable], vals: list, srcs: list) -> Any:
        kinds = tuple(
            _NONE if v is None else _GIVEN if s is None else _TRACKED for v, s in zip(vals, srcs)
        )
        types = tuple(
            None if v is None else v.aval if type(v) is _ArrayImpl else jax.typeof(v) for v in vals
        )
        op = _compiled((key, types, kinds), make, kinds)
        given = [v for v in vals if v is not None]
        with _set_current_trace(self.parent_trace):
            outs, kept = op.fwd(*given)
        inputs = Saved([given[i] for i in op.from_inputs])
        wrapped = self._wrap(op, (kept, inputs), srcs, outs)
        return jax.tree_util.tree_unflatten(op.out_tree, wrapped)

    def _uncached(self, fn: Callable, vals: list, srcs: list) -> Any:
        """``fn(*vals)`` differentiated by ``jax.vjp`` of this one call, run eagerly."""
        mask = [s is not None for s in srcs]

        def f(*t: Any) -> Any:
            it = iter(t)
            return fn(*[next(it) if m else v for v, m in zip(vals, mask)])

        with _set_current_trace(self.parent_trace):
            out, pullback = jax.vjp(f, *[v for v, m in zip(vals, mask) if m])
        outs, out_tree = jax.tree_util.tree_flatten(out)
        wrapped = self._wrap(_Pullback(outs, out_tree), pullback, srcs, outs)
        return jax.tree_util.tree_unflatten(out_tree, wrapped)

    def process_custom_jvp_call(
        self, primitive: Any, fun: Any, jvp: Any, tracers: Sequence[Any], /, **params: Any
    ) -> Any:
        return self._custom(primitive, (fun, jvp), tracers, params)

    def process_custom_vjp_call(
        self, primitive: Any, fun: Any, fwd: Any, bwd: Any, tracers: Sequence[Any], /, **params: Any
    ) -> Any:
        return self._custom(primitive, (fun, fwd, bwd), tracers, params)

    def _custom(self, primitive: Any, subfuns: tuple, tracers: Sequence[Any], params: dict) -> Any:
        """A ``custom_jvp``/``custom_vjp`` call: ``jax.vjp`` of it, its own rule honoured."""
        vals, srcs, tracked = self._split(tracers)
        params = dict(params, subfuns=subfuns)
        if not tracked:
            return _bind_with_trace(primitive, self.parent_trace, vals, params)
        return self._uncached(lambda *xs: primitive.bind(*xs, **params), vals, srcs)

    def process_call(self, primitive: Any, f: Any, tracers: Sequence[Any], params: dict) -> Any:
        return f.call_wrapped(*tracers)  # trace through: each operation inside is recorded

    def process_map(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError(
            "jax.pmap inside an eager jm.backward is not supported: compile the step with "
            "jm.compile (or use jax.shard_map / shardings, which jm.compile carries)."
        )

    def stage_value(self, val: Any) -> Any:
        if type(val) is TapeTracer and val._trace is self:
            return val
        with _set_current_trace(self.parent_trace):
            return self.parent_trace.stage_value(concrete(val))

    if _jx.HAS_QDD:

        def cur_qdd(self, x: Any) -> Any:
            return _jx.cur_qdd(concrete(x))

    # -------------------------------------------------------------- the backward pass

    def backward(self, loss: Any) -> dict[int, Any]:
        """Walk the tape back from ``loss`` (seeded with ones): cotangents by tap index.

        Parameters the loss does not depend on get nothing. What the nodes kept
        is freed.
        """
        grads: dict[int, Any] = {}
        if type(loss) is not TapeTracer or loss._trace is not self:
            return grads
        for node, ct in self._walk(loss, _seed(loss.val), retain=False):
            _add_to(grads, node.sinks, ct)
        return grads

    def backward_graph(self, loss: TapeTracer, seed: Any, retain: bool) -> dict[Any, dict]:
        """``Tensor.backward`` of a graph value: cotangents by recorder, then by tap index
        (each module call that tapped parameters had its own recorder)."""
        out: dict[Any, dict] = {}
        for node, ct in self._walk(loss, seed, retain):
            rec = node.kept
            _add_to(out.setdefault(rec, {}), node.sinks, ct)
        return out

    def _walk(self, loss: TapeTracer, seed: Any, retain: bool) -> list[tuple[_Node, Any]]:
        """Run the backward of every node ``loss`` depends on, latest first: the leaves
        reached, with their cotangents.

        A node runs once all the nodes after it (its consumers) have; a node whose
        outputs received no cotangent is skipped. Unless ``retain``, each node run
        frees what it kept, and a later walk through it raises PyTorch's error.
        """
        start = loss.node
        seen = {id(start): start}
        stack = [start]
        while stack:
            for src, _ in stack.pop().inputs:
                if id(src) not in seen:
                    seen[id(src)] = src
                    stack.append(src)
        order = sorted(seen.values(), key=lambda n: n.seq, reverse=True)
        leaves = []
        start.cts = [None] * start.n_out
        start.cts[loss.index] = seed
        try:
            for node in order:
                cts = node.cts
                if cts is None:
                    continue
                node.cts = None
                op = node.op
                if op is None:
                    leaves.append((node, cts[0]))
                    continue
                if op is _FREED:
                    raise RuntimeError(SECOND_BACKWARD_HELP)
                in_cts = op.run_backward(node, cts)
                if not retain:
                    node.kept = None
                    node.op = _FREED
                for (src, j), c in zip(node.inputs, in_cts):
                    if c is None or (hasattr(c, "dtype") and c.dtype == _float0):
                        continue
                    s = src.cts
                    if s is None:
                        s = src.cts = [None] * src.n_out
                    s[j] = c if s[j] is None else s[j] + c
        finally:
            for node in order:  # a failed walk leaves nothing behind
                node.cts = None
        return leaves


def _add_to(grads: dict[int, Any], sinks: tuple[int, ...], ct: Any) -> None:
    """Add a leaf's cotangent into ``grads`` by tap index (block ``b``'s slice to
    ``sinks[b]`` for a stacked value)."""
    for b, i in enumerate(sinks):
        g = ct if len(sinks) == 1 else ct[b]
        grads[i] = g if i not in grads else grads[i] + g


#: Ones like a loss, by (shape, dtype, sharding): the seed of every backward pass, made
#: once (an immutable array; a fresh ``ones_like`` is a dispatch per step).
_SEEDS: dict[tuple, jax.Array] = {}


def _seed(val: Any) -> Any:
    try:
        key = (val.shape, val.dtype, val.sharding)
        out = _SEEDS.get(key)
        where = val.sharding if val.committed else None
    except (AttributeError, TypeError):  # not a plain array: no cache
        return jnp.ones_like(val)
    if out is None:
        if len(_SEEDS) >= 64:
            _SEEDS.clear()
        # From NumPy: ``ones_like`` would compile a program for each new loss shape.
        out = _SEEDS[key] = jax.device_put(np.ones(val.shape, val.dtype), where)
    return out
