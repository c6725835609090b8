"""Fuzz ``jm.jit.load`` with truncated and byte-flipped program files, each load isolated.

Saves one program (Linear + BatchNorm1d + Dropout + Linear, training mode),
makes ``--flips`` copies with one random bit flipped and ``--truncations``
copies cut at a random length, and loads each in a worker interpreter
(``--batch`` loads per worker; a worker that dies is replaced, and the load it
died on is counted as a death). Every load must raise ``ProgramFileError``:
the script reports how many did, how many loaded (should be 0), how many
raised something else (should be 0) and how many killed the process (must be 0).

``--raw`` fuzzes ``jax.export.deserialize`` directly on the bare serialized
program (no jm.jit checksums), to show what the checksums protect against.

Run: ``python benchmarks/jit_fuzz.py [--flips 500] [--truncations 200] [--raw]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import numpy as np

import jmodule as jm
import jmodule.jit
from jmodule import nn

WORKER = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp
    import jmodule.jit as jit
    raw = sys.argv[1] == "raw"
    for path in sys.argv[2:]:
        print(json.dumps({"start": path}), flush=True)
        try:
            if raw:
                with open(path, "rb") as f:
                    exported = jax.export.deserialize(bytearray(f.read()))
                exported.call([jnp.zeros(a.shape, a.dtype) for a in exported.in_avals[:-1]],
                              [jnp.ones((8, 16))])
            else:
                jit.load(path)(jnp.ones((8, 16)))
            result = "loaded"
        except jit.ProgramFileError as e:
            result = type(e).__name__
        except Exception as e:
            result = "other: " + type(e).__name__
        print(json.dumps({"path": path, "result": result}), flush=True)
    """
)


def _saved(raw: bool) -> bytes:
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Dropout(0.1), nn.Linear(32, 4))
    sm = jm.jit.trace(model, jax.numpy.ones((8, 16)))
    if raw:
        from jmodule.jit._trace import FlatForward

        flat = FlatForward(sm.module, sm._traced_forward)
        return bytes(flat.export(sm.__dict__["_jm_signature"], ("cpu", "cuda")).serialize())
    path = os.path.join(tempfile.mkdtemp(), "model.jmjit")
    sm.save(path)
    with open(path, "rb") as f:
        return f.read()


def _mutants(data: bytes, flips: int, truncations: int, directory: str, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(flips):
        mutated = bytearray(data)
        mutated[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
        paths.append(os.path.join(directory, f"flip{i:05d}"))
        with open(paths[-1], "wb") as f:
            f.write(bytes(mutated))
    for i in range(truncations):
        paths.append(os.path.join(directory, f"cut{i:05d}"))
        with open(paths[-1], "wb") as f:
            f.write(data[: int(rng.integers(0, len(data)))])
    return paths


def run(paths: list[str], batch: int, raw: bool) -> tuple[collections.Counter, list[str]]:
    """Load every path in workers; returns result counts and the paths that killed a worker."""
    counts: collections.Counter = collections.Counter()
    deaths = []
    pending = list(paths)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    while pending:
        chunk, pending = pending[:batch], pending[batch:]
        try:
            proc = subprocess.run(
                [sys.executable, "-c", WORKER, "raw" if raw else "jm", *chunk],
                capture_output=True,
                encoding="utf-8",
                errors="replace",  # a dying process may write anything
                env=env,
                timeout=60 + 20 * len(chunk),
            )
            stdout, returncode = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout or b""
            stdout = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
            returncode = "timeout"
        started, done = None, set()
        for line in stdout.splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "start" in record:
                started = record["start"]
            else:
                done.add(record["path"])
                counts[record["result"]] += 1
        if returncode != 0:
            dead = started if started not in done else None
            deaths.append(f"{dead} (exit status {returncode})")
            counts["process death"] += 1
            pending = [p for p in chunk if p not in done and p != dead] + pending
    return counts, deaths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=500)
    parser.add_argument("--truncations", type=int, default=200)
    parser.add_argument("--batch", type=int, default=25, help="loads per worker interpreter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw", action="store_true", help="fuzz jax.export.deserialize itself")
    args = parser.parse_args()
    data = _saved(args.raw)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        paths = _mutants(data, args.flips, args.truncations, directory, args.seed)
        counts, deaths = run(paths, args.batch, args.raw)
    what = "raw jax.export.deserialize" if args.raw else "jm.jit.load"
    print(f"{what}: {len(paths)} trials ({args.flips} bit flips, {args.truncations} truncations)")
    print(f"file size {len(data)} bytes, {time.perf_counter() - start:.0f} s")
    for result, n in counts.most_common():
        print(f"  {result:<40}{n:>6}")
    for death in deaths:
        print(f"  died on {death}")
    if not args.raw and (deaths or set(counts) - {"ProgramFileError", "IncompatibleVersionError"}):
        sys.exit(1)


if __name__ == "__main__":
    main()
