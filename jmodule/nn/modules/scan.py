"""Scan over layers: a stack of identical blocks run as one ``jax.lax.scan``.

``jm.nn.scan(blocks)`` takes a ``ModuleList`` or ``Sequential`` of
structurally identical blocks (a transformer's layers) and returns a
:class:`Scan` module that runs them as one ``jax.lax.scan`` whose body is one
block: the program holds one copy of the block however deep the stack is, so
trace and compile time do not grow with depth.

The blocks stay real child modules, under their own names (``0``, ``1``,
...): ``state_dict()``, ``load_state_dict``, ``named_modules()``,
``parameters()`` (and so optimizers), ``.to()`` see each block's own
parameters and buffers, exactly as without scanning. Only at call time are
their current values stacked (one array per state entry, with a leading
block axis; inside a compiled program this is part of the trace) and sliced,
block by block, into the first block, which runs as the scan body:

* gradients flow back through the stacking to each block's own ``Parameter``
  (``jm.backward`` fills every block's ``.grad``, as the unrolled loop does);
* buffer writes (BatchNorm running statistics) come out of the scan stacked
  and are written back to each block;
* the default generator's key is carried from one block to the next, so each
  block draws its own dropout masks: the very masks the unrolled loop draws.

Inside a ``jm.compile`` step the blocks' parameters of one kind are moreover
*held* stacked across calls (``_lowering/program.Group``): the step reads
one stacked array per kind, the scan body uses it as it is (one gradient tap
for the stack), the optimizer updates it as one piece of its flat layout, and
the step writes one stacked array back. Between calls each block's
``Parameter`` holds its block of it (``state.StackedValue``), sliced out
when read; a block changed or replaced outside the step is stacked again by
the next call. So the program's inputs, outputs and XLA kernels do not grow
with depth either.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _jax_internals as _jx
from jmodule import random as _random
from jmodule._lowering import binding, state, structure
from jmodule._lowering import flat as _flat
from jmodule.nn.modules import _hooks
from jmodule.nn.modules.module import Module, _indent

__all__ = ["Scan", "scan"]

#: Module attributes that are bookkeeping, not what ``forward`` computes with.
_BOOKKEEPING = structure.BOOKKEEPING | state.PRIVATE

_HOOK_HELP = (
    "The scanned blocks run as one traced loop body (the first block, with each block's "
    "values in turn), so a hook on one block cannot run with that block's inputs and "
    "outputs. Remove the hook, register it on the Scan module itself (it sees the whole "
    "stack's input and output), or run the blocks unrolled: `for block in scanned: x = "
    "block(x)`."
)


def _where(block: str, path: str) -> str:
    return f"'{block}.{path}'" if path else f"block '{block}'"


def _same_value(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether two plain attribute values make ``forward`` compute the same thing."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (jax.Array, np.ndarray)):
        if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k], depth + 1) for k in a)
    if type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__") and depth < 3:
        return _same_value(vars(a), vars(b), depth + 1)
    try:
        return bool(a == b)
    except Exception:
        return False


def _state_line(kind: str, v: Any) -> str:
    if v is None:
        return f"{kind} None"
    return f"{kind} {tuple(v.shape)} {jnp.dtype(v.dtype).name}"


def _difference(first: Module, other: Module, name0: str, name: str) -> str | None:
    """The first structural difference between two blocks, in words, or None."""
    mods0 = dict(first.named_modules(remove_duplicate=False))
    mods = dict(other.named_modules(remove_duplicate=False))
    for path in mods0:
        if path not in mods:
            return f"{_where(name0, path)} has no counterpart in block '{name}'"
    for path in mods:
        if path not in mods0:
            return f"{_where(name, path)} has no counterpart in block '{name0}'"
    for path, m0 in mods0.items():
        m = mods[path]
        d0, d = m0.__dict__, m.__dict__
        here, there = _where(name0, path), _where(name, path)
        if type(m0) is not type(m):
            return f"{there} is a {type(m).__qualname__} where {here} is a {type(m0).__qualname__}"
        if d0["training"] != d["training"]:
            return f"{there} has training={d['training']} where {here} has {d0['training']}"
        for store, kind in (("_parameters", "parameter"), ("_buffers", "buffer")):
            if list(d0[store]) != list(d[store]):
                return f"{there} has {kind}s {list(d[store])} where {here} has {list(d0[store])}"
            for key, v0 in d0[store].items():
                v = d[store][key]
                a, b = _state_line(kind, v0), _state_line(kind, v)
                if a != b:
                    p = f"{path}.{key}" if path else key
                    return f"'{name}.{p}' is {b} where '{name0}.{p}' is {a}"
        if d0["_non_persistent_buffers_set"] != d["_non_persistent_buffers_set"]:
            return f"{there} and {here} have different non-persistent buffers"
        keys0 = [k for k in d0 if k not in _BOOKKEEPING]
        keys = [k for k in d if k not in _BOOKKEEPING]
        for key in keys0:
            if key not in d:
                return f"{here} has attribute '{key}', which {there} lacks"
        for key in keys:
            if key not in d0:
                return f"{there} has attribute '{key}', which {here} lacks"
            if not _same_value(d0[key], d[key]):
                return f"attribute '{key}' of {there} is {d[key]!r} where {here} has {d0[key]!r}"
    return None


def _hook_problem(name: str, block: Module) -> str | None:
    for path, m in block.named_modules():
        d = m.__dict__
        for store, kind in (
            ("_forward_pre_hooks", "forward pre-hook"),
            ("_forward_hooks", "forward hook"),
            ("_backward_pre_hooks", "backward pre-hook"),
            ("_backward_hooks", "backward hook"),
        ):
            if d[store]:
                return f"{_where(name, path)} has a {kind}"
    return None


class Scan(Module):
    """Structurally identical blocks run as one ``jax.lax.scan``: made by :func:`scan`.

    ``scanned(x, *args, **kwargs)`` computes what ``for block in blocks: x =
    block(x, *args, **kwargs)`` computes (values, gradients, buffer updates,
    dropout draws), with one block in the program instead of all of them.

    Its children are the blocks, under the names they had in the container
    (``0``, ``1``, ...), so the state-dict keys of a model whose ``self.h``
    was a ``ModuleList`` are unchanged (``h.0.attn.weight``). Indexing,
    ``len()`` and iteration give the blocks, as in the container.

    Requirements (each checked at call time, with an error naming the first
    problem):

    * the blocks are structurally identical: same classes, submodule names,
      parameter and buffer names, shapes and dtypes, training flags and plain
      attributes (``requires_grad`` may differ: frozen blocks get no
      gradient);
    * ``x`` (the carry: an array or a pytree of arrays) and each block's
      output have the same structure, shapes and dtypes; the other arguments
      are passed unchanged to every block;
    * no block (nor any module inside one) has forward or backward hooks,
      and no global module hook is registered: inside the scan body one
      traced block stands for every block, so a hook could not see the block
      it belongs to. Hooks on the ``Scan`` module itself work as usual.
    """

    #: Its forward calls modules that may be user code: a jm.Tensor passes on to them.
    _jm_passes_tensors = True

    #: A compiled step reads and writes the blocks' parameters stacked, one array per
    #: kind (``_lowering/compiled._groups``), kept in ``__dict__["_jm_stacks"]``.
    _jm_stacked = True

    def __init__(self, blocks: Iterable[Module] | Module, *, unroll: int | bool = 1) -> None:
        super().__init__()
        if isinstance(blocks, Module):
            d = blocks.__dict__
            if any(d[k] for k in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks")):
                raise ValueError(
                    f"jm.nn.scan: the {type(blocks).__name__} has hooks, which the new Scan "
                    "module would not run; register them on the Scan module instead"
                )
            named = [(k, m) for k, m in blocks._modules.items() if m is not None]
            self.training = blocks.training
        else:
            named = [(str(i), m) for i, m in enumerate(blocks)]
        if not named:
            raise ValueError("jm.nn.scan: needs at least one block")
        for key, m in named:
            if not isinstance(m, Module):
                raise TypeError(
                    f"jm.nn.scan: blocks must be Modules, but block '{key}' is a {type(m).__name__}"
                )
            self.add_module(key, m)
        self.unroll = unroll

    # ------------------------------------------------------------------ container

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, idx: int) -> Module:
        blocks = list(self._modules.values())
        if not isinstance(idx, int):
            raise TypeError(f"Scan indices must be integers, not {type(idx).__name__}")
        if not -len(blocks) <= idx < len(blocks):
            raise IndexError(f"index {idx} is out of range")
        return blocks[idx]

    def __dir__(self) -> list[str]:
        return [k for k in super().__dir__() if not k.isdigit()]

    def extra_repr(self) -> str:
        return "" if self.unroll == 1 else f"unroll={self.unroll}"

    def __repr__(self) -> str:
        reprs = [(k, repr(m)) for k, m in self._modules.items()]
        runs: list[list[Any]] = []
        for i, (k, r) in enumerate(reprs):
            if runs and runs[-1][2] == r and k == str(i) and runs[-1][1] == str(i - 1):
                runs[-1][1] = k
                runs[-1][3] += 1
            else:
                runs.append([k, k, r, 1])
        lines = [self.extra_repr()] if self.extra_repr() else []
        for start, end, r, count in runs:
            text = f"({start}): {r}" if count == 1 else f"({start}-{end}): {count} x {r}"
            lines.append(_indent(text, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    # ------------------------------------------------------------------ the call

    def _check(self) -> list[tuple[str, Module]]:
        """The blocks, after checking they can be scanned (raises naming the first problem)."""
        named = [(k, m) for k, m in self._modules.items() if m is not None]
        if _hooks._global_forward_pre_hooks or _hooks._global_forward_hooks:
            raise RuntimeError(
                "jm.nn.scan: a global module forward hook is registered "
                "(register_module_forward_(pre_)hook). " + _HOOK_HELP
            )
        seen: dict[int, str] = {}
        for key, block in named:
            problem = _hook_problem(key, block)
            if problem:
                raise RuntimeError(f"jm.nn.scan: {problem}. {_HOOK_HELP}")
            for path, m in block.named_modules():
                if m.__dict__["_buffers"]:
                    owner = seen.setdefault(id(m), key)
                    if owner != key:
                        raise RuntimeError(
                            f"jm.nn.scan: {_where(key, path)} (which has buffers) is also a "
                            f"module of block '{owner}'; blocks that share a module with "
                            "buffers update it one after another, which one scan body "
                            "cannot do. Give each block its own module."
                        )
        key0, first = named[0]
        for key, block in named[1:]:
            diff = _difference(first, block, key0, key)
            if diff:
                raise ValueError(
                    f"jm.nn.scan: the blocks are not structurally identical: {diff}. Scan "
                    "runs every block as the first one with its own values, so they must "
                    "differ in values only."
                )
        return named

    def forward(self, input: Any, *args: Any, **kwargs: Any) -> Any:
        """``for block in self: input = block(input, *args, **kwargs)``, as one scan.

        Args:
            input: the carry, an array or a pytree of arrays; each block's
                output must have its structure, shapes and dtypes.
            *args: passed to every block unchanged.
            **kwargs: passed to every block unchanged.

        Returns:
            The last block's output.

        Raises:
            ValueError: the blocks differ in structure.
            RuntimeError: a block has hooks, or blocks share a module with buffers.
            TypeError: a block's output does not match its input.
        """
        named = self._check()
        if not _staged():  # eager: block by block, as PyTorch (nothing to compile)
            x = input
            for _, block in named:
                y = block(x, *args, **kwargs)
                _check_carry(x, y)
                x = y
            return x
        n = len(named)
        trees = [state.tree_slots(block) for _, block in named]
        first = named[0][1]
        tree0 = trees[0]
        recorder = state.local.recorder
        if recorder is not None:  # snapshot the blocks now, while they hold their own state
            for tree in trees:
                for _, m in tree.named_modules:
                    recorder.enter(m)

        # One stacked array per slot of the first block: parameters read as computing
        # with them does (a gradient recorder taps each block's own Parameter).
        cells = [_cells(tree) for tree in trees]
        for (key, _), tree in zip(named[1:], trees[1:]):
            if tree.names != tree0.names:
                raise ValueError(
                    "jm.nn.scan: the blocks are not structurally identical: block "
                    f"'{key}' ties its parameters differently from block '{named[0][0]}' "
                    f"(its state is {list(tree.names)}, block '{named[0][0]}''s "
                    f"{list(tree0.names)})"
                )
        stacked = []
        for j in range(len(tree0.slots)):
            whole = _read_stacked([cs[j] for cs in cells])
            if whole is not None:  # a compiled step's stacked input, as it came in
                stacked.append(whole)
                continue
            values = []
            for (key, _), tree, cs in zip(named, trees, cells):
                container, name = tree.slots[j]
                v = state.read(cs[j]) if cs[j] is not None else state.value(container[name])
                if isinstance(v, jax.ShapeDtypeStruct):
                    raise RuntimeError(state.META_HELP + f" (block '{key}': {tree.names[j]})")
                values.append(v)
            shapes = {(tuple(v.shape), jnp.dtype(v.dtype)) for v in values}
            if len(shapes) > 1:
                ref = (tuple(values[0].shape), jnp.dtype(values[0].dtype))
                bad = next(i for i, v in enumerate(values) if (tuple(v.shape), v.dtype) != ref)
                raise ValueError(
                    f"jm.nn.scan: '{named[bad][0]}.{tree0.names[j]}' has shape "
                    f"{tuple(values[bad].shape)} and dtype {values[bad].dtype} where "
                    f"'{named[0][0]}.{tree0.names[j]}' has {ref[0]} and {ref[1]}"
                )
            stacked.append(_flat.stack(values))

        carry_leaves, carry_tree = jax.tree_util.tree_flatten(input, is_leaf=state.is_cell)
        carry_leaves = [state.as_array(x) for x in carry_leaves]
        gen = _random.default_generator
        key_slot = state.rng_slot(gen)
        key = key_slot[0][key_slot[1]]
        slots0 = list(tree0.slots)
        buffers0 = [i for i, k in enumerate(tree0.kinds) if k == "buffer"]
        box: dict[str, Any] = {}

        def body(carry: tuple, xs: list) -> tuple:
            leaves, k = carry
            h = jax.tree_util.tree_unflatten(carry_tree, leaves)
            # Inside the body only its own slots count as bound (as in checkpoint): a
            # write to state outside the blocks would leave a value of this trace
            # behind. The depth of the stack is kept, so gradient recorders still see
            # the first block's values as bound here (not theirs to tap).
            outer = state.local.bound
            state.local.bound = [set() for _ in outer]
            try:
                with binding.bound([*slots0, key_slot], [*xs, k], tree0.named_modules):
                    out = first._call_impl(h, *args, **kwargs)
                    new = [state.value(slots0[i][0][slots0[i][1]]) for i in buffers0]
                    new_key = key_slot[0][key_slot[1]]
            finally:
                state.local.bound = outer
            out_leaves = _check_carry(h, out)
            changed = [
                j for j, (i, v) in enumerate(zip(buffers0, new)) if v is not xs[i] and v is not None
            ]
            box["changed"] = changed
            box["drew"] = new_key is not k
            return (out_leaves, new_key if box["drew"] else k), [new[j] for j in changed]

        (leaves, new_key), new_buffers = jax.lax.scan(
            body, (carry_leaves, key), stacked, length=n, unroll=self.unroll
        )
        for j, values in zip(box["changed"], new_buffers):
            i = buffers0[j]
            for b, tree in enumerate(trees):
                container, name = tree.slots[i]
                owner = _buffer_owner(tree, container)
                owner._set_buffer(container, name, values[b])
        if box["drew"]:
            if (
                isinstance(new_key, jax.core.Tracer)
                and not isinstance(key, jax.core.Tracer)
                and not state.is_bound(gen.__dict__)
            ):
                raise RuntimeError(_random._FOREIGN_TRACE)
            key_slot[0][key_slot[1]] = new_key
        return jax.tree_util.tree_unflatten(carry_tree, leaves)


def _read_stacked(column: list[Any]) -> Any:
    """The blocks' parameters of one kind as the stack they are blocks of, or None.

    Inside a compiled step that reads them stacked (``program.Group``) each
    holds a :class:`~state.StackedValue` of one stacked input: that array is
    used as it is (with one gradient tap for all of them), instead of
    stacking the blocks' slices again. None when the column is not exactly
    that (buffers, values of their own, some already read in this gradient).
    """
    if column[0] is None:
        return None
    refs = [state.raw(c) for c in column]
    whole = getattr(refs[0], "stack", None)
    if whole is None or whole.shape[0] != len(column):
        return None
    for b, r in enumerate(refs):
        if type(r) is not state.StackedValue or r.stack is not whole or r.index != b:
            return None
    recorder = state.local.recorder
    if recorder is None or not any(state.requires_grad(c) for c in column):
        return whole
    return recorder.tap_stacked(column, whole)


def _cells(tree: state.TreeState) -> list[Any]:
    """Per slot of ``tree``: its Parameter, or None for a buffer."""
    params = iter(tree.params)
    return [next(params) if k == "param" else None for k in tree.kinds]


def _buffer_owner(tree: state.TreeState, container: dict) -> Module:
    for _, m in tree.named_modules:
        if m.__dict__["_buffers"] is container:
            return m
    raise AssertionError("a buffer slot without its module")  # pragma: no cover


def _check_carry(x: Any, out: Any) -> list[Any]:
    """A block's output must be a valid next input: its leaves, checked against ``x``'s."""
    leaves, tree = jax.tree_util.tree_flatten(x, is_leaf=state.is_cell)
    out_leaves, out_tree = jax.tree_util.tree_flatten(out, is_leaf=state.is_cell)
    if out_tree != tree:
        raise TypeError(
            "jm.nn.scan: a block's output must have the structure of its first input (the "
            f"carry passed from block to block), but the input is {tree} and the output "
            f"{out_tree}. Return the new carry only (pass the other arguments after it; "
            "they reach every block unchanged)."
        )
    out_leaves = [state.value(o) for o in out_leaves]
    for i, (a, b) in enumerate(zip(leaves, out_leaves)):
        a = state.value(a)
        if not hasattr(b, "shape") or tuple(jnp.shape(a)) != tuple(b.shape):
            raise TypeError(
                "jm.nn.scan: a block's output must have the shape of its input (the carry "
                f"passed from block to block): input leaf {i} has shape {jnp.shape(a)}, the "
                f"output {getattr(b, 'shape', type(b).__name__)}"
            )
        if jnp.result_type(a) != b.dtype:
            raise TypeError(
                f"jm.nn.scan: a block turns input dtype {jnp.result_type(a)} into {b.dtype}; "
                "the carry passed from block to block must keep its dtype. Cast the input "
                "first."
            )
    return out_leaves


def _staged() -> bool:
    """Whether this call is being staged into a program (``jax.jit``, ``jm.compile``,
    ``model.compile()``, a scan or checkpoint region), under any other transformation.

    Outside one (eager code, ``jm.backward`` run eagerly) nothing is compiled, so there
    is no compile time to save: the blocks then run one by one, as PyTorch runs them.
    """
    trace = _jx.current_trace()
    while trace is not None:
        if isinstance(trace, _jx.EvalTrace):
            return False
        if isinstance(trace, _jx.DynamicJaxprTrace):
            return True
        trace = _jx.parent_trace(trace)
    return True


def scan(blocks: Iterable[Module] | Module, *, unroll: int | bool = 1) -> Scan:
    """Run structurally identical blocks as one ``jax.lax.scan``: depth-independent compile time.

    ``scan(blocks)(x, *args)`` computes ``for block in blocks: x = block(x,
    *args)``: the same outputs, gradients (each block's ``.grad``), buffer
    updates and dropout draws, but the compiled program holds one block,
    run once per block over the blocks' stacked state. Inside a
    ``jm.compile`` training step the blocks' parameters are read, updated by
    the optimizer and written back stacked, one array per kind (each block's
    ``Parameter`` then holds its block of it until read), so the program's
    inputs, outputs and XLA kernels do not grow with depth; what still does
    is Python bookkeeping per Parameter (gradients, optimizer state, which
    stay per block as PyTorch's). See ``benchmarks/scan.py`` for the measured
    trace+compile time of 48 blocks against 4.

    The blocks stay child modules under their own names, so ``state_dict()``
    keys and values are the unscanned ones and PyTorch weights load
    unchanged: replace ``self.h = nn.ModuleList(blocks)`` by ``self.h =
    jm.nn.scan(nn.ModuleList(blocks))`` and the loop ``for block in self.h: x
    = block(x)`` by ``x = self.h(x)``. See :class:`Scan` for what the blocks
    must satisfy (identical structure, output shaped like the input, no
    hooks on the blocks) and the errors otherwise.

    Eagerly (outside any compiled program, ``jm.backward`` included) the
    blocks run one by one, op by op as PyTorch runs them: nothing is
    compiled there, so there is no compile time to save. Inside ``jm.compile``,
    ``model.compile()``, or ``jax.jit`` through ``jm.func.functional_call``,
    they run as the scan. The requirements below are checked in both cases.

    Args:
        blocks: a ``ModuleList`` or ``Sequential`` (or a list) of modules of
            identical structure.
        unroll: passed to ``jax.lax.scan`` (how many blocks per loop
            iteration in the compiled program).

    Returns:
        A :class:`Scan` module holding the blocks.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> blocks = jm.nn.ModuleList([jm.nn.Linear(4, 4) for _ in range(3)])
    >>> h = jm.nn.scan(blocks)
    >>> x = jnp.ones((2, 4))
    >>> unrolled = x
    >>> for block in blocks:
    ...     unrolled = block(unrolled)
    >>> bool(jnp.allclose(h(x), unrolled, atol=1e-6))
    True
    >>> list(h.state_dict())[:2]
    ['0.weight', '0.bias']
    """
    return Scan(blocks, unroll=unroll)
