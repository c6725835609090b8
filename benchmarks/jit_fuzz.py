"""Fuzz ``jm.jit.load`` with damaged and rewritten program files, each load isolated.

Saves one program (Linear + BatchNorm1d + Dropout + Linear, training mode) and
makes three kinds of copies:

* ``--flips``: one random bit flipped anywhere (the digests then fail);
* ``--truncations``: cut at a random length;
* ``--programs``: 1 to ``--bytes`` random bytes of the *program part* changed
  and every digest recomputed, as anyone rewriting a file on purpose can do
  (the digests pass; only jm.jit's checks of the program stand between the
  bytes and JAX's StableHLO deserializer).

Each copy is loaded, and the loaded program called once, in a worker
interpreter (``--batch`` loads per worker, ``--jobs`` workers at once). A
load that has not finished after ``--timeout`` seconds is a hang: its worker
is killed and the rest of its batch goes to a new worker; a worker that
dies is replaced the same way and the load it died on is counted as a death.
The workers run with ``JMODULE_JIT_VERIFY_TIMEOUT=--verify-timeout``, the
time ``jm.jit.load`` gives the verification of a program. A worker's loads
share its one verifying child process (started at its first load, about a
second; then about 10 ms a program), so large batches are cheap.

Outcomes: ``loaded`` (loaded and ran: a change that does not matter, e.g. in
a name), ``ProgramFileError``/``IncompatibleVersionError``, ``other: ...``
(any other exception), ``hang`` and ``process death``. Flipped and truncated
copies must all raise ``ProgramFileError``; rewritten programs may load, but
must never raise anything else, hang or kill the process. Exits non-zero
otherwise.

``--raw`` fuzzes ``jax.export.deserialize`` directly on the bare serialized
program (no jm.jit checksums), to show what the checksums protect against.
Before jm.jit verified programs in a child process, 200 rewritten programs
(seed 0) gave a load that hung (over 60 s, in StableHLO deserialization) and a
raw ``RuntimeError`` at a first call; ``tests/jit/test_jit_hostile_programs.py``
runs 200 of them.

Run: ``python benchmarks/jit_fuzz.py [--flips 500] [--truncations 200] [--programs 0] [--raw]``;
rewritten programs only: ``python benchmarks/jit_fuzz.py --flips 0 --truncations 0 --programs 200``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import queue
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import numpy as np

import jmodule as jm
import jmodule.jit
from jmodule import nn
from jmodule.jit import _format

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
                jax.block_until_ready(jit.load(path)(jnp.ones((8, 16))))
            result = "loaded"
        except jit.ProgramFileError as e:
            result = type(e).__name__
        except Exception as e:
            result = "other: " + type(e).__name__ + ": " + str(e).splitlines()[0][:120]
        print(json.dumps({"path": path, "result": result}), flush=True)
    """
)

#: Seconds a worker may take to start (import jax and jmodule) before its first load.
_STARTUP = 120.0


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


def rewrite_program(
    meta: dict, parts: dict[str, bytes], rng: np.random.Generator, max_bytes: int
) -> bytes:
    """A program file whose program part has 1 to ``max_bytes`` bytes changed, digests redone.

    ``meta`` and ``parts`` are what ``_format.decode`` returns for a saved file
    (parts as bytes); ``_format.encode`` writes every part's sha256 and the
    header's digest again, so the file passes every checksum.
    """
    program = bytearray(parts["program"])
    for _ in range(int(rng.integers(1, max_bytes + 1))):
        program[int(rng.integers(0, len(program)))] ^= int(rng.integers(1, 256))
    return _format.encode(meta, {**parts, "program": bytes(program)})


def _mutants(
    data: bytes,
    flips: int,
    truncations: int,
    programs: int,
    max_bytes: int,
    directory: str,
    seed: int,
) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []

    def put(name: str, content: bytes) -> None:
        paths.append(os.path.join(directory, name))
        with open(paths[-1], "wb") as f:
            f.write(content)

    for i in range(flips):
        mutated = bytearray(data)
        mutated[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
        put(f"flip{i:05d}", bytes(mutated))
    for i in range(truncations):
        put(f"cut{i:05d}", data[: int(rng.integers(0, len(data)))])
    if programs:
        meta, views = _format.decode(data, "the saved program")
        parts = {k: bytes(v) for k, v in views.items()}
        for i in range(programs):
            put(f"program{i:05d}", rewrite_program(meta, parts, rng, max_bytes))
    return paths


def _worker(
    chunk: list[str], raw: bool, timeout: float, env: dict
) -> tuple[dict[str, str], str | None, str | None]:
    """Load ``chunk`` in one worker: ``(results, path it stopped on, why)``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, "raw" if raw else "jm", *chunk],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for raw_line in proc.stdout:
                lines.put(raw_line.decode("utf-8", "replace"))  # a dying process may write anything
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    results: dict[str, str] = {}
    started = None
    deadline = time.monotonic() + _STARTUP
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            proc.kill()
            proc.wait()
            reader.join(30)
            return results, started, "hang"
        if line is None:
            break
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "start" in record:
            started = record["start"]
            deadline = time.monotonic() + timeout
        else:
            results[record["path"]] = record["result"]
            started = None
            deadline = time.monotonic() + _STARTUP
    returncode = proc.wait()
    reader.join(30)
    if returncode != 0 or started is not None:
        return results, started, f"process death (exit status {returncode})"
    return results, None, None


def _load_all(chunk: list[str], raw: bool, timeout: float, env: dict) -> tuple[dict, list]:
    """Load ``chunk`` in workers, a new one after each hang or death."""
    outcomes: dict[str, str] = {}
    notes = []
    pending = list(chunk)
    while pending:
        results, stopped, why = _worker(pending, raw, timeout, env)
        outcomes.update(results)
        if why is not None:
            if stopped is None and not results:
                raise RuntimeError(f"a worker failed before its first load: {why}")
            if stopped is not None:
                outcomes[stopped] = "hang" if why == "hang" else "process death"
            notes.append(f"{why} on {stopped}")
        pending = [p for p in pending if p not in outcomes]
    return outcomes, notes


def run(
    paths: list[str],
    batch: int,
    raw: bool,
    timeout: float = 180.0,
    verify_timeout: float = 20.0,
    jobs: int = 2,
) -> tuple[dict[str, str], list[str]]:
    """Load every path in workers (``jobs`` at once, ``batch`` loads each).

    Returns each path's outcome and notes on the hangs and deaths.
    """
    env = dict(os.environ, JAX_PLATFORMS="cpu", JMODULE_JIT_VERIFY_TIMEOUT=str(verify_timeout))
    chunks = [paths[i : i + batch] for i in range(0, len(paths), batch)]
    outcomes: dict[str, str] = {}
    notes: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max(jobs, 1)) as pool:
        for results, chunk_notes in pool.map(
            lambda chunk: _load_all(chunk, raw, timeout, env), chunks
        ):
            outcomes.update(results)
            notes += chunk_notes
    return outcomes, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=500)
    parser.add_argument("--truncations", type=int, default=200)
    parser.add_argument("--programs", type=int, default=0, help="rewritten program parts")
    parser.add_argument("--bytes", type=int, default=4, help="most bytes changed per program")
    parser.add_argument("--batch", type=int, default=100, help="loads per worker interpreter")
    parser.add_argument("--jobs", type=int, default=2, help="workers running at once")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a load may take")
    parser.add_argument("--verify-timeout", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", help="write the copies to this directory and keep them")
    parser.add_argument("--raw", action="store_true", help="fuzz jax.export.deserialize itself")
    args = parser.parse_args()
    if args.raw and args.programs:
        parser.error("--programs rewrites program files; --raw fuzzes bare programs")
    data = _saved(args.raw)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.keep or scratch
        os.makedirs(directory, exist_ok=True)
        paths = _mutants(
            data, args.flips, args.truncations, args.programs, args.bytes, directory, args.seed
        )
        outcomes, notes = run(
            paths, args.batch, args.raw, args.timeout, args.verify_timeout, args.jobs
        )
    what = "raw jax.export.deserialize" if args.raw else "jm.jit.load + first call"
    print(
        f"{what}: {len(paths)} trials ({args.flips} bit flips, {args.truncations} truncations, "
        f"{args.programs} rewritten programs with 1-{args.bytes} bytes changed), seed {args.seed}"
    )
    print(f"file size {len(data)} bytes, {time.perf_counter() - start:.0f} s")
    failed = False
    for kind in ("flip", "cut", "program"):
        counts = collections.Counter(
            outcomes[p] for p in paths if os.path.basename(p).startswith(kind)
        )
        if not counts:
            continue
        print(f" {kind}:")
        for result, n in counts.most_common():
            print(f"  {result:<70}{n:>6}")
        allowed = {"ProgramFileError", "IncompatibleVersionError"}
        if kind == "program":
            allowed.add("loaded")
        failed |= bool(set(counts) - allowed)
    for note in notes:
        print(f"  {note}")
    if not args.raw and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
