"""Per-call cost of a compiled forward: jmodule vs plain JAX and the peers, in one run.

Two models:
  (a) MLP 16-32-32-10 at batch 8 (dispatch-bound: the per-call overhead shows);
  (b) 32 layers of Linear(8, 8) + BatchNorm1d(8) + ReLU in train mode at
      batch 8 (192 state arrays, 96 buffers written back each call).

Contestants: plain ``jax.jit`` of the equivalent pure function over
pre-flattened parameter lists (the floor), jmodule ``model.compile()``,
jmodule ``jm.jit.script`` when available, Flax ``nnx.jit`` and
``nnx.cached_partial``, Equinox ``eqx.filter_jit`` and PyTorch eager.
Prints microseconds per call and the ratio to the floor.

Run: ``make bench`` or ``python benchmarks/dispatch.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import equinox as eqx
import jax
import numpy as np
import torch
from flax import nnx

import jmodule as jm
from jmodule import nn

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MLP_SIZES = (16, 32, 32, 10)
DEEP_LAYERS, DEEP_WIDTH, BATCH = 32, 8, 8


def per_call_us(step: Callable[[], object], calls: int, repeats: int) -> float:
    """Best-of-``repeats`` mean time of ``calls`` consecutive calls, in microseconds."""
    for _ in range(20):
        out = step()
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = step()
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


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
    tx = torch.from_numpy(np.asarray(x))

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


def deep_contestants(x: jax.Array) -> dict[str, Callable[[], object]]:
    layers = []
    for _ in range(DEEP_LAYERS):
        layers += [nn.Linear(DEEP_WIDTH, DEEP_WIDTH), nn.BatchNorm1d(DEEP_WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers)
    model.compile()

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

        def __init__(self, key):
            keys = jax.random.split(key, DEEP_LAYERS)
            self.linears = [eqx.nn.Linear(DEEP_WIDTH, DEEP_WIDTH, key=k) for k in keys]

        def __call__(self, buffers, x):
            new = []
            for i, lin in enumerate(self.linears):
                mean, var, count = buffers[3 * i : 3 * i + 3]
                x = jax.vmap(lin)(x)
                m = x.mean(0)
                v = ((x - m) ** 2).mean(0)
                n = x.shape[0]
                new += [0.9 * mean + 0.1 * m, 0.9 * var + 0.1 * v * n / (n - 1), count + 1]
                x = jax.nn.relu((x - m) * jax.lax.rsqrt(v + 1e-5))
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
    tx = torch.from_numpy(np.asarray(x))

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


def report(title: str, contestants: dict[str, Callable[[], object]], calls: int, repeats: int):
    """Best-of-``repeats`` us/call of each contestant, measured in interleaved rounds.

    Each round times every contestant once (``calls`` consecutive calls), so a
    change in machine load during the run hits them all alike.
    """
    print(f"\n{title}")
    print(f"{'contestant':<28}{'us/call':>10}{'x floor':>10}")
    best = {name: float("inf") for name in contestants}
    for _ in range(repeats):
        for name, step in contestants.items():
            best[name] = min(best[name], per_call_us(step, calls, 1))
    floor = next(iter(best.values()))
    for name, us in best.items():
        print(f"{name:<28}{us:>10.1f}{us / floor:>10.2f}")
    return best


def save_results(name: str, tables: dict[str, dict[str, float]]) -> None:
    """Write ``benchmarks/results/<name>.json`` (read by ``readme_table.py``)."""
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    meta = {"jax": jax.__version__, "platform": jax.devices()[0].platform, "cores": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "tables": tables}, indent=2) + "\n")
    print(f"\nwrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    args = parser.parse_args()
    calls, repeats = (200, 3) if args.quick else (2000, 7)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores")
    x = jax.random.normal(jax.random.key(0), (BATCH, MLP_SIZES[0]))
    tables = {}
    title = "forward, MLP 16-32-32-10, batch 8"
    tables[title] = report(title, mlp_contestants(x), calls, repeats)
    xd = jax.random.normal(jax.random.key(1), (BATCH, DEEP_WIDTH))
    title = f"forward, {DEEP_LAYERS} x (Linear {DEEP_WIDTH} + BatchNorm1d + ReLU), train, batch 8"
    tables[title] = report(title, deep_contestants(xd), calls // 4, repeats)
    if not args.quick:
        save_results("dispatch", tables)


if __name__ == "__main__":
    main()
