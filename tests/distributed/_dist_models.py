"""Models and data shared by the scale-out tests (imported, never collected)."""

import jax
import jax.numpy as jnp
import numpy as np

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import nn
from jmodule._placement import factory as _factory


def classifier():
    """Linear-BatchNorm-ReLU-Linear; no bias before BatchNorm (its gradient is
    rounding noise, which Adam would amplify into run-to-run differences)."""
    return nn.Sequential(
        nn.Linear(8, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 8)
    )


def batch(n=32, seed=0):
    """Inputs (n, 8) and integer labels in [0, 8)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 8, n).astype(np.int32)


def train_step(model, opt, x, y):
    """The PyTorch loop, compiled whole by ``jm.compile``."""
    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    opt.step()
    return loss


def run_steps(model, opt, x, y, steps=3):
    """Losses of ``steps`` compiled steps, and the compiled step."""
    step = jm.compile(train_step)
    losses = [step(model, opt, x, y) for _ in range(steps)]
    return losses, step


class Block(nn.Module):
    """A transformer block with PyTorch's attention and a fc1/fc2 MLP."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(jax.nn.gelu(self.fc1(x)))


class Big(nn.Module):
    """A decoder-only language model's weights: embedding + ``layers`` blocks
    (fused qkv, output projection, 4x MLP)."""

    def __init__(self, layers, d, vocab):
        super().__init__()
        self.embed = nn.Parameter(_factory.empty((vocab, d)))
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "qkv": nn.Linear(d, 3 * d),
                    "out": nn.Linear(d, d),
                    "fc1": nn.Linear(d, 4 * d),
                    "fc2": nn.Linear(4 * d, d),
                }
            )
            for _ in range(layers)
        )


#: About 310 billion parameters (GPT-3 175B is 96 layers of width 12288).
BIG_CONFIG = {"layers": 96, "d": 16384, "vocab": 50304}


def values(model):
    """``state_dict()`` as numpy arrays (gathered)."""
    return {k: np.asarray(v) for k, v in model.state_dict().items()}


def as_float(x):
    """A scalar from a (possibly multi-process, replicated) array."""
    return float(jnp.asarray(x.addressable_data(0)))
