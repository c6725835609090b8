"""Activation checkpointing: XLA temporary memory and step time of a compiled training step.

A 24-block transformer-like model (``jm.nn.TransformerEncoderLayer``:
d_model 64, 4 heads, feed-forward 256, dropout 0.1; sequence 64, batch 8)
and its compiled training step (``jm.compile``: zero_grad, ``jm.backward``,
Adam), built twice: every block called directly, and every block under
``jm.utils.checkpoint.checkpoint``. Reported:

* XLA's temporary memory of each step,
  ``step.lower(...).compile().memory_analysis().temp_size_in_bytes``, and
  the figure: checkpointed / plain, target <= 1/3;
* the step time of each, in ``--rounds`` paired rounds (both steps once per
  round, the order alternating), and the median over rounds of the paired
  ratio (the cost of recomputing the forward pass; no target).

XLA:CPU removes JAX's optimization barriers (its OptimizationBarrierExpander
pass) before scheduling; XLA:GPU removes them only after. Without them the
CPU compiler is free to merge each block's recomputation with the forward
pass or run it early, so with a plain ``jax.checkpoint`` the recomputed
activations live as long as stored ones would: the step paid the
recomputation and saved no temporary memory (checkpointed / plain 1.008,
1.40x the step time, before the change below). On CPU,
``jm.utils.checkpoint`` therefore makes each block's recomputation depend on
the cotangent arriving at that block (a ``jax.custom_vjp`` whose backward
rule selects every saved input through a condition computed from the
cotangent, see ``jmodule/utils/checkpoint.py``), so it cannot run before the
backward pass reaches the block; on GPU/TPU it is ``jax.checkpoint`` as is.

Run: ``.venv/bin/python benchmarks/remat.py [--blocks 24] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import harness

import jmodule as jm
from jmodule.utils.checkpoint import checkpoint

TARGET = 1 / 3


class Model(jm.nn.Module):
    def __init__(self, blocks: int, d: int, heads: int, ck: bool):
        super().__init__()
        self.blocks = jm.nn.ModuleList(
            [
                jm.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
                for _ in range(blocks)
            ]
        )
        self.head = jm.nn.Linear(d, d)
        self.ck = ck

    def forward(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.ck else block(x)
        return self.head(x)


def build(ck: bool, args: argparse.Namespace):
    jm.manual_seed(0)
    model = Model(args.blocks, args.d, args.heads, ck)
    opt = jm.optim.Adam(model.parameters(), lr=1e-3)

    @jm.compile
    def step(m, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: jm.nn.functional.mse_loss(m(x), y))
        opt.step()
        return loss

    return model, opt, step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=5, help="steps timed per round")
    args = p.parse_args()

    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (args.batch, args.seq, args.d))
    y = jax.random.normal(ky, (args.batch, args.seq, args.d))
    runs = {}
    temp = {}
    for name, ck in (("plain", False), ("checkpointed", True)):
        model, opt, step = build(ck, args)
        t0 = time.perf_counter()
        temp[name] = step.lower(model, opt, x, y).compile().memory_analysis().temp_size_in_bytes
        jax.block_until_ready(step(model, opt, x, y))  # compile for calls, too
        took = time.perf_counter() - t0
        print(f"{name}: temp {temp[name] / 2**20:.2f} MiB (compiled in {took:.1f} s)")
        runs[name] = (model, opt, step)

    rounds: dict[str, list[float]] = {"plain": [], "checkpointed": []}
    for r in range(args.rounds):
        order = ("plain", "checkpointed") if r % 2 == 0 else ("checkpointed", "plain")
        for name in order:
            model, opt, step = runs[name]
            jax.block_until_ready(step(model, opt, x, y))
            t0 = time.perf_counter()
            for _ in range(args.calls):
                jax.block_until_ready(step(model, opt, x, y))
            rounds[name].append((time.perf_counter() - t0) / args.calls)
    ratios = [c / p for c, p in zip(rounds["checkpointed"], rounds["plain"])]
    time_ratio = statistics.median(ratios)
    mem_ratio = temp["checkpointed"] / temp["plain"]
    platform = jax.devices()[0].platform
    verdict = "PASS" if mem_ratio <= TARGET else "MISS"
    print(
        f"\n{args.blocks} blocks, d={args.d}, {args.heads} heads, seq {args.seq}, "
        f"batch {args.batch}, on {platform}"
    )
    print(
        f"XLA temp memory: plain {temp['plain'] / 2**20:.2f} MiB, checkpointed "
        f"{temp['checkpointed'] / 2**20:.2f} MiB, ratio {mem_ratio:.3f} "
        f"(target <= {TARGET:.3f}): {verdict}"
    )
    if verdict == "MISS" and platform == "cpu":
        print("  (on CPU the recomputation should wait for the cotangent: see the docstring)")
    print(
        f"step time: plain {statistics.median(rounds['plain']) * 1e3:.2f} ms, checkpointed "
        f"{statistics.median(rounds['checkpointed']) * 1e3:.2f} ms, paired median ratio "
        f"{time_ratio:.3f}x (cost of recomputation; no target)"
    )
    figures: list = []
    harness.figure(
        figures, "remat temp memory, checkpointed / plain", "memory", mem_ratio, mem_ratio, TARGET
    )
    harness.figure(
        figures, "remat step time, checkpointed / plain", "latency", time_ratio, time_ratio, None
    )
    harness.save_results(
        "remat",
        {
            "XLA temp bytes": dict(temp),
            "step seconds (median)": {k: statistics.median(v) for k, v in rounds.items()},
        },
        rounds={"step seconds": rounds},
        figures=figures,
    )


if __name__ == "__main__":
    main()
