"""Gradients of what a closure read: the machinery under ``jm.backward`` and ``jm.grad``.

``differentiate(fn)`` runs ``fn()`` once under ``jax.vjp`` of one dummy
scalar ``z``, with a :class:`Recorder` installed for this thread
(``state.local.recorder``). Every parameter the closure *reads* (``state.read``
is the only way to read a cell's value) that requires grad is, on its first
read, replaced for the rest of the closure by ``tap(value, z)``: an identity
whose backward rule hands the cotangent it receives, d(loss)/d(parameter), to
the recorder. However the closure reached the parameter (a module in a dict,
a global, an attribute chain, a bare Parameter), reading it is what makes it
differentiated; nothing is scanned. Parameters the loss does not depend on
get no cotangent (JAX skips the tap), so their ``.grad`` stays None, as in
PyTorch.

Buffers the closure writes with values that depend on the parameters (batch
norm statistics) are recorded, restored when the closure ends, and written
back as the primal values ``jax.vjp`` returns. Modules the closure calls are
snapshotted on their first call, and restored if it fails or leaves a traced
value behind. The same code runs eagerly and inside a compiled trace, where
it becomes part of the program.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import set_current_trace as _set_current_trace

from jmodule import _jax_internals as _jx
from jmodule._jax_internals import ArrayImpl as _ArrayImpl
from jmodule._lowering import binding, state
from jmodule._lowering import tape as _tape
from jmodule._tensor import Tensor as _Tensor
from jmodule._tensor import wrap as _wrap


class _Sink:
    """Where one tap's cotangent goes (hashable by identity, as JAX's static arguments)."""

    __slots__ = ("index", "recorder")

    def __init__(self, recorder: Recorder, index: int):
        self.recorder = recorder
        self.index = index


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tap(sink: _Sink, v: Any, z: Any) -> Any:
    return v


def _tap_fwd(sink: _Sink, v: Any, z: Any) -> tuple[Any, None]:
    return v, None


class _StackSink(_Sink):
    """Where a stacked tap's cotangent goes: block ``b``'s slice to tap index ``indices[b]``."""

    __slots__ = ("indices",)

    def __init__(self, recorder: Recorder, indices: tuple[int, ...]):
        super().__init__(recorder, indices[0])
        self.indices = indices


def _tap_bwd(sink: _Sink, _: None, g: Any) -> tuple[None, None]:
    grads = sink.recorder.grads
    if type(sink) is _StackSink:
        for b, i in enumerate(sink.indices):
            grads[i] = g[b] if i not in grads else grads[i] + g[b]
        return None, None
    i = sink.index
    grads[i] = g if i not in grads else grads[i] + g
    return None, None


_tap.defvjp(_tap_fwd, _tap_bwd)


class Tap(NamedTuple):
    """A parameter a recorder differentiates: its cell, its value before, its tap index."""

    cell: Any
    before: Any
    index: int


class Write(NamedTuple):
    """A slot written with a value of the recorder's trace, and the value it held before."""

    container: dict
    key: str
    before: Any


class NewValue(NamedTuple):
    """A recorded write's slot and the value the closure left there (``Recorder.finish``)."""

    container: dict
    key: str
    value: Any


class Differentiated(NamedTuple):
    """What :func:`differentiate` computed."""

    loss: Any
    aux: Any
    recorder: Recorder
    #: Cotangents by tap index; None when the closure was a PyTorch-style step closure
    #: (it called ``jm.backward`` itself).
    grads: dict[int, Any] | None


class Recorder:
    """One gradient computation in progress in this thread: what its closure reads and writes.

    Args:
        z: the dummy scalar ``jax.vjp`` differentiates (a tracer of its trace).
        only: ids of the parameters to differentiate (None: every one that
            requires grad).
        step_closure: this is ``Optimizer.step(closure)`` trying the closure as
            a loss-only one; a ``jm.backward`` inside it makes it PyTorch style.
    """

    def __init__(
        self,
        z: Any,
        only: set[int] | None = None,
        step_closure: bool = False,
        tape: _tape.TapeTrace | None = None,
    ):
        self.z = z
        #: The eager tape recording the closure (``tape.py``), or None: ``jax.vjp``'s trace.
        self.tape = tape
        self.trace = _jx.trace_of(z) if tape is None else tape
        #: Bindings active when it started (a compiled step's): values bound later (by a
        #: ``functional_call`` inside the closure) are not the parameters' own.
        self.depth = len(state.local.bound)
        self.only = only
        self.step_closure = step_closure
        #: A jm.backward ran inside (only for step closures): stop differentiating.
        self.nested = False
        #: The recorder active when this one started (see :func:`outside`).
        self.outer: Recorder | None = state.local.recorder
        #: Per tapped parameter, by id.
        self.tapped: dict[int, Tap] = {}
        #: Cotangents by tap index (filled when the VJP runs).
        self.grads: dict[int, Any] = {}
        #: Slots written with values of this trace, by ``(id(container), key)``.
        self.writes: dict[tuple[int, str], Write] = {}
        #: Modules called, each snapshotted on its first call.
        self.snapshots: dict[int, binding.Snapshot] = {}
        self.called: list[tuple[None, Any]] = []

    # -------------------------------------------------------------- seen by the state

    def read(self, cell: Any, v: Any) -> Any:
        """A read of ``cell`` (see ``state.read``): tap a parameter on its first read."""
        if self.nested or not state.requires_grad(cell):
            return v
        cid = id(cell)
        if cid in self.tapped or (self.only is not None and cid not in self.only):
            return v
        if len(state.local.bound) > self.depth and state.bound_since(cell.__dict__, self.depth):
            return v  # a value functional_call put there: its own gradient flows, not p's
        if isinstance(v, jax.ShapeDtypeStruct):
            return v  # meta: whatever uses it raises the meta-device error
        return self.tap(cell, v)

    def tap(self, cell: Any, v: Any) -> Any:
        """Differentiate ``cell`` from now on: its slot holds ``tap(v, z)`` until the end."""
        index = len(self.tapped)
        if self.tape is not None and type(v) is _ArrayImpl and not v.committed:
            with _set_current_trace(self.tape.parent_trace):  # maybe in a nested trace
                v = _committed(v)
        marked = self._mark(_Sink(self, index), v)
        self.tapped[id(cell)] = Tap(cell, v, index)
        state.assign(cell, marked)
        return marked

    def tap_stacked(self, cells: Sequence[Any], stacked: Any) -> Any | None:
        """Differentiate ``cells`` (scanned blocks' parameters of one kind) through their stack.

        ``stacked[b]`` is ``cells[b]``'s value (each holds a
        :class:`~state.StackedValue` of it). One tap of the stack instead of one
        per block; each cell is recorded as tapped, with its own index, and
        its slot holds its block of the tapped stack. None (nothing tapped)
        unless every cell is one this recorder would tap on its first read.
        """
        if self.nested:
            return None
        deeper = len(state.local.bound) > self.depth
        for cell in cells:
            cid = id(cell)
            if (
                not state.requires_grad(cell)
                or cid in self.tapped
                or (self.only is not None and cid not in self.only)
                or (deeper and state.bound_since(cell.__dict__, self.depth))
            ):
                return None
        start = len(self.tapped)
        indices = tuple(range(start, start + len(cells)))
        marked = self._mark(_StackSink(self, indices), stacked)
        for b, (cell, index) in enumerate(zip(cells, indices)):
            self.tapped[id(cell)] = Tap(cell, state.raw(cell), index)
            state.assign(cell, state.StackedValue(marked, b))
        return marked

    def _mark(self, sink: _Sink, v: Any) -> Any:
        """``v``, differentiated from now on: its cotangent goes to ``sink``."""
        if self.tape is not None:
            indices = sink.indices if type(sink) is _StackSink else (sink.index,)
            return self.tape.leaf(v, indices, self)
        if _jx.current_trace() is self.trace:
            return _tap(sink, v, self.z)
        # first read inside a nested transformation (scan, vmap, checkpoint): tap at this
        # recorder's level, so the value outlives the inner trace
        with _set_current_trace(self.trace):
            return _tap(sink, v, self.z)

    def tap_array(self, x: Any) -> tuple[Any, int]:
        """An array argument to differentiate (``jm.grad`` of an array): ``(tapped, index)``."""
        holder = state.Cell()  # not a parameter: only tapped here, never read by a module
        marked = self.tap(holder, x)
        return marked, self.tapped[id(holder)].index

    def owns(self, v: Any) -> bool:
        """Whether ``v`` is a value of this recorder's trace (it depends on tapped values)."""
        return isinstance(v, jax.core.Tracer) and _jx.trace_of(v) is self.trace

    def note_write(self, container: dict, key: str) -> None:
        """``container[key]`` is about to hold a value of this trace: restore it at the end."""
        k = (id(container), key)
        if k not in self.writes:
            self.writes[k] = Write(container, key, container.get(key))

    def enter(self, module: Any) -> None:
        """``module`` is being called: snapshot it on its first call."""
        mid = id(module)
        if mid not in self.snapshots:
            self.snapshots[mid] = binding.Snapshot(module)
            self.called.append((None, module))

    # -------------------------------------------------------------- the end

    def finish(self, ok: bool) -> list[NewValue]:
        """Put back every tapped value and written slot; check the modules for leaks.

        Returns every recorded write's new value, for the caller to write back as
        primal values once the VJP is done.
        """
        for t in self.tapped.values():
            state.assign(t.cell, t.before)
        new = []
        for w in self.writes.values():
            new.append(NewValue(w.container, w.key, w.container.get(w.key)))
            w.container[w.key] = w.before
        allowed = {id(t.before) for t in self.tapped.values()}
        binding.check_and_restore(
            list(self.snapshots.values()), self.called, ok, allowed | {id(n.value) for n in new}
        )
        return new


@contextlib.contextmanager
def outside(rec: Recorder) -> Iterator[None]:
    """Run the block as if ``rec`` had not started: its enclosing recorder and trace."""
    local = state.local
    local.recorder = rec.outer
    try:
        with _set_current_trace(_jx.parent_trace(rec.trace)):
            yield
    finally:
        local.recorder = rec


def active() -> Recorder | None:
    """This thread's innermost gradient recorder, or None."""
    return state.local.recorder


# ----------------------------------------------------------------------------- the graph


def graph_wanted() -> bool:
    """Whether a call on jm.Tensors made now records the graph ``Tensor.backward`` walks:
    grad mode on, no gradient being taken, and eager (no trace, not even a tape's)."""
    local = state.local
    return (
        local.grad_enabled
        and local.recorder is None
        and not local.bound
        and type(_jx.current_trace()) is _jx.EvalTrace
    )


def in_graph(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` recorded on this thread's graph tape (PyTorch's autograd
    graph, for ``loss.backward()``).

    A module called eagerly on jm.Tensors, and every Tensor operation on a value of
    the graph, runs here: the call is one stretch of tape, with a :class:`Recorder`
    of its own that taps the parameters it reads (each stretch taps them again; the
    gradients add up). What the call returns are the tape's values (Tensors of
    :class:`~tape.TapeTracer` s, concrete for printing and control flow); buffers it
    wrote get their arrays, as after an eager ``jm.backward``. The graph lives as
    long as values that need it: the tape keeps no list of nodes.
    """
    local = state.local
    parent = _jx.current_trace()
    tape = local.graph
    if tape is None or tape.parent_trace is not parent:
        tape = local.graph = _tape.TapeTrace(parent, graph=True)
    rec = Recorder(None, tape=tape)
    local.recorder = rec
    ok = False
    try:
        with _set_current_trace(tape):
            out = fn(*args, **kwargs)
        ok = True
    finally:
        local.recorder = None
        new = rec.finish(ok)
        # the leaves keep the recorder (for .backward): only what .backward reads stays
        rec.snapshots = {}
        rec.called = []
        rec.writes = {}
    for n in new:
        n.container[n.key] = _tape.concrete(n.value)
    return out


def differentiate(
    fn: Callable[[Recorder], Any],
    *,
    only: set[int] | None = None,
    has_aux: bool = False,
    caller: str,
    step_closure: bool = False,
) -> Differentiated:
    """Run ``fn(recorder)`` once, differentiated w.r.t. every parameter it reads.

    The cotangents are None when the closure turned out to be a PyTorch-style step
    closure (it called ``jm.backward`` itself). Recorded buffer writes are written
    back, as their primal values.
    """
    if not state.local.bound and _tape.eager():
        return _differentiate_eagerly(fn, only, has_aux, caller, step_closure)
    outer = state.local.recorder
    box: list[Recorder] = []
    #: ``(container, key)`` of the recorded writes: only their values pass through
    #: ``jax.vjp`` (a dict in its output would come back as a copy: a parameter's
    #: ``__dict__`` holding a ``.grad`` a compiled call wrote is one).
    where: list[tuple[dict, str]] = []

    def f(z: Any) -> tuple[Any, tuple[Any, list]]:
        rec = Recorder(z, only, step_closure)
        box.append(rec)
        state.local.recorder = rec
        ok = False
        try:
            out = fn(rec)
            ok = True
        finally:
            state.local.recorder = outer
            new = rec.finish(ok)
        where.extend((n.container, n.key) for n in new)
        writes = [n.value for n in new]
        loss, aux = out if has_aux else (out, None)
        loss = state.value(loss)
        if type(loss) is _Tensor:  # a jm.Tensor loss: given back as one
            tensor_loss.append(True)
            loss = loss.array
        if not rec.nested and (not isinstance(loss, jax.Array) or loss.shape != ()):
            raise RuntimeError(
                f"{caller}: grad can be implicitly created only for scalar outputs "
                f"(the loss has shape {getattr(loss, 'shape', type(loss).__name__)})"
            )
        return loss, (aux, writes)

    z0 = jnp.zeros((), jnp.float32)
    tensor_loss: list[bool] = []
    loss, vjp_fn, (aux, writes) = jax.vjp(f, z0, has_aux=True)
    rec = box[0]
    for (container, key), v in zip(where, writes):
        container[key] = v
    if rec.nested:
        return Differentiated(loss, aux, rec, None)
    if rec.tapped:
        vjp_fn(jnp.ones_like(loss))
    return Differentiated(_wrap(loss) if tensor_loss else loss, aux, rec, rec.grads)


def _differentiate_eagerly(
    fn: Callable[[Recorder], Any],
    only: set[int] | None,
    has_aux: bool,
    caller: str,
    step_closure: bool,
) -> Differentiated:
    """:func:`differentiate` outside any trace: the closure runs on a tape (``tape.py``).

    The same contract, with the values concrete: what the closure wrote to
    buffers is written back as arrays, and the loss and ``aux`` come back as
    arrays.
    """
    outer = state.local.recorder
    tape = _tape.TapeTrace(_jx.current_trace())
    rec = Recorder(None, only, step_closure, tape=tape)
    state.local.recorder = rec
    ok = False
    try:
        with _set_current_trace(tape):
            out = fn(rec)
        ok = True
    finally:
        state.local.recorder = outer
        try:
            new = rec.finish(ok)
        finally:
            if not ok:
                tape.done = True
    for n in new:
        n.container[n.key] = _tape.concrete(n.value)
    loss, aux = out if has_aux else (out, None)
    loss = state.value(loss)
    tensor_loss = type(loss) is _Tensor
    if tensor_loss:  # a jm.Tensor loss: given back as one
        loss = loss.array
    try:
        if not rec.nested and (not isinstance(loss, jax.Array) or loss.shape != ()):
            raise RuntimeError(
                f"{caller}: grad can be implicitly created only for scalar outputs "
                f"(the loss has shape {getattr(loss, 'shape', type(loss).__name__)})"
            )
        grads = None if rec.nested else tape.backward(loss) if rec.tapped else {}
    finally:
        tape.done = True
    loss = _tape.concrete(loss)
    return Differentiated(_wrap(loss) if tensor_loss else loss, _tape.usable(aux), rec, grads)


def _committed(v: Any) -> Any:
    """``v`` committed to its device if it is a fresh array (``jnp`` output) that is not.

    A compiled program keys its executables on committedness, and a program's
    outputs are committed: a parameter committed on its first tap keeps the
    first and second steps on the same programs.
    """
    if type(v) is _ArrayImpl and not v.committed and not v.is_deleted():
        return jax.device_put(v, next(iter(v.devices())))
    return v


STEP_ARGUMENT_HELP = (
    "The closure given to Optimizer.step() computed with parameters before it called "
    "{name}, a compiled function that runs jm.backward, and passed it a value that depends on "
    "them (an argument of shape {shape}). The program's jm.backward would treat that value as "
    "a constant, which PyTorch does not. Compute it inside the compiled function, in the "
    "function given to jm.backward: `loss = jm.backward(lambda: loss_fn(model(x), y))`."
)


def note_backward(inputs: Any = None, name: str = "") -> None:
    """A ``jm.backward`` is starting, or a compiled program whose trace ran one is called.

    The compiled program being traced here, if any, notes that it runs one
    (``Program.backward``: its later calls report it here, although its
    Python no longer runs). An enclosing step-closure trial becomes PyTorch
    style: what it read so far is not differentiated. A parameter bound by a
    trace that started inside the trial (a compiled call's, which gets the
    tapped value back when it ends) keeps its tap until the trace is over: its
    slot holds the trace's value, not the trial's, and the trace would bake
    the parameter's value into its program as a constant. The compiled call
    calls this again when it returns (``compiled._run_plan``).

    Args:
        inputs: a compiled call's arguments: one that depends on what an
            enclosing step-closure trial read is an error.
        name: the compiled function's name, for that error.

    Raises:
        RuntimeError: an argument of the compiled call depends on the trial's reads.
    """
    watch = state.local.watch
    if watch is not None:
        watch.backward = True
    rec = state.local.recorder
    if rec is not None and rec.step_closure:
        for x in jax.tree_util.tree_leaves(inputs):
            if rec.owns(x):
                raise RuntimeError(STEP_ARGUMENT_HELP.format(name=name, shape=tuple(x.shape)))
        rec.nested = True
        for cid, (cell, old, _) in list(rec.tapped.items()):
            if not state.bound_since(cell.__dict__, rec.depth):
                state.assign(cell, old)
                del rec.tapped[cid]


# ----------------------------------------------------------------------------- backward hooks


def _identity(values: tuple, on_grads: Callable[[tuple], tuple]) -> tuple:
    """``values`` unchanged; on the way back, cotangents pass through ``on_grads``."""

    @jax.custom_vjp
    def ident(*xs: Any) -> tuple:
        return xs

    def fwd(*xs: Any) -> tuple[tuple, None]:
        return xs, None

    def bwd(_: None, grads: tuple) -> tuple:
        return tuple(on_grads(tuple(grads)))

    ident.defvjp(fwd, bwd)
    return ident(*values)


def _checked(new: Any, old: Sequence[Any], who: str, what: str) -> list[Any]:
    if not isinstance(new, (tuple, list)):
        new = (new,)
    if len(new) != len(old):
        raise RuntimeError(
            f"{who} returned an invalid number of {what}, got {len(new)}, but expected {len(old)}"
        )
    return list(new)


class BackwardHooks:
    """PyTorch's ``BackwardHook``: identity functions around a module's inputs and
    outputs whose VJPs run the module's backward pre-hooks and full backward hooks."""

    def __init__(self, module: Any, recorder: Recorder):
        self.module = module
        self.recorder = recorder
        self.n_inputs = 0
        self.input_pos: list[int] = []
        self.n_outputs = 0
        self.output_pos: list[int] = []
        self.grad_output: tuple = ()

    def setup_input_hook(self, args: tuple) -> tuple:
        self.n_inputs = len(args)
        owns = self.recorder.owns
        self.input_pos = [i for i, a in enumerate(args) if owns(a)]
        if not self.input_pos:
            return args
        new = _identity(tuple(args[i] for i in self.input_pos), self._input_grads)
        out = list(args)
        for j, i in enumerate(self.input_pos):
            out[i] = new[j]
        return tuple(out)

    def setup_output_hook(self, result: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(result)
        self.n_outputs = len(leaves)
        owns = self.recorder.owns
        self.output_pos = [i for i, o in enumerate(leaves) if owns(o)]
        if not self.output_pos:
            return result
        new = _identity(tuple(leaves[i] for i in self.output_pos), self._output_grads)
        for j, i in enumerate(self.output_pos):
            leaves[i] = new[j]
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def _output_grads(self, grads: tuple) -> tuple:
        module = self.module
        grad_output: list[Any] = [None] * self.n_outputs
        for j, i in enumerate(self.output_pos):
            grad_output[i] = grads[j]
        for hook in module._backward_pre_hooks.values():
            res = hook(module, tuple(grad_output))
            if res is not None:
                grad_output = _checked(res, grad_output, "Backward pre hook", "grad_output")
        self.grad_output = tuple(grad_output)
        if not self.input_pos and module._backward_hooks:
            # No input needs a gradient: PyTorch calls the hooks from here, and warns.
            warnings.warn(
                "Full backward hook is firing when gradients are computed with respect to "
                "module outputs since no inputs require gradients. See "
                "https://docs.pytorch.org/docs/main/generated/torch.nn.Module.html"
                "#torch.nn.Module.register_full_backward_hook for more details.",
                UserWarning,
                stacklevel=2,
            )
            for hook in module._backward_hooks.values():
                hook(module, (None,) * self.n_inputs, self.grad_output)
        return tuple(_like(grad_output[i], grads[j]) for j, i in enumerate(self.output_pos))

    def _input_grads(self, grads: tuple) -> tuple:
        module = self.module
        grad_input: list[Any] = [None] * self.n_inputs
        for j, i in enumerate(self.input_pos):
            grad_input[i] = grads[j]
        for hook in module._backward_hooks.values():
            res = hook(module, tuple(grad_input), self.grad_output)
            if res is not None:
                grad_input = _checked(res, grad_input, "Backward hook", "grad_input")
        return tuple(_like(grad_input[i], grads[j]) for j, i in enumerate(self.input_pos))


def _like(v: Any, ref: jax.Array) -> jax.Array:
    """A hook's replacement gradient as an array shaped and typed like ``ref``."""
    if v is None:
        return jnp.zeros_like(ref)
    v = jnp.asarray(state.value(v), ref.dtype)
    if v.shape != ref.shape:
        raise RuntimeError(
            f"Backward hook returned a gradient of shape {v.shape}, expected {ref.shape}"
        )
    return v
