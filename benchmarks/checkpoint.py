"""Checkpoint speed: jm.save / jm.load against numpy, torch and plain Orbax, in one run.

A 256 MiB state_dict of ~100 float32 arrays (sizes vary, as in a real model)
is saved to a fresh path and loaded back in ``--repeats`` paired rounds: each
contender runs once per round, in an order that reverses every other round,
so changes in machine load hit them alike. Reported: each contender's median,
and each issue-14 figure as the median over rounds of the *paired* ratio
(jm / other in the same round), with its target and PASS/MISS.

jm.save writes Orbax's format (``_directory.ORBAX_OPTIONS``) with its own
writer (``jmodule/serialization/_orbax_writer.py``: Orbax's TensorStore specs
and files, the arrays in one TensorStore commit); the plain Orbax contender is
Orbax's own ``PyTreeCheckpointHandler``. ``--arrays 1000`` shows the
per-array cost the writer removes (Orbax's ~2 ms of Python per array).

Fair baselines. jm's save is durable (every file it wrote is fsync'ed before
the commit); ``numpy.save`` and ``torch.save`` are not, so they are also timed
with an fsync of what they wrote ("+fsync"). The plain Orbax contender uses
the very handler options jm writes with (``_directory.ORBAX_OPTIONS``: OCDBT,
zarr3, no compression, Orbax's default concurrency; and jm's OCDBT data file
size, ``ocdbt_target_data_file_size=_orbax_writer.TARGET_DATA_FILE_SIZE``) and the same durability
(TensorStore fsyncs its data files; the other files Orbax writes are fsync'ed
afterwards, as jm does); its restore places every array on the device with
``ArrayRestoreArgs(sharding=...)``. Loads read from the page cache (the files
were just written), which measures the software, not the disk.

``jm.save(overwrite=True)`` returns once the new checkpoint is committed; the
old one is deleted in a background thread. Its round is timed to the return,
then the deletion is waited for (untimed) so it does not slow the next
contender; "overwrite + deletion" times both.

Also timed: ``CheckpointManager(async_=True).save`` (the time until control
returns to the training loop) against a synchronous save of the same state.

Run: ``.venv/bin/python benchmarks/checkpoint.py [--mib 256] [--arrays 100] [--repeats 9]``
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
from jmodule._placement.device import single_device_sharding
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


TARGETS = [
    # (figure, contender, reference, target)
    ("jm.save / plain Orbax save (same options, +fsync)", "jm.save", "orbax save +fsync", 1.05),
    ("jm.save / torch.save +fsync", "jm.save", "torch.save +fsync", 1.0),
    ("jm.save(overwrite=True) / jm.save fresh", "jm.save (overwrite=True)", "jm.save", 1.1),
    ("jm.load (verified) / plain Orbax restore", "jm.load", "orbax restore", 1.05),
    ("jm.load (verified) / torch.load(weights_only=True)", "jm.load", "torch.load", 2.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=256)
    parser.add_argument("--arrays", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    import orbax.checkpoint as ocp
    import torch  # the benchmark's comparison only; jm never imports torch

    from jmodule.serialization import _atomic, _directory, _orbax_writer

    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="jm-ckpt-bench-"))
    sd = make_state(args.mib, args.arrays)
    nbytes = sum(v.nbytes for v in sd.values())
    host = {k: np.asarray(v) for k, v in sd.items()}
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in host.items()}
    print(
        f"state_dict: {len(sd)} float32 arrays, {nbytes / 2**20:.1f} MiB, on "
        f"{jax.devices()[0].platform} ({os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}); writing to {root}; {args.repeats} paired rounds\n"
        f"Orbax handler options (jm's and the plain Orbax contender's): "
        f"{_directory.ORBAX_OPTIONS}\n"
    )

    def fresh(path: Path):
        return lambda: (
            shutil.rmtree(path, ignore_errors=True) or (path.unlink() if path.is_file() else None)
        )

    results: dict[str, float] = {}
    rounds: dict[str, list[float]] = {}

    def record(name: str, times: list[float]) -> None:
        results[name] = statistics.median(times)
        rounds[name] = times
        print(
            f"  {name:<30} median {results[name] * 1e3:8.1f} ms   min {min(times) * 1e3:8.1f} ms"
            f"   {nbytes / results[name] / 2**30:6.2f} GiB/s"
        )

    def paired_rounds(cases: list[tuple[str, object, object, object]]) -> None:
        """Time every case once per round; odd rounds run the cases in reverse order.

        A case is ``(name, fn, before, after)``: ``before``/``after`` run untimed
        around ``fn`` (``after`` waits for work ``fn`` left in the background).
        """
        times: dict[str, list[float]] = {name: [] for name, *_ in cases}
        for r in range(args.repeats):
            for name, fn, before, after in cases if r % 2 == 0 else cases[::-1]:
                if before is not None:
                    before()
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                if after is not None:
                    after()
        for name, *_ in cases:
            record(name, times[name])

    npdir, tfile, odir, jdir = root / "numpy", root / "torch.pt", root / "orbax", root / "jm"
    wdir = root / "jm-overwritten"

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
            fsync_files([tfile, root])

    def orbax_save():
        checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**_directory.ORBAX_OPTIONS))
        checkpointer.save(
            odir,
            args=ocp.args.PyTreeSave(
                dict(sd), ocdbt_target_data_file_size=_orbax_writer.TARGET_DATA_FILE_SIZE
            ),
        )
        checkpointer.close()
        _atomic.fsync_tree(odir)  # the durability jm gives (files outside TensorStore's)
        _atomic.fsync_dir(root)

    def overwrite_and_delete():
        jms.save(sd, wdir, overwrite=True)
        _atomic.settle()

    jms.save(sd, wdir)  # what the overwrite rounds replace
    print("save")
    paired_rounds(
        [
            ("numpy.save", np_save, fresh(npdir), None),
            ("numpy.save +fsync", lambda: np_save(True), fresh(npdir), None),
            ("torch.save", torch_save, fresh(tfile), None),
            ("torch.save +fsync", lambda: torch_save(True), fresh(tfile), None),
            ("orbax save +fsync", orbax_save, fresh(odir), None),
            ("jm.save", lambda: jms.save(sd, jdir), fresh(jdir), None),
            (
                "jm.save (overwrite=True)",
                lambda: jms.save(sd, wdir, overwrite=True),
                None,
                _atomic.settle,
            ),
            ("jm.save overwrite + deletion", overwrite_and_delete, None, None),
        ]
    )

    sharding = single_device_sharding(jax.devices()[0])

    def orbax_load():
        checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**_directory.ORBAX_OPTIONS))
        restore = {k: ocp.ArrayRestoreArgs(sharding=sharding) for k in sd}
        jax.block_until_ready(
            checkpointer.restore(odir, args=ocp.args.PyTreeRestore(restore_args=restore))
        )
        checkpointer.close()

    print("load (from the page cache)")
    paired_rounds(
        [
            (
                "numpy.load",
                lambda: [np.load(npdir / f"{i}.npy") for i in range(len(sd))],
                None,
                None,
            ),
            ("torch.load", lambda: torch.load(tfile, weights_only=True), None, None),
            ("orbax restore", orbax_load, None, None),
            ("jm.load", lambda: jax.block_until_ready(jms.load(jdir)), None, None),
            (
                "jm.load verify=False",
                lambda: jax.block_until_ready(jms.load(jdir, verify=False)),
                None,
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
    paired = lambda a, b: statistics.median(x / y for x, y in zip(rounds[a], rounds[b]))
    print("\nissue 14 figures (median of the per-round ratios; medians' ratio; target)")
    figures = []
    for text, name, ref, target in TARGETS:
        median = paired(name, ref)
        verdict = "PASS" if median <= target else "MISS"
        print(
            f"  {text:<52} {median:5.2f}x  (medians {r[name] / r[ref]:5.2f}x)"
            f"  target <= {target:.2f}  {verdict}"
        )
        regime = "page cache" if name.startswith("jm.load") else "durable"
        figures.append(
            {
                "figure": text,
                "regime": regime,
                "ratio": min(rounds[name]) / min(rounds[ref]),
                "median_ratio": median,
                "target": target,
            }
        )
    print("\nother ratios (median of the per-round ratios; below 1 means jm is faster)")
    for name, ref in [
        ("jm.save", "numpy.save +fsync"),
        ("jm.save", "torch.save"),
        ("jm.save overwrite + deletion", "jm.save"),
        ("orbax save +fsync", "torch.save +fsync"),
        ("orbax restore", "torch.load"),
        ("jm.load verify=False", "torch.load"),
        ("jm.load", "numpy.load"),
    ]:
        print(f"  {name} / {ref}: {paired(name, ref):5.2f}x")
    fraction = r["save, async_=True (returns)"] / r["save, async_=False"]
    print(f"  async save returns after {100 * fraction:.1f}% of a synchronous save's time")
    print(f"(load average at the end: {os.getloadavg()[0]:.1f})")
    shutil.rmtree(root, ignore_errors=True)
    size = f"{nbytes / 2**20:.0f} MiB state_dict of {len(sd)} arrays"
    us = {k: v * 1e6 for k, v in r.items()}
    pick = lambda *names: {n: us[n] for n in names}
    save_names = [
        "torch.save +fsync",
        "numpy.save",
        "numpy.save +fsync",
        "torch.save",
        "orbax save +fsync",
        "jm.save",
        "jm.save (overwrite=True)",
    ]
    load_names = ["torch.load", "numpy.load", "orbax restore", "jm.load", "jm.load verify=False"]
    manager_names = ["save, async_=False", "save, async_=True (returns)"]
    save_title = f"checkpoint save, {size}"
    load_title = f"checkpoint load, {size}"
    manager_title = f"CheckpointManager.save of a {size}, until control returns"
    per_round = lambda names: {n: [t * 1e6 for t in rounds[n]] for n in names}
    save_results(
        "checkpoint",
        {
            save_title: pick(*save_names),
            load_title: pick(*load_names),
            manager_title: pick(*manager_names),
        },
        rounds={
            save_title: per_round(save_names),
            load_title: per_round(load_names),
            manager_title: per_round(manager_names),
        },
        figures=figures,
    )


if __name__ == "__main__":
    main()
