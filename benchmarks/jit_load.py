"""Load-to-first-output of a saved ``jm.jit`` program vs re-tracing the original model.

For each model, a program is saved once; then, each in a fresh interpreter
(so no in-memory trace or executable cache helps either side, and JAX's
persistent compilation cache is off):

* **load**: ``jm.jit.load(path)`` and the first call, until its output is ready
  (checksums, deserialization, XLA compilation; no Python tracing of the model);
* **retrace**: build the model from its class, load its weights, ``jm.jit.script``
  it and make the first call (Python tracing of forward, lowering, XLA compilation).

Imports are done before the clock starts on both sides. Prints the median of
``--repeats`` runs in milliseconds.

Run: ``python benchmarks/jit_load.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

MODELS = textwrap.dedent(
    """
    import jax
    from jmodule import nn

    def mlp():
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 10))
        return m.eval(), (8, 16)

    def deep_bn():
        layers = []
        for _ in range(32):
            layers += [nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()]
        return nn.Sequential(*layers), (8, 8)

    def transformer():
        layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True)
        return nn.TransformerEncoder(layer, 4).eval(), (8, 16, 64)

    MODELS = {"mlp": mlp, "deep_bn": deep_bn}
    if hasattr(nn, "TransformerEncoder"):
        MODELS["transformer"] = transformer
    """
)

PREPARE = textwrap.dedent(
    """
    import sys, json
    import numpy as np
    import jax, jax.numpy as jnp
    import jmodule as jm
    import jmodule.jit
    sys.path.insert(0, sys.argv[1])
    from jit_load_models import MODELS
    name, directory = sys.argv[2], sys.argv[3]
    model, shape = MODELS[name]()
    x = np.asarray(jax.random.normal(jax.random.key(0), shape))
    np.save(f"{directory}/{name}.x.npy", x)
    np.savez(f"{directory}/{name}.weights.npz",
             **{k: np.asarray(v) for k, v in model.state_dict().items()})
    jm.jit.trace(model, jnp.asarray(x)).save(f"{directory}/{name}.jmjit")
    print(json.dumps({"size": __import__("os").path.getsize(f"{directory}/{name}.jmjit")}))
    """
)

MEASURE = textwrap.dedent(
    """
    import sys, json, time
    import numpy as np
    import jax, jax.numpy as jnp
    import jmodule as jm
    import jmodule.jit
    mode, name, directory, models_dir, warm = sys.argv[1:6]
    x = jnp.asarray(np.load(f"{directory}/{name}.x.npy"))
    if mode == "retrace":
        sys.path.insert(0, models_dir)
        from jit_load_models import MODELS
        weights = dict(np.load(f"{directory}/{name}.weights.npz"))
    jax.block_until_ready(jnp.ones(3) + 1)  # start the runtime before the clock
    if warm == "warm":  # jax.export's one-time setup (it imports jax's LAPACK bindings)
        tiny = jax.export.export(jax.jit(lambda a: a * 2))(jnp.ones(3))
        jax.block_until_ready(tiny.call(jnp.ones(3)))
    start = time.perf_counter()
    build = 0.0
    if mode == "load":
        model = jm.jit.load(f"{directory}/{name}.jmjit")
    else:
        model, _ = MODELS[name]()
        model.load_state_dict(weights)
        build = time.perf_counter() - start
        model = jm.jit.script(model)
    jax.block_until_ready(model(x))
    total = time.perf_counter() - start
    print(json.dumps({"ms": (total - build) * 1e3, "build_ms": build * 1e3}))
    """
)


def _run(args: list[str]) -> dict:
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "jit_load_models.py"), "w") as f:
            f.write(MODELS)
        namespace: dict = {}
        exec(MODELS, namespace)
        print(
            f"{'model':<13}{'file KB':>8}{'load cold':>11}{'load':>8}{'retrace':>9}"
            f"{'load/retrace':>14}{'+build':>8}   (ms, median of {args.repeats})"
        )
        for name in namespace["MODELS"]:
            size = _run([PREPARE, directory, name, directory])["size"]

            def median(mode: str, warm: str, key: str = "ms", name: str = name) -> float:
                runs = [
                    _run([MEASURE, mode, name, directory, directory, warm])
                    for _ in range(args.repeats)
                ]
                return statistics.median(r[key] for r in runs)

            cold = median("load", "cold")
            load = median("load", "warm")
            retrace = median("retrace", "warm")
            build = median("retrace", "warm", "build_ms")
            print(
                f"{name:<13}{size / 1024:>8.1f}{cold:>11.0f}{load:>8.0f}{retrace:>9.0f}"
                f"{load / retrace:>14.2f}{build:>8.0f}"
            )
        print(
            "load: jm.jit.load + first call, after jax.export's one-time setup in the process "
            "(load cold: including it). retrace: jm.jit.script of the built model + first call. "
            "+build: constructing the model and loading its weights, which retracing also "
            "needs (not in 'retrace')."
        )


if __name__ == "__main__":
    main()
