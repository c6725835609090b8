"""Activation sharding hints inside ``forward``: a thin ``with_sharding_constraint``."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jmodule._lowering.state import Cell
from jmodule.nn.parameter import as_array

__all__ = ["constrain"]

_NO_MESH = (
    "constrain(x, {spec}) needs a mesh to resolve the PartitionSpec: pass mesh=... "
    "(e.g. constrain(x, P('data', None), mesh=mesh)), give a NamedSharding instead, or run "
    "the compiled step inside `with jax.set_mesh(mesh):`."
)


def constrain(x: Any, spec: PartitionSpec | Sharding, mesh: Mesh | None = None) -> Any:
    """Ask XLA to shard ``x`` (an array or a pytree of them) as ``spec`` at this point.

    ``jax.lax.with_sharding_constraint`` under another name: inside a
    compiled step it pins an intermediate's sharding (e.g. activations split
    over ``"data"`` on dimension 0) and XLA moves data to honour it; eagerly
    it places the value so. Values are unchanged.

    Args:
        x: an array, Parameter, or pytree of them.
        spec: a ``PartitionSpec`` (resolved on ``mesh``) or a ``Sharding``.
        mesh: the mesh for a ``PartitionSpec``; default: the mesh set with
            ``jax.set_mesh``.

    Returns:
        ``x`` with the sharding constraint applied.

    Raises:
        ValueError: a ``PartitionSpec`` with neither ``mesh`` nor a mesh set.

    >>> import jax.numpy as jnp, jmodule as jm
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jm.distributed.make_mesh()
    >>> x = jm.distributed.constrain(jnp.ones((8, 2)), P("data", None), mesh)
    >>> x.sharding.spec, x.addressable_shards[0].data.shape
    (P('data', None), (1, 2))
    """
    if isinstance(spec, PartitionSpec):
        if mesh is not None:
            spec = NamedSharding(mesh, spec)
        elif jax.sharding.get_abstract_mesh().empty:
            raise ValueError(_NO_MESH.format(spec=spec))
    elif not isinstance(spec, Sharding):
        raise TypeError(
            f"constrain expects a jax.sharding.PartitionSpec or Sharding, got {type(spec).__name__}"
        )
    x = jax.tree_util.tree_map(as_array, x, is_leaf=lambda v: isinstance(v, Cell))
    return jax.lax.with_sharding_constraint(x, spec)
