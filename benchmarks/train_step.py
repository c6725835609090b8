"""Per-step time and memory of a compiled Adam training step, against the floor and the peers.

The step is the PyTorch loop under ``@jm.compile``::

    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    opt.step()
    return loss

Two MLPs: 16-32-32-10 at batch 8 (dispatch-bound; issue 13's target: at most
1.15x the floor) and 784-512-512-10 at batch 128 (compute-bound; target at
most 1.05x). Contestants: plain JAX + optax with a jitted, donated step (the
floor), jmodule, Flax ``nnx.jit`` and ``nnx.cached_partial`` steps with
``nnx.Optimizer``, an ``eqx.filter_jit`` step with optax, and PyTorch eager
(one intra-op thread for the small model, where threads only add barrier
cost on a shared machine; all cores for the large one).

Every contestant is timed in both regimes of ``harness.py``, in the same
interleaved rounds: *latency* (``block_until_ready(loss)`` after every step,
as a loop printing ``loss.item()`` each step does) and *pipelined* (``calls``
steps, one block at the end). One table per model per regime. Memory:
argument + temporary bytes from XLA's ``memory_analysis()`` of jmodule's
compiled step and of the floor's.

Run: ``make bench`` or ``python benchmarks/train_step.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import equinox as eqx
import jax
import numpy as np
import optax
import torch
from flax import nnx
from harness import REGIMES, figure, median_ratio, run_tables, save_results

import jmodule as jm
import jmodule.nn.functional as F
import jmodule.optim
from jmodule import nn

LR = 1e-3


def jm_mlp(sizes: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def floor_loss(params: list, x: jax.Array, y: jax.Array) -> jax.Array:
    """The MLP's cross-entropy in plain JAX, over ``[W0, b0, W1, b1, ...]`` (PyTorch layout)."""
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i].T + params[i + 1]
        if i < len(params) - 2:
            h = jax.nn.relu(h)
    return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()


def contestants(sizes: tuple[int, ...], batch: int) -> tuple[dict[str, Callable], dict]:
    key = jax.random.key(0)
    x = jax.random.normal(key, (batch, sizes[0]))
    y = jax.random.randint(jax.random.key(1), (batch,), 0, sizes[-1])

    # jmodule: the PyTorch loop, compiled whole.
    model = jm_mlp(sizes)
    opt = jm.optim.Adam(model.parameters(), lr=LR)

    @jm.compile
    def jm_step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    # The floor: plain JAX + optax over pre-flattened parameters, donated.
    params = [p.data.copy() for p in model.parameters()]
    tx = optax.adam(LR)
    state = {"params": params, "opt": tx.init(params)}

    def _floor(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(floor_loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    floor_jit = jax.jit(_floor, donate_argnums=(0, 1))

    def floor_step():
        state["params"], state["opt"], loss = floor_jit(state["params"], state["opt"], x, y)
        return loss

    # Flax NNX.
    class NnxMLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.layers = nnx.List(
                [nnx.Linear(sizes[i], sizes[i + 1], rngs=rngs) for i in range(len(sizes) - 1)]
            )

        def __call__(self, h):
            for i, layer in enumerate(self.layers):
                h = layer(h)
                if i < len(self.layers) - 1:
                    h = jax.nn.relu(h)
            return h

    nnx_model = NnxMLP(nnx.Rngs(0))
    nnx_opt = nnx.Optimizer(nnx_model, optax.adam(LR), wrt=nnx.Param)

    def nnx_train(model, optimizer, x, y):
        def loss(m):
            return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    nnx_step = nnx.jit(nnx_train)
    nnx_cached = nnx.cached_partial(nnx_step, nnx_model, nnx_opt)

    # Equinox.
    eqx_model = eqx.nn.MLP(
        sizes[0], sizes[-1], width_size=sizes[1], depth=len(sizes) - 2, key=jax.random.key(0)
    )
    eqx_state = {"model": eqx_model, "opt": tx.init(eqx.filter(eqx_model, eqx.is_array))}

    @eqx.filter_jit(donate="all-except-first")
    def eqx_train(x, model, opt_state, y):
        def loss(m):
            return optax.softmax_cross_entropy_with_integer_labels(jax.vmap(m)(x), y).mean()

        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, value

    def eqx_step():
        eqx_state["model"], eqx_state["opt"], value = eqx_train(
            x, eqx_state["model"], eqx_state["opt"], y
        )
        return value

    # PyTorch eager.
    torch_layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        torch_layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            torch_layers.append(torch.nn.ReLU())
    torch_model = torch.nn.Sequential(*torch_layers)
    torch_opt = torch.optim.Adam(torch_model.parameters(), lr=LR)
    tx_t, ty_t = torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y)).long()

    def torch_step():
        torch_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(torch_model(tx_t), ty_t)
        loss.backward()
        torch_opt.step()
        return loss.detach()

    steps = {
        "plain JAX + optax (floor)": floor_step,
        "jmodule @jm.compile step": lambda: jm_step(model, opt, x, y),
        "flax nnx.jit": lambda: nnx_step(nnx_model, nnx_opt, x, y),
        "flax nnx.cached_partial": lambda: nnx_cached(x, y),
        "equinox eqx.filter_jit": eqx_step,
        "pytorch eager": torch_step,
    }
    # Memory of the two compiled programs (after a call, so donation is settled).
    for _ in range(3):
        jm_step(model, opt, x, y)
        floor_step()
    ours = jm_step.lower(model, opt, x, y).compile().memory_analysis()
    floor = floor_jit.lower(state["params"], state["opt"], x, y).compile().memory_analysis()
    memory = {
        "jmodule": ours.argument_size_in_bytes + ours.temp_size_in_bytes,
        "floor": floor.argument_size_in_bytes + floor.temp_size_in_bytes,
    }
    return steps, memory


MODELS = (
    # sizes, batch, calls per measurement, issue 13's target, torch threads
    ((16, 32, 32, 10), 8, 1000, 1.15, 1),
    ((784, 512, 512, 10), 128, 100, 1.05, os.cpu_count() or 1),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (smoke run)")
    args = parser.parse_args()
    rounds, budget = (3, 0.05) if args.quick else (11, 0.2)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores")
    tables: dict[str, dict[str, float]] = {}
    raw: dict[str, dict[str, list[float]]] = {}
    figures: list = []
    for sizes, batch, calls, target, threads in MODELS:
        if args.quick:
            calls = max(calls // 10, 10)
        torch.set_num_threads(threads)
        steps, memory = contestants(sizes, batch)
        label = "-".join(map(str, sizes))
        title = f"Adam training step, MLP {label}, batch {batch}"
        measured = run_tables(title, steps, calls, rounds, tables, raw, budget_s=budget)
        for regime in REGIMES:
            per_round = measured[regime]
            floor, ours = next(iter(per_round)), "jmodule @jm.compile step"
            ratio = min(per_round[ours]) / min(per_round[floor])
            text = f"{title}: @jm.compile step / jax.jit + optax (donated)"
            figure(figures, text, regime, ratio, median_ratio(per_round, ours), target)
        ratio = memory["jmodule"] / memory["floor"]
        print(
            f"argument+temp memory: jmodule {memory['jmodule']:,} B, floor {memory['floor']:,} B "
            f"({ratio:.3f}x)"
        )
        tables[f"memory (argument+temp bytes), MLP {label}"] = {
            "plain JAX + optax (floor)": memory["floor"],
            "jmodule @jm.compile step": memory["jmodule"],
        }
    if not args.quick:
        save_results("train_step", tables, rounds=raw, figures=figures)


if __name__ == "__main__":
    main()
