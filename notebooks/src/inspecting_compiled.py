# %% [markdown]
# # Inspecting compiled modules
#
# `jm.jit.script` / `jm.jit.trace` wrap a module in a `ScriptModule` that shares
# its state and runs as one XLA program. This notebook shows the program three
# ways (`graph`, `inlined_graph`, `code`), the reasons for every recompilation,
# and saving the compiled program to one file that loads without the model's
# Python class.

# %%
import io
import logging

import jax.numpy as jnp
import numpy as np

import jmodule as jm
from jmodule import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(jnp.tanh(self.bn(self.fc1(x))))


jm.manual_seed(0)
model = Block().eval()
scripted = jm.jit.trace(model, jnp.ones((3, 4)))
scripted.module is model

# %% [markdown]
# ## The program as a jaxpr, with parameters named by their `state_dict` keys

# %%
print(scripted.graph)

# %% [markdown]
# `inlined_graph` inlines nested calls; `code` renders the program as Python
# (valid syntax, one statement per operation) that re-executes to the same output.

# %%
print(scripted.code)

# %%
code, constants = scripted.code_with_constants
print(type(constants).__name__, len(code.splitlines()), "lines")

# %% [markdown]
# ## Recompilation, and why
# Each recompilation is logged on the `jmodule.compile` logger with its reason.

# %%
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", force=True)
scripted(jnp.ones((3, 4)))  # cached
scripted(jnp.ones((5, 4)))  # new input shape
model.train()
scripted(jnp.ones((5, 4)))  # training mode changed
handle = model.fc1.register_forward_hook(lambda m, args, out: out * 2)
scripted(jnp.ones((5, 4)))  # hook added
handle.remove()
model.eval()
logging.getLogger().setLevel(logging.WARNING)
for reason in jm.compile_stats(scripted).reasons:
    print(reason)

# %% [markdown]
# ## Save the compiled program; load it without the class
# The file holds the `jax.export` StableHLO (for CPU and CUDA), the weights and
# a checksum of every part. With `dynamic_batch=True` dimension 0 of the inputs
# is symbolic, so one file serves every batch size.

# %%
saver = jm.jit.trace(model, jnp.ones((3, 4)), dynamic_batch=True)
buffer = io.BytesIO()
saver.save(buffer)
print(f"{buffer.tell():,} bytes")
buffer.seek(0)
loaded = jm.jit.load(buffer)
for batch in (3, 7):
    x = jnp.ones((batch, 4))
    print(batch, np.allclose(loaded(x), model(x), atol=1e-6))
print(list(loaded.state_dict())[:3])
