"""Per-call cost of a compiled forward: jmodule vs plain JAX and the peers, both regimes, one run.

Two models:
  (a) MLP 16-32-32-10 at batch 8 (dispatch-bound: the per-call overhead shows);
  (b) 32 layers of Linear(8, 8) + BatchNorm1d(8) + ReLU in train mode at
      batch 16 (192 state arrays, 96 buffers written back each call).

Contestants: plain ``jax.jit`` of the equivalent pure function over
pre-flattened parameter lists (the floor), jmodule ``model.compile()``,
jmodule ``jm.jit.script`` when available, Flax ``nnx.jit`` and
``nnx.cached_partial``, Equinox ``eqx.filter_jit`` and PyTorch eager.

Every contestant is timed in both regimes of ``harness.py``: *latency*
(``block_until_ready`` after every call, as serving or ``loss.item()`` each
step does) and *pipelined* (``calls`` calls, one block at the end), in
interleaved rounds, best of rounds. One table per model per regime:
microseconds per call, best / best floor, and the median over rounds of the
paired per-round ratio (a noise check).

(c) Unrelated-module construction: the compiled model (b), each call preceded
by constructing a module that has nothing to do with it (``nn.MSELoss()``;
and, a second variant, ``nn.Linear(8, 8)``, which also initialises
parameters). Construction costs time of its own, so the figure is::

    time(construct; call) / (time(construct) + time(call))

each of the three measured separately in the same interleaved rounds. 1.00
means constructing a module does not slow the compiled call at all (no cache
invalidation, no re-validation of guards, no retrace); 1.05 means that
constructing any module adds 5% of (construct + call) to the next compiled
call. In the pipelined regime, construction (host work) may overlap the
previous call's computation, so a figure below 1 is possible there; in the
latency regime it cannot overlap. The construct + call row also blocks on
the constructed ``Linear``'s parameters, as does the construct-alone row.

(d) The deep model's forward (b) timed call by call (issue 28): jmodule's
``model.compile()`` and the floor alternate one call at a time
(``harness.paired``: latency blocks each call; pipelined alternates blocks of
10 calls), ``--paired-rounds`` rounds of ``--pairs`` pairs per process, each
round's ratio of medians, the median round per process, in
``--processes`` fresh processes (3); judged on the median process.

Run: ``make bench`` or ``python benchmarks/dispatch.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import equinox as eqx
import jax
import numpy as np
import torch
from flax import nnx
from harness import REGIMES, figure, median_ratio, paired, run_tables, save_results

import jmodule as jm
from jmodule import nn

# These models are far too small for intra-op parallelism, and with two
# OpenMP threads on a shared 2-core machine PyTorch's barriers cost 10-100x
# whenever anything else runs; one thread is its fast, stable setting here.
torch.set_num_threads(1)
MLP_SIZES = (16, 32, 32, 10)
MLP_BATCH = 8
DEEP_LAYERS, DEEP_WIDTH, DEEP_BATCH = 32, 8, 16
TARGET_FORWARD, TARGET_CONSTRUCT = 1.15, 1.05


# ---------------------------------------------------------------- (a) MLP


def mlp_contestants(x: jax.Array) -> dict[str, Callable[[], object]]:
    sizes = MLP_SIZES
    model = nn.Sequential()
    for i in range(len(sizes) - 1):
        model.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            model.append(nn.ReLU())
    params = [p.data for p in model.parameters()]

    @jax.jit
    def floor(params, x):
        for i in range(0, len(params), 2):
            x = x @ params[i].T + params[i + 1]
            if i < len(params) - 2:
                x = jax.nn.relu(x)
        return x

    compiled = nn.Sequential(*list(model))
    compiled.load_state_dict(model.state_dict())
    compiled.compile()

    class NnxMLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.layers = nnx.List(
                [nnx.Linear(sizes[i], sizes[i + 1], rngs=rngs) for i in range(len(sizes) - 1)]
            )

        def __call__(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = jax.nn.relu(x)
            return x

    nnx_model = NnxMLP(nnx.Rngs(0))
    nnx_step = nnx.jit(lambda m, x: m(x))
    nnx_cached = nnx.cached_partial(nnx_step, nnx_model)

    eqx_model = eqx.nn.MLP(
        sizes[0], sizes[-1], width_size=sizes[1], depth=len(sizes) - 2, key=jax.random.key(0)
    )
    eqx_step = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))

    torch_model = torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 10),
    )
    tx = torch.from_numpy(np.array(x))

    def torch_step():
        with torch.no_grad():
            return torch_model(tx)

    out = {
        "plain jax.jit (floor)": lambda: floor(params, x),
        "jmodule model.compile()": lambda: compiled(x),
    }
    script = _script(model, x)
    if script is not None:
        out["jmodule jm.jit.script"] = lambda: script(x)
    out.update(
        {
            "flax nnx.jit": lambda: nnx_step(nnx_model, x),
            "flax nnx.cached_partial": lambda: nnx_cached(x),
            "equinox eqx.filter_jit": lambda: eqx_step(eqx_model, x),
            "pytorch eager": torch_step,
        }
    )
    return out


def _script(model: nn.Module, x: jax.Array):
    jit = getattr(jm, "jit", None)
    if jit is None or not hasattr(jit, "script"):
        return None
    return jit.script(model, example_inputs=(x,))


# ---------------------------------------------------------------- (b) deep BN MLP


def deep_model() -> nn.Sequential:
    """32 x (Linear 8 + BatchNorm1d + ReLU), compiled, in train mode (the default)."""
    layers = []
    for _ in range(DEEP_LAYERS):
        layers += [nn.Linear(DEEP_WIDTH, DEEP_WIDTH), nn.BatchNorm1d(DEEP_WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers)
    model.compile()
    return model


def deep_contestants(x: jax.Array) -> dict[str, Callable[[], object]]:
    model = deep_model()

    params = [p.data for p in model.parameters()]
    state = {"buffers": [b for _, b in model.named_buffers()]}

    @jax.jit
    def floor(params, buffers, x):
        new = []
        for i in range(DEEP_LAYERS):
            w, b, g, beta = params[4 * i : 4 * i + 4]
            mean, var, count = buffers[3 * i : 3 * i + 3]
            x = x @ w.T + b
            m = x.mean(0)
            v = ((x - m) ** 2).mean(0)
            n = x.shape[0]
            new += [0.9 * mean + 0.1 * m, 0.9 * var + 0.1 * v * n / (n - 1), count + 1]
            x = jax.nn.relu((x - m) * jax.lax.rsqrt(v + 1e-5) * g + beta)
        return x, new

    def floor_step():
        out, state["buffers"] = floor(params, state["buffers"], x)
        return out

    class NnxDeep(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.linears = nnx.List(
                [nnx.Linear(DEEP_WIDTH, DEEP_WIDTH, rngs=rngs) for _ in range(DEEP_LAYERS)]
            )
            self.norms = nnx.List(
                [nnx.BatchNorm(DEEP_WIDTH, momentum=0.9, rngs=rngs) for _ in range(DEEP_LAYERS)]
            )

        def __call__(self, x):
            for lin, bn in zip(self.linears, self.norms):
                x = jax.nn.relu(bn(lin(x)))
            return x

    nnx_model = NnxDeep(nnx.Rngs(0))
    nnx_step = nnx.jit(lambda m, x: m(x))
    nnx_cached = nnx.cached_partial(nnx_step, nnx_model)

    class EqxDeep(eqx.Module):
        linears: list
        gammas: list
        betas: list

        def __init__(self, key):
            keys = jax.random.split(key, DEEP_LAYERS)
            self.linears = [eqx.nn.Linear(DEEP_WIDTH, DEEP_WIDTH, key=k) for k in keys]
            self.gammas = [jax.numpy.ones(DEEP_WIDTH) for _ in keys]
            self.betas = [jax.numpy.zeros(DEEP_WIDTH) for _ in keys]

        def __call__(self, buffers, x):
            new = []
            for i, lin in enumerate(self.linears):
                mean, var, count = buffers[3 * i : 3 * i + 3]
                x = jax.vmap(lin)(x)
                m = x.mean(0)
                v = ((x - m) ** 2).mean(0)
                n = x.shape[0]
                new += [0.9 * mean + 0.1 * m, 0.9 * var + 0.1 * v * n / (n - 1), count + 1]
                g, beta = self.gammas[i], self.betas[i]
                x = jax.nn.relu((x - m) * jax.lax.rsqrt(v + 1e-5) * g + beta)
            return x, new

    eqx_model = EqxDeep(jax.random.key(0))
    eqx_fn = eqx.filter_jit(lambda m, s, x: m(s, x))
    eqx_state = {"buffers": list(state["buffers"])}

    def eqx_step():
        out, eqx_state["buffers"] = eqx_fn(eqx_model, eqx_state["buffers"], x)
        return out

    torch_layers = []
    for _ in range(DEEP_LAYERS):
        torch_layers += [
            torch.nn.Linear(DEEP_WIDTH, DEEP_WIDTH),
            torch.nn.BatchNorm1d(DEEP_WIDTH),
            torch.nn.ReLU(),
        ]
    torch_model = torch.nn.Sequential(*torch_layers)
    tx = torch.from_numpy(np.array(x))

    def torch_step():
        with torch.no_grad():
            return torch_model(tx)

    out = {
        "plain jax.jit (floor)": floor_step,
        "jmodule model.compile()": lambda: model(x),
    }
    eager_copy = nn.Sequential(*[type(m)(*_args(m)) for m in model])
    eager_copy.load_state_dict(model.state_dict())
    script = _script(eager_copy, x)
    if script is not None:
        out["jmodule jm.jit.script"] = lambda: script(x)
    out.update(
        {
            "flax nnx.jit": lambda: nnx_step(nnx_model, x),
            "flax nnx.cached_partial": lambda: nnx_cached(x),
            "equinox eqx.filter_jit": eqx_step,
            "pytorch eager": torch_step,
        }
    )
    return out


def _args(module: nn.Module) -> tuple:
    if isinstance(module, nn.Linear):
        return (module.in_features, module.out_features)
    if isinstance(module, nn.BatchNorm1d):
        return (module.num_features,)
    return ()


# ---------------------------------------------------------------- (c) construction


CONSTRUCTIONS = {
    "nn.MSELoss()": lambda: nn.MSELoss(),
    "nn.Linear(8, 8)": lambda: nn.Linear(8, 8),
}


def construction_contestants(x: jax.Array) -> dict[str, Callable[[], object]]:
    """The compiled call alone, each construction alone, and each construction then the call."""
    model = deep_model()

    def arrays(module: nn.Module) -> list[jax.Array]:
        return [p.data for p in module.parameters()]

    out: dict[str, Callable[[], object]] = {"compiled call alone": lambda: model(x)}
    for label, make in CONSTRUCTIONS.items():

        def alone(make=make):
            return arrays(make())

        def then_call(make=make):
            made = make()
            return model(x), arrays(made)

        out[f"{label} alone"] = alone
        out[f"{label}, then compiled call"] = then_call
    return out


def construction_figures(
    measured: dict[str, dict[str, list[float]]], title: str, figures: list
) -> None:
    """(construct; call) / (construct + call), best-of-rounds and median of paired rounds.

    Only the ``nn.MSELoss()`` figure has a target: constructing a ``Linear``
    runs JAX programs of its own (its initialisers), which slow the next XLA
    call on this CPU whoever makes it; ``isolated_call_figures`` measures
    that case against plain ``jax.jit`` doing the same.
    """
    for regime in REGIMES:
        rounds = measured[regime]
        call = rounds["compiled call alone"]
        for label in CONSTRUCTIONS:
            made, both = rounds[f"{label} alone"], rounds[f"{label}, then compiled call"]
            ratio = min(both) / (min(made) + min(call))
            paired = [b / (m + c) for b, m, c in zip(both, made, call)]
            extra = min(both) - min(made) - min(call)
            print(f"[{regime}] {label} before each call: {extra:+.1f} us/call beyond the sum")
            figure(
                figures,
                f"{title}: ({label}; call) / ({label} + call)",
                regime,
                ratio,
                float(np.median(paired)),
                TARGET_CONSTRUCT if label == "nn.MSELoss()" else None,
            )


def isolated_call_figures(x: jax.Array, calls: int, rounds: int, title: str, figures: list) -> None:
    """Latency of the compiled call itself, with and without a construction just before it.

    Only the call (and its ``block_until_ready``) is inside the timer; the
    construction runs, and finishes, before the timer starts. The plain-JAX
    floor is timed the same way as a control: constructing a ``Linear``
    dispatches its own JAX programs (the initialisers), which slows the next
    XLA call on this CPU whoever makes it (caches, thread pool), so that
    figure is jmodule's slowdown relative to the floor's. Rounds interleave
    everything; the figures are medians of paired per-round ratios.
    """
    contestants = deep_contestants(x)
    calls_of = {
        "jmodule": contestants["jmodule model.compile()"],
        "plain jax.jit": contestants["plain jax.jit (floor)"],
    }
    variants = {"nothing": None, **CONSTRUCTIONS}
    per_round = {(who, name): [] for who in calls_of for name in variants}
    for call in calls_of.values():
        for _ in range(20):
            jax.block_until_ready(call())
    for i in range(rounds):
        names = list(variants)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            make = variants[name]
            for who, call in calls_of.items():
                total = 0.0
                for _ in range(calls):
                    if make is not None:
                        made = make()
                        jax.block_until_ready([p.data for p in made.parameters()])
                    start = time.perf_counter()
                    jax.block_until_ready(call())
                    total += time.perf_counter() - start
                per_round[(who, name)].append(total / calls * 1e6)
    print(f"\n{title} [latency, the call alone timed]")
    print(
        f"{'constructed before each call':<36}{'jmodule us':>12}{'x none':>8}{'floor x none':>14}"
    )
    for name in variants:
        jm_rounds, floor_rounds = per_round[("jmodule", name)], per_round[("plain jax.jit", name)]
        jm_x = [a / b for a, b in zip(jm_rounds, per_round[("jmodule", "nothing")])]
        floor_x = [a / b for a, b in zip(floor_rounds, per_round[("plain jax.jit", "nothing")])]
        print(
            f"{name:<36}{min(jm_rounds):>12.1f}{np.median(jm_x):>8.3f}{np.median(floor_x):>14.3f}"
        )
        if name == "nothing":
            continue
        relative = [a / b for a, b in zip(jm_x, floor_x)]
        figure(
            figures,
            f"{title}: the call after {name} / the call alone, relative to plain jax.jit's",
            "latency",
            float(np.median(relative)),
            float(np.median(relative)),
            TARGET_CONSTRUCT,
        )


def forward_figures(measured, title: str, figures: list) -> None:
    for regime in REGIMES:
        rounds = measured[regime]
        floor, ours = next(iter(rounds)), "jmodule model.compile()"
        ratio = min(rounds[ours]) / min(rounds[floor])
        text = f"{title}: model.compile() / jax.jit"
        figure(figures, text, regime, ratio, median_ratio(rounds, ours), TARGET_FORWARD)


def paired_child(pairs: int, rounds: int) -> dict[str, float]:
    """(d) in this process: per regime, the median over rounds of the paired ratio."""
    xd = jax.random.normal(jax.random.key(1), (DEEP_BATCH, DEEP_WIDTH))
    steps = deep_contestants(xd)
    ours, floor = steps["jmodule model.compile()"], steps["plain jax.jit (floor)"]
    for _ in range(20):
        jax.block_until_ready(ours())
        jax.block_until_ready(floor())
    out = {}
    for regime in REGIMES:
        ratios = []
        for _ in range(rounds):
            a, b = paired(ours, floor, pairs, regime)
            ratios.append(a / b)
        out[regime] = statistics.median(ratios)
    return out


def paired_figures(args: argparse.Namespace, title: str, figures: list) -> None:
    """(d): ``--processes`` fresh processes of :func:`paired_child`, judged on their median."""
    runs = []
    for i in range(args.processes):
        cmd = [sys.executable, __file__, "--paired-child", "--pairs", str(args.pairs)]
        cmd += ["--paired-rounds", str(args.paired_rounds)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        runs.append(json.loads(res.stdout.split("PAIRED ", 1)[1]))
        print(f"process {i + 1}: {runs[-1]}", flush=True)
    for regime in REGIMES:
        per = [r[regime] for r in runs]
        text = f"{title}: model.compile() / jax.jit, call by call ({len(per)} processes: "
        text += ", ".join(f"{p:.2f}" for p in per) + ")"
        figure(figures, text, regime, min(per), statistics.median(per), TARGET_FORWARD)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    parser.add_argument("--processes", type=int, default=3, help="(d): fresh processes")
    parser.add_argument("--pairs", type=int, default=200, help="(d): pairs per round")
    parser.add_argument("--paired-rounds", type=int, default=9, help="(d): rounds per process")
    parser.add_argument("--paired-only", action="store_true", help="(d) only; results/ untouched")
    parser.add_argument("--paired-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    deep = f"{DEEP_LAYERS} x (Linear {DEEP_WIDTH} + BatchNorm1d + ReLU), train, batch {DEEP_BATCH}"
    if args.paired_child:
        print("PAIRED " + json.dumps(paired_child(args.pairs, args.paired_rounds)))
        return
    if args.paired_only:
        paired_figures(args, f"forward, {deep}", [])
        return
    calls, rounds, budget = (200, 3, 0.05) if args.quick else (2000, 11, 0.15)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores")
    tables: dict[str, dict[str, float]] = {}
    raw: dict[str, dict[str, list[float]]] = {}
    figures: list = []

    x = jax.random.normal(jax.random.key(0), (MLP_BATCH, MLP_SIZES[0]))
    title = f"forward, MLP 16-32-32-10, batch {MLP_BATCH}"
    measured = run_tables(title, mlp_contestants(x), calls, rounds, tables, raw, budget_s=budget)
    forward_figures(measured, title, figures)

    xd = jax.random.normal(jax.random.key(1), (DEEP_BATCH, DEEP_WIDTH))
    title = f"forward, {deep}"
    measured = run_tables(
        title, deep_contestants(xd), calls // 4, rounds, tables, raw, budget_s=budget
    )
    forward_figures(measured, title, figures)

    title = f"unrelated module constructed before each compiled call, {deep}"
    contestants = construction_contestants(xd)
    measured = run_tables(
        title, contestants, calls // 4, rounds, tables, raw, ref="call", budget_s=budget
    )
    construction_figures(measured, "compiled forward, unrelated module constructed", figures)
    isolated_call_figures(xd, calls // 8, rounds, f"compiled forward, {deep}", figures)
    if args.quick:
        args.processes, args.paired_rounds, args.pairs = 1, 2, 50
    paired_figures(args, f"forward, {deep}", figures)

    if not args.quick:
        save_results("dispatch", tables, rounds=raw, figures=figures)


if __name__ == "__main__":
    main()
