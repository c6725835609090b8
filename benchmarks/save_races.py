"""Racing saves and exits with saves in flight, run many times: issue 14's figures.

The scenarios of ``tests/serialization/test_checkpoint_races.py`` and
``tests/serialization/test_checkpoint_exit.py`` (``tests/serialization/_save_races.py``), as often
as the issue ran them:

* two threads ``jm.save`` to one new path at once (30 trials): how often both
  report success (one checkpoint silently gone), and how often exactly one does;
* two processes, each with its own ``CheckpointManager`` on one directory,
  save 12 steps, meeting before each (sync and async): steps both report saved;
* a script saves asynchronously with ``max_to_keep=2`` and exits without
  waiting (8 runs each: off the end, ``sys.exit(0)``): runs whose last step is
  missing or damaged, and their exit codes; plus runs whose last save fails,
  which must exit non-zero with the error on stderr;
* a thread, then another process, loads a path again and again while
  ``jm.save(overwrite=True)`` replaces it 60 times: loads that failed, that
  returned a mixture of two checkpoints, or an older step than the one before.

Exits non-zero if any run lost a checkpoint or hid an error.

Run: ``.venv/bin/python benchmarks/save_races.py [--threads 30] [--steps 12] [--exits 8]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serialization"))

import _save_races


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=30, help="two-thread trials")
    parser.add_argument("--steps", type=int, default=12, help="steps of the two managers")
    parser.add_argument("--exits", type=int, default=8, help="runs per way of exiting")
    parser.add_argument("--overwrites", type=int, default=60, help="saves under a loader")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="jm-races-"))
    bad = 0
    start = time.monotonic()
    try:
        outcomes = []
        for trial in range(args.threads):
            (work / f"t{trial}").mkdir()
            outcomes.append(_save_races.thread_trial(work / f"t{trial}"))
        both = sum(o.results == ["ok", "ok"] for o in outcomes)
        one = sum(
            sorted(o.results) == ["exists", "ok"]
            and o.on_disk == o.results.index("ok")
            and o.intact
            and not o.leftovers
            for o in outcomes
        )
        bad += args.threads - one
        print(
            f"two threads, one new path: both succeeded in {both}/{args.threads} trials, "
            f"exactly one succeeded (the other got CheckpointExistsError, the winner's "
            f"checkpoint intact, nothing left behind) in {one}/{args.threads}"
        )
        for out in _save_races.manager_race(work / "managers", steps=args.steps):
            print(
                f"two processes, two managers ({out.mode}): both reported step saved for "
                f"{len(out.both_ok)}/{out.steps} steps, neither for {len(out.none_ok)}, "
                f"checkpoint not the winner's for {len(out.wrong)}, losers told "
                f"{len(out.messages)}x, leftovers {out.leftovers}"
            )
            bad += len(out.both_ok) + len(out.none_ok) + len(out.wrong) + len(out.leftovers)
        for how in ("end", "exit", "fail"):
            runs = [
                _save_races.exit_trial(work / f"exit-{how}-{i}", how) for i in range(args.exits)
            ]
            codes = sorted({r.returncode for r in runs})
            if how == "fail":
                loud = sum(
                    r.returncode != 0 and "background save of step 3" in r.stderr for r in runs
                )
                print(
                    f"last async save fails at exit: reported on stderr with a non-zero exit in "
                    f"{loud}/{args.exits} runs (exit codes {codes})"
                )
                bad += args.exits - loud
                continue
            lost = sum(not (r.steps == [2, 3] and r.last_intact) for r in runs)
            print(
                f"async saves, script exits ({how}) without waiting: last step lost in "
                f"{lost}/{args.exits} runs (exit codes {codes})"
            )
            bad += lost + sum(r.returncode != 0 for r in runs)
        for process in (False, True):
            (work / f"load-{process}").mkdir()
            out = _save_races.load_race(
                work / f"load-{process}", saves=args.overwrites, process=process
            )
            print(
                f"loads in {'another process' if process else 'a thread'} during "
                f"{args.overwrites} overwrites: {out.failed} of {out.loads + out.failed} "
                f"failed, {out.mixed} mixed, {out.out_of_order} out of order"
                + (f" (first: {out.errors[0]})" if out.errors else "")
            )
            bad += out.failed + out.mixed + out.out_of_order
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{time.monotonic() - start:.0f} s; {'FAILED' if bad else 'all good'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
