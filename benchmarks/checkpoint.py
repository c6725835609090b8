"""Checkpoint speed: jm.save / jm.load against numpy, torch and plain Orbax, in one run.

A 256 MiB state_dict of ~100 float32 arrays (sizes vary, as in a real model)
is saved to a fresh path and loaded back, ``--repeats`` rounds in which each
contender runs once (so changes in machine load hit them alike); medians are
reported. jm's save is durable (every file is fsync'ed, as Orbax's
tensorstore does by default); ``numpy.save`` and ``torch.save`` are not, so
they are also timed with an fsync of each file they wrote ("+fsync"), the fair
floor for a durable write. Loads read from the page cache (the files were just
written), which measures the software, not the disk.

Also timed: ``CheckpointManager(async_=True).save`` (the time until control
returns to the training loop) against a synchronous save of the same state.

Run: ``.venv/bin/python benchmarks/checkpoint.py [--mib 256] [--arrays 100] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jmodule.serialization as jms
from jmodule.checkpoint import CheckpointManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import save_results


def make_state(mib: float, arrays: int, seed: int = 0) -> collections.OrderedDict:
    """~``mib`` MiB of float32 in ``arrays`` arrays of varying size, on the default device."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.2, 1.8, arrays)
    sizes = (weights / weights.sum() * mib * 2**20 / 4).astype(int) // 64 * 64
    sd = collections.OrderedDict()
    for i, n in enumerate(sizes):
        kind = ("weight", "bias", "running_mean")[i % 3]
        sd[f"layers.{i // 3}.{kind}"] = jnp.asarray(
            rng.standard_normal(max(int(n), 64), dtype=np.float32).reshape(-1, 64)
        )
    return jax.block_until_ready(sd)


def fsync_files(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=256)
    parser.add_argument("--arrays", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    import torch  # the benchmark's comparison only; jm never imports torch

    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="jm-ckpt-bench-"))
    sd = make_state(args.mib, args.arrays)
    nbytes = sum(v.nbytes for v in sd.values())
    host = {k: np.asarray(v) for k, v in sd.items()}
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in host.items()}
    print(
        f"state_dict: {len(sd)} float32 arrays, {nbytes / 2**20:.1f} MiB, on "
        f"{jax.devices()[0].platform} ({os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}); writing to {root}; {args.repeats} rounds, medians\n"
    )

    def fresh(path: Path):
        return lambda: (
            shutil.rmtree(path, ignore_errors=True) or (path.unlink() if path.is_file() else None)
        )

    results: dict[str, float] = {}

    def record(name: str, times: list[float]) -> None:
        results[name] = statistics.median(times)
        print(
            f"  {name:<28} median {results[name] * 1e3:8.1f} ms   min {min(times) * 1e3:8.1f} ms"
            f"   {nbytes / results[name] / 2**30:6.2f} GiB/s"
        )

    def round_robin(cases: list[tuple[str, object, object]]) -> None:
        """Time every case once per round, so load changes hit them all alike."""
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        for _ in range(args.repeats):
            for name, fn, before in cases:
                if before is not None:
                    before()
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        for name, _, _ in cases:
            record(name, times[name])

    npdir, tfile, odir, jdir = root / "numpy", root / "torch.pt", root / "orbax", root / "jm"

    def np_save(sync: bool = False):
        npdir.mkdir()
        paths = []
        for i, v in enumerate(host.values()):
            paths.append(npdir / f"{i}.npy")
            np.save(paths[-1], v)
        if sync:
            fsync_files([*paths, npdir])

    def torch_save(sync: bool = False):
        torch.save(tensors, tfile)
        if sync:
            fsync_files([tfile])

    import orbax.checkpoint as ocp

    def orbax_save():
        checkpointer = ocp.Checkpointer(
            ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=False)
        )
        checkpointer.save(odir, args=ocp.args.PyTreeSave(dict(sd)))
        checkpointer.close()

    print("save")
    round_robin(
        [
            ("numpy.save", np_save, fresh(npdir)),
            ("numpy.save +fsync", lambda: np_save(True), fresh(npdir)),
            ("torch.save", torch_save, fresh(tfile)),
            ("torch.save +fsync", lambda: torch_save(True), fresh(tfile)),
            ("orbax save (no checksums)", orbax_save, fresh(odir)),
            ("jm.save", lambda: jms.save(sd, jdir), fresh(jdir)),
            ("jm.save (overwrite=True)", lambda: jms.save(sd, jdir, overwrite=True), None),
        ]
    )

    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def orbax_load():
        checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
        restore = {k: ocp.ArrayRestoreArgs(sharding=sharding) for k in sd}
        jax.block_until_ready(
            checkpointer.restore(odir, args=ocp.args.PyTreeRestore(restore_args=restore))
        )
        checkpointer.close()

    print("load (from the page cache)")
    round_robin(
        [
            ("numpy.load", lambda: [np.load(npdir / f"{i}.npy") for i in range(len(sd))], None),
            ("torch.load", lambda: torch.load(tfile, weights_only=True), None),
            ("orbax restore (no checksums)", orbax_load, None),
            ("jm.load", lambda: jax.block_until_ready(jms.load(jdir)), None),
            (
                "jm.load verify=False",
                lambda: jax.block_until_ready(jms.load(jdir, verify=False)),
                None,
            ),
        ]
    )

    print("CheckpointManager")
    sync_times, async_times, async_total = [], [], []
    for r in range(args.repeats):
        with CheckpointManager(root / f"sync{r}", async_=False) as manager:
            t0 = time.perf_counter()
            manager.save(0, sd)
            sync_times.append(time.perf_counter() - t0)
        with CheckpointManager(root / f"async{r}", async_=True) as manager:
            t0 = time.perf_counter()
            manager.save(0, sd)
            async_times.append(time.perf_counter() - t0)
            manager.wait_until_finished()
            async_total.append(time.perf_counter() - t0)
        shutil.rmtree(root / f"sync{r}")
        shutil.rmtree(root / f"async{r}")
    record("save, async_=False", sync_times)
    record("save, async_=True (returns)", async_times)
    record("save, async_=True (on disk)", async_total)

    r = results
    print("\nratios (jm / other; below 1 means jm is faster)")
    print(f"  save: jm / numpy        {r['jm.save'] / r['numpy.save']:5.2f}x")
    print(f"  save: jm / numpy+fsync  {r['jm.save'] / r['numpy.save +fsync']:5.2f}x")
    print(f"  save: jm / torch        {r['jm.save'] / r['torch.save']:5.2f}x")
    print(f"  save: jm / torch+fsync  {r['jm.save'] / r['torch.save +fsync']:5.2f}x")
    print(f"  save: jm / orbax        {r['jm.save'] / r['orbax save (no checksums)']:5.2f}x")
    print(f"  load: jm / orbax        {r['jm.load'] / r['orbax restore (no checksums)']:5.2f}x")
    print(f"  load: jm / numpy        {r['jm.load'] / r['numpy.load']:5.2f}x")
    print(f"  load: jm / torch        {r['jm.load'] / r['torch.load']:5.2f}x")
    print(f"  load: jm (no verify) / numpy {r['jm.load verify=False'] / r['numpy.load']:5.2f}x")
    fraction = r["save, async_=True (returns)"] / r["save, async_=False"]
    print(f"  async save returns after {100 * fraction:.1f}% of a synchronous save's time")
    print(f"(load average at the end: {os.getloadavg()[0]:.1f})")
    shutil.rmtree(root, ignore_errors=True)
    size = f"{nbytes / 2**20:.0f} MiB state_dict of {len(sd)} arrays"
    us = {k: v * 1e6 for k, v in r.items()}
    pick = lambda *names: {n: us[n] for n in names}
    save_results(
        "checkpoint",
        {
            f"checkpoint save, {size}": pick(
                "numpy.save",
                "numpy.save +fsync",
                "torch.save",
                "orbax save (no checksums)",
                "jm.save",
            ),
            f"checkpoint load, {size}": pick(
                "numpy.load", "torch.load", "orbax restore (no checksums)", "jm.load"
            ),
            f"CheckpointManager.save of a {size}, until control returns": pick(
                "save, async_=False", "save, async_=True (returns)"
            ),
        },
    )


if __name__ == "__main__":
    main()
