"""Meshes and batch placement.

``make_mesh`` names the devices' axes (``{"data": 2, "model": 4}``) with JAX's
``Auto`` axis type, so the SPMD partitioner chooses every intermediate
sharding; ``shard_batch`` puts a batch on the mesh split over the data axis,
from each process's local part when there are several processes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jmodule._lowering.state import Cell
from jmodule._placement.sharding import axis_size

__all__ = ["make_mesh", "replicated", "shard_batch"]


def make_mesh(
    shape: Mapping[str, int] | Sequence[int] | None = None,
    axis_names: Sequence[str] | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A device mesh with named axes, as ``torch.distributed.init_device_mesh``.

    Args:
        shape: ``{axis: size}`` or sizes (with ``axis_names``); one size may be
            ``-1`` (whatever the other axes leave). Default: one ``"data"``
            axis over every device.
        axis_names: names for a sequence ``shape``.
        devices: the devices to use (default: all of ``jax.devices()``, across
            every process).

    Returns:
        A ``jax.sharding.Mesh`` whose axes are ``Auto`` (sharded by JAX's
        partitioner); device order follows JAX's topology-aware layout.

    Raises:
        ValueError: the sizes do not multiply to the number of devices, or
            names and sizes do not pair up.

    >>> import jmodule as jm
    >>> dict(jm.distributed.make_mesh({"data": -1, "model": 2}).shape)  # on 8 devices
    {'data': 4, 'model': 2}
    """
    devices = list(jax.devices() if devices is None else devices)
    if shape is None:
        names, sizes = ("data",), [-1]
    elif isinstance(shape, Mapping):
        if axis_names is not None:
            raise ValueError("give axis names either as the keys of shape or as axis_names")
        names, sizes = tuple(shape), list(shape.values())
    else:
        sizes = list(shape)
        if axis_names is None or len(axis_names) != len(sizes):
            raise ValueError(
                f"make_mesh needs one name per axis: got sizes {tuple(sizes)} and names "
                f"{axis_names!r}"
            )
        names = tuple(axis_names)
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one axis size may be -1, got {dict(zip(names, sizes))}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if known <= 0 or len(devices) % known:
            raise ValueError(
                f"cannot fill axis {names[sizes.index(-1)]!r}: {len(devices)} devices are not a "
                f"multiple of the other axes' {known}"
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"a mesh of {dict(zip(names, sizes))} needs {math.prod(sizes)} devices, but "
            f"{len(devices)} are given (JAX sees {jax.device_count()}; on CPU, simulate more with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts)"
        )
    return jax.make_mesh(
        tuple(sizes), names, axis_types=(AxisType.Auto,) * len(names), devices=devices
    )


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding that keeps a full copy on every device of ``mesh``.

    >>> import jmodule as jm
    >>> model = jm.nn.Linear(2, 2).to(jm.distributed.replicated(jm.distributed.make_mesh()))
    >>> model.weight.sharding.is_fully_replicated, len(model.weight.addressable_shards)
    (True, 8)
    """
    return NamedSharding(mesh, PartitionSpec())


def _put(x: Any, sharding: NamedSharding) -> jax.Array:
    if isinstance(x, Cell):
        x = x.data
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))


def shard_batch(batch: Any, mesh: Mesh, axis: str | tuple[str, ...] = "data") -> Any:
    """Put a batch (an array or a pytree of arrays) on ``mesh``, dimension 0 split over ``axis``.

    With one process, ``batch`` is the whole batch. With several
    (``jm.distributed.init``), each passes its own local part and gets back
    the global array (local batch size x process count), as
    ``jax.make_array_from_process_local_data`` builds it.

    Raises:
        ValueError: ``axis`` is not a mesh axis, or a batch dimension is not
            divisible by its devices.

    >>> import jax.numpy as jnp, jmodule as jm
    >>> x = jm.distributed.shard_batch(jnp.ones((16, 3)), jm.distributed.make_mesh())
    >>> x.sharding.spec, x.addressable_shards[0].data.shape  # 2 rows on each of 8 devices
    (P('data',), (2, 3))
    """
    size = axis_size(mesh, axis)
    local = max(1, size // jax.process_count())
    sharding = NamedSharding(mesh, PartitionSpec(axis))

    def put(x: Any) -> jax.Array:
        if np.ndim(x) == 0 or x.shape[0] % local:
            raise ValueError(
                f"shard_batch: dimension 0 of an array of shape {tuple(np.shape(x))} must be "
                f"divisible by the {local} device(s) of this process along mesh axis {axis!r}"
            )
        return _put(x, sharding)

    return jax.tree_util.tree_map(put, batch, is_leaf=lambda x: isinstance(x, Cell))
