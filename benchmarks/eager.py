"""Eager mode against PyTorch eager: the notebook training loop without ``jm.compile``.

The step is a PyTorch tutorial's, run eagerly (SGD with momentum 0.9)::

    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    opt.step()

Models: an MLP 784-128-10 (batch 32); a CNN (conv 1->8, max-pool, conv 8->16,
max-pool, linear; batch 32 at 1x28x28); the MLP with BatchNorm1d + Dropout in
train mode; the tests' ResNet-18 (``tests/shared_models.py``, batch 4 at 64x64).
Figures (issue 25): eager step <= 1.5x PyTorch eager and eager forward <= 1.2x
(forward in train mode; PyTorch's under ``torch.no_grad()``), both regimes.

Timing: jmodule and PyTorch alternate call by call (A, B, A, B, ... the order
reversing every call), each call blocked on (latency: the loop reads
``loss.item()``), or in alternating blocks of calls blocked once (pipelined).
A round's figure is the median call; a round pairs jmodule with PyTorch at one
thread count, rounds alternating 1 and 2 threads. PyTorch's reference is its
faster thread count in this process (on a quiet host 2 threads win; under load
its 2-thread pool stalls), and a figure is the median over that count's
rounds of the per-round ratio. The whole measurement runs in ``--processes``
fresh processes (3 by default); the verdict is on the median of theirs.
Flax NNX and Equinox, un-jitted (eager JAX: each primitive dispatched on its
own, ``nnx.value_and_grad`` / ``eqx.filter_value_and_grad`` and optax SGD), are
timed in the same process, fewer calls, as a ratio to the same reference.

First steps (``--first``): a fresh process with its own empty persistent
compilation cache times the CNN's first and second eager steps and counts the
XLA compilations of each step (``jax.monitoring``); a second fresh process on
the same cache is the notebook after a kernel restart. Targets: first step
<= 1.5 s, first two <= 2 s, after a restart first step <= 0.5 s, nothing
compiled from the third step on.

Run: ``python benchmarks/eager.py [--processes 3] [--pairs 200] [--rounds 6]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import harness
import jax
import jax.numpy as jnp
import numpy as np

BATCH = 32
TARGETS = {"step": 1.5, "forward": 1.2}


# ----------------------------------------------------------------------------- models


def build(lib: Any, which: str) -> tuple[Any, tuple[int, ...]]:
    """Model ``which`` from ``lib`` (``torch.nn`` or ``jm.nn``) and its input shape."""
    if which == "mlp":
        return lib.Sequential(lib.Linear(784, 128), lib.ReLU(), lib.Linear(128, 10)), (BATCH, 784)
    if which == "mlp+bn+dropout":
        layers = (lib.Linear(784, 128), lib.BatchNorm1d(128), lib.ReLU(), lib.Dropout(0.1))
        return lib.Sequential(*layers, lib.Linear(128, 10)), (BATCH, 784)
    if which == "cnn":
        return lib.Sequential(
            lib.Conv2d(1, 8, 3, padding=1),
            lib.ReLU(),
            lib.MaxPool2d(2),
            lib.Conv2d(8, 16, 3, padding=1),
            lib.ReLU(),
            lib.MaxPool2d(2),
            lib.Flatten(),
            lib.Linear(16 * 7 * 7, 10),
        ), (BATCH, 1, 28, 28)
    if which == "resnet18":
        from shared_models import resnet18

        return resnet18(lib), (4, 3, 64, 64)
    raise ValueError(which)


MODELS = ("mlp", "cnn", "mlp+bn+dropout", "resnet18")
FORWARD = ("mlp", "cnn", "mlp+bn+dropout")


def jm_and_torch(which: str) -> dict[str, Callable[[], Any]]:
    """The eager step and forward of jmodule and PyTorch, the same weights in both."""
    import torch

    import jmodule as jm
    import jmodule.nn.functional as F

    torch.manual_seed(0)
    tmodel, shape = build(torch.nn, which)
    model, _ = build(jm.nn, which)
    model.load_state_dict(tmodel.state_dict())
    rng = np.random.default_rng(0)
    xn = rng.standard_normal(shape).astype(np.float32)
    yn = rng.integers(0, 10, shape[0])
    x, y = jnp.asarray(xn), jnp.asarray(yn)
    tx, ty = torch.from_numpy(xn), torch.from_numpy(yn)
    opt = jm.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.01, momentum=0.9)

    def jm_step() -> Any:
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    def torch_step() -> Any:
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(tx), ty)
        loss.backward()
        topt.step()
        return loss.detach()

    def torch_forward() -> Any:
        with torch.no_grad():
            return tmodel(tx)

    # The floor: the same forward as one plain ``jax.jit`` program over the state.
    state = {k: jnp.asarray(v) for k, v in model.state_dict().items()}
    key = jax.random.key(0)
    pure = jax.jit(lambda s, x, k: jm.func.functional_call(model, s, (x,), rng_key=k))

    return {
        "jm step": jm_step,
        "torch step": torch_step,
        "jm forward": lambda: model(x),
        "torch forward": torch_forward,
        "floor forward": lambda: pure(state, x, key),
    }


def peers(which: str) -> dict[str, Callable[[], Any]]:
    """Flax NNX and Equinox steps and forwards, un-jitted (eager JAX), where written."""
    import equinox as eqx
    import optax
    from flax import nnx

    out: dict[str, Callable[[], Any]] = {}
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.integers(0, 10, BATCH))
    tx = optax.sgd(0.01, momentum=0.9)

    def ce(logits: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    if which in ("mlp", "mlp+bn+dropout"):
        x = jnp.asarray(rng.standard_normal((BATCH, 784)).astype(np.float32))

        class NnxNet(nnx.Module):
            def __init__(self, rngs: nnx.Rngs):
                self.l1 = nnx.Linear(784, 128, rngs=rngs)
                self.bn = nnx.BatchNorm(128, rngs=rngs) if which != "mlp" else None
                self.drop = nnx.Dropout(0.1, rngs=rngs) if which != "mlp" else None
                self.l2 = nnx.Linear(128, 10, rngs=rngs)

            def __call__(self, x: Any) -> Any:
                h = self.l1(x)
                if self.bn is not None:
                    h = self.bn(h)
                h = nnx.relu(h)
                if self.drop is not None:
                    h = self.drop(h)
                return self.l2(h)

        nnx_x = x
    elif which == "cnn":
        x = jnp.asarray(rng.standard_normal((BATCH, 28, 28, 1)).astype(np.float32))  # NHWC

        class NnxNet(nnx.Module):  # type: ignore[no-redef]
            def __init__(self, rngs: nnx.Rngs):
                self.c1 = nnx.Conv(1, 8, (3, 3), padding=1, rngs=rngs)
                self.c2 = nnx.Conv(8, 16, (3, 3), padding=1, rngs=rngs)
                self.fc = nnx.Linear(16 * 7 * 7, 10, rngs=rngs)

            def __call__(self, x: Any) -> Any:
                pool = lambda h: nnx.max_pool(h, (2, 2), (2, 2))
                h = pool(nnx.relu(self.c1(x)))
                h = pool(nnx.relu(self.c2(h)))
                return self.fc(h.reshape(h.shape[0], -1))

        nnx_x = x
    else:
        return out  # ResNet-18: not written for the peers

    net = NnxNet(nnx.Rngs(0))
    nnx_opt = nnx.Optimizer(net, tx, wrt=nnx.Param)

    def nnx_step() -> Any:
        loss, grads = nnx.value_and_grad(lambda m: ce(m(nnx_x)))(net)
        nnx_opt.update(net, grads)
        return loss

    out["flax nnx step"] = nnx_step
    out["flax nnx forward"] = lambda: net(nnx_x)

    if which == "mlp+bn+dropout":
        return out  # Equinox's BatchNorm needs its State threaded by hand: not written
    key = jax.random.key(0)
    if which == "mlp":
        k1, k2 = jax.random.split(key)
        model = [eqx.nn.Linear(784, 128, key=k1), eqx.nn.Linear(128, 10, key=k2)]

        def fwd(m: Any, x: Any) -> Any:
            return jax.vmap(lambda v: m[1](jax.nn.relu(m[0](v))))(x)

        ex = x
    else:
        k1, k2, k3 = jax.random.split(key, 3)
        model = [
            eqx.nn.Conv2d(1, 8, 3, padding=1, key=k1),
            eqx.nn.Conv2d(8, 16, 3, padding=1, key=k2),
            eqx.nn.Linear(16 * 7 * 7, 10, key=k3),
        ]
        pool = eqx.nn.MaxPool2d(2, 2)

        def fwd(m: Any, x: Any) -> Any:
            def one(v: Any) -> Any:
                h = pool(jax.nn.relu(m[0](v)))
                h = pool(jax.nn.relu(m[1](h)))
                return m[2](h.reshape(-1))

            return jax.vmap(one)(x)

        ex = jnp.moveaxis(x, -1, 1)  # NCHW
    holder = {"m": model, "s": tx.init(eqx.filter(model, eqx.is_array))}

    def eqx_step() -> Any:
        m = holder["m"]
        loss, grads = eqx.filter_value_and_grad(lambda m: ce(fwd(m, ex)))(m)
        updates, holder["s"] = tx.update(grads, holder["s"], eqx.filter(m, eqx.is_array))
        holder["m"] = eqx.apply_updates(m, updates)
        return loss

    out["equinox step"] = eqx_step
    out["equinox forward"] = lambda: fwd(holder["m"], ex)
    return out


# ----------------------------------------------------------------------------- timing


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def alone(f: Callable, seconds: float, min_calls: int = 3) -> float:
    """Median seconds per call of ``f`` over about ``seconds`` (at least ``min_calls``)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        jax.block_until_ready(f())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def child(args: argparse.Namespace) -> dict:
    """One process's measurements (printed as JSON by ``--child``)."""
    out: dict[str, Any] = {"meta": harness.meta(), "figures": {}, "times": {}}
    for which in args.models:
        steps = jm_and_torch(which)
        kinds = ("step", "forward") if which in FORWARD else ("step",)
        for kind in kinds:
            a, b = steps[f"jm {kind}"], steps[f"torch {kind}"]
            floor = steps.get(f"floor {kind}")
            for _ in range(10):  # compile, warm
                for f in (a, b, floor) if floor else (a, b):
                    jax.block_until_ready(f())
            for regime in harness.REGIMES:
                rounds: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
                floors: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
                for r in range(args.rounds):
                    threads = 1 + r % 2
                    _set_threads(threads)
                    jax.block_until_ready(b())
                    rounds[threads].append(harness.paired(a, b, args.pairs, regime))
                    if floor:
                        floors[threads].append(harness.paired(floor, b, args.pairs, regime))
                torch_t = {n: statistics.median(t for _, t in v) for n, v in rounds.items()}
                best = min(torch_t, key=torch_t.get)
                ratio = statistics.median(j / t for j, t in rounds[best])
                jm_t = statistics.median(j for j, _ in rounds[best])
                name = f"{which} eager {kind} [{regime}]"
                out["figures"][name] = ratio
                out["times"][name] = {
                    "jmodule": jm_t,
                    f"torch ({best} thread{'s' if best > 1 else ''})": torch_t[best],
                    f"torch ({3 - best} thread{'s' if best == 1 else ''})": torch_t[3 - best],
                }
                print(f"{name}: jm {jm_t * 1e6:.0f} us, torch {torch_t} -> {ratio:.3f}x")
                if floor:
                    fl = statistics.median(j / t for j, t in floors[best])
                    out["floors"] = out.get("floors", {}) | {name: fl}
                    out["times"][name]["plain jax.jit (floor)"] = statistics.median(
                        j for j, _ in floors[best]
                    )
                    print(f"{name}: plain jax.jit / torch -> {fl:.3f}x")
        _set_threads(min(torch_t, key=torch_t.get) if which in FORWARD else 1)
        for name, f in peers(which).items():
            jax.block_until_ready(f())  # compiles each primitive
            kind = name.split()[-1]
            t = alone(f, args.peer_seconds)
            ref = out["times"][f"{which} eager {kind} [latency]"]
            torch_best = min(v for k, v in ref.items() if k.startswith("torch"))
            out["times"][f"{which} eager {kind} [latency]"][name.rsplit(" ", 1)[0]] = t
            print(f"{which} {name}: {t * 1e6:.0f} us ({t / torch_best:.1f}x torch)")
    return out


# ----------------------------------------------------------------------------- first steps


FIRST = r"""
import json, sys, time
import jax
import jax.numpy as jnp
import numpy as np
sys.path.insert(0, {bench!r})
from eager import build
import jmodule as jm
import jmodule.nn.functional as F

compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: compiles.append(event)
    if event == "/jax/core/compile/backend_compile_duration" else None
)
start = time.perf_counter()
model, shape = build(jm.nn, "cnn")
opt = jm.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
y = jnp.asarray(rng.integers(0, 10, shape[0]))
setup = time.perf_counter() - start
times, counts = [], []
for _ in range(4):
    n = len(compiles)
    t = time.perf_counter()
    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    opt.step()
    float(loss)
    times.append(time.perf_counter() - t)
    counts.append(len(compiles) - n)
print(json.dumps({{"setup": setup, "times": times, "compiles": counts}}))
"""


def first_steps() -> dict:
    """The CNN's first eager steps in fresh processes: an empty cache, then a warm one."""
    bench = str(pathlib.Path(__file__).resolve().parent)
    script = FIRST.format(bench=bench)
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, JMODULE_COMPILATION_CACHE=cache)
        for name in ("empty cache", "after a restart (warm cache)"):
            res = subprocess.run(
                [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
            )
            out[name] = json.loads(res.stdout.strip().splitlines()[-1])
            t, c = out[name]["times"], out[name]["compiles"]
            print(
                f"first steps, {name}: {', '.join(f'{s:.2f} s' for s in t)} "
                f"(XLA compiles per step: {c}; model setup {out[name]['setup']:.2f} s)"
            )
    return out


# ----------------------------------------------------------------------------- main


def reference_first(table: dict[str, float]) -> dict[str, float]:
    """The table with PyTorch at its faster thread count first: the reference row."""
    torch_rows = [k for k in table if k.startswith("torch")]
    best = min(torch_rows, key=table.get)
    return {f"pytorch eager, {best[len('torch ') :].strip('()')} (reference)": table[best]} | {
        k: v for k, v in table.items() if k != best
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=200, help="calls per round and contestant")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (alternating 1/2 threads)")
    parser.add_argument("--peer-seconds", type=float, default=2.0)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-first", action="store_true", help="skip the first-step runs")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)))
        return
    runs = []
    for i in range(args.processes):
        print(f"\n=== process {i + 1} of {args.processes}")
        cmd = [sys.executable, __file__, "--child", "--pairs", str(args.pairs)]
        cmd += ["--rounds", str(args.rounds), "--peer-seconds", str(args.peer_seconds)]
        cmd += ["--models", *args.models]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        print("\n".join(line for line in res.stdout.splitlines() if not line.startswith("RESULT")))
        runs.append(json.loads(res.stdout.split("RESULT ", 1)[1]))
    tables: dict[str, dict[str, float]] = {}
    figures: list[dict[str, Any]] = []
    print()
    for name in runs[0]["figures"]:
        per = [r["figures"][name] for r in runs]
        med = statistics.median(per)
        kind = "step" if " step " in name else "forward"
        target = TARGETS[kind]
        text, regime = name.rsplit(" [", 1)
        harness.figure(
            figures,
            f"{text}: jm / PyTorch eager (3 processes: {', '.join(f'{p:.2f}' for p in per)})",
            regime.rstrip("]"),
            min(per),
            med,
            target,
        )
        times = [r["times"][name] for r in runs]
        table = {
            k: statistics.median(t[k] for t in times if k in t) * 1e6
            for k in dict.fromkeys(k for t in times for k in t)
        }
        tables[name] = reference_first(table)
        if "floors" in runs[0] and name in runs[0]["floors"]:
            fl = [r["floors"][name] for r in runs]
            harness.figure(
                figures,
                f"{text} as plain jax.jit (the floor): / PyTorch eager "
                f"(3 processes: {', '.join(f'{p:.2f}' for p in fl)})",
                regime.rstrip("]"),
                min(fl),
                statistics.median(fl),
                None,
            )
    data: dict[str, Any] = {"processes": runs}
    if not args.no_first:
        print()
        first = first_steps()
        data["first_steps"] = first
        cold, warm = first["empty cache"], first["after a restart (warm cache)"]
        for text, value, target in (
            ("CNN first eager step, empty compilation cache (s)", cold["times"][0], 1.5),
            ("CNN first two eager steps, empty compilation cache (s)", sum(cold["times"][:2]), 2.0),
            ("CNN first eager step after a restart, warm cache (s)", warm["times"][0], 0.5),
            ("CNN XLA compiles from the third step on", float(sum(cold["compiles"][2:])), 0.0),
        ):
            harness.figure(figures, text, "first steps", value, value, target)
    if args.models != list(MODELS) or args.no_first:  # results/ holds whole runs only
        print("\na partial run (--models or --no-first): benchmarks/results/ left as it was")
        return
    harness.save_results("eager", tables, figures=figures)
    out = harness.RESULTS / "eager_runs.json"
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
