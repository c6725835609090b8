"""``Optimizer``: PyTorch's optimizer interface, with optax doing the arithmetic.

Two kinds share this interface:

* ``Optimizer(params, transformation)`` wraps any optax transformation. Each
  param group is one pytree (the list of its parameters) with one optax
  state, exactly as optax would run it.
* The PyTorch optimizers (``SGD``, ``Adam``, ...) subclass
  :class:`TorchOptimizer`: one optax state per parameter, because PyTorch keeps
  state (and the ``step`` count) per parameter, creates it on the first step
  a parameter has a gradient, and skips parameters whose ``.grad`` is None.
  Each builds its optax chain from the group's options with
  ``_transformation`` and names the optax state leaves with PyTorch's names
  (``exp_avg``, ``momentum_buffer``, ...), so ``state_dict()`` has PyTorch's
  layout.

State lives in plain dicts of arrays (the optax state tree flattened, its
treedef kept aside), and hyper-parameters (``lr``, ``betas``, ...) are held
as one array per group (float32; float64 when the group holds a float64
parameter), refreshed when the Python values change.
That is what ``jm.compile`` binds (``_jm_describe``): a compiled training
step reads the learning rate as an input, so a scheduler changing it never
recompiles.
"""

from __future__ import annotations

import logging
import operator
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jmodule._lowering import flat as _flat
from jmodule._lowering import jaxprs as _jaxprs
from jmodule._lowering import quick as _quick
from jmodule._lowering import state as _state
from jmodule._lowering import structure
from jmodule._lowering import tracebacks as _tracebacks
from jmodule.autograd import step_closure
from jmodule.nn.parameter import Parameter, as_array
from jmodule.optim._packed import (
    Bucket,
    PackedState,
    SharedBucket,
    packable,
    place_of,
    replicated_like,
)

logger = logging.getLogger("jmodule.optim")

__all__ = ["Optimizer", "ParamsT", "TorchOptimizer"]

ParamsT = Iterable[Parameter] | Iterable[tuple[str, Parameter]] | Iterable[dict[str, Any]]

NOT_GIVEN_HELP = (
    "{cls}.step() ran inside a compiled function that was not given the optimizer, so "
    "its state could not be carried in and out of the program. Pass the optimizer as an "
    "argument: `@jm.compile def train_step(model, opt, x, y): ...`."
)
CHANGED_INSIDE_HELP = (
    "{what} changed inside a compiled function. A compiled step reads the optimizer's "
    "options as inputs when it is called, so a change made while it runs would be lost. "
    "Change them (or step the LR scheduler) outside the compiled function."
)


def _stacked_runs(raws: list) -> tuple[tuple[int, int], ...]:
    """``(first, count)`` of each run of consecutive members holding the blocks of one stack.

    Inside a compiled step over scanned blocks, the blocks' parameters of one
    kind hold :class:`~jmodule._lowering.state.StackedValue` blocks of one
    stacked input (``_lowering/program.Group``); the packing lays them out
    consecutively, in block order (:func:`_scan_order`), so their values are
    the stacked array's elements in order: one piece of the flat layout.
    """
    runs = []
    i, n = 0, len(raws)
    while i < n:
        r = raws[i]
        if type(r) is _state.StackedValue and r.index == 0:
            whole, count = r.stack, r.stack.shape[0]
            if i + count <= n and all(
                type(raws[i + b]) is _state.StackedValue
                and raws[i + b].stack is whole
                and raws[i + b].index == b
                for b in range(count)
            ):
                runs.append((i, count))
                i += count
                continue
        i += 1
    return tuple(runs)


def _pieces(members: Sequence[Parameter], raws: list, runs: tuple) -> list[Any]:
    """The members' values, each run of blocks of one stack as that stacked array."""
    out: list[Any] = []
    starts = dict(runs)
    i = 0
    while i < len(members):
        if i in starts:
            out.append(raws[i].stack)
            i += starts[i]
        else:
            out.append(_state.peek(members[i]))
            i += 1
    return out


def _apply_pieces(bucket: Bucket, runs: tuple, values: list, updates: Any) -> list[Any]:
    """The new value of each piece: ``optax.apply_updates`` of its part of ``updates``."""
    out = []
    starts = dict(runs)
    member = 0
    for v in values:
        count = starts.get(member, 1)
        s = bucket.starts[member]
        n = sum(bucket.sizes[member : member + count])
        u = jnp.reshape(updates[s : s + n], v.shape)
        out.append(optax.apply_updates(v, u))
        member += count
    return out


def _assign_pieces(members: Sequence[Parameter], runs: tuple, new_values: list) -> None:
    """Write each piece's new value back: a run's blocks as blocks of its new stack."""
    starts = dict(runs)
    member = 0
    for v in new_values:
        count = starts.get(member)
        if count is None:
            _state.assign(members[member], v)
            member += 1
        else:
            for b in range(count):
                _state.assign(members[member + b], _state.StackedValue(v, b))
            member += count


def _scan_key(p: Parameter) -> tuple | None:
    """``(scan module id, path in the block, block index)`` of a scanned block's parameter.

    Found through the parent links a module tree's enumeration leaves
    (``state.link``): None when ``p`` is not (only) in one ``jm.nn.scan`` block.
    """
    child = _only_module_above(p)
    name = None if child is None else _only_name(child.__dict__["_parameters"], p)
    if name is None:
        return None
    path = [name]
    for _ in range(64):
        parent = _only_module_above(child)
        key = None if parent is None else _only_name(parent.__dict__["_modules"], child)
        if key is None:
            return None
        if getattr(type(parent), "_jm_stacked", False):
            blocks = [k for k, c in parent.__dict__["_modules"].items() if c is not None]
            return (id(parent), tuple(path), blocks.index(key))
        path = [key, *path]
        child = parent
    return None


def _only_module_above(obj: Any) -> Any | None:
    """The one module whose enumeration linked ``obj`` (``state.link``), or None."""
    found = [m for m in obj.__dict__.get("_jm_up", ()) if "_modules" in m.__dict__]
    return found[0] if len(found) == 1 else None


def _only_name(entries: dict, obj: Any) -> str | None:
    """The one name under which ``entries`` holds ``obj``, or None."""
    names = [n for n, q in entries.items() if q is obj]
    return names[0] if len(names) == 1 else None


def _scan_order(members: list[Parameter]) -> list[Parameter]:
    """``members`` with scanned blocks' parameters of one kind together, in block order.

    So that a compiled step over ``jm.nn.scan`` blocks finds each kind's
    parameters as one consecutive run of the flat layout (the stacked array's
    elements in order, see :func:`_stacked_runs`). Other members keep their
    order; the layout is internal (``state_dict()`` is per parameter).
    """
    keys = [_scan_key(p) for p in members]
    if not any(keys):
        return members
    first: dict[tuple, int] = {}
    order = []
    for i, (p, k) in enumerate(zip(members, keys)):
        if k is None:
            order.append(((i, 0), p))
        else:
            kind = k[:2]
            order.append(((first.setdefault(kind, i), k[2]), p))
    order.sort(key=lambda t: t[0])
    return [p for _, p in order]


def _hyper_dtype(params: list) -> Any:
    """The dtype of a group's hyper-parameter array: float64 if a parameter is float64."""
    wide = any(jnp.dtype(_state.raw(p).dtype) == jnp.float64 for p in params)
    return np.float64 if wide else np.float32


def _leaf_name(path: tuple) -> tuple[str, ...]:
    """``(DictKey('adam'), GetAttrKey('mu'))`` -> ``('adam', 'mu')``."""
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
    return tuple(out)


class _Seen(NamedTuple):
    """What an optimizer's last description was made from."""

    version: int
    parted: int
    #: The optimizer's structure version (moves when a parameter's requires_grad does).
    own: int
    #: Per param group: the group dict, its option values, its number of parameters.
    groups: tuple[tuple[dict, tuple, int], ...]


class Record(NamedTuple):
    """One parameter's optimizer state: the options it was made for, and its state dicts."""

    cfg: tuple
    #: Its state under PyTorch's names (``state[p]`` once it has stepped).
    public: dict[str, Any]
    #: optax leaves PyTorch does not save.
    hidden: dict[str, Any]


class Optimizer:
    """PyTorch's optimizer interface over an optax transformation.

    ``Optimizer(params, transformation)`` runs ``transformation`` (any
    ``optax.GradientTransformation``) on each param group, with the group's
    parameters as one pytree (a list) and one optax state per group. As in
    PyTorch, a parameter whose ``.grad`` is None is not changed; since an
    optax transformation sees the whole group at once, it is given a zero
    gradient for it (its state entries still advance). A group where no
    parameter has a gradient is skipped entirely.

    The transformation holds its own hyper-parameters, so the groups have no
    ``lr`` for ``lr_scheduler`` to change: schedule inside optax instead
    (``optax.adam(optax.cosine_decay_schedule(1e-3, 1000))``).

    Args:
        params: an iterable of Parameters, of ``(name, Parameter)`` pairs, or
            of dicts defining param groups (``{"params": [...]}``).
        transformation: the optax transformation.

    >>> import jax.numpy as jnp, optax
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.ones(2))
    >>> opt = jm.optim.Optimizer([w], optax.sgd(0.5))
    >>> w.grad = jnp.ones(2)
    >>> opt.step()
    >>> w.data
    Array([0.5, 0.5], dtype=float32)
    """

    #: ``(name, group key, index)`` of the float options held as arrays.
    _hyper: tuple[tuple[str, str, int | None], ...] = ()

    def __init__(self, params: ParamsT, transformation: Any):
        if isinstance(transformation, optax.GradientTransformation):
            self._tx: optax.GradientTransformation | None = transformation
            defaults: dict[str, Any] = {}
        elif isinstance(transformation, dict) and isinstance(self, TorchOptimizer):
            self._tx = None
            defaults = transformation
        else:
            raise TypeError(
                "Optimizer(params, transformation) takes an optax.GradientTransformation "
                f"(e.g. optax.adam(1e-3)); got {type(transformation).__name__}"
            )
        self.defaults = defaults
        self.state: defaultdict[Parameter, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        self._hp: dict[str, jax.Array] = {}  # slot container: one array per group
        self._hp_floats: dict[str, tuple[float, ...]] = {}
        self._jitted: dict[Any, Callable] = {}
        self._version = 0
        self._desc_sig: Any = None
        self._desc: structure.Description | None = None
        #: What the last describe saw (the per-call path compares it).
        self._seen: _Seen | None = None
        #: Bumped when packed members' step counts part ways (see ``_packed.Bucket``).
        self._parted = 0
        self._opt_called = False
        self._init_storage()
        if isinstance(params, (jax.Array, Parameter)):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Parameters "
                f"or dicts, but got {type(params).__name__}"
            )
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # ------------------------------------------------------------------ groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group (with its own options) to ``param_groups``.

        Args:
            param_group: ``{"params": [...], **options}``; options not given
                take the optimizer's defaults.

        Raises:
            TypeError: not a dict, a set of params, or a non-Parameter.
            ValueError: a parameter already in another group, or names given
                for some parameters but not others.
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Parameter):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        else:
            params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        params = [p[1] if isinstance(p, tuple) else p for p in params]
        if names:
            if len(names) != len(params):
                raise ValueError(
                    "all optimizer params should be with/without names. Some param names are "
                    "missing"
                )
            param_group["param_names"] = names
        param_group["params"] = params
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(
                    "optimizer can only optimize Parameters, but one of the params is "
                    f"{type(p).__module__}.{type(p).__qualname__} (wrap arrays in "
                    "jm.nn.Parameter so the optimizer can update them in place)"
                )
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        if len({id(p) for p in params}) != len(params):
            warnings.warn(
                "optimizer contains a parameter group with duplicate parameters; in future, this "
                "will cause an error; see github.com/pytorch/pytorch/issues/40967 for more "
                "information",
                stacklevel=3,
            )
        seen: set[int] = set()
        for group in self.param_groups:
            seen.update(id(p) for p in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                which = "with names" if "param_names" in param_group else "without names"
                raise ValueError(
                    "all optimizer param groups should be with/without names. "
                    f"cannot add param group {which} to the optimizer"
                )
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        for p in params:  # a change of requires_grad moves this optimizer's version
            _state.link(p, self)
        self.param_groups.append(param_group)
        self._version += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the ``.grad`` of every parameter (set it to None, or to zeros).

        >>> import jax.numpy as jnp
        >>> import jmodule as jm
        >>> w = jm.nn.Parameter(jnp.ones(2))
        >>> w.grad = jnp.ones(2)
        >>> jm.optim.SGD([w], lr=0.1).zero_grad()
        >>> w.grad is None
        True
        """
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None  # without reading it: a compiled step then needs no old grads
                elif p.grad is not None:
                    p.grad = jnp.zeros_like(p.grad)

    # ------------------------------------------------------------------ step

    @_tracebacks.entry
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a ``.grad``; return the closure's loss.

        Args:
            closure: optional. A PyTorch-style closure (it calls
                ``opt.zero_grad()`` and ``jm.backward(...)`` itself) is run
                once and its loss returned. A closure that only returns the
                loss is differentiated for you, as ``opt.zero_grad()`` then
                ``jm.backward(closure)`` would (once, in one pass). Which kind
                it is shows while it runs: one that calls ``jm.backward``
                (under any name, at any depth, or inside a ``jm.compile``'d
                function it calls) is PyTorch style.

        Returns:
            The closure's loss, or None without a closure.

        Raises:
            RuntimeError: a PyTorch-style closure computed with the
                parameters before its ``jm.backward`` and the gradients
                depend on that (PyTorch would differentiate it, jmodule
                cannot), including a value passed to a compiled function
                that runs ``jm.backward``.

        >>> import jax.numpy as jnp
        >>> import jmodule as jm
        >>> model = jm.nn.Linear(2, 1)
        >>> opt = jm.optim.SGD(model.parameters(), lr=0.1)
        >>> fwd_bwd = jm.compile(lambda m, x: jm.backward(lambda: (m(x) ** 2).mean()))
        >>> def closure():
        ...     opt.zero_grad()
        ...     return fwd_bwd(model, jnp.ones((4, 2)))
        >>> losses = [float(opt.step(closure)) for _ in range(3)]
        >>> losses[2] < losses[1] < losses[0]
        True
        """
        loss = None
        if closure is not None:
            loss = self._run_closure(closure)
        self._opt_called = True
        stepped = False
        for i, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                stepped = True
                self._step_group(i, group, params)
        if not stepped and _state.tracing() and not self.__dict__.get("_jm_told_no_grads"):
            self.__dict__["_jm_told_no_grads"] = True  # once per optimizer
            logger.info(
                "%s.step() in a compiled function found no parameter with a .grad, so it "
                "changed nothing (as in PyTorch). Compute the gradients first in the same "
                "function: loss = jm.backward(lambda: loss_fn(model(x), y)); opt.step().",
                type(self).__name__,
            )
        return loss

    def _run_closure(self, closure: Callable[[], Any]) -> Any:
        mine = [p for group in self.param_groups for p in group["params"]]
        try:
            return step_closure(closure, mine)
        except BaseException:
            for p in mine:  # back to what zero_grad() leaves (no stray tracers)
                if isinstance(p.grad, jax.core.Tracer) and not _state.is_bound(p.__dict__):
                    p.grad = None
            raise

    def _hyper_array(self, i: int, group: dict[str, Any]) -> jax.Array | None:
        """The group's hyper-parameters as one array (the bound one when compiled).

        float32, or float64 when the group holds a float64 parameter (x64 on), so
        that ``lr=0.1`` is float64's 0.1 for a float64 model, as in PyTorch.
        """
        if not self._hyper:
            return None
        key = str(i)
        if _state.is_bound(self._hp):
            floats = self._hyper_floats(group)
            if floats != self._hp_floats[key]:
                changed = next(
                    gk
                    for (_, gk, _), a, b in zip(self._hyper, floats, self._hp_floats[key])
                    if a != b
                )
                what = f"param_groups[{i}]['{changed}'] was"
                raise RuntimeError(CHANGED_INSIDE_HELP.format(what=what))
            return self._hp[key]
        self._refresh_hyper(key, group)
        return self._hp[key]

    def _hyper_floats(self, group: dict[str, Any]) -> tuple[float, ...]:
        return tuple(float(group[k] if j is None else group[k][j]) for _, k, j in self._hyper)

    def _refresh_hyper(self, key: str, group: dict[str, Any]) -> None:
        floats = self._hyper_floats(group)
        if self._hp_floats.get(key) != floats:
            self._hp_floats[key] = floats
            params = group["params"]  # may be empty (a group whose parameters come later)
            self._hp[key] = replicated_like(
                np.asarray(floats, dtype=_hyper_dtype(params)),
                _state.peek(params[0]) if params else None,
            )

    def _check_bound(self, container: dict, value: Any) -> None:
        if isinstance(value, jax.core.Tracer) and not _state.is_bound(container):
            raise RuntimeError(NOT_GIVEN_HELP.format(cls=type(self).__name__))

    def _jit(self, key: Any, make: Callable[[], Callable]) -> Callable:
        fn = self._jitted.get(key)
        if fn is None:
            fn = self._jitted[key] = _quick.Jit(make(), False)  # any optax chain: plain
        return fn

    # ------------------------------------------------------------------ jm.compile

    def _jm_traced_effects(self) -> tuple[bool, frozenset[int]]:
        """After a ``jm.compile``'d call that traced: what its Python did to this optimizer.

        ``step()`` marks the optimizer stepped (the schedulers' order check reads it)
        and makes ``state[p]`` visible; that Python runs once, while tracing. A
        program reused for another optimizer of the same structure (a notebook cell
        making model and optimizer again) runs none of it, so the call replays it
        (:meth:`_jm_replay`): ``(stepped, indices of the parameters with state)``.
        """
        return bool(self._opt_called), self._visible()

    def _jm_replay(self, effects: tuple[bool, frozenset[int]]) -> None:
        """Repeat what a reused program's trace reported (:meth:`_jm_traced_effects`)."""
        called, visible = effects
        if called:
            self._opt_called = True
        self._show(visible)

    def _visible(self) -> frozenset[int]:
        """Indices (in group order) of the parameters whose ``state`` entry is visible."""
        return frozenset()

    def _show(self, visible: frozenset[int]) -> None:
        """Make the ``state`` entries of the parameters at ``visible`` visible."""

    def _jm_describe(self) -> structure.Description:
        """Structure key and state slots, for ``jm.compile`` (cached; cheap per call)."""
        seen = self._seen
        if (
            seen is not None
            and seen.version == self._version
            and seen.parted == self._parted
            and seen.own == self.__dict__.get("_jm_version", 0)
            and len(seen.groups) == len(self.param_groups)
        ):
            # The per-call path: every option is the very object seen last time.
            for g, (ref, items, n) in zip(self.param_groups, seen.groups):
                if g is not ref or len(g) != len(items) or len(g["params"]) != n:
                    break
                if not all(map(operator.is_, items, g.values())):
                    break
            else:
                return self._desc  # type: ignore[return-value]
        sig = (self._version, self._structure_key(), self._parted, _state.version(self))
        if sig != self._desc_sig:
            self._prepare_all()
            sig = (self._version, self._structure_key(), self._parted, _state.version(self))
            slots: list = []
            names: list[str] = []
            index = 0
            for i, group in enumerate(self.param_groups):
                for p in group["params"]:
                    slots += [_state.value_slot(p), _state.grad_slot(p)]
                    names += [f"params[{index}]", f"params[{index}].grad"]
                    index += 1
                if self._hyper:
                    self._refresh_hyper(str(i), group)
                    slots.append((self._hp, str(i)))
                    names.append(f"param_groups[{i}].hyper")
            state_slots, state_names = self._state_slots()
            key = ("jm.optim", type(self).__qualname__, self._tx, sig[1], self._layout_key())
            self._desc = structure.stateful(key, slots + state_slots, names + state_names)
            self._desc_sig = sig
        elif self._hyper:
            for i, group in enumerate(self.param_groups):
                self._refresh_hyper(str(i), group)
        self._seen = _Seen(
            self._version,
            self._parted,
            self.__dict__.get("_jm_version", 0),
            tuple(
                (g, tuple(g.values()), len(g["params"]))
                if not any(isinstance(v, (list, dict, set)) and k != "params" for k, v in g.items())
                else (g, (object(),), -1)  # a mutable option: check it fully every call
                for g in self.param_groups
            ),
        )
        return self._desc

    def _structure_key(self) -> tuple:
        return tuple(len(g["params"]) for g in self.param_groups)

    def _layout_key(self) -> tuple:
        """What else the compiled update depends on (the packed layout, for TorchOptimizer)."""
        return ()

    # ------------------------------------------------------------------ state dicts

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state, in PyTorch's layout.

        ``{"state": {index: {name: array}}, "param_groups": [{**options,
        "params": [index, ...]}]}``, parameters numbered in group order. An
        ``Optimizer(params, transformation)`` keeps one optax state per group,
        under ``"optax_state"`` (one ``{leaf path: array}`` per group).

        >>> import jax.numpy as jnp
        >>> import jmodule as jm
        >>> w = jm.nn.Parameter(jnp.ones(2))
        >>> opt = jm.optim.Adam([w])
        >>> w.grad = jnp.ones(2)
        >>> opt.step()
        >>> sorted(opt.state_dict()["state"][0])
        ['exp_avg', 'exp_avg_sq', 'step']
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        return {**self._packed_state(index), "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` (or from ``torch.optim`` of the same kind).

        Everything is checked first; when anything is wrong, nothing changes
        and the error lists every problem.

        Raises:
            ValueError: the groups or the state do not match this optimizer.
        """
        saved_groups = [dict(g) for g in state_dict["param_groups"]]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(
            len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, saved_groups)
        ):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of "
                "optimizer's group"
            )
        id_map: dict[Any, Parameter] = {}
        for g, s in zip(self.param_groups, saved_groups):
            id_map.update(zip(s["params"], g["params"]))
        new_groups = []
        for g, s in zip(self.param_groups, saved_groups):
            s = {k: (list(v) if isinstance(v, list) else v) for k, v in s.items()}
            s["params"] = g["params"]
            if "param_names" in g and "param_names" not in s:
                s["param_names"] = g["param_names"]
            new_groups.append(s)
        apply = self._check_state(state_dict, new_groups, id_map)
        self.param_groups[:] = new_groups
        apply()
        self._version += 1

    def __getstate__(self) -> dict:
        return _state.without_private(self.__dict__)

    def __setstate__(self, saved: dict) -> None:
        self.__dict__.update(saved)
        for group in self.param_groups:
            for p in group["params"]:
                _state.link(p, self)

    def __repr__(self) -> str:
        out = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            out += f"\nParameter Group {i}\n"
            for key in sorted(group):
                if key != "params":
                    out += f"    {key}: {group[key]}\n"
        return out + ")"

    # ------------------------------------------------------------------ one optax state per group

    def _init_storage(self) -> None:
        #: Per group: the flattened optax state (a slot container) and its treedef.
        self._group_state: dict[int, dict[str, Any]] = {}
        self._group_treedef: dict[int, Any] = {}

    def _group_init(self, i: int, group: dict[str, Any]) -> None:
        tx = self._tx
        assert tx is not None
        tree = tx.init([_state.peek(p) for p in group["params"]])
        flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
        self._group_state[i] = {jax.tree_util.keystr(path): leaf for path, leaf in flat}
        self._group_treedef[i] = treedef
        self._version += 1

    def _prepare_all(self) -> None:
        for i, group in enumerate(self.param_groups):
            if i not in self._group_state:
                self._group_init(i, group)

    def _step_group(self, i: int, group: dict[str, Any], params: list[Parameter]) -> None:
        if i not in self._group_state:
            if any(isinstance(_state.peek(p), jax.core.Tracer) for p in group["params"]):
                raise RuntimeError(NOT_GIVEN_HELP.format(cls=type(self).__name__))
            self._group_init(i, group)
        store = self._group_state[i]
        if store:  # a stateless transformation (optax.sgd) has nothing to carry
            self._check_bound(store, _state.peek(params[0]))
        treedef = self._group_treedef[i]
        keys = tuple(store)  # treedef order (a dict argument comes back key-sorted)
        tx = self._tx

        def make() -> Callable:
            def update(values: list, grads: list, leaves: dict) -> tuple[list, dict]:
                old = [leaves[k] for k in keys]
                full = [jnp.zeros_like(v) if g is None else g for v, g in zip(values, grads)]
                updates, new_state = tx.update(full, treedef.unflatten(old), values)
                new_values = [
                    v if g is None else optax.apply_updates(v, u)
                    for v, g, u in zip(values, grads, updates)
                ]
                new_leaves = jax.tree_util.tree_leaves(new_state)
                return new_values, {k: n.astype(o.dtype) for k, o, n in zip(keys, old, new_leaves)}

            return update

        members = group["params"]
        values = [_state.peek(p) for p in members]
        grads = [p.grad for p in members]
        new_values, new_leaves = self._jit(("group", i, treedef, keys), make)(values, grads, store)
        for p, v in zip(members, new_values):
            if p.grad is not None:
                _state.assign(p, v)
        store.update(new_leaves)

    def _state_slots(self) -> tuple[list, list[str]]:
        slots, names = [], []
        for i, store in self._group_state.items():
            for k in store:
                slots.append((store, k))
                names.append(f"optax_state[{i}]{k}")
        return slots, names

    @property
    def optax_state(self) -> list[Any]:
        """Each group's optax state as optax's own pytree (``Optimizer(params, tx)`` only)."""
        return [
            self._group_treedef[i].unflatten(list(self._group_state[i].values()))
            for i in sorted(self._group_state)
        ]

    def _packed_state(self, index: dict[int, int]) -> dict[str, Any]:
        return {
            "state": {},
            "optax_state": [
                dict(self._group_state.get(i, {})) for i in range(len(self.param_groups))
            ],
        }

    def _check_state(
        self, state_dict: dict[str, Any], groups: list[dict[str, Any]], id_map: dict
    ) -> Callable[[], None]:
        saved = state_dict.get("optax_state")
        if saved is None:
            raise ValueError("loaded state dict has no 'optax_state' (one entry per param group)")
        problems = []
        fresh: dict[int, dict[str, Any]] = {}
        treedefs: dict[int, Any] = {}
        for i, group in enumerate(groups):
            tree = self._tx.init([_state.peek(p) for p in group["params"]])
            flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
            want = {jax.tree_util.keystr(path): leaf for path, leaf in flat}
            got = saved[i] if i < len(saved) else {}
            if not got:  # never stepped when saved
                continue
            for k in want.keys() - got.keys():
                problems.append(f"optax_state[{i}]: missing {k}")
            for k in got.keys() - want.keys():
                problems.append(f"optax_state[{i}]: unexpected {k}")
            for k in want.keys() & got.keys():
                value = as_array(got[k])
                if value.shape != want[k].shape:
                    problems.append(
                        f"optax_state[{i}]{k}: shape {tuple(value.shape)} in the state dict, "
                        f"{tuple(want[k].shape)} here"
                    )
            fresh[i] = {
                k: as_array(got[k]).astype(want[k].dtype) if k in got else v
                for k, v in want.items()
            }
            treedefs[i] = treedef
        if problems:
            raise ValueError("Error(s) in loading state_dict:\n\t" + "\n\t".join(problems))

        def apply() -> None:
            self._group_state.clear()
            self._group_state.update(fresh)
            self._group_treedef.update(treedefs)

        return apply


#: The compiled updates of the PyTorch optimizers, keyed by class, hyper-parameter names and
#: structure (``TorchOptimizer._shared_jit``): a cache of programs keyed by what they compute.
_UPDATES: dict[tuple, Callable] = {}
#: The state leaves' shapes of a class's chain on a probe, by structure and dtype
#: (``TorchOptimizer._classify``).
_PROBED: dict[tuple, tuple] = {}
#: The initial state of a class's chain for a parameter type, by structure (``_initial``):
#: its treedef, leaf paths and, per leaf, the scalar constant it is filled with (or None).
_INITS: dict[tuple, tuple] = {}
_MAX_INITS = 4096


def _initial(init: Callable, value: Any, key: tuple) -> tuple[Any, list] | None:
    """``init(value)``'s treedef and ``(path, leaf)`` pairs made on the host, or None.

    An optax state starts as constants (zeros, counts at 0, Adagrad's initial
    accumulator): read off ``init``'s jaxpr once per structure and parameter
    type, they are filled in NumPy and put where ``init`` would put them (the
    parameter's placement for leaves of its shape), so a first ``step()``
    compiles no program per parameter shape. None when a leaf is computed
    (``init`` then runs as usual) or ``value`` is not a concrete array.
    """
    if not isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer):
        return None
    k = (*key, value.shape, value.dtype)
    entry = _INITS.get(k)
    if entry is None:
        probe = jax.ShapeDtypeStruct(value.shape, value.dtype)  # a value would be staged
        closed, shapes = jax.make_jaxpr(init, return_shape=True)(probe)
        leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
        consts = _jaxprs.constant_outputs(closed)
        entry = (treedef, [p for p, _ in leaves], [consts.get(j) for j in range(len(leaves))])
        if len(_INITS) >= _MAX_INITS:
            _INITS.clear()
        _INITS[k] = entry
    treedef, paths, consts = entry
    if any(c is None for c in consts):
        return None
    made = []
    for fill, shape, dtype in consts:
        host = np.full(shape, fill, dtype)
        like = shape == value.shape and value.committed
        made.append(jax.device_put(host, value.sharding if like else None))
    return treedef, list(zip(paths, made))


class TorchOptimizer(Optimizer):
    """Base of the PyTorch optimizers: one optax state per parameter, PyTorch's names.

    Subclasses define :meth:`_structure` (the group options that shape the
    program, hashable), :meth:`_transformation` (the optax chain for a group,
    built from the structure, the hyper-parameter values and the parameter's
    previous state), ``_hyper`` (the float options held as arrays),
    ``_state_names`` (``(chain label, optax field) -> PyTorch name``) and
    ``_state_order`` (PyTorch's key order).

    ``state[p]`` is a live dict of ``p``'s optax state under PyTorch's names
    (writing to it changes the next step, as in PyTorch). Its ``step`` is
    optax's int32 count; ``state_dict()`` reports it as float32, as PyTorch
    stores it, and ``load_state_dict`` converts back. Optax leaves PyTorch does
    not save (SGD's dampening count) live outside ``state`` and are derived on
    load.
    """

    _state_names: dict[tuple[str, ...], str] = {}
    _state_order: tuple[str, ...] = ()
    #: Whether its update is elementwise arithmetic (a small one compiles quick eagerly,
    #: ``jmodule/_lowering/quick.py``); False where it multiplies matrices or reduces.
    _elementwise: bool = True

    def __init__(self, params: ParamsT, defaults: dict[str, Any]):
        if defaults.get("differentiable"):
            raise ValueError(
                "differentiable=True is not supported: jmodule optimizers are pure JAX "
                "functions, so differentiate through them with jax.grad instead."
            )
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        raise NotImplementedError(
            f"{type(self).__name__} must define _structure(group): the static options of a "
            "param group (a subclass of TorchOptimizer, such as SGD or Adam, does)"
        )

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        raise NotImplementedError(
            f"{cls.__name__} must define _transformation(cfg, hp, state): the optax "
            "chain of one parameter (a subclass of TorchOptimizer, such as SGD or Adam, does)"
        )

    def _shared_jit(self, key: Any, make: Callable[[], Callable]) -> Callable:
        """The compiled update ``key`` names, shared by every optimizer of this class.

        An update depends on the class (its ``_transformation`` and ``_hyper``)
        and on what ``key`` holds (the structure and the packed layout), never on
        the optimizer: a new optimizer like an earlier one (a notebook cell run
        again, an optimizer per thread) compiles nothing. ``make`` must keep no
        parameter or state alive (buckets give their :meth:`~Bucket.static` copy).
        """
        full = (type(self), self._hyper, key)
        fn = _UPDATES.get(full)
        if fn is None:
            fn = _UPDATES.setdefault(full, _quick.Jit(make(), None if self._elementwise else False))
        return fn

    def _param_structure(self, group: dict[str, Any], p: Parameter) -> tuple:
        """The structure of ``p``'s chain: the group's, unless the state's shape depends on ``p``.

        Adafactor's state is factored for a matrix and not for a vector, so its
        parameters of one group have different structures; such an optimizer
        extends the group's structure here (and keeps its state unpacked).
        """
        return self._structure(group)

    def _derive_hidden(self, cfg: dict[str, Any], public: dict[str, Any], hidden: dict) -> None:
        """Set optax leaves PyTorch does not save, after loading ``public`` from a state dict."""

    # ------------------------------------------------------------------ per-parameter state

    def _init_storage(self) -> None:
        #: Per parameter: (structure, public dict (= state[p] once live), hidden dict).
        self._records: dict[Parameter, Record] = {}
        self._layouts: dict[tuple, tuple[Any, tuple[tuple[bool, str], ...]]] = {}
        #: Small parameters whose state is packed (see ``_packed.py``): buckets per
        #: group index, and each packed parameter's ``(bucket, position)``.
        self._buckets: dict[int, list[Bucket]] = {}
        self._packed: dict[Parameter, tuple[Bucket, int]] = {}
        self._organized: Any = None

    def _layout(self, cfg: tuple, value: Any) -> tuple[Any, tuple[tuple[bool, str], ...], Any]:
        """Treedef, leaf naming and a fresh optax state for a parameter under ``cfg``."""
        hp = {n: 0.0 for n, _, _ in self._hyper}  # an init never reads them
        init = self._transformation(dict(cfg), hp, None).init
        made = _initial(init, value, (type(self), self._hyper, cfg))
        if made is None:
            flat, treedef = jax.tree_util.tree_flatten_with_path(init(value))
        else:
            treedef, flat = made
        layout = []
        for path, _ in flat:
            key = _leaf_name(path)
            name = self._state_names.get(key)
            layout.append((True, name) if name else (False, ".".join(key)))
        self._layouts[cfg] = (treedef, tuple(layout))
        return treedef, tuple(layout), [leaf for _, leaf in flat]

    def _fresh(self, cfg: tuple, value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        _, layout, leaves = self._layout(cfg, value)
        public, hidden = {}, {}
        for (is_public, name), leaf in zip(layout, leaves):
            (public if is_public else hidden)[name] = leaf
        order = {n: j for j, n in enumerate(self._state_order)}
        public = dict(sorted(public.items(), key=lambda kv: order.get(kv[0], len(order))))
        return public, hidden

    def _record(self, group: dict[str, Any], p: Parameter) -> tuple:
        """``p``'s record for ``group``'s current structure (made or remade as needed)."""
        cfg = self._param_structure(group, p)
        rec = self._records.get(p)
        if rec is not None and rec.cfg == cfg:
            return rec
        if isinstance(_state.peek(p), jax.core.Tracer):
            if rec is None:
                raise RuntimeError(NOT_GIVEN_HELP.format(cls=type(self).__name__))
            raise RuntimeError(CHANGED_INSIDE_HELP.format(what="A param group's options were"))
        public, hidden = self._fresh(cfg, _state.peek(p))
        if rec is not None:  # options changed: keep the entries that still apply
            for old, new in ((rec.public, public), (rec.hidden, hidden)):
                for k, v in old.items():
                    if k in new and getattr(v, "shape", None) == new[k].shape:
                        new[k] = v
            old_public = rec.public
            old_public.clear()
            old_public.update(public)
            public = old_public
        rec = self._records[p] = Record(cfg, public, hidden)
        self._version += 1
        return rec

    def _visible(self) -> frozenset[int]:
        params = [p for g in self.param_groups for p in g["params"]]
        return frozenset(i for i, p in enumerate(params) if p in self.state)

    def _show(self, visible: frozenset[int]) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        for i in visible:
            p = params[i] if i < len(params) else None
            if p is None or p in self.state:
                continue
            if p in self._packed:
                bucket, j = self._packed[p]
                self.state[p] = PackedState(bucket, j)
            else:
                rec = self._records.get(p)
                if rec is not None:
                    self._materialize(p, rec.public)

    def _materialize(self, p: Parameter, public: Any) -> None:
        """Make ``p``'s state visible in ``state`` (PyTorch keeps none for plain SGD)."""
        if public and self.state.get(p) is not public:
            self.state[p] = public

    def _prepare_all(self) -> None:
        self._organize()

    def _organize(self) -> None:
        """Lay the state out for the current groups and options: records and packed buckets.

        Runs when the groups, their options or the loaded state changed (a
        version and structure check otherwise): buckets are unpacked into
        per-parameter records, records are made or updated for every
        parameter, and the small ones are packed again.
        """
        sig = (self._version, self._structure_key(), _state.version(self))
        if sig == self._organized:
            return
        for buckets in self._buckets.values():
            for bucket in buckets:
                self._dissolve(bucket)
        self._buckets.clear()
        self._packed.clear()
        for group in self.param_groups:
            for p in group["params"]:
                self._record(group, p)
        # a large step: packing's gathers cost more than the arrays it saves (_flat)
        small = _flat.PACK_MAX_TOTAL >= sum(
            _state.peek(p).size for g in self.param_groups for p in g["params"] if p.requires_grad
        )
        for i, group in enumerate(self.param_groups):
            self._buckets[i] = self._pack_group(group, small)
        self._version += 1
        self._organized = (self._version, self._structure_key(), _state.version(self))

    def _dissolve(self, bucket: Bucket) -> None:
        for p, (public, hidden) in zip(bucket.params, bucket.unpack()):
            self._records[p] = Record(bucket.cfg, public, hidden)
            if p in self.state:
                self.state[p] = public

    def _classify(self, cfg: tuple, dtype: Any) -> tuple | None:
        """Which state leaves are one scalar per parameter, for parameters of ``dtype``.

        ``(layout, per_param names)``, or None when the state cannot be packed:
        no state (plain SGD), or an entry that is neither a scalar nor shaped
        like the parameter. Decided on an abstract probe of shape ``(2,)``, so a
        scalar parameter does not make its elementwise entries look per-parameter.
        """
        key = (type(self), self._hyper, cfg, jnp.dtype(dtype))
        shapes = _PROBED.get(key)  # (tracing the chain's init each time is most of it)
        if shapes is None:
            probe = jax.ShapeDtypeStruct((2,), dtype)
            hp = {n: 0.0 for n, _, _ in self._hyper}
            tree = jax.eval_shape(self._transformation(dict(cfg), hp, None).init, probe)
            shapes = tuple(leaf.shape for leaf in jax.tree_util.tree_leaves(tree))
            _PROBED[key] = shapes
        if not shapes or any(shape not in ((), (2,)) for shape in shapes):
            return None
        if cfg not in self._layouts:
            self._layout(cfg, jnp.zeros((2,), dtype))
        _, layout = self._layouts[cfg]
        per_param = frozenset(n for (_, n), shape in zip(layout, shapes) if shape == ())
        return layout, per_param

    def _pack_group(self, group: dict[str, Any], small: bool) -> list[Bucket]:
        """Lay out the group's state in buckets (see ``_packed.py``).

        Small parameters on one device with one dtype (two or more) are packed
        flat when the optimizer's are ``small`` (at most
        :data:`~jmodule._lowering.flat.PACK_MAX_TOTAL` elements in all); the
        others on the same devices (two or more) share their step counts in a
        :class:`SharedBucket`.
        """
        cfg = self._structure(group)
        flat: dict[tuple, list[Parameter]] = {}
        shared: dict[Any, list[Parameter]] = {}
        for p in group["params"]:
            if p in self._packed or not p.requires_grad:
                continue  # a frozen parameter gets no gradient: it steps, if ever, alone
            value = _state.peek(p)
            where = packable(value) if small else None
            if where is not None:
                flat.setdefault(where, []).append(p)
            elif place_of(value) is not None:
                shared.setdefault((str(value.dtype), place_of(value)), []).append(p)
        for where, members in list(flat.items()):
            if len(members) < 2:  # alone: it may still share its count
                del flat[where]
                value = _state.peek(members[0])
                shared.setdefault((where[0], place_of(value)), []).append(members[0])
        buckets = []
        for kind, together in ((Bucket, flat), (SharedBucket, shared)):
            for (dtype, _), members in together.items():
                if len(members) < 2:
                    continue
                classified = self._classify(cfg, dtype)
                if classified is None:
                    continue
                layout, per_param = classified
                if kind is SharedBucket and not per_param:
                    continue  # nothing to share
                if kind is Bucket:
                    members = _scan_order(members)
                records = [self._records[p][1:] for p in members]  # (public, hidden)
                bucket = kind(
                    cfg, members, layout, per_param, records, list(records[0][0]), self._part
                )
                for j, p in enumerate(members):
                    del self._records[p]
                    self._packed[p] = (bucket, j)
                    if p in self.state:
                        self.state[p] = PackedState(bucket, j)
                buckets.append(bucket)
        return buckets

    def _structure_key(self) -> tuple:
        return tuple((self._structure(g), len(g["params"])) for g in self.param_groups)

    def _layout_key(self) -> tuple:
        return tuple(
            (i, type(b).__name__, b.shapes, b.uniform)
            for i, buckets in self._buckets.items()
            for b in buckets
        )

    def _part(self) -> None:
        self._parted += 1

    def _state_slots(self) -> tuple[list, list[str]]:
        slots, names = [], []
        index = 0
        for i, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p not in self._packed:
                    _, public, hidden = self._records[p]
                    for kind, store in (("", public), ("~", hidden)):
                        for k in store:
                            slots.append((store, k))
                            names.append(f"state[{index}].{kind}{k}")
                index += 1
            for b, bucket in enumerate(self._buckets.get(i, ())):
                for k, shown in bucket.slots():
                    slots.append((bucket.store, k))
                    names.append(f"param_groups[{i}].packed[{b}].{shown}")
        return slots, names

    def _step_group(self, i: int, group: dict[str, Any], params: list[Parameter]) -> None:
        for p in params:  # the lr must come in as an input, not be baked in
            value = _state.raw(p)  # a block of a stacked value stays unsliced
            self._check_bound(
                self._hp, value.stack if type(value) is _state.StackedValue else value
            )
            self._check_bound(self._hp, p.grad)
        self._organize()
        hp = self._hyper_array(i, group)
        stepping = {id(p) for p in params}
        for bucket in self._buckets.get(i, ()):
            mask = tuple(id(p) in stepping for p in bucket.params)
            if any(mask):
                self._step_bucket(hp, bucket, mask)
        params = [p for p in params if p not in self._packed]
        if not params:
            return
        records = [self._record(group, p) for p in params]
        kinds: dict[tuple, list[int]] = {}  # one kind unless _param_structure tells them apart
        for k, rec in enumerate(records):
            kinds.setdefault(rec.cfg, []).append(k)
        for cfg, ks in kinds.items():
            self._step_params(hp, cfg, [params[k] for k in ks], [records[k] for k in ks])

    def _step_params(
        self, hp: Any, cfg: tuple, params: list[Parameter], records: list[Record]
    ) -> None:
        """One step of unpacked parameters of one structure ``cfg``."""
        treedef, layout = self._layouts[cfg]
        names = [n for n, _, _ in self._hyper]
        transformation = type(self)._transformation

        def make() -> Callable:
            def update(hp_arr, values, grads, publics, hiddens):
                hyper = {n: hp_arr[j] for j, n in enumerate(names)}
                out_values, out_publics, out_hiddens = [], [], []
                for v, g, public, hidden in zip(values, grads, publics, hiddens):
                    leaves = [(public if pub else hidden)[n] for pub, n in layout]
                    tx = transformation(dict(cfg), hyper, public)
                    updates, new_state = tx.update(g, treedef.unflatten(leaves), v)
                    out_values.append(optax.apply_updates(v, updates))
                    new_pub, new_hid = {}, {}
                    for (pub, n), old, new in zip(
                        layout, leaves, jax.tree_util.tree_leaves(new_state)
                    ):
                        (new_pub if pub else new_hid)[n] = new.astype(old.dtype)
                    out_publics.append(new_pub)
                    out_hiddens.append(new_hid)
                return out_values, out_publics, out_hiddens

            return update

        values, publics, hiddens = self._shared_jit(("param", cfg), make)(
            hp,
            [_state.peek(p) for p in params],
            [p.grad for p in params],
            [rec.public for rec in records],
            [rec.hidden for rec in records],
        )
        for p, rec, v, pub, hid in zip(params, records, values, publics, hiddens):
            _state.assign(p, v)
            rec.public.update(pub)
            rec.hidden.update(hid)
            self._materialize(p, rec.public)

    def _step_bucket(self, hp: Any, bucket: Bucket, mask: tuple[bool, ...]) -> None:
        """One step of the bucket's members whose ``mask`` entry is set (those with a grad).

        A flat bucket runs the group's optax chain once over the members'
        concatenated parameters and gradients (the same elementwise arithmetic
        as one chain per parameter); a shared bucket runs it per member. While
        every member has taken the same number of steps (``bucket.uniform``)
        the per-parameter counts are one scalar. Members without a gradient
        keep their values and state, as PyTorch skips them.
        """
        members = bucket.params
        raws = [_state.raw(p) for p in members]
        for p, value in zip(members, raws):
            self._check_bound(
                bucket.store, value.stack if type(value) is _state.StackedValue else value
            )
            if tuple(value.shape) != bucket.shapes[bucket.index[id(p)]]:
                self._organized = None  # lay the state out again on the next call
                raise RuntimeError(
                    f"a parameter of shape {bucket.shapes[bucket.index[id(p)]]} now has shape "
                    f"{tuple(value.shape)}; the optimizer lays its state out again on the next "
                    "step (call it again)"
                )
        treedef, layout = self._layouts[bucket.cfg]
        every = all(mask)
        uniform = bucket.uniform and every
        shared = isinstance(bucket, SharedBucket)
        # Scanned blocks' parameters held as one stacked array (a compiled step's input,
        # see jm.nn.scan): updated as that array, not block by block.
        runs = () if shared or not every else _stacked_runs(raws)
        values = _pieces(members, raws, runs)
        grads = [p.grad if m else None for p, m in zip(members, mask)]
        if shared:
            fn = self._shared_jit(
                ("bucket", bucket.signature(), mask, uniform),
                lambda: self._shared_update(bucket, treedef, layout, mask, uniform),
            )
        else:
            fn = self._shared_jit(
                ("bucket", bucket.signature(), mask, uniform, runs),
                lambda: self._flat_update(bucket, treedef, layout, mask, uniform, runs),
            )
        new_values, new_store = fn(hp, values, grads, bucket.store)
        stepped = [p for p, m in zip(members, mask) if m]
        if runs:
            _assign_pieces(members, runs, new_values)
        else:
            for p, v in zip(stepped, new_values):
                _state.assign(p, v)
        bucket.store.update(new_store)
        for p in stepped:
            if p not in self.state:
                self.state[p] = PackedState(bucket, bucket.index[id(p)])
        if not every and bucket.per_param and bucket.uniform:
            bucket.uniform = False  # the counts part ways: later programs repeat them
            self._part()

    def _flat_update(
        self,
        bucket: Bucket,
        treedef: Any,
        layout: tuple,
        mask: tuple[bool, ...],
        uniform: bool,
        runs: tuple[tuple[int, int], ...] = (),
    ) -> Callable:
        """The update of a flat bucket: one optax chain over the concatenated members.

        ``runs`` (every member stepping): ``(first member, count)`` of the runs
        of members given as one stacked array (see :func:`_stacked_runs`):
        ``values`` then has one entry per run or other member, and so has the
        result.
        """
        cfg, count = bucket.cfg, len(bucket.params)
        bucket = bucket.static()  # the closure keeps no parameter or state alive
        names = [n for n, _, _ in self._hyper]
        transformation = type(self)._transformation
        every = all(mask)
        elem_mask = np.repeat(np.asarray(mask), bucket.sizes)
        param_mask = np.asarray(mask)
        starts = np.asarray(bucket.starts)

        def update(hp_arr, values, grads, store):
            hyper = {n: hp_arr[j] for j, n in enumerate(names)}
            flat_v = bucket.flat(values)
            dt = flat_v.dtype  # one dtype per flat bucket
            flat_g = bucket.flat(
                [
                    jnp.zeros(shape, dt) if g is None else g.astype(dt)
                    for shape, g in zip(bucket.shapes, grads)
                ]
            )
            leaves = []
            for _, n in layout:
                leaf = store[n]
                if n in bucket.per_param:
                    leaf = leaf[0] if uniform else bucket.expand(leaf)
                leaves.append(leaf)
            public = {n: leaf for (pub, n), leaf in zip(layout, leaves) if pub}
            tx = transformation(dict(cfg), hyper, public)
            updates, new_state = tx.update(flat_g, treedef.unflatten(leaves), flat_v)
            new_store = {}
            for (_, n), new in zip(layout, jax.tree_util.tree_leaves(new_state)):
                old = store[n]
                if n in bucket.per_param:
                    new = jnp.broadcast_to(new, (count,)) if uniform else new[starts]
                    keep = param_mask
                else:
                    keep = elem_mask
                new = new.astype(old.dtype)
                new_store[n] = new if every else jnp.where(keep, new, old)
            if runs:
                return _apply_pieces(bucket, runs, values, updates), new_store
            new_values = [
                optax.apply_updates(v, u)
                for v, u, m in zip(values, bucket.split(updates), mask)
                if m
            ]
            return new_values, new_store

        return update

    def _shared_update(
        self,
        bucket: SharedBucket,
        treedef: Any,
        layout: tuple,
        mask: tuple[bool, ...],
        uniform: bool,
    ) -> Callable:
        """The update of a shared bucket: the optax chain per member, one count while uniform."""
        cfg = bucket.cfg
        names = [n for n, _, _ in self._hyper]
        count = len(bucket.params)
        bucket = bucket.static()  # the closure keeps no parameter or state alive
        transformation = type(self)._transformation
        stepping = [j for j, m in enumerate(mask) if m]

        def update(hp_arr, values, grads, store):
            hyper = {n: hp_arr[j] for j, n in enumerate(names)}
            new_store: dict[str, Any] = {}
            new_values = []
            scalars: dict[str, list[Any]] = {n: [] for n in bucket.per_param}
            for j in stepping:
                v, g = values[j], grads[j]
                leaves = [
                    (store[n][0] if uniform else store[n][j])
                    if n in bucket.per_param
                    else store[bucket.key(n, j)]
                    for _, n in layout
                ]
                public = {n: leaf for (pub, n), leaf in zip(layout, leaves) if pub}
                tx = transformation(dict(cfg), hyper, public)
                updates, new_state = tx.update(g.astype(v.dtype), treedef.unflatten(leaves), v)
                for (_, n), old, new in zip(layout, leaves, jax.tree_util.tree_leaves(new_state)):
                    if n in bucket.per_param:
                        scalars[n].append(new.astype(store[n].dtype))
                    else:
                        new_store[bucket.key(n, j)] = new.astype(old.dtype)
                new_values.append(optax.apply_updates(v, updates))
            for n, new in scalars.items():
                if uniform:  # every member stepped from the same count
                    new_store[n] = jnp.broadcast_to(new[0], (count,))
                else:
                    new_store[n] = store[n].at[np.asarray(stepping)].set(jnp.stack(new))
            return new_values, new_store

        return update

    def _packed_state(self, index: dict[int, int]) -> dict[str, Any]:
        unpacked: dict[int, dict[str, Any]] = {}
        for buckets in self._buckets.values():
            for bucket in buckets:
                if any(p in self.state for p in bucket.params):
                    for p, (public, _) in zip(bucket.params, bucket.unpack()):
                        unpacked[id(p)] = public
        state = {}
        for p, public in self.state.items():
            public = unpacked.get(id(p), public)
            state[index[id(p)]] = {
                k: (v.astype(jnp.float32) if k == "step" else v) for k, v in public.items()
            }
        return {"state": state}

    def _check_state(
        self, state_dict: dict[str, Any], groups: list[dict[str, Any]], id_map: dict
    ) -> Callable[[], None]:
        problems: list[str] = []
        loaded: list[tuple[Parameter, Record]] = []
        group_of = {id(p): g for g in groups for p in g["params"]}
        for k, saved in state_dict["state"].items():
            p = id_map.get(k)
            if p is None:
                problems.append(f"state for parameter {k!r}, which no param group lists")
                continue
            cfg = self._param_structure(group_of[id(p)], p)
            public, hidden = self._fresh(cfg, _state.peek(p))
            if len(saved) == 0:  # torch's defaultdict leaves empty entries behind
                continue
            missing = [n for n in public if n not in saved]
            unexpected = [n for n in saved if n not in public]
            if missing or unexpected:
                problems.append(
                    f"state[{k}]: keys {sorted(saved)} in the state dict, {sorted(public)} "
                    f"expected for these options"
                    + (f" (missing {missing})" if missing else "")
                    + (f" (unexpected {unexpected})" if unexpected else "")
                )
                continue
            for n, fresh in public.items():
                value = as_array(saved[n])
                if value.shape != fresh.shape:
                    problems.append(
                        f"state[{k}]['{n}']: shape {tuple(value.shape)} in the state dict, "
                        f"{tuple(fresh.shape)} expected (the parameter's shape is "
                        f"{tuple(p.shape)})"
                    )
                    continue
                public[n] = value.astype(fresh.dtype)
            self._derive_hidden(dict(cfg), public, hidden)
            loaded.append((p, Record(cfg, public, hidden)))
        if problems:
            raise ValueError("Error(s) in loading state_dict:\n\t" + "\n\t".join(problems))

        def apply() -> None:
            self.state.clear()
            self._records.clear()
            self._buckets.clear()
            self._packed.clear()
            self._organized = None
            for p, rec in loaded:
                self._records[p] = rec
                self.state[p] = rec.public

        return apply
