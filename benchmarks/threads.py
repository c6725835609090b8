"""Two threads: is ``jm.backward`` in one thread safe while another thread runs a model?

Thread A makes ``CALLS`` (300) calls of
``jm.backward(lambda: F.cross_entropy(model_a(x_i), y_i))`` on an eager MLP
16-32-32-10 at batch 8, a different batch each call, accumulating gradients
(no ``zero_grad`` between calls, so every call's contribution is in the
result). Meanwhile thread B calls another model, ``model_b(x)``, in a loop
until A finishes: in one variant ``model_b`` is eager, in the other it is
compiled (``model_b.compile()``).

Checks, each printed as a PASS/FAIL line (issue 13's targets):

* no exception raised in thread A (counted per call, A carries on);
* no exception raised in thread B (counted per call, B carries on);
* A's accumulated gradients equal, exactly (``np.array_equal``), those of the
  same ``CALLS`` backward calls made with no other thread running.

And a sanity check that two single-threaded runs give identical gradients
(else the exact comparison would mean nothing). Every variant runs
``--trials`` times; a check passes only if it passes in every trial.

Timing: the wall time of A's calls alone (single thread) and with B running,
per call, best of trials; the single-threaded run is repeated in every trial,
interleaved with the two-threaded ones, so load drift hits them alike (the
first trial's single-threaded gradients are the reference). With
the GIL the two-threaded figure is expected to be slower; it is reported,
not judged. Where A's calls raise, the two-threaded time is that of failing
calls, so it is only comparable once the error checks pass.

Run: ``make bench`` or ``python benchmarks/threads.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import jax
import numpy as np
from harness import save_results

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import nn

SIZES, BATCH, CALLS = (16, 32, 32, 10), 8, 300
JOIN_TIMEOUT_S = 120.0
KEEP_MESSAGES = 3


def mlp() -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(SIZES) - 1):
        layers.append(nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Errors:
    """A count of exceptions and the first few distinct messages."""

    def __init__(self) -> None:
        self.count = 0
        self.messages: list[str] = []

    def add(self, exc: BaseException) -> None:
        self.count += 1
        text = f"{type(exc).__name__}: {exc}"[:300]
        if text not in self.messages and len(self.messages) < KEEP_MESSAGES:
            self.messages.append(text)


def run_a(model: nn.Module, batches: list[tuple[jax.Array, jax.Array]], errors: Errors) -> float:
    """Thread A's work: the backward calls; returns their wall time in seconds."""
    model.zero_grad()
    start = time.perf_counter()
    for x, y in batches:
        try:
            loss = jm.backward(lambda: F.cross_entropy(model(x), y))  # noqa: B023 (called now)
            jax.block_until_ready(loss)
        except Exception as exc:
            errors.add(exc)
    grads = [p.grad for p in model.parameters()]
    jax.block_until_ready([g for g in grads if g is not None])
    return time.perf_counter() - start


def grads_of(model: nn.Module) -> list[np.ndarray | None]:
    return [None if p.grad is None else np.asarray(p.grad) for p in model.parameters()]


def same(a: list[np.ndarray | None], b: list[np.ndarray | None]) -> bool:
    return len(a) == len(b) and all(
        x is not None and y is not None and np.array_equal(x, y) for x, y in zip(a, b)
    )


def two_threads(
    model_a: nn.Module,
    batches: list[tuple[jax.Array, jax.Array]],
    call_b: Callable[[], Any],
) -> dict[str, Any]:
    """A's backward calls while thread B calls ``call_b`` in a loop until A is done."""
    errors_a, errors_b = Errors(), Errors()
    started, done = threading.Event(), threading.Event()
    b_calls = [0]

    def thread_b() -> None:
        while not done.is_set():
            try:
                jax.block_until_ready(call_b())
                b_calls[0] += 1
            except Exception as exc:
                errors_b.add(exc)
            started.set()

    b = threading.Thread(target=thread_b, name="thread B", daemon=True)
    b.start()
    started.wait(JOIN_TIMEOUT_S)
    result: dict[str, Any] = {}

    def thread_a() -> None:
        try:
            result["seconds"] = run_a(model_a, batches, errors_a)
        finally:
            done.set()

    a = threading.Thread(target=thread_a, name="thread A", daemon=True)
    a.start()
    a.join(JOIN_TIMEOUT_S * 10)
    b.join(JOIN_TIMEOUT_S)
    hung = a.is_alive() or b.is_alive()
    return {
        "seconds": result.get("seconds", float("nan")),
        "errors_a": errors_a,
        "errors_b": errors_b,
        "b_calls": b_calls[0],
        "hung": hung,
        "grads": grads_of(model_a),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 backward calls, one trial")
    parser.add_argument("--trials", type=int, default=2, help="repeats of every variant")
    args = parser.parse_args()
    calls, trials = (30, 1) if args.quick else (CALLS, args.trials)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores")

    keys = jax.random.split(jax.random.key(0), 2 * calls)
    batches = [
        (
            jax.random.normal(keys[2 * i], (BATCH, SIZES[0])),
            jax.random.randint(keys[2 * i + 1], (BATCH,), 0, SIZES[-1]),
        )
        for i in range(calls)
    ]
    xb = jax.random.normal(jax.random.key(1), (BATCH, SIZES[0]))
    model_a, eager_b, compiled_b = mlp(), mlp(), mlp()
    compiled_b.compile()
    jax.block_until_ready([eager_b(xb), compiled_b(xb)])  # compile before any timing
    variants = {
        "B only sleeps (control)": lambda: time.sleep(1e-3),
        "B calls an eager model": lambda: eager_b(xb),
        "B calls a compiled model": lambda: compiled_b(xb),
    }

    run_a(model_a, batches[:10], Errors())  # warm-up: compiles what the eager ops need
    single_s: list[float] = []
    single_grads: list[list[np.ndarray | None]] = []
    errors_single = Errors()
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for trial in range(trials):
        for _ in range(2 if trials == 1 else 1):  # two single-threaded runs at least
            single_s.append(run_a(model_a, batches, errors_single))
            single_grads.append(grads_of(model_a))
        reference = single_grads[0]
        print(f"trial {trial + 1}: A alone {single_s[-1] / calls * 1e3:.2f} ms/call")
        for name, call_b in variants.items():
            out = two_threads(model_a, batches, call_b)
            out["grads_equal"] = same(out.pop("grads"), reference)
            found[name].append(out)
            print(
                f"trial {trial + 1}: {name}: A {out['seconds'] / calls * 1e3:.2f} ms/call, "
                f"errors A {out['errors_a'].count}/{calls}, errors B {out['errors_b'].count}"
                f"/{out['b_calls'] + out['errors_b'].count}, grads equal {out['grads_equal']}"
            )
    reproducible = errors_single.count == 0 and all(same(g, reference) for g in single_grads)

    checks: list[dict[str, Any]] = []

    def check(text: str, passed: bool, detail: str, messages: list[str] | None = None) -> None:
        print(f"{'PASS' if passed else 'FAIL'}  {text}: {detail}")
        for message in messages or []:
            print(f"        e.g. {message}")
        entry: dict[str, Any] = {"check": text, "passed": bool(passed), "detail": detail}
        if messages:
            entry["messages"] = messages
        checks.append(entry)

    print()
    check(
        "single-threaded runs reproduce their gradients exactly",
        reproducible,
        f"{len(single_grads)} runs of {calls} jm.backward calls, errors {errors_single.count}",
        errors_single.messages,
    )
    tables: dict[str, dict[str, float]] = {}
    title = f"thread A: {calls} jm.backward calls, MLP 16-32-32-10, batch {BATCH} (per call)"
    tables[title] = {"A alone (single thread)": min(single_s) / calls * 1e6}
    for name, runs in found.items():
        a_errors = sum(r["errors_a"].count for r in runs)
        b_errors = sum(r["errors_b"].count for r in runs)
        b_calls = sum(r["b_calls"] for r in runs)
        a_messages = list(dict.fromkeys(m for r in runs for m in r["errors_a"].messages))
        b_messages = list(dict.fromkeys(m for r in runs for m in r["errors_b"].messages))
        check(
            f"{name}: no errors in thread A",
            a_errors == 0,
            f"{a_errors} of {calls * trials} backward calls raised",
            a_messages[:KEEP_MESSAGES],
        )
        check(
            f"{name}: no errors in thread B",
            b_errors == 0,
            f"{b_errors} of {b_calls + b_errors} calls raised",
            b_messages[:KEEP_MESSAGES],
        )
        equal = [r["grads_equal"] for r in runs]
        check(
            f"{name}: A's gradients equal the single-threaded run's (np.array_equal)",
            all(equal),
            f"equal in {sum(equal)} of {trials} trials",
        )
        if any(r["hung"] for r in runs):
            check(f"{name}: both threads finished", False, "a thread did not finish in time")
        tables[title][f"A while {name}"] = min(r["seconds"] for r in runs) / calls * 1e6

    print(f"\n{title}")
    alone = tables[title]["A alone (single thread)"]
    for name, us in tables[title].items():
        print(f"{name:<44}{us / 1e3:>10.2f} ms{us / alone:>8.2f}x")
    if not args.quick:
        save_results("threads", tables, checks=checks)


if __name__ == "__main__":
    main()
