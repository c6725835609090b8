"""``loss.backward()`` on jm.Tensors, eagerly: the tutorial step, against PyTorch eager.

One eager training step, written as a PyTorch tutorial writes it:
``opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward();
opt.step()``. Contestants, an MLP 784-128-10 at batch 32 with SGD momentum
(the MLP of ``benchmarks/eager.py``):

* ``pytorch eager`` (the reference), at 1 and at 2 threads;
* ``jm loss.backward()``: the same lines with ``import jmodule.torch as torch``
  (the graph ``recorder.in_graph`` records);
* ``jm.backward(closure)``: the closure spelling, on the same Tensors.

Both regimes of ``harness.py`` (latency: ``float(loss)`` every step, as a
tutorial's loop prints it; pipelined: one block after many steps), interleaved
rounds, in one process; run it three times for a figure. Run:
``python benchmarks/tensor_backward.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np
import torch
from harness import REGIMES, figure, median_ratio, run_tables, save_results

import jmodule as jm
import jmodule.torch as jtorch


def _mlp(nn):
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    torch.manual_seed(0)
    ref = _mlp(torch.nn)
    ours, closure_model = _mlp(jtorch.nn), _mlp(jtorch.nn)
    for m in (ours, closure_model):
        m.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 784)).astype(np.float32), rng.integers(0, 10, 32)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    jx, jy = jtorch.from_numpy(x), jtorch.from_numpy(y)
    topt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)
    jopt = jtorch.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)
    copt = jtorch.optim.SGD(closure_model.parameters(), lr=0.01, momentum=0.9)

    def torch_step(threads):
        def step():
            torch.set_num_threads(threads)
            topt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ref(tx), ty)
            loss.backward()
            topt.step()
            return loss.detach().numpy()  # what block_until_ready waits for: nothing pending

        return step

    def jm_step():
        jopt.zero_grad()
        loss = jtorch.nn.functional.cross_entropy(ours(jx), jy)
        loss.backward()
        jopt.step()
        return loss.array

    def closure_step():
        copt.zero_grad()
        loss = jm.backward(lambda: jtorch.nn.functional.cross_entropy(closure_model(jx), jy))
        copt.step()
        return loss.array

    contestants = {
        "pytorch eager, 2 threads": torch_step(2),
        "pytorch eager, 1 thread": torch_step(1),
        "jm loss.backward()": jm_step,
        "jm.backward(closure)": closure_step,
    }
    for f in contestants.values():
        for _ in range(3):
            f()
    tables: dict = {}
    raw: dict = {}
    figures: list = []
    measured = run_tables(
        "MLP 784-128-10, batch 32, eager SGD step: us per step",
        contestants,
        calls=20 if quick else 100,
        rounds=3 if quick else 11,
        tables=tables,
        raw=raw,
        ref="pytorch eager, 2 threads",
    )
    for regime in REGIMES:
        rounds = measured[regime]
        fastest_torch = min(
            ("pytorch eager, 2 threads", "pytorch eager, 1 thread"), key=lambda k: min(rounds[k])
        )
        for name in ("jm loss.backward()", "jm.backward(closure)"):
            ratio = min(rounds[name]) / min(rounds[fastest_torch])
            figure(figures, f"{name} / PyTorch eager ({fastest_torch})", regime, ratio,
                   median_ratio(rounds, name, fastest_torch), 1.5)  # fmt: skip
        a, b = "jm loss.backward()", "jm.backward(closure)"
        ratio = min(rounds[a]) / min(rounds[b])
        figure(figures, f"{a} / {b}", regime, ratio, median_ratio(rounds, a, b), None)
    save_results("tensor_backward", tables, rounds=raw, figures=figures)


if __name__ == "__main__":
    main()
