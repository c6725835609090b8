"""Sharded training steps, FSDP memory and meta init: jmodule vs plain JAX.

On 8 devices (simulated CPU devices unless JAX already sees 8 or more):

(a) Per-step time of a compiled Adam training step (MLP, the same loss code
    on both sides) with the batch sharded over ``"data"``, weights either
    replicated (data parallel) or FSDP-sharded (``jm.distributed.fsdp``),
    written two ways: jmodule (``jm.compile`` of the PyTorch-style loop over a
    ``jm.distributed.shard``-ed model) and plain JAX (``jax.jit`` of
    ``value_and_grad`` + ``optax.adam`` over parameter arrays with the same
    shardings, donating them). Target: the jmodule step takes at most 1.05x
    the plain-JAX step. The XLA ops that move data (copies, all-gathers,
    reduce-scatters, all-reduces) of both compiled programs are counted too.
    jmodule's one extra copy is of its step-count vector (one int32 per
    parameter, PyTorch keeps a count per parameter), which XLA copies before
    writing the new counts into the same buffer.
(b) Per-device argument memory, from XLA's ``memory_analysis()``, with
    FSDP-sharded weights vs replicated ones: of the forward+backward over the
    model's state, and of the whole jmodule training step (weights and Adam
    state). Target: 1/8 within 5%.
(c) Meta init: building a decoder of about 310 billion parameters (96 blocks
    of width 16384) under ``with jm.device("meta"):`` vs plain JAX's
    ``jax.eval_shape`` of an init function for the same arrays: time, and
    host memory (``tracemalloc`` peak) next to the 1.24 TB the float32
    weights would take.

Results go to ``benchmarks/results/sharding.json`` (``readme_table.py``).
Run: ``python benchmarks/sharding.py [--quick]`` (``--quick``: fewer steps,
nothing saved).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import jax.numpy as jnp
import numpy as np
import optax
from harness import save_results

import jmodule as jm
import jmodule.distributed as dist
import jmodule.optim
from jmodule import nn

SIZES = (256, 1024, 1024, 1024, 256)
BATCH = 128
LR = 1e-3
#: About 310 billion parameters (GPT-3 175B is 96 layers of width 12288).
BIG = {"layers": 96, "d": 16384, "vocab": 50304}
MOVES = ("copy", "all-gather", "reduce-scatter", "all-reduce")


def make_model() -> nn.Sequential:
    jm.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(len(SIZES) - 1):
        layers.append(nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def rules(mesh: jax.sharding.Mesh, layout: str) -> dist.Rules | None:
    return dist.fsdp(mesh) if layout == "fsdp" else None


def data(mesh: jax.sharding.Mesh) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH).astype(np.int32)
    return dist.shard_batch((x, y), mesh)


def nll(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Mean negative log-likelihood: the same loss code on both sides."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


class Step:
    """One contestant: ``step()`` runs a training step, ``lower()`` its program."""

    def __init__(self, run: Callable[[], Any], lower: Callable[[], Any]):
        self.run, self.lower = run, lower

    def moves(self) -> dict[str, int]:
        """How many data-moving ops of each kind the compiled program has."""
        text = self.lower().compile().as_text()
        return {op: len(re.findall(rf" {op}(?:-start)?\(", text)) for op in MOVES}


def per_step_ms(
    steps_by_name: dict[str, Step], steps: int, repeats: int
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Best-of-``repeats`` mean time of ``steps`` consecutive steps, in milliseconds.

    The contestants take turns within each repeat, so load from other
    processes on the machine falls on all of them alike. Also returns every
    repeat's time, for ratios taken within one repeat.
    """
    for step in steps_by_name.values():
        for _ in range(3):
            out = step.run()
        jax.block_until_ready(out)
    times: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for _ in range(repeats):
        for name, step in steps_by_name.items():
            start = time.perf_counter()
            for _ in range(steps):
                out = step.run()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    return {name: min(t) for name, t in times.items()}, times


def median_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """The median over repeats of ``num``'s time over ``den``'s in the same repeat."""
    return float(np.median(np.array(times[num]) / np.array(times[den])))


def jmodule_step(mesh: jax.sharding.Mesh, layout: str, zero_grad_last: bool = False) -> Step:
    """The PyTorch loop under ``jm.compile``.

    With ``opt.zero_grad()`` first (the usual loop) the gradients stay in
    ``.grad`` after the step, so the program also writes them out;
    ``zero_grad_last`` clears them at the end instead, so the program's
    outputs are exactly the plain-JAX step's (weights, optimizer state, loss).
    """
    model = dist.shard(make_model(), mesh, rules(mesh, layout))
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
    return Step(lambda: step(model, opt, x, y), lambda: step.lower(model, opt, x, y))


def plain_jax_step(mesh: jax.sharding.Mesh, layout: str, keep_grads: bool = False) -> Step:
    """``jax.jit`` of value_and_grad + optax.adam over arrays with the same shardings.

    ``keep_grads`` also returns the gradients, as the PyTorch loop leaves them
    in ``.grad``.
    """
    model = make_model()
    shardings = dist.shardings(model, mesh, rules(mesh, layout))
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

    return Step(run, lambda: step.lower(box[0], box[1], x, y))


def forward_backward_bytes(mesh: jax.sharding.Mesh, layout: str) -> int:
    """Per-device argument bytes of the compiled forward+backward over the model state."""
    model = dist.shard(make_model(), mesh, rules(mesh, layout))
    state = model.state_dict()

    def grads(state):
        x = jnp.ones((8, SIZES[0]))  # built inside: a constant, not an argument
        return jax.grad(lambda s: jnp.sum(jm.func.functional_call(model, s, (x,))))(state)

    return jax.jit(grads).lower(state).compile().memory_analysis().argument_size_in_bytes


def train_step_bytes(mesh: jax.sharding.Mesh, layout: str) -> int:
    """Per-device argument bytes of the jmodule Adam step (weights, Adam state, batch)."""
    step = jmodule_step(mesh, layout, zero_grad_last=True)
    jax.block_until_ready(step.run())  # settles donation: lower() is then what runs
    return step.lower().compile().memory_analysis().argument_size_in_bytes


# ---------------------------------------------------------------- (c) meta init


class Decoder(nn.Module):
    """A decoder-only language model's weights (GPT-style blocks, untied head)."""

    def __init__(self, layers: int, d: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln1": nn.LayerNorm(d),
                    "qkv": nn.Linear(d, 3 * d),
                    "out": nn.Linear(d, d),
                    "ln2": nn.LayerNorm(d),
                    "fc1": nn.Linear(d, 4 * d),
                    "fc2": nn.Linear(4 * d, d),
                }
            )
            for _ in range(layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)


def meta_decoder() -> Decoder:
    with jm.device("meta"):
        return Decoder(**BIG)


def plain_jax_init(key: jax.Array) -> dict[str, jax.Array]:
    """The same arrays, initialised as PyTorch does, in plain JAX (for ``jax.eval_shape``)."""
    layers, d, vocab = BIG["layers"], BIG["d"], BIG["vocab"]
    keys = iter(jax.random.split(key, 2 + 8 * layers))

    def linear(prefix: str, fan_in: int, fan_out: int, bias: bool = True) -> dict:
        bound = 1 / math.sqrt(fan_in)
        out = {
            f"{prefix}.weight": jax.random.uniform(
                next(keys), (fan_out, fan_in), jnp.float32, -bound, bound
            )
        }
        if bias:
            out[f"{prefix}.bias"] = jax.random.uniform(
                next(keys), (fan_out,), jnp.float32, -bound, bound
            )
        return out

    def norm(prefix: str) -> dict:
        return {f"{prefix}.weight": jnp.ones(d), f"{prefix}.bias": jnp.zeros(d)}

    params = {"embed.weight": jax.random.normal(next(keys), (vocab, d))}
    for i in range(layers):
        p = f"blocks.{i}"
        params |= norm(f"{p}.ln1") | linear(f"{p}.qkv", d, 3 * d) | linear(f"{p}.out", d, d)
        params |= norm(f"{p}.ln2") | linear(f"{p}.fc1", d, 4 * d) | linear(f"{p}.fc2", 4 * d, d)
    return params | norm("ln") | linear("head", d, vocab, bias=False)


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def traced_peak(fn: Callable[[], Any]) -> int:
    """Peak bytes of Python allocations while ``fn`` runs (``tracemalloc``)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def meta_init(mesh: jax.sharding.Mesh, repeats: int) -> dict[str, dict[str, float]]:
    model = meta_decoder()
    params = list(model.parameters())
    assert all(jm.is_meta(p) for p in params)
    count = sum(math.prod(p.shape) for p in params)
    weights = 4 * count
    abstract = jax.eval_shape(plain_jax_init, jax.random.key(0))
    assert {k: v.shape for k, v in abstract.items()} == {
        k: v.shape for k, v in model.state_dict().items()
    }, "the plain-JAX init must describe the same arrays"

    def eval_shape() -> dict[str, jax.ShapeDtypeStruct]:
        # a new function each time: jax.eval_shape caches the trace of one it has seen
        return jax.eval_shape(lambda key: plain_jax_init(key), jax.random.key(0))

    seconds = {
        "jax": best_seconds(eval_shape, repeats),
        "jm": best_seconds(meta_decoder, repeats),
    }
    peak = {"jax": traced_peak(eval_shape), "jm": traced_peak(meta_decoder)}
    plan_s = best_seconds(lambda: dist.shard(meta_decoder(), mesh, dist.fsdp(mesh)), 1)
    sharded = dist.shard(model, mesh, dist.fsdp(mesh))
    per_device = sum(4 * math.prod(p.sharding.shard_shape(p.shape)) for p in sharded.parameters())
    print(
        f"\n(c) meta init: {count / 1e9:.1f}B parameters ({BIG['layers']} blocks of width "
        f"{BIG['d']}); float32 weights would take {weights / 1e12:.2f} TB"
    )
    print(f"{'':<38} {'ms':>9} {'traced peak MiB':>16}")
    print(
        f"{'plain JAX jax.eval_shape(init)':<38} {seconds['jax'] * 1e3:>9.1f} "
        f"{peak['jax'] / 2**20:>16.2f}"
    )
    print(
        f"{'jmodule jm.device(meta)':<38} {seconds['jm'] * 1e3:>9.1f} {peak['jm'] / 2**20:>16.2f}"
    )
    print(
        f"build + FSDP plan on 8 devices: {plan_s * 1e3:.1f} ms; per device after "
        f"to_empty: {per_device / 1e9:.1f} GB ({per_device / weights:.4f} of the whole)"
    )
    size = f"{count / 1e9:.0f}B-parameter decoder ({weights / 1e12:.2f} TB of float32 weights)"
    return {
        f"meta init of a {size}, time": {
            "plain JAX jax.eval_shape of the init": seconds["jax"] * 1e6,
            "jmodule, built under jm.device('meta')": seconds["jm"] * 1e6,
        },
        f"memory (host, tracemalloc peak) of the meta init of a {size}": {
            "plain JAX jax.eval_shape of the init": float(peak["jax"]),
            "jmodule, built under jm.device('meta')": float(peak["jm"]),
        },
    }


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps; nothing saved")
    args = parser.parse_args()
    steps, repeats = (5, 3) if args.quick else (5, 40)
    assert jax.device_count() >= 8, jax.devices()
    mesh = dist.make_mesh(devices=jax.devices()[:8])
    params = sum(SIZES[i] * SIZES[i + 1] + SIZES[i + 1] for i in range(len(SIZES) - 1))
    print(
        f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices, "
        f"{os.cpu_count()} cores; MLP {SIZES} ({params / 1e6:.2f}M params), batch {BATCH} "
        "sharded over 'data'"
    )
    print(f"\n(a) compiled Adam step, ms per step (best of {repeats} runs of {steps} steps)")
    print("  jax:   value_and_grad + optax.adam; outputs weights, Adam state, loss")
    print("  jm*:   the PyTorch loop with zero_grad() last: the same outputs as jax")
    print("  jax+g: jax also returning the gradients")
    print("  jm:    the usual loop, zero_grad() first: .grad stays set after the step")
    print(
        f"{'layout':<7} {'jax':>8} {'jm*':>8} {'jm*/jax':>8} {'jax+g':>8} {'jm':>8} {'jm/jax+g':>9}"
    )
    tables: dict[str, dict[str, float]] = {}
    moves, medians = {}, {}
    for layout in ("dp", "fsdp"):
        contestants = {
            "jax": plain_jax_step(mesh, layout),
            "jm*": jmodule_step(mesh, layout, zero_grad_last=True),
            "jax+g": plain_jax_step(mesh, layout, keep_grads=True),
            "jm": jmodule_step(mesh, layout),
        }
        ms, times = per_step_ms(contestants, steps, repeats)
        moves[layout] = {name: step.moves() for name, step in contestants.items()}
        print(
            f"{layout:<7} {ms['jax']:>8.2f} {ms['jm*']:>8.2f} {ms['jm*'] / ms['jax']:>7.3f}x "
            f"{ms['jax+g']:>8.2f} {ms['jm']:>8.2f} {ms['jm'] / ms['jax+g']:>8.3f}x"
        )
        medians[layout] = (median_ratio(times, "jm*", "jax"), median_ratio(times, "jm", "jax+g"))
        what = "data parallel" if layout == "dp" else "FSDP"
        title = f"sharded Adam step on 8 devices, {what}"
        tables[title] = {"plain JAX": ms["jax"] * 1e3, "jmodule, zero_grad() last": ms["jm*"] * 1e3}
        tables[f"{title}, .grad kept"] = {
            "plain JAX returning grads": ms["jax+g"] * 1e3,
            "jmodule, zero_grad() first": ms["jm"] * 1e3,
        }
    print("median over repeats of the ratio within a repeat (robust to load from others):")
    for layout, (star, plain) in medians.items():
        print(f"  {layout:<5} jm*/jax {star:.3f}x  jm/jax+g {plain:.3f}x")
    print(f"\ndata-moving XLA ops per compiled step ({', '.join(MOVES)}):")
    for layout, by_name in moves.items():
        shown = "  ".join(f"{n} {tuple(m.values())}" for n, m in by_name.items())
        print(f"  {layout:<5} {shown}")

    print("\n(b) per-device argument bytes (memory_analysis), FSDP vs replicated weights")
    for label, measure in (
        ("forward+backward", forward_backward_bytes),
        ("Adam training step", train_step_bytes),
    ):
        full, sharded = measure(mesh, "dp"), measure(mesh, "fsdp")
        print(
            f"  {label:<19} replicated {full:>12,d}  FSDP {sharded:>11,d}  ratio "
            f"{sharded / full:.4f}  (target 1/8 = 0.1250 within 5%)"
        )
        tables[f"memory per device, {label} arguments"] = {
            "replicated weights": float(full),
            "FSDP over 8 devices": float(sharded),
        }
    spec = dist.shardings(make_model(), mesh, dist.fsdp(mesh))
    print("  FSDP specs:", {k: tuple(v.spec) for k, v in spec.items()})

    tables |= meta_init(mesh, 2 if args.quick else 5)
    if not args.quick:
        save_results("sharding", tables)


if __name__ == "__main__":
    main()
