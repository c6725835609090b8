"""The main job, end to end on the CPU: ``make demo``.

1. Define a small CNN imperatively, as in PyTorch, and show compiled == eager.
2. Train it on scikit-learn's digits with a compiled PyTorch-style step.
3. Save an Orbax checkpoint, restore it into a fresh model, check accuracy.
4. Save the compiled program, reload it in a fresh process that never sees
   the model's class, check it gives the same predictions.
"""

from __future__ import annotations

import copy
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import nn

EPOCHS, BATCH = 12, 64


class DigitsCNN(nn.Module):
    """Conv -> BatchNorm -> ReLU -> MaxPool -> Dropout -> Linear, for 8x8 digits."""

    def __init__(self, channels: int = 32, n_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.dropout = nn.Dropout(0.25)
        self.head = nn.Linear(channels * 4 * 4, n_classes)

    def forward(self, x):
        return self.head(self.dropout(self.features(x).reshape(x.shape[0], -1)))


def say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def accuracy(model: nn.Module, x: jax.Array, y: np.ndarray) -> float:
    model.eval()
    pred = np.asarray(model(x).argmax(-1))
    return float((pred == y).mean())


def main() -> None:
    start = time.perf_counter()
    print(f"jmodule {jm.__version__} on JAX {jax.__version__}, devices: {jax.devices()}\n")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # NCHW
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    x_test_j = jnp.asarray(x_test)

    # 1. Define, run eagerly, compile.
    jm.manual_seed(0)
    model = DigitsCNN()
    print(model, "\n")
    probe = jnp.asarray(x_train[:BATCH])
    eager_copy = copy.deepcopy(model)
    jm.manual_seed(1)
    eager_out = eager_copy(probe)
    compiled_copy = copy.deepcopy(model)
    compiled_copy.compile()
    jm.manual_seed(1)
    compiled_out = compiled_copy(probe)
    diff = float(jnp.abs(eager_out - compiled_out).max())
    say("compile", f"compiled forward == eager forward (max difference {diff:.1e})")

    # 2. Train with a compiled PyTorch-style step.
    opt = jm.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = jm.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)

    @jm.compile
    def train_step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    rng = np.random.default_rng(0)
    n_batches = len(x_train) // BATCH
    for _ in tqdm(range(EPOCHS), desc="training", unit="epoch"):
        model.train()
        order = rng.permutation(len(x_train))
        for b in range(n_batches):
            idx = order[b * BATCH : (b + 1) * BATCH]
            loss = train_step(model, opt, jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx]))
        scheduler.step()
    acc = accuracy(model, x_test_j, y_test)
    stats = jm.compile_stats(train_step)
    say(
        "train",
        f"{EPOCHS} epochs, last loss {float(loss):.4f}, test accuracy {acc:.1%} "
        f"(the step compiled {stats.num_traces}x)",
    )
    if acc < 0.97:
        raise SystemExit(f"accuracy {acc:.1%} is below 97%")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # 3. Checkpoint and restore.
        jm.save(
            {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": EPOCHS},
            tmp / "checkpoint",
        )
        restored = jm.load(tmp / "checkpoint")
        fresh = DigitsCNN()
        fresh.load_state_dict(restored["model"])
        fresh_acc = accuracy(fresh, x_test_j, y_test)
        say(
            "checkpoint",
            f"saved to an Orbax checkpoint, restored into a fresh model: "
            f"accuracy {fresh_acc:.1%} (epoch {restored['epoch']})",
        )
        if fresh_acc != acc:
            raise SystemExit("the restored model disagrees with the trained one")

        # 4. Save the compiled program; load it where the class does not exist.
        program = tmp / "digits.jmod"
        model.eval()
        scripted = jm.jit.trace(model, (x_test_j,))
        scripted.save(str(program))
        np.save(tmp / "x.npy", x_test)
        expected = np.asarray(model(x_test_j).argmax(-1))
        loader = textwrap.dedent(
            f"""
            import numpy as np, jax.numpy as jnp, jmodule as jm
            loaded = jm.jit.load({str(program)!r})
            x = jnp.asarray(np.load({str(tmp / "x.npy")!r}))
            np.save({str(tmp / "pred.npy")!r}, np.asarray(loaded(x).argmax(-1)))
            """
        )
        subprocess.run([sys.executable, "-c", loader], check=True)
        same = np.array_equal(np.load(tmp / "pred.npy"), expected)
        say(
            "jit",
            f"saved the compiled program ({program.stat().st_size:,} bytes), reloaded it "
            f"in a fresh process without the class: same predictions: {same}",
        )
        if not same:
            raise SystemExit("the reloaded program disagrees")

    say("done", f"everything above took {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
