"""Compiled training steps of real models against plain JAX and against PyTorch eager.

The step is the PyTorch loop under ``@jm.compile``::

    opt.zero_grad()
    loss = jm.backward(lambda: loss_of(model, batch))
    opt.step()
    return loss

Models (issue 28): an MLP 784-128-10 (batch 32, SGD momentum 0.9); a small CNN
(conv 1->8, max-pool, conv 8->16, max-pool, linear; batch 32 at 1x28x28, SGD
momentum); the tests' ResNet-18 (``tests/shared_models.py``, torchvision's
architecture at a quarter of the width; batch 4 at 64x64, SGD); nanoGPT's
``model.py`` as ported in ``tests/models/ports`` (4 layers, 4 heads, 128
wide, context 64, vocabulary 65, batch 8; AdamW, weight decay 0.1); the
ViT of the ports (32x32 images in 4x4 patches, 64 wide, depth 4, 4 heads;
batch 8; Adam). All in float32, dropout 0.

The floor is the same functional program under plain ``jax.jit`` + optax:
the model's forward with its state passed in (its new buffers, BatchNorm's
running statistics, returned), ``jax.value_and_grad``, the optax
transformation of the optimizer, parameters, optimizer state and buffers
donated, and what PyTorch's step leaves behind returned: the new
parameters, buffers and optimizer state, the gradients and the loss.
PyTorch eager runs the same step with the same weights.

Timing (``harness.paired``): contestants take turns call by call (latency:
each call blocked on, as ``loss.item()`` each step does) or in alternating
blocks of calls blocked once (pipelined); a round pairs jmodule with the
floor and with PyTorch at one thread count, rounds alternating 1 and 2
threads, and PyTorch's reference is its faster count in the process. A
figure is the median over rounds of the per-round ratio; the run is repeated
in ``--processes`` fresh processes (3) and judged on the median of theirs.
Targets: <= 1.05x the floor, <= 1.0x PyTorch eager, both regimes.

Compile time: the first call of the ResNet-18 step (trace, compile, run)
against the floor's, each in a fresh process of its own (whichever comes
first in a process pays JAX's own warm-up), the persistent compilation cache
off, ``--processes`` pairs; target <= 1.10x.

Run: ``python benchmarks/models.py [--processes 3] [--pairs 60] [--rounds 4]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ("mlp", "cnn", "resnet18", "nanogpt", "vit")
TARGETS = {"floor": 1.05, "torch": 1.0, "compile": 1.10}
GPT = dict(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=True)
VIT = dict(
    image_size=32, patch_size=4, num_classes=10, dim=64, depth=4, heads=4, mlp_dim=128,
    dim_head=16, dropout=0.0, emb_dropout=0.0,
)  # fmt: skip


def _port(stem: str) -> Any:
    path = ROOT / "tests" / "models" / "ports" / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def build(which: str) -> dict[str, Any]:
    """Both models (the same weights), a batch, the loss and both optimizers' settings."""
    import optax
    import torch

    import jmodule as jm

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    classify = True
    if which in ("mlp", "cnn"):
        from eager import build as small

        tmodel, shape = small(torch.nn, which)
        model, _ = small(jm.nn, which)
    elif which == "resnet18":
        from shared_models import resnet18

        tmodel, model, shape = resnet18(torch.nn), resnet18(jm.nn), (4, 3, 64, 64)
    elif which == "nanogpt":
        t, j = _port("nanogpt_torch"), _port("nanogpt_jm")
        tmodel, model = t.GPT(t.GPTConfig(**GPT)), j.GPT(j.GPTConfig(**GPT))
        classify = False
    elif which == "vit":
        t, j = _port("vit_torch"), _port("vit_jm")
        tmodel, model, shape = t.ViT(**VIT), j.ViT(**VIT), (8, 3, 32, 32)
    else:
        raise ValueError(which)
    model.load_state_dict({k: v.numpy() for k, v in tmodel.state_dict().items()})
    if classify:
        xn = rng.standard_normal(shape).astype(np.float32)
        yn = rng.integers(0, 10, shape[0])
    else:
        xn = rng.integers(0, GPT["vocab_size"], (8, GPT["block_size"]))
        yn = rng.integers(0, GPT["vocab_size"], (8, GPT["block_size"]))
    if which in ("mlp", "cnn"):
        opts = (lambda ps: jm.optim.SGD(ps, lr=0.01, momentum=0.9),
                lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
                optax.sgd(0.01, momentum=0.9))  # fmt: skip
    elif which == "resnet18":
        opts = (lambda ps: jm.optim.SGD(ps, lr=0.01), lambda ps: torch.optim.SGD(ps, lr=0.01),
                optax.sgd(0.01))  # fmt: skip
    elif which == "nanogpt":
        kw = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        opts = (lambda ps: jm.optim.AdamW(ps, **kw), lambda ps: torch.optim.AdamW(ps, **kw),
                optax.adamw(1e-3, b1=0.9, b2=0.95, weight_decay=0.1))  # fmt: skip
    else:
        opts = (lambda ps: jm.optim.Adam(ps, lr=1e-3), lambda ps: torch.optim.Adam(ps, lr=1e-3),
                optax.adam(1e-3))  # fmt: skip
    if classify:

        def loss_of(m: Any, x: Any, y: Any) -> Any:
            return jm.nn.functional.cross_entropy(m(x), y)

        def torch_loss(m: Any, x: Any, y: Any) -> Any:
            return torch.nn.functional.cross_entropy(m(x), y)
    else:

        def loss_of(m: Any, x: Any, y: Any) -> Any:
            return m(x, y)[1]

        def torch_loss(m: Any, x: Any, y: Any) -> Any:
            return m(x, y)[1]

    return dict(tmodel=tmodel, model=model, xn=xn, yn=yn, opts=opts, loss_of=loss_of,
                torch_loss=torch_loss)  # fmt: skip


def contestants(which: str) -> dict[str, Callable[[], Any]]:
    """The jmodule step, the plain-JAX floor and PyTorch's step (first calls not yet made)."""
    import optax
    import torch

    import jmodule as jm
    from jmodule._lowering import binding

    b = build(which)
    model, tmodel, loss_of = b["model"], b["tmodel"], b["loss_of"]
    make_opt, make_topt, tx = b["opts"]
    x, y = jnp.asarray(b["xn"]), jnp.asarray(b["yn"])
    if which in ("nanogpt", "vit"):  # the ports compute with torch tensors: jm.Tensors
        x, y = jm.torch.from_numpy(b["xn"]), jm.torch.from_numpy(b["yn"])
    tx_t, ty_t = torch.from_numpy(b["xn"]), torch.from_numpy(b["yn"])
    opt, topt = make_opt(model.parameters()), make_topt(tmodel.parameters())

    @jm.compile
    def jm_step(model: Any, opt: Any, x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = jm.backward(lambda: loss_of(model, x, y))
        opt.step()
        return loss

    def torch_step() -> Any:
        topt.zero_grad()
        loss = b["torch_loss"](tmodel, tx_t, ty_t)
        loss.backward()
        topt.step()
        return loss.detach()

    # The floor: the same forward as a pure function of the state, plain jax.jit + optax.
    slots = jm.func.state_slots(model)
    pnames = [n for n, _ in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]
    modules = tuple(model.named_modules())
    state = {
        "p": {n: jnp.array(p.data) for n, p in model.named_parameters()},
        "b": {n: jnp.array(v) for n, v in model.named_buffers()},
    }
    state["o"] = tx.init(state["p"])

    def loss_fn(p: dict, bufs: dict, x: Any, y: Any) -> tuple[Any, dict]:
        with binding.bound(
            [slots[n] for n in pnames + bnames], [p[n] for n in pnames] + [bufs[n] for n in bnames],
            modules,
        ):  # fmt: skip
            loss = jnp.asarray(loss_of(model, x, y))
            new = {n: jnp.asarray(slots[n][0][slots[n][1]]) for n in bnames}
        return loss, new

    def floor_fn(p: dict, o: Any, bufs: dict, x: Any, y: Any) -> tuple:
        (loss, bufs), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, bufs, x, y)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, bufs, grads, loss

    floor_jit = jax.jit(floor_fn, donate_argnums=(0, 1, 2))

    def floor_step() -> Any:
        state["p"], state["o"], state["b"], state["grads"], loss = floor_jit(
            state["p"], state["o"], state["b"], x, y
        )
        return loss

    def jm_run() -> Any:
        return jm_step(model, opt, x, y)

    # The compiled programs, for HLO comparisons (``--hlo``).
    jm_run.lower = lambda: jm_step.lower(model, opt, x, y)  # type: ignore[attr-defined]
    floor_step.lower = lambda: floor_jit.lower(state["p"], state["o"], state["b"], x, y)  # type: ignore[attr-defined]
    return {"jm": jm_run, "floor": floor_step, "torch": torch_step}


def child(args: argparse.Namespace) -> dict:
    """One process's measurements (printed as JSON by ``--child``)."""
    import torch

    out: dict[str, Any] = {"meta": harness.meta(), "figures": {}, "times": {}}
    for which in args.models:
        steps = contestants(which)
        for _ in range(5):  # compile, warm
            for f in steps.values():
                jax.block_until_ready(f())
        for regime in harness.REGIMES:
            vs_floor: list[tuple[float, float]] = []
            vs_torch: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
            for r in range(args.rounds):
                threads = 1 + r % 2
                torch.set_num_threads(threads)
                jax.block_until_ready(steps["torch"]())
                vs_floor.append(harness.paired(steps["jm"], steps["floor"], args.pairs, regime))
                vs_torch[threads].append(
                    harness.paired(steps["jm"], steps["torch"], args.pairs, regime)
                )
            torch_t = {n: statistics.median(t for _, t in v) for n, v in vs_torch.items()}
            best = min(torch_t, key=torch_t.get)
            name = f"{which} [{regime}]"
            out["figures"][f"{name} floor"] = statistics.median(j / f for j, f in vs_floor)
            out["figures"][f"{name} torch"] = statistics.median(j / t for j, t in vs_torch[best])
            out["times"][name] = {
                "plain jax.jit + optax (floor)": statistics.median(f for _, f in vs_floor),
                "jmodule @jm.compile": statistics.median(j for j, _ in vs_floor),
                f"pytorch eager ({best} thread{'s' if best > 1 else ''})": torch_t[best],
                f"pytorch eager ({3 - best} thread{'s' if best == 1 else ''})": torch_t[3 - best],
                # alternating with PyTorch, whose spinning threads share the two cores
                "jmodule @jm.compile, in the PyTorch pairs": statistics.median(
                    j for j, _ in vs_torch[best]
                ),
            }
            print(
                f"{name}: jm/floor {out['figures'][f'{name} floor']:.3f}, "
                f"jm/torch {out['figures'][f'{name} torch']:.3f} "
                f"({', '.join(f'{k} {v * 1e3:.2f} ms' for k, v in out['times'][name].items())})",
                flush=True,
            )
    return out


def first_call(which: str, name: str) -> float:
    """Seconds of the first call of contestant ``name`` (trace, compile, run) in this process."""
    step = contestants(which)[name]
    start = time.perf_counter()
    jax.block_until_ready(step())
    return time.perf_counter() - start


def compile_times(which: str, processes: int) -> list[tuple[float, float]]:
    """(jmodule, floor) first-call seconds, each in a fresh process with no compilation
    cache, the order alternating: whichever runs first in a process pays JAX's own
    warm-up, so each contestant gets a process of its own."""
    env = dict(os.environ, JMODULE_COMPILATION_CACHE="0")
    pairs = []
    for i in range(processes):
        got = {}
        for name in ("jm", "floor") if i % 2 == 0 else ("floor", "jm"):
            cmd = [sys.executable, __file__, "--first-call", which, name]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            got[name] = float(res.stdout.split("FIRST ", 1)[1].split()[0])
        print(f"{which} first call: jm {got['jm']:.2f} s, plain jax.jit {got['floor']:.2f} s")
        pairs.append((got["jm"], got["floor"]))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=60, help="calls per round and contestant")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (alternating 1/2 threads)")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first-call", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_call:
        print(f"FIRST {first_call(*args.first_call)}")
        return
    if args.child:
        print("RESULT " + json.dumps(child(args)))
        return
    runs = []
    env = dict(os.environ, JMODULE_COMPILATION_CACHE="0")  # compile times: nothing cached
    for i in range(args.processes):
        print(f"\n=== process {i + 1} of {args.processes}", flush=True)
        cmd = [sys.executable, __file__, "--child", "--pairs", str(args.pairs)]
        cmd += ["--rounds", str(args.rounds), "--models", *args.models]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        print("\n".join(line for line in res.stdout.splitlines() if not line.startswith("RESULT")))
        runs.append(json.loads(res.stdout.split("RESULT ", 1)[1]))
    tables: dict[str, dict[str, float]] = {}
    figures: list[dict[str, Any]] = []
    print()
    for key in runs[0]["figures"]:
        name, versus = key.rsplit(" ", 1)
        which, regime = name.removesuffix("]").split(" [")
        per = [r["figures"][key] for r in runs]
        ref = "plain jax.jit + optax" if versus == "floor" else "PyTorch eager"
        harness.figure(
            figures,
            f"{which} compiled training step: jm / {ref} "
            f"({len(per)} processes: {', '.join(f'{p:.2f}' for p in per)})",
            regime,
            min(per),
            statistics.median(per),
            TARGETS[versus],
        )
        if versus == "floor":
            times = [r["times"][name] for r in runs]
            rows = dict.fromkeys(k for t in times for k in t)
            tables[f"{which} compiled training step [{regime}]"] = {
                k: statistics.median(t[k] for t in times if k in t) * 1e6 for k in rows
            }
    if "resnet18" in args.models:
        pairs = compile_times("resnet18", args.processes)
        seconds = ", ".join(f"{a:.2f} s / {f:.2f} s" for a, f in pairs)
        harness.figure(
            figures,
            "resnet18 first step (trace + compile + run, no cache): jm / plain jax.jit "
            f"({seconds})",
            "compile",
            min(a / f for a, f in pairs),
            statistics.median(a / f for a, f in pairs),
            TARGETS["compile"],
        )
    if args.models != list(MODELS):  # results/ holds whole runs only
        print("\na partial run (--models): benchmarks/results/ left as it was")
        return
    harness.save_results("models", tables, figures=figures)
    (harness.RESULTS / "models_runs.json").write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
