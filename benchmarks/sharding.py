"""Sharded training steps: jmodule vs plain JAX with the same shardings, and FSDP memory.

On 8 devices (simulated CPU devices unless JAX already sees 8 or more):

(a) Per-step time of a compiled Adam training step (MLP, the same loss code
    on both sides) with the batch sharded over ``"data"``, weights either replicated (data
    parallel) or FSDP-sharded, written two ways: jmodule (``jm.compile`` of
    the PyTorch-style loop over a ``jm.distributed.shard``-ed model) and
    plain JAX (``jax.jit`` of ``value_and_grad`` + ``optax.adam`` over
    parameter arrays with the same shardings, donating them). Target: the
    jmodule step takes at most 1.05x the plain-JAX step.
(b) Per-device argument memory, from XLA's ``memory_analysis()``, of the
    compiled forward+backward of the model with FSDP-sharded weights vs
    replicated ones. Target: 1/8 within 5%.

Run: ``python benchmarks/sharding.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jmodule as jm
import jmodule.distributed as dist
import jmodule.optim
from jmodule import nn

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SIZES = (256, 1024, 1024, 1024, 256)
BATCH = 128
LR = 1e-3


def make_model() -> nn.Sequential:
    jm.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(len(SIZES) - 1):
        layers.append(nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def place(model: nn.Sequential, mesh: jax.sharding.Mesh, layout: str) -> nn.Sequential:
    return dist.shard(model, mesh, dist.fsdp(mesh) if layout == "fsdp" else None)


def data(mesh: jax.sharding.Mesh) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH).astype(np.int32)
    return dist.shard_batch((x, y), mesh)


def nll(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Mean negative log-likelihood: the same loss code on both sides."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def per_step_ms(steps_by_name: dict, steps: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` mean time of ``steps`` consecutive steps, in milliseconds.

    The contestants take turns within each repeat, so load from other
    processes on the machine falls on all of them alike.
    """
    for step in steps_by_name.values():
        for _ in range(3):
            out = step()
        jax.block_until_ready(out)
    best = dict.fromkeys(steps_by_name, float("inf"))
    for _ in range(repeats):
        for name, step in steps_by_name.items():
            start = time.perf_counter()
            for _ in range(steps):
                out = step()
            jax.block_until_ready(out)
            best[name] = min(best[name], (time.perf_counter() - start) / steps)
    return {name: t * 1e3 for name, t in best.items()}


def jmodule_step(mesh, layout, zero_grad_last=False):
    """The PyTorch loop under ``jm.compile``.

    With ``opt.zero_grad()`` first (the usual loop) the gradients stay in
    ``.grad`` after the step, so the program also writes them out;
    ``zero_grad_last`` clears them at the end instead, so the program's
    outputs are exactly the plain-JAX step's (weights, optimizer state, loss).
    """
    model = place(make_model(), mesh, layout)
    opt = jm.optim.Adam(model.parameters(), lr=LR)
    x, y = data(mesh)

    def train_step(model, opt, x, y):
        if not zero_grad_last:
            opt.zero_grad()
        loss = jm.backward(lambda: nll(model(x), y))
        opt.step()
        if zero_grad_last:
            opt.zero_grad()
        return loss

    step = jm.compile(train_step)
    return lambda: step(model, opt, x, y)


def plain_jax_step(mesh, layout, keep_grads=False):
    """``jax.jit`` of value_and_grad + optax.adam over arrays with the same shardings.

    ``keep_grads`` also returns the gradients, as the PyTorch loop leaves them
    in ``.grad``.
    """
    model = make_model()
    shardings = dist.shardings(model, mesh, dist.fsdp(mesh) if layout == "fsdp" else None)
    params = {k: jax.device_put(v, shardings[k]) for k, v in model.state_dict().items()}
    n_linear = len(SIZES) - 1
    tx = optax.adam(LR)
    state = tx.init(params)
    x, y = data(mesh)

    def loss_fn(p, x, y):
        h = x
        for i in range(n_linear):
            h = h @ p[f"{2 * i}.weight"].T + p[f"{2 * i}.bias"]
            if i < n_linear - 1:
                h = jax.nn.relu(h)
        return nll(h, y)

    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss, (g if keep_grads else None)

    step = jax.jit(step, donate_argnums=(0, 1))
    box = [params, state, None]

    def run():
        box[0], box[1], loss, box[2] = step(box[0], box[1], x, y)
        return loss

    return run


def argument_bytes(mesh, layout) -> int:
    """Per-device argument bytes of the compiled forward+backward over the model state."""
    model = place(make_model(), mesh, layout)
    state = model.state_dict()

    def grads(state):
        x = jnp.ones((8, SIZES[0]))  # built inside: a constant, not an argument
        return jax.grad(lambda s: jnp.sum(jm.func.functional_call(model, s, (x,))))(state)

    stats = jax.jit(grads).lower(state).compile().memory_analysis()
    return stats.argument_size_in_bytes


def save_results(tables: dict[str, dict[str, float]]) -> None:
    """Write ``benchmarks/results/sharding.json`` (read by ``readme_table.py``)."""
    out = RESULTS / "sharding.json"
    out.parent.mkdir(exist_ok=True)
    meta = {"jax": jax.__version__, "platform": jax.devices()[0].platform, "cores": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "tables": tables}, indent=2) + "\n")
    print(f"\nwrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    args = parser.parse_args()
    steps, repeats = (10, 3) if args.quick else (20, 10)
    assert jax.device_count() >= 8, jax.devices()
    mesh = dist.make_mesh(devices=jax.devices()[:8])
    params = sum(SIZES[i] * SIZES[i + 1] + SIZES[i + 1] for i in range(len(SIZES) - 1))
    print(
        f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices; "
        f"MLP {SIZES} ({params / 1e6:.2f}M params), batch {BATCH} sharded over 'data'"
    )
    print(f"\n(a) compiled Adam step, ms per step (best of {repeats} x {steps} steps)")
    print("  jax:  value_and_grad + optax.adam; outputs weights, Adam state, loss")
    print("  jm*:  the PyTorch loop with zero_grad() last: the same outputs as jax")
    print("  jax+g: jax also returning the gradients")
    print("  jm:   the usual loop, zero_grad() first: .grad stays set after the step")
    print(
        f"{'layout':<7} {'jax':>8} {'jm*':>8} {'jm*/jax':>8} {'jax+g':>8} {'jm':>8} {'jm/jax+g':>9}"
    )
    tables: dict[str, dict[str, float]] = {}
    for layout in ("dp", "fsdp"):
        contestants = {
            "jax": plain_jax_step(mesh, layout),
            "jm*": jmodule_step(mesh, layout, zero_grad_last=True),
            "jax+g": plain_jax_step(mesh, layout, keep_grads=True),
            "jm": jmodule_step(mesh, layout),
        }
        ms = per_step_ms(contestants, steps, repeats)
        print(
            f"{layout:<7} {ms['jax']:>8.2f} {ms['jm*']:>8.2f} {ms['jm*'] / ms['jax']:>7.3f}x "
            f"{ms['jax+g']:>8.2f} {ms['jm']:>8.2f} {ms['jm'] / ms['jax+g']:>8.3f}x"
        )
        what = "data parallel" if layout == "dp" else "FSDP"
        title = f"sharded Adam step on 8 devices, {what}"
        tables[title] = {"plain JAX": ms["jax"] * 1e3, "jmodule, zero_grad() last": ms["jm*"] * 1e3}
        tables[f"{title}, .grad kept"] = {
            "plain JAX returning grads": ms["jax+g"] * 1e3,
            "jmodule, zero_grad() first": ms["jm"] * 1e3,
        }
    print("\n(b) per-device argument bytes of forward+backward (memory_analysis)")
    full = argument_bytes(mesh, "dp")
    sharded = argument_bytes(mesh, "fsdp")
    print(f"replicated {full:>12,d}\nFSDP       {sharded:>12,d}")
    print(f"ratio      {sharded / full:>12.4f}  (target 1/8 = 0.1250 within 5%)")
    tables["memory per device, forward+backward arguments"] = {
        "replicated": float(full),
        "FSDP over 8 devices": float(sharded),
    }
    spec = dist.shardings(make_model(), mesh, dist.fsdp(mesh))
    print("FSDP specs:", {k: tuple(v.spec) for k, v in spec.items()})
    if not args.quick:
        save_results(tables)


if __name__ == "__main__":
    main()
