"""Scale-out on JAX's own SPMD partitioner: meshes, sharding rules, several processes.

jmodule never runs its own distributed engine. A model's parameters are
``jax.Array``s with shardings; a compiled step (``jm.compile``) given a batch
sharded over a ``"data"`` axis runs as one SPMD program, and XLA inserts
every collective (gradient all-reduce or reduce-scatter, weight gathers).

- :func:`make_mesh` names device axes; :func:`replicated` is the full-copy
  sharding (``model.to(replicated(mesh))`` is data parallel).
- :func:`shard` places each parameter by name-pattern rules; :func:`fsdp`
  and :func:`tensor_parallel` are rule presets; :func:`shardings` shows
  what rules would do without moving anything.
- ``model.to_empty(device=(mesh, rules))`` allocates a meta-built model
  already sharded; ``reset_parameters()`` then fills each shard in place.
- :func:`shard_batch` places a batch; :func:`constrain` pins activation
  shardings inside ``forward``.
- :func:`init` joins a multi-process job (``jax.distributed.initialize``).

The examples in this package's docstrings run on 8 devices; on a CPU, set
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX starts to
simulate them (the docstring tests do).

>>> import jax.numpy as jnp, jmodule as jm
>>> from jmodule.distributed import make_mesh, shard, fsdp, shard_batch
>>> mesh = make_mesh()                       # one "data" axis over all 8 devices
>>> model = shard(jm.nn.Linear(8, 4), mesh, fsdp(mesh))
>>> model.weight.sharding.spec               # each device holds 1/8 of the weight
P(None, 'data')
>>> y = model(shard_batch(jnp.ones((16, 8)), mesh))
>>> y.shape, y.addressable_shards[0].data.shape
((16, 4), (2, 4))
"""

from jmodule._placement.sharding import Rules as Rules
from jmodule._placement.sharding import ShardingRuleError as ShardingRuleError
from jmodule._placement.sharding import Spec as Spec
from jmodule.distributed._constrain import constrain as constrain
from jmodule.distributed._mesh import make_mesh as make_mesh
from jmodule.distributed._mesh import replicated as replicated
from jmodule.distributed._mesh import shard_batch as shard_batch
from jmodule.distributed._presets import DEFAULT_TP_PLAN as DEFAULT_TP_PLAN
from jmodule.distributed._presets import fsdp as fsdp
from jmodule.distributed._presets import tensor_parallel as tensor_parallel
from jmodule.distributed._process import get_rank as get_rank
from jmodule.distributed._process import get_world_size as get_world_size
from jmodule.distributed._process import init as init
from jmodule.distributed._process import is_initialized as is_initialized
from jmodule.distributed._rules import shard as shard
from jmodule.distributed._rules import shardings as shardings

__all__ = [
    "DEFAULT_TP_PLAN",
    "Rules",
    "ShardingRuleError",
    "Spec",
    "constrain",
    "fsdp",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "make_mesh",
    "replicated",
    "shard",
    "shard_batch",
    "shardings",
    "tensor_parallel",
]
