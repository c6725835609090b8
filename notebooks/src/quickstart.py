# %% [markdown]
# # jmodule quickstart
#
# PyTorch's `nn.Module` programming model, compiled by JAX. This notebook:
# defines a model imperatively, runs it eagerly, compiles it, trains it with a
# PyTorch-style loop, checkpoints it with Orbax, and resumes.

# %%
import tempfile

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from tqdm.auto import tqdm

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import nn

print(jax.devices())

# %% [markdown]
# ## Define a model, exactly as in PyTorch


# %%
class MLP(nn.Module):
    def __init__(self, n_in=64, hidden=128, n_out=10):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(hidden, n_out)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))


jm.manual_seed(0)
model = MLP()
model

# %% [markdown]
# `repr` is PyTorch's text; in Jupyter the module renders as a tree (above).
# `state_dict()` keys are PyTorch's, values are plain `jax.Array`s:

# %%
print(repr(model))
{k: (v.shape, str(v.dtype)) for k, v in model.state_dict().items()}

# %% [markdown]
# ## Run eagerly, then compiled
# Eager calls run op by op (hooks fire, Python control flow works);
# after `model.compile()` each call is one XLA program, with BatchNorm
# statistics and dropout keys carried in and out.

# %%
digits = load_digits()
x_all = jnp.asarray(digits.data / 16.0, jnp.float32)
y_all = jnp.asarray(digits.target)
x_train, y_train, x_test, y_test = x_all[:1400], y_all[:1400], x_all[1400:], y_all[1400:]

eager_logits = model(x_train[:8])
model.compile()
compiled_logits = model(x_train[:8])
print(eager_logits.shape, compiled_logits.shape, jm.compile_stats(model))
jm.summary(model, x_train[:8])
# %% [markdown]
# ## Train with the PyTorch loop, compiled whole
# `jm.backward(closure)` is `loss.backward()`: it runs the closure once and
# accumulates `.grad`. Under `@jm.compile` the whole step is one XLA program.

# %%
opt = jm.optim.Adam(model.parameters(), lr=1e-3)
scheduler = jm.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)


@jm.compile
def train_step(model, opt, x, y):
    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    opt.step()
    return loss


def accuracy(model):
    model.eval()
    acc = float((model(x_test).argmax(-1) == y_test).mean())
    model.train()
    return acc


rng = np.random.default_rng(0)
losses = []  # one array per step: no host sync inside the loop
for epoch in (bar := tqdm(range(10), desc="training")):
    order = rng.permutation(len(x_train))
    for start in range(0, len(order) - 63, 64):
        idx = order[start : start + 64]
        losses.append(train_step(model, opt, x_train[idx], y_train[idx]))
    scheduler.step()
    bar.set_postfix(loss=f"{float(losses[-1]):.3f}", accuracy=f"{accuracy(model):.3f}")
print(f"test accuracy {accuracy(model):.3f}", jm.compile_stats(train_step))

# %% [markdown]
# The loss curve (the per-step losses stayed on the device until now):

# %%
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(np.asarray(jnp.stack(losses)))
ax.set(xlabel="step", ylabel="training loss", yscale="log")
plt.show()

# %% [markdown]
# ## The training toolkit: mixed precision, clipping, schedules, EMA
# What a PyTorch training loop reaches for, with PyTorch's names, inside one
# compiled step: `jm.autocast` (bfloat16 matmuls on the CPU, the losses in
# float32), `jm.nn.utils.clip_grad_norm_`, any `torch.optim` optimizer
# (here NAdam), a warm-restart schedule, and an exponential moving average of
# the weights (`jm.optim.swa_utils.AveragedModel`).

# %%
jm.manual_seed(1)
toolkit_model = MLP()
toolkit_opt = jm.optim.NAdam(toolkit_model.parameters(), lr=2e-3)
restarts = jm.optim.lr_scheduler.CosineAnnealingWarmRestarts(toolkit_opt, T_0=3)
ema = jm.optim.swa_utils.AveragedModel(
    toolkit_model, multi_avg_fn=jm.optim.swa_utils.get_ema_multi_avg_fn(0.99), use_buffers=True
)


@jm.compile
def toolkit_step(model, opt, ema, x, y):
    opt.zero_grad()
    with jm.autocast("cpu"):
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    norm = jm.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
    ema.update_parameters(model)
    return loss, norm


for epoch in range(6):
    order = rng.permutation(len(x_train))
    for start in range(0, len(order) - 63, 64):
        idx = order[start : start + 64]
        loss, norm = toolkit_step(toolkit_model, toolkit_opt, ema, x_train[idx], y_train[idx])
    restarts.step()
print(
    f"loss {float(loss):.2f}, gradient norm {float(norm):.2f}, "
    f"lr now {restarts.get_last_lr()[0]:.5f}, {jm.compile_stats(toolkit_step).num_traces} trace(s)"
)
print(f"test accuracy: model {accuracy(toolkit_model):.2f}, EMA {accuracy(ema.module):.2f}")

# %% [markdown]
# ## Checkpoint with Orbax, and resume
# `jm.checkpoint.CheckpointManager` keeps numbered steps, saves in the
# background and restores the latest complete one.

# %%
directory = tempfile.mkdtemp()
manager = jm.checkpoint.CheckpointManager(directory, max_to_keep=2)
manager.save(10, {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 10})
manager.wait_until_finished()
print("steps on disk:", manager.all_steps())

restored = manager.restore()
model2 = MLP()
model2.load_state_dict(restored["model"])
opt2 = jm.optim.Adam(model2.parameters(), lr=1e-3)
opt2.load_state_dict(restored["optim"])
print("restored epoch", restored["epoch"], "accuracy", accuracy(model2))
assert accuracy(model2) == accuracy(model)

# %%
for epoch in range(restored["epoch"], restored["epoch"] + 3):  # resume training
    order = rng.permutation(len(x_train))
    for start in range(0, len(order) - 63, 64):
        idx = order[start : start + 64]
        loss = train_step(model2, opt2, x_train[idx], y_train[idx])
    print(f"epoch {epoch}: loss {float(loss):.3f}, test accuracy {accuracy(model2):.3f}")
