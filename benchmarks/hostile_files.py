"""Hostile files against the readers: time, peak memory and outcome of each, in fresh processes.

The scenarios of issue 14 (items 3, 4, 6, 7 and the program-file half of 9),
each a small file (or directory) built here, loaded ``--repeats`` times, each
time in a fresh interpreter watched from outside: killed if its resident
memory passes ``--cap-mb`` or it runs past ``--timeout`` seconds. Prints, per
scenario, the outcome (the result or the error class), the median time of
the load call and the largest memory growth during it (peak RSS minus RSS
before the call).

* ``dag-20``/``dag-40``: a pickle whose lists share references through the
  memo (depth 20 / 40; under 1 KB);
* ``view``: a 1-element storage viewed as (8192, 8192) with strides (0, 0);
* ``deflate``: a zip whose data record inflates to 500 MB from ~500 KB
  (the pickle declares a 1-element storage);
* ``json-*``: 100,000 nested brackets in a safetensors header, a
  ``*.index.json``, a checkpoint's ``jmodule.json`` (with a valid SHA-256)
  and a ``jm.jit`` program header (with valid digests);
* ``hub-cache``: a Hugging Face hub cache snapshot (index and shards are
  symlinks into ``blobs/``);
* ``fifo-*``/``zero-*``: a checkpoint's ``jmodule.json``, a ``.pt``, a
  ``.safetensors`` and a ``jm.jit`` file replaced by a FIFO / a symlink to
  ``/dev/zero``;
* ``jit-*``: a ``jm.jit`` file whose header (or program) was rewritten with
  recomputed digests; the load and the first call both count.

Each row ends with the baseline the issue quotes for that scenario (measured
on main before the fix; "-" where the issue quotes none). ``--root DIR`` runs
the loads against another checkout (e.g. main) to measure that baseline here.

Run: ``python benchmarks/hostile_files.py [--repeats 3] [--only dag-20,view] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import pickle
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import jax.numpy as jnp
    import jmodule as jm
    import jmodule.jit

    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
        return 0

    kind, path = sys.argv[1:]
    try:  # reset the peak (VmHWM) to the current RSS, so that the import's peak does not count
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = rss("VmRSS:")
    start = time.perf_counter()
    stage = "load"
    try:
        if kind == "jit":
            program = jm.jit.load(path)
            stage = "first call"
            program(jnp.ones((4, 6)))
        else:
            jm.load(path)
        outcome = "loaded"
    except Exception as e:
        outcome = f"{stage}: {type(e).__name__}: {str(e)[:120]}"
    seconds = time.perf_counter() - start
    print(json.dumps({"outcome": outcome, "seconds": seconds,
                      "grew": rss("VmHWM:") - before}), flush=True)
    """
)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run(kind: str, path: Path, cap: int, timeout: float, root: Path) -> dict:
    """One load in a fresh interpreter, killed past ``cap`` bytes of RSS or ``timeout``."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,  # python -c puts the working directory first on sys.path
    )
    start, peak = time.monotonic(), 0
    while proc.poll() is None:
        peak = max(peak, _rss(proc.pid))
        if peak > cap or time.monotonic() - start > timeout:
            proc.kill()
            proc.wait()
            why = f"killed at {peak / 2**20:.0f} MiB RSS" if peak > cap else "killed: hung"
            return {"outcome": why, "seconds": time.monotonic() - start, "grew": peak}
        time.sleep(0.01)
    out, err = proc.communicate()
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"outcome": f"crashed ({proc.returncode}): {err[-300:]}", "seconds": 0, "grew": 0}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- scenarios

_MAGIC = 0x1950A86A20F9469CFC6C


def _legacy(obj_pickle: bytes) -> bytes:
    head = b"".join(pickle.dumps(x, protocol=2) for x in (_MAGIC, 1001, {"little_endian": True}))
    return head + obj_pickle + pickle.dumps([], protocol=2)


def dag(directory: Path, depth: int) -> tuple[str, Path]:
    node: list = []
    for _ in range(depth):
        node = [node, node]
    path = directory / f"dag{depth}.pt"
    path.write_bytes(_legacy(pickle.dumps(node, protocol=2)))
    return "load", path


def _tensor_pickle(numel: int, size: tuple, stride: tuple) -> bytes:
    import torch

    class Ref:
        pass

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Ref):
                return ("storage", torch.FloatStorage, "0", "cpu", numel)
            return None

    class T:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (Ref(), 0, size, stride, False, {}))

    buf = io.BytesIO()
    P(buf, protocol=2).dump({"x": T()})
    return buf.getvalue()


def _zip(path: Path, records: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in records.items():
            z.writestr(name, data)


def view(directory: Path) -> tuple[str, Path]:
    path = directory / "view.pt"
    pkl = _tensor_pickle(1, (8192, 8192), (0, 0))
    _zip(path, {"archive/data.pkl": pkl, "archive/data/0": b"\0" * 4})
    return "load", path


def deflate(directory: Path) -> tuple[str, Path]:
    path = directory / "deflate.pt"
    pkl = _tensor_pickle(1, (1,), (1,))

    def zeros(out):
        chunk = b"\0" * (1 << 20)
        for _ in range(500):
            out.write(chunk)

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("archive/data.pkl", pkl)
        with z.open("archive/data/0", "w", force_zip64=True) as out:
            zeros(out)
    return "load", path


_DEEP = "[" * 100_000 + "]" * 100_000


def json_safetensors(directory: Path) -> tuple[str, Path]:
    header = ('{"__metadata__":' + _DEEP + "}").encode()
    path = directory / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return "load", path


def json_index(directory: Path) -> tuple[str, Path]:
    path = directory / "model.safetensors.index.json"
    path.write_text('{"weight_map":' + _DEEP + "}")
    return "load", path


def _checkpoint(directory: Path) -> Path:
    import jax.numpy as jnp

    import jmodule as jm

    path = directory / "ckpt"
    jm.save({"w": jnp.ones(4)}, path)
    return path


def json_metafile(directory: Path) -> tuple[str, Path]:
    path = _checkpoint(directory)
    body = ('{"format":"jmodule.checkpoint","tree":' + _DEEP + "}").encode()
    digest = hashlib.sha256(body).hexdigest()
    (path / "jmodule.json").write_bytes(
        f"jmodule-checkpoint 1 sha256={digest} bytes={len(body)}\n".encode() + body
    )
    return "load", path


def json_jit(directory: Path) -> tuple[str, Path]:
    from jmodule.jit import _format

    header = ('{"meta":' + _DEEP + ',"parts":[],"data_length":0}').encode()
    prefix = struct.pack("<8sIQ", _format.MAGIC, _format.FORMAT_VERSION, len(header))
    path = directory / "deep.jmjit"
    path.write_bytes(prefix + header + hashlib.sha256(prefix + header).digest())
    return "jit", path


def hub_cache(directory: Path) -> tuple[str, Path]:
    import jax.numpy as jnp

    import jmodule as jm

    repo = directory / "models--org--net"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    weight_map = {}
    for i, key in enumerate(("a.weight", "b.weight")):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        jm.save({key: jnp.full(3, float(i))}, directory / name)
        blob = hashlib.sha256((directory / name).read_bytes()).hexdigest()
        (directory / name).rename(blobs / blob)
        (snap / name).symlink_to(f"../../blobs/{blob}")
        weight_map[key] = name
    index = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    (blobs / "index").write_bytes(index)
    (snap / "model.safetensors.index.json").symlink_to("../../blobs/index")
    return "load", snap / "model.safetensors.index.json"


def _special(path: Path, kind: str) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def special(directory: Path, what: str, kind: str) -> tuple[str, Path]:
    if what == "jmodule.json":
        ckpt = _checkpoint(directory)
        _special(ckpt / "jmodule.json", kind)
        return "load", ckpt
    path = directory / what
    _special(path, kind)
    return ("jit" if what.endswith(".jmjit") else "load"), path


def _program(directory: Path):
    import jax.numpy as jnp

    import jmodule as jm
    import jmodule.jit
    from jmodule.jit import _format

    buf = io.BytesIO()
    jm.jit.trace(jm.nn.Linear(6, 2), jnp.ones((4, 6))).save(buf)
    return _format.decode(buf.getvalue(), "program")


def jit_header(directory: Path) -> tuple[str, Path]:
    from jmodule.jit import _format

    meta, parts = _program(directory)
    meta["inputs"] = {"list": meta["inputs"]["tuple"]}
    path = directory / "header.jmjit"
    path.write_bytes(_format.encode(meta, {k: bytes(v) for k, v in parts.items()}))
    return "jit", path


def jit_program(directory: Path) -> tuple[str, Path]:
    import jax

    from jmodule.jit import _format

    meta, parts = _program(directory)
    exported = jax.export.deserialize(bytearray(bytes(parts["program"])))
    bad = dataclasses.replace(exported, mlir_module_serialized=b"not stablehlo at all")
    parts = {k: bytes(v) for k, v in parts.items()}
    parts["program"] = bytes(bad.serialize())
    path = directory / "program.jmjit"
    path.write_bytes(_format.encode(meta, parts))
    return "jit", path


#: What issue 14 measured on main for each scenario (the baseline).
BASELINE = {
    "dag-20": "5.8 s, +443 MB (703-byte file)",
    "dag-40": "killed at 1.5 GiB (depth 22-40)",
    "view": "loaded as 514 MB",
    "deflate": "inflated to ~500 MB, then refused",
    "json-safetensors": "RecursionError",
    "json-index": "RecursionError",
    "json-jmodule.json": "RecursionError",
    "json-jit": "RecursionError",
    "hub-cache": "refused: shard outside its own directory",
    "fifo-jmodule.json": "blocks forever",
    "zero-jmodule.json": "memory grows without bound",
    "fifo-pt": "-",
    "zero-safetensors": "-",
    "fifo-jit": "-",
    "jit-header": "loads; first call: KeyError 'tuple'",
    "jit-program": "loads; first call: Failed to deserialize StableHLO",
}

SCENARIOS = {
    "dag-20": lambda d: dag(d, 20),
    "dag-40": lambda d: dag(d, 40),
    "view": view,
    "deflate": deflate,
    "json-safetensors": json_safetensors,
    "json-index": json_index,
    "json-jmodule.json": json_metafile,
    "json-jit": json_jit,
    "hub-cache": hub_cache,
    "fifo-jmodule.json": lambda d: special(d, "jmodule.json", "fifo"),
    "zero-jmodule.json": lambda d: special(d, "jmodule.json", "zero"),
    "fifo-pt": lambda d: special(d, "w.pt", "fifo"),
    "zero-safetensors": lambda d: special(d, "w.safetensors", "zero"),
    "fifo-jit": lambda d: special(d, "p.jmjit", "fifo"),
    "jit-header": jit_header,
    "jit-program": jit_program,
}


def _short(outcome: str, work: Path) -> str:
    """An outcome without the scenario directory's path."""
    return outcome.replace(f"{work}/", "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cap-mb", type=float, default=1536, help="kill a load past this RSS")
    parser.add_argument("--timeout", type=float, default=30.0, help="kill a load after this")
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose jmodule loads")
    parser.add_argument("--width", type=int, default=90, help="outcome column width")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    work = Path(tempfile.mkdtemp(prefix="jm-hostile-"))
    try:
        print(f"jmodule from {root}; {args.repeats} fresh interpreter(s) per scenario")
        print(
            f"{'scenario':<18} {'size':>9} {'median s':>9} {'max +MiB':>9}  "
            f"{'outcome':<{args.width}}  baseline (issue 14)"
        )
        for name in names:
            d = work / name
            d.mkdir()
            kind, path = SCENARIOS[name](d)
            size = path.stat().st_size if path.is_file() else 0
            cap = int(args.cap_mb * 2**20)
            runs = [_run(kind, path, cap, args.timeout, root) for _ in range(args.repeats)]
            outcome = " | ".join(sorted({_short(r["outcome"], work) for r in runs}))
            print(
                f"{name:<18} {size:>9} {statistics.median(r['seconds'] for r in runs):>9.3f} "
                f"{max(r['grew'] for r in runs) / 2**20:>9.1f}  "
                f"{outcome[: args.width]:<{args.width}}  {BASELINE[name]}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
