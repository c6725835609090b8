"""Every jm.optim optimizer's compiled training step against plain JAX with its optax arithmetic.

Issue 16: each new optimizer's compiled step stays within the speed targets of
the optimizers we had (``benchmarks/train_step.py``: the ``@jm.compile`` step
at most 1.15x the floor for the dispatch-bound MLP 16-32-32-10 at batch 8, and
at most 1.05x for the compute-bound 784-512-512-10 at batch 128).

For each optimizer the step is the PyTorch loop under ``@jm.compile``
(``zero_grad``, ``jm.backward``, ``opt.step()``); the floor is a donated
``jax.jit`` step over a list of arrays that applies, per parameter, the very
optax transformation the optimizer builds for it (``opt._transformation``:
what jmodule computes, without jmodule), so the ratio is jmodule's overhead,
not the algorithm's cost. Both are timed in both regimes of ``harness.py``
(latency and pipelined) in the same interleaved rounds.

Not here: ``LBFGS`` (eager only: its iteration counts depend on the values),
``SparseAdam`` (its row masking is outside the transformation); ``Muon``
trains the matrices only (it refuses vectors, as torch's does), and so does
its floor.

Run: ``python benchmarks/optimizers.py [--quick] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import jax
import optax
from harness import RESULTS, figure, median_ratio, run_tables, save_results
from train_step import floor_loss, jm_mlp

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import optim

OPTIMIZERS: dict[str, Callable] = {
    "SGD (momentum)": lambda ps: optim.SGD(ps, lr=1e-2, momentum=0.9),
    "Adam": lambda ps: optim.Adam(ps, lr=1e-3),
    "AdamW": lambda ps: optim.AdamW(ps, lr=1e-3),
    "RMSprop": lambda ps: optim.RMSprop(ps, lr=1e-3),
    "Adagrad": lambda ps: optim.Adagrad(ps, lr=1e-2),
    "Adadelta": lambda ps: optim.Adadelta(ps),
    "Adamax": lambda ps: optim.Adamax(ps),
    "NAdam": lambda ps: optim.NAdam(ps),
    "RAdam": lambda ps: optim.RAdam(ps),
    "Rprop": lambda ps: optim.Rprop(ps),
    "ASGD": lambda ps: optim.ASGD(ps),
    "Adafactor": lambda ps: optim.Adafactor(ps),
    "Muon": lambda ps: optim.Muon([p for p in ps if p.ndim == 2]),
}

MODELS = (
    # sizes, batch, calls per measurement, target (benchmarks/train_step.py's)
    ((16, 32, 32, 10), 8, 500, 1.15),
    ((784, 512, 512, 10), 128, 50, 1.05),
)


def contestants(name: str, sizes: tuple[int, ...], batch: int) -> dict[str, Callable]:
    x = jax.random.normal(jax.random.key(0), (batch, sizes[0]))
    y = jax.random.randint(jax.random.key(1), (batch,), 0, sizes[-1])
    jm.manual_seed(0)
    model = jm_mlp(sizes)
    opt = OPTIMIZERS[name](list(model.parameters()))

    @jm.compile
    def jm_step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    # The floor: the same per-parameter optax transformations, in plain JAX.
    group = opt.param_groups[0]
    trained = {id(p) for p in group["params"]}
    hyper = dict(zip((n for n, _, _ in opt._hyper), opt._hyper_floats(group)))
    txs = [
        opt._transformation(dict(opt._param_structure(group, p)), hyper, None)
        if id(p) in trained
        else None
        for p in model.parameters()
    ]
    params = [p.data.copy() for p in model.parameters()]
    state = {
        "params": params,
        "opt": [None if tx is None else tx.init(v) for tx, v in zip(txs, params)],
    }

    def _floor(params, opt_states, x, y):
        loss, grads = jax.value_and_grad(floor_loss)(params, x, y)
        out_p, out_s = [], []
        for tx, p, g, s in zip(txs, params, grads, opt_states):
            if tx is None:
                out_p.append(p)
                out_s.append(s)
                continue
            updates, s = tx.update(g, s, p)
            out_p.append(optax.apply_updates(p, updates))
            out_s.append(s)
        return out_p, out_s, loss

    floor_jit = jax.jit(_floor, donate_argnums=(0, 1))

    def floor_step():
        state["params"], state["opt"], loss = floor_jit(state["params"], state["opt"], x, y)
        return loss

    return {
        "plain JAX + the same optax (floor)": floor_step,
        "jmodule @jm.compile step": lambda: jm_step(model, opt, x, y),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (smoke run)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", nargs="*", default=None, help="optimizer names")
    args = parser.parse_args()
    tables: dict = {}
    raw: dict = {}
    figures: list = []
    detail: dict = {}
    names = args.only or list(OPTIMIZERS)
    for sizes, batch, calls, target in MODELS:
        label = "-".join(map(str, sizes))
        worst: dict[str, tuple[float, float, str]] = {}
        for name in names:
            steps = contestants(name, sizes, batch)
            title = f"{name} training step, MLP {label}, batch {batch}"
            measured = run_tables(
                title,
                steps,
                calls // 10 if args.quick else calls,
                2 if args.quick else args.rounds,
                tables,
                raw,
            )
            for regime, per_round in measured.items():
                jm_name = "jmodule @jm.compile step"
                best = min(per_round[jm_name]) / min(next(iter(per_round.values())))
                median = median_ratio(per_round, jm_name)
                detail[f"{title} [{regime}]"] = {"best": best, "median": median}
                print(f"  {name} [{regime}]: best {best:.3f}x, median round {median:.3f}x")
                if regime not in worst or median > worst[regime][1]:
                    worst[regime] = (best, median, name)
        for regime, (best, median, name) in worst.items():
            figure(
                figures,
                f"every optimizer's step, MLP {label}, batch {batch}: @jm.compile / plain JAX "
                f"+ the same optax, the worst of {len(names)} ({name})",
                regime,
                best,
                median,
                target,
            )
    if not args.only and not args.quick:
        # The per-optimizer tables stay in the JSON ("detail", "rounds"); README.md shows
        # the four figures (the worst optimizer per model and regime).
        save_results("optimizers", {}, rounds=raw, figures=figures)
        path = RESULTS / "optimizers.json"
        data = json.loads(path.read_text())
        data["detail"] = detail
        data["detail_tables"] = tables
        path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
