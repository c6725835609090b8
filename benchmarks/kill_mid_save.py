"""Kill-mid-save at scale: 200 trials of a process saving a ~100 MB state, SIGKILLed at random.

The same harness as ``tests/serialization/test_checkpoint_kill.py``
(``tests/serialization/_ckpt_kill.py``), with more and bigger trials. Each trial starts a
worker that saves in a loop
(overwriting one path, saving fresh paths, or through an asynchronous
CheckpointManager with max_to_keep=2), kills it at a random moment, and checks
that every checkpoint on disk that loads is complete and exactly the state it
was saved from, that no completed checkpoint was lost, that the manager
restores the latest complete step, and that the next save (or manager start)
cleans up and keeps max_to_keep. Then one death at each step of the commit
protocol, per mode. Exits non-zero if any trial found a problem.

Run: ``.venv/bin/python benchmarks/kill_mid_save.py [--trials 200] [--mb 100]``
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

import _ckpt_kill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(dir=args.dir, prefix="jm-kill-"))
    start = time.monotonic()

    def progress(i, outcome, harness):
        flag = "PROBLEM " + "; ".join(outcome.problems) if outcome.problems else "ok"
        where = outcome.die_at or ("mid-save" if outcome.mid_save else "between saves")
        print(
            f"[{i + 1:4d}] {outcome.mode:>9} {where:>13}: {outcome.completed} saves completed, "
            f"loaded {outcome.loaded[-3:]}, {flag}   (window {harness.window:.2f} s, "
            f"{time.monotonic() - start:.0f} s)",
            flush=True,
        )

    try:
        outcomes = _ckpt_kill.run(args.trials, args.mb, workdir, args.seed, log=progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{len(outcomes)} trials of a {args.mb:g} MB state in {time.monotonic() - start:.0f} s")
    print(_ckpt_kill.summary(outcomes))
    bad = [o for o in outcomes if o.problems]
    print(f"trials with problems: {len(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
