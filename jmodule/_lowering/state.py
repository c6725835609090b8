"""State: the cells holding a tree's arrays, the slots naming them, and what changed.

This module is the bottom of jmodule and the single owner of four things
(``_lowering/README.md`` tells the whole story):

* **The cell.** :class:`Cell` is the array-like base of ``Parameter`` and
  ``Buffer``: its value lives in ``cell.__dict__["_value"]``. Code computing
  with a cell reads it through :func:`read` (every operator, pytree flatten,
  ``__jax_array__``, ...), which lets a gradient recorder see the read;
  :func:`peek` reads without being seen (shapes, dtypes, optimizer updates,
  serialization) and :func:`assign` writes. Nothing outside this module
  touches ``_value``.
* **Slots.** A slot is a ``(container dict, key)`` pair holding one array: a
  cell's value (:func:`value_slot`), a parameter's ``.grad``
  (:func:`grad_slot`), a module's buffer, a generator's key
  (:func:`rng_slot`). :func:`tree_slots` is the one enumeration of a module
  tree's slots; compile, backward, ``functional_call``, the optimizers, the
  ``jm.jit`` views and Flax interop all use it.
* **This thread's context.** Which slot containers an active trace has bound,
  the gradient recorder of an active ``jm.backward``, the ``.grad`` watcher,
  the compiled call being traced and the active ``jm.autocast`` regions: all
  per thread (:data:`local`), so threads never see each other's traces.
* **Versions.** Every module (and parameter) has a version that
  :func:`touch` increments, together with those of every tree containing it
  (parents are linked, weakly, when a tree is enumerated). A compiled program
  compares its root's version to the one it was described at: one integer,
  however large the tree, and nothing outside the tree moves it.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _jax_internals as _jx
from jmodule._convert import torch_to_numpy
from jmodule._jax_internals import ArrayImpl as _ArrayImpl

__all__ = [
    "Cell",
    "PackedGrad",
    "Slot",
    "StackedValue",
    "TreeState",
    "as_array",
    "assign",
    "bound_since",
    "grad_slot",
    "grad_value",
    "is_bound",
    "is_cell",
    "link",
    "local",
    "lock",
    "peek",
    "raw",
    "read",
    "requires_grad",
    "rng_slot",
    "slot_value",
    "touch",
    "tracing",
    "tree_slots",
    "value",
    "value_slot",
    "version",
]

#: ``(container, key)``: ``container[key]`` holds one piece of state.
Slot = tuple[dict, str]


# ----------------------------------------------------------------------------- this thread


class _Thread(threading.local):
    """What this thread is doing with state; each thread has its own."""

    def __init__(self) -> None:
        #: Ids of the slot containers bound by this thread's active traces, innermost last.
        self.bound: list[set[int]] = []
        #: The innermost active gradient recorder (``jm.backward``/``jm.grad``), or None.
        self.recorder: Any = None
        #: The ``.grad`` watcher of the compiled program being traced, or None.
        self.watch: Any = None
        #: The compiled call being traced here (what ``Program._pure`` binds), or None.
        self.call: Any = None
        #: The values of an active ``nn.utils.parametrize.cached()`` block, or None.
        self.parametrize_cache: Any = None
        #: The active autocast regions (``jm.autocast``): a sorted tuple of hashable
        #: ``(device_type, dtype name)`` pairs, one per enabled device type, or None.
        #: Part of every compiled program's key: what an op casts to is traced in.
        self.autocast: tuple | None = None
        #: Whether the innermost active trace left the default generator out (its
        #: program was known not to draw: see ``compiled._stub``), and whether the
        #: innermost active trace used the generator's key.
        self.rng_left_out = False
        self.rng_used = False
        #: PyTorch's grad mode (``jm.no_grad``, ``jm.set_grad_enabled``): whether eager
        #: calls on jm.Tensors record the graph ``Tensor.backward`` walks.
        self.grad_enabled = True
        #: This thread's graph tape (``recorder.in_graph``), made on first use, or None.
        self.graph: Any = None


class NeedsGenerator(Exception):
    """A trace that left the default generator out of its program used it.

    Raised by the generator inside such a trace; the compiled call catches it,
    puts the generator back into the program (holding its lock) and calls
    again. A program's Python can start drawing on a retrace (a shape, a
    changed global): the call then still takes its numbers from the stream,
    holding the generator's lock.
    """


#: Per-thread context (a ``threading.local``): never shared between threads.
local = _Thread()


def tracing() -> bool:
    """True while this thread is tracing a compiled program (slots are bound)."""
    return bool(local.bound)


def is_bound(container: dict) -> bool:
    """True when ``container`` holds slots bound by one of this thread's active traces."""
    cid = id(container)
    return any(cid in bound for bound in local.bound)


def bound_since(container: dict, depth: int) -> bool:
    """True when ``container`` was bound by one of this thread's bindings after the first
    ``depth`` (those active when, say, a gradient recorder started)."""
    cid = id(container)
    return any(cid in bound for bound in local.bound[depth:])


# ----------------------------------------------------------------------------- cells


META_HELP = (
    "This parameter is on the meta device: it has a shape and dtype but no data, so it "
    "cannot be computed with. Allocate it with module.to_empty(device=...) and initialise it "
    "(reset_parameters() or load_state_dict) first."
)


def traced_device() -> jax.Device:
    """The device a traced program runs on unless its inputs say otherwise: JAX's default
    device (``jax_default_device``, else the first device of the default backend). What
    ``x.device`` answers inside traced code, where arrays have no device of their own."""
    configured = jax.config.jax_default_device
    if isinstance(configured, jax.Device):
        return configured
    if isinstance(configured, str):
        return jax.devices(configured)[0]
    return jax.devices()[0]


def is_cell(x: Any) -> bool:
    """Whether ``x`` is a Parameter or Buffer (a :class:`Cell`)."""
    return isinstance(x, Cell)


def read(cell: Cell) -> Any:
    """``cell``'s value, to compute with: an active ``jm.backward`` in this thread sees it."""
    v = cell.__dict__["_value"]
    if type(v) is StackedValue:
        v = _unstack(cell.__dict__)
    recorder = local.recorder
    if recorder is None:
        return v
    return recorder.read(cell, v)


def peek(cell: Cell) -> Any:
    """``cell``'s current value, unseen by gradient recorders (for shapes, updates, I/O)."""
    v = cell.__dict__["_value"]
    return _unstack(cell.__dict__) if type(v) is StackedValue else v


def raw(cell: Cell) -> Any:
    """What ``cell``'s value slot holds: its array, or a :class:`StackedValue` (not sliced)."""
    return cell.__dict__["_value"]


class StackedValue:
    """A value a compiled step wrote as one block's slice of a stacked array.

    A compiled training step over scanned blocks (``jm.nn.scan``) reads and
    writes the blocks' parameters of one kind as one stacked array (one
    program input and output, not one per block, see ``program.Group``); the
    value slot of each block's parameter holds this reference until the
    parameter is read outside the program, which slices it out
    (:func:`slot_value`) and keeps the slice. Its metadata (shape, dtype)
    needs no slicing.
    """

    __slots__ = ("cache", "index", "stack")

    def __init__(self, stack: Any, index: int):
        self.stack = stack
        self.index = index
        #: The block's slice, once taken (what the slot holds after it was read).
        self.cache: Any = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.stack.shape[1:])

    @property
    def dtype(self) -> Any:
        return self.stack.dtype

    @property
    def ndim(self) -> int:
        return self.stack.ndim - 1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return self.stack.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.stack.itemsize

    def materialize(self) -> Any:
        """The block's slice of the stack (taken once)."""
        v = self.cache
        if v is None:
            v = self.cache = self.stack[self.index]
        return v


def holds_stacked(*values: Sequence[Any]) -> bool:
    """Whether any of ``values`` is a :class:`StackedValue` (a block a compiled step wrote).

    A StackedValue is no JAX type: a compiled call given one raises ``TypeError``
    while checking its arguments, before anything runs or is donated, so the
    per-call paths ask this only then (a set of 225 slots' types every call cost
    5-9 us).
    """
    return any(StackedValue in set(map(type, v)) for v in values)


def _unstack(container: dict, key: str = "_value") -> Any:
    v = container[key] = container[key].materialize()
    return v


def slot_value(container: dict, key: str) -> Any:
    """What slot ``(container, key)`` holds, a :class:`StackedValue` sliced out (and kept)."""
    v = container[key]
    return _unstack(container, key) if type(v) is StackedValue else v


def assign(cell: Cell, value: Any) -> None:
    """Replace ``cell``'s value (no checks: the caller made ``value`` an array)."""
    cell.__dict__["_value"] = value


def committed(v: Any, like: Any = None) -> Any:
    """``v`` committed to the device it is on, if it is an uncommitted concrete array
    (and, given ``like``, only if ``like`` is a committed array placed as ``v`` is).

    ``jax.jit`` keys its executables on whether each argument is committed, and
    a program's outputs are: a fresh array (``jnp.asarray(numpy)``, a ``jnp``
    op on uncommitted inputs) put into a slot a compiled program reads would
    make its next call compile the program again. A plan's first arrays
    (``like`` None) and values replacing state as it stands (``p.data = ...``,
    ``load_state_dict``, in-place methods: ``like`` the value replaced) go
    through here. Same device, no copy of the data.

    >>> import jax.numpy as jnp
    >>> jnp.ones(2).committed, committed(jnp.ones(2)).committed
    (False, True)
    """
    if type(v) is not _ArrayImpl or v.committed or v.is_deleted():
        return v
    if like is not None and not (
        type(like) is _ArrayImpl and like.committed and like.sharding == v.sharding
    ):
        return v
    return jax.device_put(v, next(iter(v.devices())))


def value(x: Any) -> Any:
    """``x``'s array if it is a cell (read as :func:`read` does), else ``x`` itself."""
    return read(x) if isinstance(x, Cell) else x


def as_array(x: Any) -> Any:
    """``x`` as a ``jax.Array`` (or tracer / ShapeDtypeStruct): cells give their value
    (as :func:`read`), numpy arrays and torch tensors are converted."""
    if isinstance(x, Cell):
        v = read(x)
        if isinstance(v, jax.ShapeDtypeStruct):
            raise RuntimeError(META_HELP)
        return v
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
        return x
    if "_jm_tensor" in type(x).__dict__:  # a jm.Tensor (jmodule/_tensor.py): its array
        return x.array
    if type(x).__module__.startswith("torch"):
        x = torch_to_numpy(x)
    return jnp.asarray(x)


def requires_grad(cell: Cell) -> bool:
    """Whether ``cell`` is a parameter that gradients are computed for."""
    return cell.__dict__.get("_requires_grad", False)


def value_slot(cell: Cell) -> Slot:
    """The slot holding ``cell``'s value."""
    return (cell.__dict__, "_value")


def grad_slot(param: Cell) -> Slot:
    """The slot holding a parameter's ``.grad``."""
    return (param.__dict__, "grad")


class PackedGrad:
    """A ``.grad`` that a compiled step wrote as part of one flat array of several.

    A compiled training step writes the gradients of small parameters as one
    array (one output, not one per parameter); the ``.grad`` slot of each
    holds this reference until ``Parameter.grad`` is read, which slices it out
    (:func:`grad_value`) and keeps the slice.
    """

    __slots__ = ("flat", "shape", "size", "start")

    def __init__(self, flat: Any, start: int, size: int, shape: tuple[int, ...]):
        self.flat = flat
        self.start = start
        self.size = size
        self.shape = shape

    def materialize(self) -> Any:
        return self.flat[self.start : self.start + self.size].reshape(self.shape)


def grad_value(container: dict) -> Any:
    """The ``.grad`` held in a parameter's ``__dict__``: an array or None (never packed)."""
    g = container["grad"]
    if type(g) is PackedGrad:
        g = container["grad"] = g.materialize()
    return g


def rng_slot(generator: Any) -> Slot:
    """The slot holding ``generator``'s key (made from its seed first, if need be)."""
    if generator.__dict__.get("_key") is None:
        generator.materialize()
    return (generator.__dict__, "_key")


def using_generator(generator: Any) -> None:
    """Note that ``generator``'s key is read or written here (inside a trace: its program
    uses it), or raise :class:`NeedsGenerator` where the trace left it out."""
    if local.bound:
        if local.rng_left_out:
            raise NeedsGenerator()
        local.rng_used = True


def recording(cell: Cell) -> bool:
    """Whether computing with ``cell`` now records the graph ``loss.backward()`` walks: it
    requires grad, grad mode is on, no gradient is being taken and nothing traces."""
    return (
        local.grad_enabled
        and local.recorder is None
        and not local.bound
        and cell.__dict__.get("_requires_grad", False)
        and type(_jx.current_trace()) is _jx.EvalTrace
    )


def _binary(op):
    # With a jm.Tensor (``jmodule/_tensor.py``) on the other side, its reflected operator
    # answers, so that the result is a Tensor (Tensor in, Tensor out).
    def forward(self, other):
        if "_jm_tensor" in type(other).__dict__:
            return NotImplemented
        return op(read(self), value(other))

    def reflected(self, other):
        return op(value(other), read(self))

    return forward, reflected


def _unary(op):
    def method(self):
        return op(read(self))

    return method


#: Array attributes that describe an array without computing with its value.
_METADATA = frozenset(
    {"shape", "dtype", "ndim", "size", "itemsize", "nbytes", "sharding", "device", "devices"}
)


#: The metadata a :class:`StackedValue` answers without slicing its block out.
_STACKED_METADATA = frozenset({"shape", "dtype", "ndim", "size", "itemsize", "nbytes"})


#: What a cell's ``__qualname__`` says: ``torch.typename``, which torch's errors use to
#: name a non-tensor (``torch.optim.Adam(model.parameters())`` raises "optimizer can only
#: optimize Tensors, but one of the params is jmodule.nn.parameter.<this>"), reads it.
TORCH_OPTIM_HINT = (
    "{cls} (a jmodule {cls}, which torch cannot use: for torch.optim.X(model.parameters()) "
    "use jm.optim.X(model.parameters()), with the same names and arguments)"
)


class Cell:
    """Array behaviour shared by Parameter and Buffer, delegating to the value.

    A cell is a pytree node with one leaf (so ``jnp`` functions and
    ``jax.jit`` accept it) and defines the array operators; attributes it does
    not have come from the value (``shape``, ``dtype``, ``sum``, ...).
    """

    __array_priority__ = 100

    @property
    def data(self) -> jax.Array:
        """The underlying ``jax.Array`` (assignable, as in PyTorch)."""
        return read(self)

    @data.setter
    def data(self, new: Any) -> None:
        new = as_array(new)
        self.__dict__["_value"] = committed(new, like=self.__dict__.get("_value"))

    def __getattr__(self, name: str) -> Any:
        # Everything jax.Array has: shape, dtype, ndim, size, T, device,
        # sharding, reshape, sum, astype, ...
        if name.startswith("__") or name == "_value":
            if name == "__qualname__":  # how torch.typename names us: see TORCH_OPTIM_HINT
                return TORCH_OPTIM_HINT.format(cls=type(self).__qualname__)
            raise AttributeError(name)
        v = self.__dict__["_value"]
        if type(v) is StackedValue and name not in _STACKED_METADATA:
            v = _unstack(self.__dict__)
        if isinstance(v, jax.ShapeDtypeStruct):
            if not hasattr(v, name):
                raise RuntimeError(f"{META_HELP} (while looking up .{name})")
            return getattr(v, name)
        if name in _METADATA:  # no value is computed with: a gradient recorder need not see it
            if name == "device" and isinstance(v, jax.core.Tracer):
                # ``device = next(model.parameters()).device`` inside compiled code: where
                # the program runs by default (what ``device=`` arguments need there)
                return traced_device()
            return _forwarded(self, v, name)
        return _forwarded(self, read(self), name)

    def __jax_array__(self) -> jax.Array:
        v = read(self)
        if isinstance(v, jax.ShapeDtypeStruct):
            raise RuntimeError(META_HELP)
        return v

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(read(self))
        return out if dtype is None else out.astype(dtype)

    def __len__(self) -> int:
        v = self.__dict__["_value"]
        return v.shape[0] if type(v) is StackedValue else len(v)

    def __iter__(self):
        return iter(read(self))

    def __getitem__(self, idx: Any) -> jax.Array:
        return read(self)[value(idx)]

    def __bool__(self) -> bool:
        return bool(read(self))

    def __float__(self) -> float:
        return float(read(self))

    def __int__(self) -> int:
        return int(read(self))

    def __index__(self) -> int:
        return operator.index(read(self))

    def __complex__(self) -> complex:
        return complex(read(self))

    __hash__ = object.__hash__

    __add__, __radd__ = _binary(operator.add)
    __sub__, __rsub__ = _binary(operator.sub)
    __mul__, __rmul__ = _binary(operator.mul)
    __truediv__, __rtruediv__ = _binary(operator.truediv)
    __floordiv__, __rfloordiv__ = _binary(operator.floordiv)
    __mod__, __rmod__ = _binary(operator.mod)
    __pow__, __rpow__ = _binary(operator.pow)
    __matmul__, __rmatmul__ = _binary(operator.matmul)
    __and__, __rand__ = _binary(operator.and_)
    __or__, __ror__ = _binary(operator.or_)
    __xor__, __rxor__ = _binary(operator.xor)
    __lshift__, __rlshift__ = _binary(operator.lshift)
    __rshift__, __rrshift__ = _binary(operator.rshift)
    # The reflected form of ``self < other`` is ``other < self``, i.e. ``self > other``.
    __lt__, __gt__ = _binary(operator.lt)
    __le__, __ge__ = _binary(operator.le)
    __eq__, _ = _binary(operator.eq)
    __ne__, _ = _binary(operator.ne)
    __neg__ = _unary(operator.neg)
    __pos__ = _unary(operator.pos)
    __abs__ = _unary(operator.abs)
    __invert__ = _unary(operator.invert)


def _forwarded(cell: Cell, v: Any, name: str) -> Any:
    """``v.name`` for ``cell.name``; an AttributeError names the cell's class, not JAX's."""
    try:
        return getattr(v, name)
    except AttributeError:
        if any(name in vars(k) for k in type(v).__mro__):
            raise  # the attribute exists and raised itself (e.g. ``backward``'s hint)
    kind = type(cell).__name__
    if isinstance(v, jax.core.Tracer) and hasattr(_ArrayImpl, name):
        raise AttributeError(
            f"'{kind}' object has no attribute '{name}' while it holds a traced value (inside "
            f"jm.compile, jm.backward or jax.jit): jax.Array.{name} exists only on concrete "
            "arrays; read it outside the traced code"
        ) from None
    raise AttributeError(
        f"'{kind}' object has no attribute '{name}' (a jmodule {kind} has jax.Array's "
        "attributes and the torch.Tensor methods listed in its docs; for another torch "
        "method call the function of that name on it: jm.<name>(p) or jnp.<name>(p))"
    ) from None


def flatten_cell(cell: Cell) -> tuple[tuple[Any], None]:
    """Pytree flattening of a cell: its value, read as computing with it does."""
    return (read(cell),), None


#: Attributes of a module, parameter, optimizer or generator that belong to this
#: module's bookkeeping: never copied, pickled or compared.
PRIVATE = frozenset(
    {"_jm_version", "_jm_up", "_jm_desc", "_jm_lock", "_jm_stacks", "_jm_fused", "_jm_fusable"}
)


def without_private(d: dict) -> dict:
    """A copy of ``d`` (an object's ``__dict__``) without this module's bookkeeping."""
    return {k: v for k, v in d.items() if k not in PRIVATE}


# ----------------------------------------------------------------------------- versions


def lock(obj: Any) -> threading.RLock:
    """``obj``'s own lock, made on first use: held while its state is read, run and written.

    Per object, never process-wide: threads working on different models never
    wait for each other.
    """
    d = obj.__dict__
    held = d.get("_jm_lock")
    if held is None:
        held = d.setdefault("_jm_lock", threading.RLock())  # atomic: one lock wins
    return held


def version(obj: Any) -> int:
    """``obj``'s structure version (0 until its first change)."""
    return obj.__dict__.get("_jm_version", 0)


def touch(obj: Any) -> None:
    """Record a structural change of ``obj`` (a module or a parameter).

    Its version and the versions of every module tree it was found in (when
    enumerated by :func:`tree_slots`) move, so their compiled programs
    describe them again on their next call. Nothing else is affected.
    """
    d = obj.__dict__
    d["_jm_version"] = d.get("_jm_version", 0) + 1
    ups = d.get("_jm_up")
    if not ups:
        return
    seen = {id(obj)}
    todo = list(ups)
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        d = o.__dict__
        d["_jm_version"] = d.get("_jm_version", 0) + 1
        more = d.get("_jm_up")
        if more:
            todo.extend(more)


def link(child: Any, parent: Any) -> None:
    """Let changes of ``child`` move ``parent``'s version (weakly: no cycle kept alive)."""
    ups = child.__dict__.get("_jm_up")
    if ups is None:
        ups = child.__dict__["_jm_up"] = weakref.WeakSet()
    ups.add(parent)


# ----------------------------------------------------------------------------- tree slots


@dataclass(frozen=True)
class TreeState:
    """The state slots of module trees, each slot once, in ``state_dict`` order.

    ``slots[i]`` is named ``names[i]``: parameters and buffers first (in
    ``state_dict`` order, tied parameters once), then the ``.grad`` of every
    parameter when asked for, then the buffers registered as None when asked
    for, then the RNG key when a generator was given; ``kinds`` tells them apart.
    """

    slots: tuple[Slot, ...]
    names: tuple[str, ...]
    #: Per slot: "param", "buffer", "grad", "none" or "rng".
    kinds: tuple[str, ...]
    #: The parameters, in slot order (each once).
    params: tuple[Any, ...]
    #: ``(dotted path, module)`` of every module, as ``named_modules()``.
    named_modules: tuple[tuple[str, Any], ...]
    #: Every dotted name of a parameter or buffer, tied and shared names included.
    aliases: dict[str, Slot] | None = None


def _walk(
    module: Any, path: str, memo: set[int], recurse: bool, again: bool = False
) -> Iterator[tuple[str, Any, bool]]:
    """``named_modules()`` order (self first, depth first), linking each child to its parent.

    Yields ``(path, module, first)``; with ``again``, a module met again (shared) is
    yielded once per path with ``first`` False (``named_modules(remove_duplicate=False)``).
    """
    first = id(module) not in memo
    memo.add(id(module))
    yield path, module, first
    if not recurse:
        return
    for name, child in module.__dict__["_modules"].items():
        if child is None:
            continue
        link(child, module)
        if id(child) in memo and not again:
            continue
        yield from _walk(child, f"{path}.{name}" if path else name, memo, True, again)


def tree_slots(
    roots: Any,
    *,
    grads: bool = False,
    rng: Any = None,
    aliases: bool = False,
    prefixes: Sequence[str] | None = None,
    recurse: bool = True,
    nones: bool = False,
) -> TreeState:
    """Enumerate the state slots of one module tree (or several), each slot once.

    Enumerating links every child to its parent and every parameter to its
    modules, so that :func:`touch` on any of them moves the roots' versions.

    Args:
        roots: a module, or a sequence of modules.
        grads: also list every parameter's ``.grad`` slot.
        rng: a generator whose key slot to list last.
        aliases: also map every dotted name (tied and shared ones included)
            to its slot, as ``named_parameters(remove_duplicate=False)`` does.
        prefixes: a name prefix per root, ending in ``.`` (default: none for
            one root, ``"[i]."`` for several).
        recurse: also the descendants of the roots (not only their own state).
        nones: also list the buffers registered as None (kind "none", after the
            ``.grad`` slots): a compiled program may give them a value.
    """
    many = isinstance(roots, (list, tuple))
    roots = tuple(roots) if many else (roots,)
    if prefixes is None:
        prefixes = [f"[{i}]." for i in range(len(roots))] if many and len(roots) > 1 else [""]
    slots: list[Slot] = []
    names: list[str] = []
    kinds: list[str] = []
    params: list[Any] = []
    seen: set[int] = set()
    memo: set[int] = set()
    named: list[tuple[str, Any]] = []
    every: dict[str, Slot] | None = {} if aliases else None
    shared: dict[str, Slot] = {}  # names through a module met again, after the others
    empty: list[tuple[Slot, str]] = []
    for root, prefix in zip(roots, prefixes):
        top = prefix.rstrip(".")
        for path, m, first in _walk(root, "", memo, recurse, again=aliases):
            full = prefix + path if path else top
            dot = full + "." if full else ""
            d = m.__dict__
            buffers = d["_buffers"]
            if not first:
                for name, p in d["_parameters"].items():
                    if p is not None:
                        shared.setdefault(dot + name, (p.__dict__, "_value"))
                for name, b in buffers.items():
                    if b is not None:
                        shared.setdefault(dot + name, (buffers, name))
                continue
            named.append((full, m))
            for name, p in d["_parameters"].items():
                if p is None:
                    continue
                link(p, m)
                slot = (p.__dict__, "_value")
                if every is not None:
                    every[dot + name] = slot
                if id(p) not in seen:
                    seen.add(id(p))
                    slots.append(slot)
                    names.append(dot + name)
                    kinds.append("param")
                    params.append(p)
            for name, b in buffers.items():
                if b is None:
                    if nones:
                        empty.append(((buffers, name), dot + name))
                    continue
                slot = (buffers, name)
                if every is not None:
                    every[dot + name] = slot
                slots.append(slot)
                names.append(dot + name)
                kinds.append("buffer")
    if every is not None:
        for name, slot in shared.items():
            every.setdefault(name, slot)
    if grads:
        for p, name in zip(params, [n for n, k in zip(names, kinds) if k == "param"]):
            slots.append((p.__dict__, "grad"))
            names.append(name + ".grad")
            kinds.append("grad")
    for slot, name in empty:
        slots.append(slot)
        names.append(name)
        kinds.append("none")
    if rng is not None:
        slots.append(rng_slot(rng))
        names.append(RNG_NAME)
        kinds.append("rng")
    return TreeState(
        slots=tuple(slots),
        names=tuple(names),
        kinds=tuple(kinds),
        params=tuple(params),
        named_modules=tuple(named),
        aliases=every,
    )


#: The name of the RNG key slot in messages and views.
RNG_NAME = "<rng key>"
