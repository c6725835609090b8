"""Convolutions on the CPU: each ResNet-18 shape, and a whole training step, against PyTorch.

XLA's CPU convolution is slow on small maps with many channels, so jmodule
lowers a convolution whose output map has at most
``_conv_lowering.MATMUL_MAX_OUTPUT`` positions as im2col + one matmul (see
``jmodule/nn/functional/_conv_lowering.py``). Measured here, in paired rounds
(every contestant once per round, in every order in turn; per shape at least 18
rounds of 10 calls; figures are medians of the per-round ratios):

* per convolution shape of torchvision's ResNet-18 (batch 4, 64x64 input),
  forward+backward: plain ``jax.jit`` of ``lax.conv_general_dilated``, jm's
  ``F.conv2d`` (whichever form the rule picks), and PyTorch eager. Check: no
  shape is slower in jm than plain ``lax.conv`` (ratio <= 1 within 10%,
  the noise of one shared 2-core host).
* a training step of that ResNet-18 (cross-entropy, SGD with momentum),
  in both regimes (latency: block every step; pipelined: block once):
  PyTorch eager, ``jm.compile`` (this lowering), and ``jm.compile`` with the
  matmul form switched off (every convolution on ``lax.conv``, as before).
  Figure: jm / PyTorch eager, target <= 1.0.

  Measured on the 2-core host (December 2026): the step with every convolution
  on ``lax.conv`` runs about as fast as with the rule (0.8-1.05x PyTorch across
  runs, as the rule's 0.9-1.1x): the isolated-shape wins of the matmul form do
  not carry over into the whole step. What brought the step under PyTorch's
  time was max pooling's gradient (a gather; it was XLA's select-and-scatter)
  and batch norm's written-out derivative.

Run: ``.venv/bin/python benchmarks/conv.py [--rounds 5] [--batch 4] [--size 64]``
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import harness
from shared_models import resnet18  # the tests' ResNet-18, here at torchvision's widths

import jmodule as jm
from jmodule.nn import functional as F
from jmodule.nn.functional import _conv_lowering

WIDTHS = (64, 128, 256, 512)


def conv_shapes(size: int) -> list[tuple[int, int, int, int, int, int]]:
    """The distinct convolutions of ResNet-18 at ``size``: (c_in, c_out, side, k, stride, pad)."""
    side = size // 4  # after the stem (stride 2) and the max-pool (stride 2)
    shapes = [(3, WIDTHS[0], size, 7, 2, 3), (64, 64, side, 3, 1, 1)]
    for cin, cout in itertools.pairwise(WIDTHS):
        shapes += [(cin, cout, side, 3, 2, 1), (cin, cout, side, 1, 2, 0)]
        side //= 2
        shapes.append((cout, cout, side, 3, 1, 1))
    return shapes


def paired(contestants: dict, rounds: int, calls: int) -> dict[str, list[float]]:
    """Milliseconds per call (latency regime) of each contestant, one entry per round."""
    for fn in contestants.values():
        for _ in range(5):
            jax.block_until_ready(fn())
    times = {name: [] for name in contestants}
    names = list(contestants)
    orders = list(itertools.permutations(names))  # each contestant after each other one
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            t0 = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(contestants[name]())
            times[name].append((time.perf_counter() - t0) / calls * 1e3)
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def bench_shape(shape: tuple, batch: int, rounds: int, rng, tables: dict, checks: list) -> None:
    """Time one convolution shape forward+backward: plain lax.conv, jm's F.conv2d, torch."""
    import torch

    cin, cout, side, k, s, p = shape
    x = jnp.asarray(rng.standard_normal((batch, cin, side, side)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k), jnp.float32)

    def lax_conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (s, s), [(p, p)] * 2, dimension_numbers=("NCHW", "OIHW", "NCHW")
        )

    def jm_conv(x, w):
        return F.conv2d(x, w, stride=s, padding=p)

    def fwd_bwd(f):
        return jax.jit(jax.grad(lambda a, b: (f(a, b) ** 2).sum(), argnums=(0, 1)))

    lax_step, jm_step = fwd_bwd(lax_conv), fwd_bwd(jm_conv)
    tx = torch.tensor(np.asarray(x), requires_grad=True)
    tw = torch.tensor(np.asarray(w), requires_grad=True)

    def torch_step():
        tx.grad = tw.grad = None
        (torch.nn.functional.conv2d(tx, tw, stride=s, padding=p) ** 2).sum().backward()
        return tw.grad

    times = paired(
        {"lax": lambda: lax_step(x, w), "jm": lambda: jm_step(x, w), "torch": torch_step},
        6 * max(3, -(-rounds // 6)),  # every order of the three equally often
        calls=10,
    )
    name = f"{cin}->{cout} {side}x{side} k{k} s{s}"
    med = {n: statistics.median(v) for n, v in times.items()}
    out = _conv_lowering.output_size((side, side), (k, k), (s, s), [(p, p)] * 2, (1, 1))
    form = "matmul" if _conv_lowering.use_matmul(out) else "conv"
    r = ratio(times, "jm", "lax")
    print(f"{name:<34}{med['lax']:>9.2f}{med['jm']:>9.2f}{med['torch']:>9.2f}{r:>8.2f}{form:>8}")
    tables[f"conv fwd+bwd ms: {name}"] = med
    checks.append(
        {"check": f"jm <= plain lax.conv: {name}", "passed": r <= 1.1, "detail": f"{r:.2f}x"}
    )


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    print(
        f"ResNet-18 convolutions, batch {args.batch} at {args.size}x{args.size}, on "
        f"{jax.devices()[0].platform} (torch threads {torch.get_num_threads()}, load average "
        f"{harness.LOAD_AT_START:.1f}); matmul form for output maps <= "
        f"{_conv_lowering.MATMUL_MAX_OUTPUT} positions\n"
    )
    rng = np.random.default_rng(0)
    tables, checks, figures = {}, [], []

    print(f"{'shape (fwd+bwd)':<34}{'lax':>9}{'jm':>9}{'torch':>9}{'jm/lax':>8}{'form':>8}")
    for shape in conv_shapes(args.size):
        bench_shape(shape, args.batch, args.rounds, rng, tables, checks)

    # ------------------------------------------------------------------ the training step
    torch.manual_seed(0)
    tmodel = resnet18(torch.nn, widths=WIDTHS)
    models = {}
    for name in ("jm", "jm, lax.conv everywhere"):
        m = resnet18(jm.nn, widths=WIDTHS)
        m.load_state_dict(tmodel.state_dict())
        models[name] = m
    x = rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.01, momentum=0.9)
    opts = {n: jm.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for n, m in models.items()}
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    jx, jy = jnp.asarray(x), jnp.asarray(y)

    def torch_step():
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(tx), ty)
        loss.backward()
        topt.step()
        return loss.detach()

    def make_step():
        @jm.compile
        def step(model, opt, x, y):
            opt.zero_grad()
            loss = jm.backward(lambda: F.cross_entropy(model(x), y))
            opt.step()
            return loss

        return step

    steps = {n: make_step() for n in models}
    jax.block_until_ready(steps["jm"](models["jm"], opts["jm"], jx, jy))  # traced: this rule
    limit = _conv_lowering.MATMUL_MAX_OUTPUT
    _conv_lowering.MATMUL_MAX_OUTPUT = 0  # traced now: every convolution on lax.conv
    try:
        n = "jm, lax.conv everywhere"
        jax.block_until_ready(steps[n](models[n], opts[n], jx, jy))
    finally:
        _conv_lowering.MATMUL_MAX_OUTPUT = limit
    contestants = {"torch eager": torch_step}
    for n in models:
        contestants[n] = lambda n=n: steps[n](models[n], opts[n], jx, jy)
    measured = harness.measure(contestants, calls=5, rounds=args.rounds, budget_s=1.0)
    for regime, per_round in measured.items():
        title = f"ResNet-18 training step, batch {args.batch} at {args.size}x{args.size} [{regime}]"
        tables[title] = harness.print_table(title, per_round, ref="torch")
        harness.figure(
            figures,
            "ResNet-18 training step: jm.compile / PyTorch eager",
            regime,
            tables[title]["jm"] / tables[title]["torch eager"],
            harness.median_ratio(per_round, "jm", "torch eager"),
            1.0,
        )
    for c in checks:
        print(f"CHECK {c['check']}: {'ok' if c['passed'] else 'FAILED'} ({c['detail']})")
    harness.save_results("conv", tables, rounds=None, figures=figures, checks=checks)


if __name__ == "__main__":
    main()
