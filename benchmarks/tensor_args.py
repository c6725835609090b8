"""What a ``jm.Tensor`` argument costs a compiled call, against a plain array and plain JAX.

A ``jm.Tensor`` (``jmodule/_tensor.py``) is a one-leaf pytree: the XLA program
is the same as with an array, and what it adds is host work, JAX flattening
and rebuilding a Python-registered pytree node. Contestants, MLP 16-32-10 at
batch 8 (dispatch-bound, so the per-call overhead shows):

* ``floor``: ``jax.jit`` of the same forward over the parameters
  (``jm.func.functional_call``), given an array;
* ``model.compile() array`` / ``model.compile() Tensor``;
* ``jm.compile array`` / ``jm.compile Tensor``: a ``jm.compile``'d function
  calling the model.

Both regimes of ``harness.py`` (latency: block on every call; pipelined: one
block after many calls), interleaved rounds, in one process; run it three
times for a figure. Run: ``python benchmarks/tensor_args.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import jax
import jax.numpy as jnp
from harness import REGIMES, figure, median_ratio, run_tables, save_results

import jmodule as jm
from jmodule import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    jm.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
    params = {k: v.data for k, v in model.state_dict(keep_vars=True).items()}
    x = jax.random.normal(jax.random.key(0), (8, 16))
    t = jm.Tensor(x)
    floor = jax.jit(lambda p, v: jm.func.functional_call(model, p, (v,)))
    compiled = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
    compiled.load_state_dict(model.state_dict())
    compiled.compile()

    @jm.compile
    def forward(m, v):
        return m(v)

    contestants = {
        "floor": lambda: floor(params, x),
        "model.compile() array": lambda: compiled(x),
        "model.compile() Tensor": lambda: compiled(t),
        "jm.compile array": lambda: forward(model, x),
        "jm.compile Tensor": lambda: forward(model, t),
    }
    for f in contestants.values():
        jax.block_until_ready(f())
    assert type(compiled(t)) is jm.Tensor and type(forward(model, t)) is jm.Tensor
    assert jnp.allclose(compiled(t).array, floor(params, x), atol=1e-6)
    tables: dict = {}
    raw: dict = {}
    figures: list = []
    measured = run_tables(
        "MLP 16-32-10, batch 8: us per call",
        contestants,
        calls=200 if quick else 2000,
        rounds=3 if quick else 9,
        tables=tables,
        raw=raw,
    )
    for regime in REGIMES:
        rounds = measured[regime]
        for route in ("model.compile()", "jm.compile"):
            a, b = f"{route} array", f"{route} Tensor"
            ratio = min(rounds[b]) / min(rounds[a])
            figure(figures, f"{route}: Tensor / array", regime, ratio,
                   median_ratio(rounds, b, a), None)  # fmt: skip
    save_results("tensor_args", tables, rounds=raw, figures=figures)


if __name__ == "__main__":
    main()
