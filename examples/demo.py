"""The main job, end to end on the CPU: `make demo`.

Defines a model imperatively as in PyTorch, runs it eagerly, compiles it into
one XLA program, runs it again, and shows that compiled and eager calls
leave the model in the same state.
"""

from __future__ import annotations

import copy
import time

import jax
import jax.numpy as jnp
import numpy as np

import jmodule as jm
from jmodule import nn


class Classifier(nn.Module):
    """A small PyTorch-style classifier: Linear, BatchNorm, ReLU, Dropout."""

    def __init__(self, n_in: int = 64, hidden: int = 128, n_classes: int = 10):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(n_in, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(0.2),
        )
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.head(self.body(x))


def timed(fn, x, calls=200):
    jax.block_until_ready(fn(x))
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(x)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    print(f"jmodule {jm.__version__} on JAX {jax.__version__}, devices: {jax.devices()}")
    jm.manual_seed(0)
    model = Classifier()
    print("\n1. Defined imperatively, printed as PyTorch prints it:\n")
    print(model)
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"\n   {n_params:,} parameters; state_dict keys: {list(model.state_dict())[:5]} ...")

    x = jax.random.normal(jax.random.key(0), (32, 64))
    eager = copy.deepcopy(model)
    jm.manual_seed(1)
    eager_out = [eager(x) for _ in range(3)]
    print("\n2. Ran eagerly 3 times (train mode: dropout on, BatchNorm statistics updating).")

    model.compile()
    jm.manual_seed(1)
    compiled_out = [model(x) for _ in range(3)]
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(eager_out, compiled_out))
    same_stats = all(
        np.allclose(a, b, atol=1e-6)
        for a, b in zip(eager.state_dict().values(), model.state_dict().values())
    )
    print("3. Compiled with model.compile() and ran 3 times from the same seed:")
    print(f"   largest output difference vs eager: {diff:.2e}")
    print(f"   same BatchNorm statistics as eager: {same_stats}")
    print(f"   num_batches_tracked: {int(model.body[1].num_batches_tracked)}")

    eager.eval()
    model.eval()
    print(
        f"\n4. Eval mode: compiled {timed(model, x):.0f} us/call, "
        f"eager {timed(eager, x):.0f} us/call"
    )
    stats = jm.compile_stats(model)
    print(f"   programs compiled: {stats.num_traces} (reasons: {list(stats.reasons)})")
    if diff > 1e-4 or not same_stats:
        raise SystemExit("compiled and eager runs disagree")
    print("\nDone: the model was defined imperatively, compiled by JAX and run on the CPU.")


if __name__ == "__main__":
    main()
