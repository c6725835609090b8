"""``jm.distributed.shard`` and ``shardings``: place a model's arrays by name-pattern rules.

The rules themselves (patterns, specs, every check against shapes and the
mesh) are ``jmodule/_placement/sharding.py``, beneath both this module and
``Module.to_empty(device=(mesh, rules))``; :func:`put` (placing onto a mesh
that spans processes) is ``jmodule/_placement/parse.py``'s.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from jmodule._lowering import state
from jmodule._placement import put
from jmodule._placement.sharding import ArrayPlan, Rules, plan

__all__ = ["shard", "shardings"]


def shardings(module: Any, mesh: Mesh, rules: Rules | None = None) -> dict[str, NamedSharding]:
    """The ``NamedSharding`` each parameter and buffer of ``module`` would get.

    Nothing moves: use it to inspect a rule set, or to build shardings for
    plain JAX code. Tied parameters appear under their first name.

    Args:
        module: the model (its parameters may be abstract, ``jm.device("meta")``).
        mesh: the device mesh.
        rules: ``{pattern: spec}`` or ``[(pattern, spec), ...]``; see :func:`shard`.

    Returns:
        ``{name: NamedSharding}`` in ``state_dict`` order (parameters, then buffers
        per module).

    Raises:
        ShardingRuleError: a matching rule cannot apply (every problem listed).

    >>> import jax, jmodule as jm
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jm.distributed.make_mesh({"data": 4, "model": 2})
    >>> s = jm.distributed.shardings(jm.nn.Linear(4, 2), mesh, {"*.weight": P("model")})
    >>> s["weight"].spec, s["bias"].spec
    (P('model',), P())
    """
    return {p.name: p.sharding for p in plan(module, mesh, rules)}


def shard(module: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """Place every parameter and buffer of ``module`` on ``mesh`` by name-pattern rules.

    Each array goes to ``NamedSharding(mesh, spec)`` with the spec of the
    first rule whose pattern matches its name; unmatched arrays are
    replicated over the mesh. Parameters keep their identity (optimizers
    holding them stay valid) and their ``.grad`` moves with them. Abstract
    (meta) parameters stay abstract and carry the sharding. Compiled steps
    then run on JAX's SPMD partitioner with these shardings.

    Args:
        module: the model; changed in place and returned.
        mesh: the device mesh (``jm.distributed.make_mesh``); its axes should
            be ``Auto`` (JAX's partitioner chooses intermediate shardings).
        rules: ``{pattern: spec}`` or ``[(pattern, spec), ...]``: ``fnmatch``
            patterns over ``state_dict`` names (a leading ``"*."`` also matches
            top-level names) mapped to a ``PartitionSpec`` or to a callable
            ``(name, shape) -> PartitionSpec | None``. ``None`` replicates all.
            Presets: :func:`fsdp`, :func:`tensor_parallel`; concatenate lists
            to combine them (first match wins).

    Returns:
        ``module``.

    Raises:
        ShardingRuleError: a matching rule cannot apply: a dimension not
            divisible by its mesh axes, an unknown mesh axis, a spec longer
            than the array's rank. Every problem is listed, naming the array,
            its shape and the rule; nothing moves.

    >>> import jmodule as jm
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jm.distributed.make_mesh({"data": 4, "model": 2})
    >>> model = jm.nn.Linear(4, 2)
    >>> _ = jm.distributed.shard(model, mesh, {"*.weight": P("model", None)})
    >>> model.weight.sharding.spec, model.weight.addressable_shards[0].data.shape
    (P('model', None), (1, 4))
    """
    placements = plan(module, mesh, rules)
    _move(placements)
    state.touch(module)
    return module


def _abstract(value: Any, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)


def _move(placements: list[ArrayPlan]) -> None:
    """Put every planned array (and a parameter's grad) onto its sharding."""
    for p in placements:
        value = p.container[p.key]
        p.container[p.key] = (
            _abstract(value, p.sharding)
            if isinstance(value, jax.ShapeDtypeStruct)
            else put(value, p.sharding)
        )
        if p.is_param and state.grad_value(p.container) is not None:
            p.container["grad"] = put(p.container["grad"], p.sharding)
