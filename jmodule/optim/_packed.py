"""Packed optimizer state: the small parameters of a param group share flat arrays.

PyTorch keeps optimizer state per parameter, and so does
:class:`~jmodule.optim.optimizer.TorchOptimizer` for large parameters. For
small ones (biases, norms, small layers) one array per parameter and per state
entry means many tiny arrays going in and out of every compiled step, and on a
dispatch-bound step that costs more than the arithmetic. So the small
parameters of a group that live on one device with one dtype form a
:class:`Bucket`: each state entry is one flat array for all of them (the
parameters' elements concatenated in group order), and a per-parameter scalar
(the ``step`` count) is one vector with an entry per parameter. The update runs
the group's optax chain once over the concatenated gradients, which is the
same arithmetic, because every PyTorch optimizer updates elementwise (the
count is repeated over each parameter's elements, so parameters with
different step counts still get their own bias corrections).

The remaining parameters of a group (large or sharded ones) keep their own
state arrays, laid out like the parameter, but those on the same devices form a
:class:`SharedBucket`: their per-parameter scalars (the ``step`` counts) are
one vector, and while they have all stepped together the update uses one
count for them all, as a plain optax update over a pytree does. One count per
parameter would add an input, an output and a few scalar kernels per
parameter to every step (measured: 21 more fused kernels in an 8-parameter
FSDP step than plain JAX's).

``opt.state[p]`` of a packed parameter is a :class:`PackedState` view: reading
an entry slices it out, writing one writes it back, so it behaves like the
live dict PyTorch users know. ``state_dict()`` unpacks (PyTorch's layout), and
``load_state_dict`` packs again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._jax_internals import ArrayImpl as _ArrayImpl
from jmodule._lowering import flat as _flat
from jmodule._lowering import state
from jmodule._placement.device import on_one_device, single_device_sharding

__all__ = [
    "PACK_MAX_ELEMENTS",
    "Bucket",
    "PackedState",
    "SharedBucket",
    "packable",
    "replicated_like",
]

#: Parameters with at most this many elements are packed.
PACK_MAX_ELEMENTS = 1 << 16


def packable(value: Any) -> tuple | None:
    """The bucket a parameter value could join (dtype, device), or None when it cannot be packed.

    Only concrete single-device arrays that are small are packed: a sharded
    parameter keeps its own state, laid out like its shards.
    """
    if type(value) is not jax.Array and not isinstance(value, jax.Array):
        return None
    if isinstance(value, jax.core.Tracer) or value.size > PACK_MAX_ELEMENTS:
        return None
    devices = value.sharding.device_set
    if len(devices) != 1:
        return None
    return (str(value.dtype), next(iter(devices)))


def place_of(value: Any) -> Any:
    """Where a parameter value lives, as a bucket key: its set of devices (None for tracers)."""
    sharding = getattr(value, "sharding", None)
    if isinstance(value, jax.core.Tracer) or sharding is None:
        return None
    return frozenset(sharding.device_set)


def replicated_like(host: Any, ref: Any) -> jax.Array:
    """``host`` on every device ``ref`` (a parameter's value) spans, so a step never moves it.

    A hyper-parameter array or step-count vector on one device would be copied
    to every device of a sharded model on each call of a compiled step.
    """
    sharding = getattr(ref, "sharding", None)
    if isinstance(ref, jax.core.Tracer) or sharding is None:
        return jnp.asarray(host)
    if isinstance(sharding, jax.sharding.NamedSharding):
        target: jax.sharding.Sharding = jax.sharding.NamedSharding(
            sharding.mesh, jax.sharding.PartitionSpec()
        )
    elif on_one_device(sharding):
        target = single_device_sharding(next(iter(sharding.device_set)))
    else:
        return jnp.asarray(host)
    from jmodule.distributed._rules import put

    return put(np.asarray(host), target)


def _join(scalars: bool, parts: Sequence[Any]) -> Any:
    """One piece per member -> a flat state entry (``scalars``: one scalar per member)."""
    if scalars:
        return jnp.stack([jnp.reshape(x, ()) for x in parts])
    return _flat.concat([jnp.reshape(x, (-1,)) for x in parts])


def _packed_store(layout: tuple, per_param: frozenset, records: Sequence) -> dict[str, Any]:
    """The flat store of a bucket: ``records`` (each member's ``(public, hidden)``) joined.

    On the CPU the concrete entries are joined in NumPy and put where a
    concatenation would have put them (the members' device; committed if any
    part is), which compiles nothing: an eager reshape or concatenation is one
    XLA program per member shape.
    """
    store = {}
    for pub, name in layout:
        parts = [(public if pub else hidden)[name] for public, hidden in records]
        store[name] = _on_host(name in per_param, parts)
        if store[name] is None:
            store[name] = _join(name in per_param, parts)
    return store


def _on_host(scalars: bool, parts: Sequence[Any]) -> jax.Array | None:
    """:func:`_join` of concrete CPU arrays of one device, in NumPy; None otherwise."""
    devices = set()
    for x in parts:
        if type(x) is not _ArrayImpl or x.is_deleted():
            return None
        devices |= x.sharding.device_set
    if len(devices) != 1 or next(iter(devices)).platform != "cpu":
        return None
    dtype = jnp.result_type(*parts)
    host = [np.asarray(x, dtype) for x in parts]
    joined = (
        np.stack([h.reshape(()) for h in host])
        if scalars
        else np.concatenate([h.reshape(-1) for h in host])
    )
    # device_put of NumPy (jnp.asarray of it compiles a program per shape); None: uncommitted
    return jax.device_put(joined, next(iter(devices)) if any(x.committed for x in parts) else None)


class Bucket:
    """The packed state of some small parameters of one param group.

    Attributes:
        cfg: the group's structure (as ``TorchOptimizer._structure``).
        params: the member parameters, in group order.
        layout: ``(is_public, name)`` of each optax state leaf, in treedef order.
        per_param: names of the leaves kept as one scalar per parameter.
        store: the slot container: leaf name -> flat array (``(total,)``, or
            ``(len(params),)`` for per-parameter scalars).
    """

    def __init__(
        self,
        cfg: tuple,
        params: Sequence[Any],
        layout: tuple[tuple[bool, str], ...],
        per_param: frozenset[str],
        records: Sequence[tuple[dict[str, Any], dict[str, Any]]],
        public_order: Sequence[str],
        on_part: Callable[[], None],
    ):
        """Pack ``records`` (each member's ``(public, hidden)`` state) into flat arrays."""
        self.cfg = cfg
        self.public_order = tuple(public_order)
        self.params = tuple(params)
        self.index = {id(p): j for j, p in enumerate(self.params)}
        self.shapes = tuple(tuple(state.peek(p).shape) for p in self.params)
        self.sizes = tuple(int(np.prod(s, dtype=np.int64)) for s in self.shapes)
        self.starts = tuple(int(s) for s in np.cumsum((0, *self.sizes[:-1])))
        self.total = sum(self.sizes)
        self.layout = layout
        self.per_param = per_param
        self.store: dict[str, Any] = self._pack(records)
        self._splitter: Any = None
        self._on_part = on_part
        #: Whether every member has the same per-parameter values (step counts), so a
        #: step can use one scalar for them all. Cleared for good when they part ways.
        self.uniform = all(
            bool(np.all(np.asarray(v) == np.asarray(v)[0]))
            for v in (self.store[n] for n in per_param)
        )

    def _pack(self, records: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
        return _packed_store(self.layout, self.per_param, records)

    def static(self) -> Bucket:
        """A copy holding only the layout (what :meth:`signature` names): no member
        parameters, no state, for compiled updates shared between optimizers."""
        twin = copy.copy(self)
        twin.params, twin.index, twin.store = (), {}, {}
        twin._splitter = twin._on_part = None
        return twin

    def signature(self) -> tuple:
        """What a compiled update depends on (shapes and layout)."""
        return (type(self).__name__, self.cfg, self.shapes, self.layout)

    def slots(self) -> list[tuple[str, str]]:
        """``(store key, display name)`` of every array the bucket keeps."""
        return [(k, f"{'' if pub else '~'}{k}") for pub, k in self.layout]

    def flat(self, arrays: Sequence[Any]) -> Any:
        """One array per member -> the flat layout (their elements concatenated)."""
        return _flat.concat([jnp.reshape(a, (-1,)) for a in arrays])

    def split(self, flat: Any) -> list[Any]:
        """The flat layout -> one array per member, in its shape."""
        return [
            jnp.reshape(flat[s : s + n], shape)
            for s, n, shape in zip(self.starts, self.sizes, self.shapes)
        ]

    def expand(self, vec: Any) -> Any:
        """One value per member -> that value repeated over the member's elements."""
        return _flat.concat([jnp.broadcast_to(vec[j], (n,)) for j, n in enumerate(self.sizes)])

    def part(self, leaf: Any, j: int, name: str) -> Any:
        """Member ``j``'s piece of the flat state entry ``leaf`` (named ``name``)."""
        if name in self.per_param:
            return leaf[j]
        s, n = self.starts[j], self.sizes[j]
        return jnp.reshape(leaf[s : s + n], self.shapes[j])

    def put(self, leaf: Any, j: int, name: str, value: Any) -> Any:
        """``leaf`` with member ``j``'s piece replaced by ``value``."""
        if name in self.per_param:
            return leaf.at[j].set(jnp.reshape(value, ()).astype(leaf.dtype))
        return jax.lax.dynamic_update_slice(
            leaf, jnp.reshape(value, (-1,)).astype(leaf.dtype), (self.starts[j],)
        )

    def join(self, name: str, parts: Sequence[Any]) -> Any:
        """One piece per member -> the flat state entry ``name``."""
        return _join(name in self.per_param, parts)

    def unpack(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every member's ``(public, hidden)`` state, as separate arrays (one dispatch)."""
        if self._splitter is None:
            members = range(len(self.params))

            def split_all(store: dict[str, Any]) -> list[dict[str, Any]]:
                return [{n: self.part(store[n], j, n) for _, n in self.layout} for j in members]

            self._splitter = jax.jit(split_all)
        entries = self._splitter(self.store)
        return [
            (
                {n: e[n] for n in self.public_order},
                {n: e[n] for pub, n in self.layout if not pub},
            )
            for e in entries
        ]

    def read(self, j: int, name: str) -> Any:
        """Member ``j``'s entry ``name``."""
        return self.part(self.store[name], j, name)

    def write(self, j: int, name: str, value: Any) -> None:
        """Set member ``j``'s entry ``name`` (the shape must match, as PyTorch's step requires)."""
        value = jnp.asarray(value)
        if name in self.per_param:
            if value.size != 1:
                raise ValueError(f"state entry '{name}' is one value; got shape {value.shape}")
        elif tuple(value.shape) != self.shapes[j]:
            raise ValueError(
                f"state entry '{name}' has the parameter's shape {self.shapes[j]}; got "
                f"{tuple(value.shape)}"
            )
        self.store[name] = self.put(self.store[name], j, name, value)
        if name in self.per_param and self.uniform:
            self.uniform = False
            self._on_part()


class SharedBucket(Bucket):
    """Parameters of one param group on the same devices that share their step counts.

    Unlike :class:`Bucket`, each member keeps its own state arrays (laid out
    like the parameter: sharded parameters keep sharded state), stored under
    ``"name[j]"``; only the per-parameter scalars are one vector (replicated
    over the members' devices). The update runs the group's optax chain per
    member, with one count for all of them while they step together.
    """

    def key(self, name: str, j: int) -> str:
        """The store key of member ``j``'s entry ``name``."""
        return name if name in self.per_param else f"{name}[{j}]"

    def _pack(self, records: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
        ref = state.peek(self.params[0])
        store = {}
        for pub, name in self.layout:
            parts = [(public if pub else hidden)[name] for public, hidden in records]
            if name in self.per_param:
                stacked = jnp.stack([jnp.reshape(x, ()) for x in parts])
                store[name] = replicated_like(stacked, ref)
            else:
                for j, x in enumerate(parts):
                    store[self.key(name, j)] = x
        return store

    def slots(self) -> list[tuple[str, str]]:
        """``(store key, display name)`` of every array the bucket keeps."""
        out = []
        for pub, n in self.layout:
            members = [0] if n in self.per_param else range(len(self.params))
            for j in members:
                k = self.key(n, j)
                out.append((k, f"{'' if pub else '~'}{k}"))
        return out

    def unpack(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every member's ``(public, hidden)`` state, as separate arrays."""
        count = len(self.params)
        if self._splitter is None:
            self._splitter = jax.jit(lambda vec: [vec[j] for j in range(count)])
        scalars = {n: self._splitter(self.store[n]) for n in self.per_param}
        entries = [
            {
                n: scalars[n][j] if n in self.per_param else self.store[self.key(n, j)]
                for _, n in self.layout
            }
            for j in range(count)
        ]
        return [
            (
                {n: e[n] for n in self.public_order},
                {n: e[n] for pub, n in self.layout if not pub},
            )
            for e in entries
        ]

    def read(self, j: int, name: str) -> Any:
        """Member ``j``'s entry ``name``."""
        if name in self.per_param:
            return self.store[name][j]
        return self.store[self.key(name, j)]

    def write(self, j: int, name: str, value: Any) -> None:
        """Set member ``j``'s entry ``name``, where the old value lived."""
        if name in self.per_param:
            super().write(j, name, value)
            return
        value = jnp.asarray(value)
        if tuple(value.shape) != self.shapes[j]:
            raise ValueError(
                f"state entry '{name}' has the parameter's shape {self.shapes[j]}; got "
                f"{tuple(value.shape)}"
            )
        old = self.store[self.key(name, j)]
        value = value.astype(old.dtype)
        if not isinstance(value, jax.core.Tracer) and not isinstance(old, jax.core.Tracer):
            value = jax.device_put(value, old.sharding)
        self.store[self.key(name, j)] = value


class PackedState(MutableMapping):
    """``opt.state[p]`` for a packed parameter: a live view of its part of the bucket.

    Reads slice the entry out; writes change what the next step uses, as with
    PyTorch's state dict. Entries cannot be added or removed.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> a, b = jm.nn.Parameter(jnp.ones(2)), jm.nn.Parameter(jnp.ones(3))
    >>> opt = jm.optim.Adam([a, b])
    >>> a.grad, b.grad = jnp.ones(2), jnp.ones(3)
    >>> opt.step()
    >>> sorted(opt.state[b]), opt.state[b]["exp_avg"].shape
    (['exp_avg', 'exp_avg_sq', 'step'], (3,))
    """

    def __init__(self, bucket: Bucket, j: int):
        self._bucket = bucket
        self._j = j
        self._names = bucket.public_order

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        return self._bucket.read(self._j, name)

    def __setitem__(self, name: str, value: Any) -> None:
        if name not in self._names:
            raise KeyError(
                f"'{name}': this parameter's optimizer state has the entries {list(self._names)}"
            )
        self._bucket.write(self._j, name, value)

    def __delitem__(self, name: str) -> None:
        raise TypeError(
            "entries of a packed optimizer state cannot be deleted (the optimizer's options "
            "decide which exist)"
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return repr(dict(self.items()))
