"""Scan over layers: trace+compile time of a compiled training step, 4 vs 48 blocks.

A GPT-style decoder (token and position embeddings; pre-norm blocks of
causal self-attention, written with ``Linear`` and
``F.scaled_dot_product_attention``, and a GELU MLP, with dropout; a final
LayerNorm and a head; small widths: d 32, 2 heads, sequence 16, batch 4,
vocabulary 64) and its compiled training step (``jm.compile``: zero_grad,
``jm.backward`` of the cross-entropy, AdamW), built with 4 and with 48 blocks,
the blocks either in a ``ModuleList`` looped over (unrolled) or in
``jm.nn.scan`` (scanned).

Measured, per configuration and round: the wall time of the first call of a
fresh step (trace, lowering, XLA compilation and one run) minus the median of
the next ``--calls`` calls (one run): the trace+compile time (after one untimed
warm-up compile, which pays the process's one-time costs). Also printed:
the number of StableHLO operations in the lowered step (``step.lower(...)``), which
shows what still grows with depth when the blocks are scanned (the blocks'
parameters are read, updated and written stacked, one array per kind, but each
block's gradient is still its own slice of the stacked gradient). Rounds
interleave the four configurations (the order rotating), and the figures are
medians over rounds of the per-round ratios (48 / 4 blocks, scanned and
unrolled). Target: scanned 48-block <= 1.3x scanned 4-block.

Run: ``.venv/bin/python benchmarks/scan.py [--rounds 3]``
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import harness

import jmodule as jm

nn = jm.nn
F = jm.nn.functional
TARGET = 1.3


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, p: float):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.drop = nn.Dropout(p)
        self.p = p

    def forward(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)
        q, k, v = (
            z.reshape(b, t, self.heads, d // self.heads).transpose(0, 2, 1, 3) for z in (q, k, v)
        )
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.drop(self.c_proj(y.transpose(0, 2, 1, 3).reshape(b, t, d)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, p)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d), nn.Dropout(p)
        )

    def forward(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, blocks: int, scanned: bool, args: argparse.Namespace):
        super().__init__()
        d = args.d
        self.wte = nn.Embedding(args.vocab, d)
        self.wpe = nn.Embedding(args.seq, d)
        h = nn.ModuleList([Block(d, args.heads, 0.1) for _ in range(blocks)])
        self.h = jm.nn.scan(h) if scanned else h
        self.scanned = scanned
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, args.vocab, bias=False)

    def forward(self, idx: jax.Array) -> jax.Array:
        x = self.wte(idx) + self.wpe(jnp.arange(idx.shape[1]))
        if self.scanned:
            x = self.h(x)
        else:
            for block in self.h:
                x = block(x)
        return self.head(self.ln_f(x))


def build(blocks: int, scanned: bool, args: argparse.Namespace):
    jm.manual_seed(0)
    model = GPT(blocks, scanned, args)
    opt = jm.optim.AdamW(model.parameters(), lr=1e-3)

    @jm.compile
    def step(m, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(m(x).reshape(-1, args.vocab), y.reshape(-1)))
        opt.step()
        return loss

    return model, opt, step


def trace_compile_seconds(blocks: int, scanned: bool, args, x, y) -> tuple[float, float, int]:
    """(first call - median steady call, median steady call, StableHLO ops in the lowered
    program) of a fresh compiled step."""
    model, opt, step = build(blocks, scanned, args)
    t0 = time.perf_counter()
    jax.block_until_ready(step(model, opt, x, y))
    first = time.perf_counter() - t0
    steady = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        jax.block_until_ready(step(model, opt, x, y))
        steady.append(time.perf_counter() - t0)
    assert jm.compile_stats(step).num_traces == 1
    run = statistics.median(steady)
    ops = sum(1 for line in step.lower(model, opt, x, y).as_text().splitlines() if " = " in line)
    return first - run, run, ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shallow", type=int, default=4)
    p.add_argument("--deep", type=int, default=48)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=5, help="steady-state calls per measurement")
    args = p.parse_args()

    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.randint(kx, (args.batch, args.seq), 0, args.vocab)
    y = jax.random.randint(ky, (args.batch, args.seq), 0, args.vocab)
    configs = [
        (f"{kind} {n}", n, kind == "scanned")
        for kind in ("scanned", "unrolled")
        for n in (args.shallow, args.deep)
    ]
    compile_s: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    step_s: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    hlo_ops: dict[str, int] = {}
    # The first compile in a process also pays one-time costs (XLA and LLVM start-up, the
    # eager kernels the step's first call uses): pay them before measuring.
    trace_compile_seconds(1, True, args, x, y)
    for r in range(args.rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for name, n, scanned in order:
            c, s, ops = trace_compile_seconds(n, scanned, args, x, y)
            compile_s[name].append(c)
            step_s[name].append(s)
            hlo_ops[name] = ops
            print(
                f"round {r}: {name:>12} blocks: trace+compile {c:7.2f} s, step "
                f"{s * 1e3:7.2f} ms, {ops} StableHLO ops",
                flush=True,
            )

    lo, hi = args.shallow, args.deep
    ratio = {
        kind: [a / b for a, b in zip(compile_s[f"{kind} {hi}"], compile_s[f"{kind} {lo}"])]
        for kind in ("scanned", "unrolled")
    }
    print(
        f"\nGPT-style model, d={args.d}, {args.heads} heads, seq {args.seq}, batch "
        f"{args.batch}, on {jax.devices()[0].platform}; medians over {args.rounds} rounds"
    )
    for name in compile_s:
        print(
            f"  {name:>12} blocks: trace+compile {statistics.median(compile_s[name]):7.2f} s, "
            f"step {statistics.median(step_s[name]) * 1e3:7.2f} ms, {hlo_ops[name]} StableHLO ops"
        )
    figures: list = []
    for kind, target in (("scanned", TARGET), ("unrolled", None)):
        med = statistics.median(ratio[kind])
        harness.figure(
            figures,
            f"trace+compile time of a compiled training step, {hi} / {lo} blocks, {kind}",
            "compile",
            med,
            med,
            target,
        )
    harness.save_results(
        "scan",
        {
            "trace+compile seconds (median)": {
                k: statistics.median(v) for k, v in compile_s.items()
            },
            "step seconds (median)": {k: statistics.median(v) for k, v in step_s.items()},
            "StableHLO ops in the lowered step": hlo_ops,
        },
        rounds={"trace+compile seconds": compile_s, "step seconds": step_s},
        figures=figures,
    )


if __name__ == "__main__":
    main()
