# %% [markdown]
# # Scaling out on JAX's own engine
#
# Sharding rules, a data-parallel compiled step and meta initialisation, on 8
# simulated CPU devices (the same code runs on 8 GPUs or a TPU slice).

# %%
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import time
import tracemalloc

import jax
import jax.numpy as jnp

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import nn
from jmodule.distributed import fsdp, make_mesh, shard, shard_batch, shardings

print(jax.devices())

# %% [markdown]
# ## Sharding rules: name patterns to `PartitionSpec`s

# %%
mesh = make_mesh()
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
rules = fsdp(mesh)
for name, spec in shardings(model, mesh, rules).items():
    print(f"{name:10s} {spec}")
shard(model, mesh, rules)
print(model[0].weight.sharding)

# %% [markdown]
# ## A data-parallel training step
# The batch is sharded over the `"data"` axis; XLA inserts the gradient
# reduction.

# %%
opt = jm.optim.SGD(model.parameters(), lr=0.1)


@jm.compile
def train_step(model, opt, x, y):
    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    opt.step()
    return loss


x = shard_batch(jax.random.normal(jax.random.key(0), (64, 64)), mesh)
y = shard_batch(jax.random.randint(jax.random.key(1), (64,), 0, 10), mesh)
for step in range(5):
    print(step, float(train_step(model, opt, x, y)))

# %% [markdown]
# ## Meta initialisation: a model bigger than any device
# Under `jm.device("meta")` parameters are shapes and dtypes only.

# %%
tracemalloc.start()
start = time.perf_counter()
with jm.device("meta"):
    big = nn.Sequential(*[nn.Linear(65536, 65536) for _ in range(64)])
elapsed = time.perf_counter() - start
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
n = sum(p.size for p in big.parameters())
print(
    f"{n / 1e9:.0f} billion parameters, built in {elapsed * 1e3:.0f} ms, peak {peak / 2**20:.1f} MiB"
)

# %%
with jm.device("meta"):
    small = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
small.to_empty(device=(mesh, fsdp(mesh)))  # allocated already sharded
for m in small.modules():
    if hasattr(m, "reset_parameters"):
        m.reset_parameters()  # initialised in place, shard by shard
print(small[0].weight.sharding, float(jnp.abs(small[0].weight.data).max()))
