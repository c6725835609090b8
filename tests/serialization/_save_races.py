"""Saves that race and saves in flight at exit: issue 14's scenarios, as functions.

Used by ``tests/serialization/test_checkpoint_races.py`` (a few trials) and
``benchmarks/save_races.py`` (the figures, many trials):

* :func:`thread_trial`: two threads ``jm.save`` to one new path at once;
* :func:`manager_race`: two processes, each with its own ``CheckpointManager``
  on one directory, save the same steps, meeting before each step so that
  their saves overlap;
* :func:`exit_trial`: a process saves in the background (``max_to_keep=2``)
  and exits without waiting: off the end of the script, by ``sys.exit(0)``,
  by an exception, or with the last save failing;
* :func:`load_race`: a thread or another process loads a path again and again
  while ``jm.save(overwrite=True)`` keeps replacing it.

Child processes get this checkout first on their path, then the parent's
``PYTHONPATH``.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EXIT_HOWS = ("end", "exit", "raise", "fail")
EXIT_STEPS = 4  # steps 0..3 are saved; max_to_keep=2 keeps 2 and 3


def child_env() -> dict[str, str]:
    """The environment of a child process: this checkout first on its path."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu")


def state(who: int, step: int, mb: float) -> dict:
    """What writer ``who`` saves as ``step``: ``w`` holds ``1000 * who + step`` throughout."""
    n = max(1, int(mb * 2**20 / 4))
    return {"who": who, "step": step, "w": np.full(n, 1000 * who + step, np.float32)}


def holds(obj: object, who: int, step: int, mb: float) -> bool:
    """Whether ``obj`` is exactly ``state(who, step, mb)``."""
    want = state(who, step, mb)
    return (
        isinstance(obj, dict)
        and obj.get("who") == who
        and obj.get("step") == step
        and np.array_equal(np.asarray(obj["w"]), want["w"])
    )


def hidden(directory: Path) -> list[str]:
    """jm's hidden leftovers (staging, old, deleted) in ``directory``."""
    return sorted(n for n in os.listdir(directory) if ".jm-" in n)


# --------------------------------------------------------------------------- threads


@dataclasses.dataclass
class ThreadOutcome:
    results: list[str]  # per thread: "ok", "exists" or the error
    on_disk: int | None  # whose checkpoint loads from the path (None: none does)
    intact: bool  # it is exactly that writer's state
    leftovers: list[str]


def thread_trial(directory: Path, overwrite: bool = False, mb: float = 0.25) -> ThreadOutcome:
    """Two threads save to ``directory/ckpt`` at once (released by one barrier)."""
    import jmodule.serialization as jms
    from jmodule.serialization import _atomic

    path = directory / "ckpt"
    if overwrite:
        jms.save(state(9, 0, mb), path)
    barrier = threading.Barrier(2)
    results = ["", ""]

    def run(who: int) -> None:
        obj = state(who, 0, mb)
        barrier.wait()
        try:
            jms.save(obj, path, overwrite=overwrite)
            results[who] = "ok"
        except jms.CheckpointExistsError:
            results[who] = "exists"
        except BaseException as e:  # reported, not raised, in the thread
            results[who] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=run, args=(who,)) for who in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _atomic.settle()  # replaced checkpoints are deleted in the background
    try:
        obj = jms.load(path)
    except jms.CheckpointError:
        return ThreadOutcome(results, None, False, hidden(directory))
    who = obj.get("who")
    return ThreadOutcome(results, who, holds(obj, who, 0, mb), hidden(directory))


# --------------------------------------------------------------------------- processes


def _meet(directory: Path, step: int, who: int, timeout: float = 120.0) -> None:
    """Wait until the other writer has reached ``step`` too."""
    (directory / f"{step}.{who}").touch()
    other = directory / f"{step}.{1 - who}"
    deadline = time.monotonic() + timeout
    while not other.exists():
        if (directory / f"failed.{1 - who}").exists():
            raise RuntimeError(f"writer {1 - who} failed")
        if time.monotonic() > deadline:
            raise TimeoutError(f"writer {1 - who} never reached step {step}")
        time.sleep(0.0005)


def _step_of(error: Exception, default: int) -> int:
    """The step an error names (jm's errors do), else ``default``."""
    m = re.search(r"\bstep (\d+)\b", str(error))
    return int(m[1]) if m else default


def manager_worker(directory: str, who: int, modes: str, steps: int, mb: float) -> None:
    """Save ``steps`` steps with a manager per mode; print ``{mode: {"lost": {step: why}}}``."""
    report = {}
    for mode in modes.split(","):
        d = Path(directory) / mode
        try:
            report[mode] = {"lost": _manager_steps(d, who, mode == "async", steps, mb)}
        except BaseException:
            (d / "meet" / f"failed.{who}").touch()  # the other writer stops waiting
            raise
    print(json.dumps(report), flush=True)


def _manager_steps(d: Path, who: int, async_: bool, steps: int, mb: float) -> dict[int, str]:
    """Save the steps; the steps this writer lost, each with what it was told.

    Any error counts (the tests then check it is the documented one); one that
    names no step belongs to the save in flight (async) or the one just called.
    """
    from jmodule.checkpoint import CheckpointManager

    manager = CheckpointManager(d / "ckpt", async_=async_)
    lost: dict[int, str] = {}
    in_flight = None
    for step in range(steps):
        obj = state(who, step, mb)
        _meet(d / "meet", step, who)
        try:
            manager.save(step, obj)
            in_flight = step
        except Exception as e:
            # Async: the error of an earlier step's background save, raised by this
            # save once it had started its own (then this step is in flight); or this
            # step's own error (it was not started).
            failed = _step_of(e, step if in_flight is None else in_flight)
            lost[failed] = f"{type(e).__name__}: {e}"
            in_flight = None if failed == step else step
    try:
        manager.wait_until_finished()
    except Exception as e:
        lost[_step_of(e, in_flight)] = f"{type(e).__name__}: {e}"
    manager.close()
    return lost


@dataclasses.dataclass
class RaceOutcome:
    mode: str
    steps: int
    both_ok: list[int]  # steps both writers reported saved (the bug)
    none_ok: list[int]  # steps neither did
    wrong: list[str]  # steps whose checkpoint is not exactly the reported winner's
    messages: list[str]  # what the losers were told
    leftovers: list[str]


def manager_race(directory: Path, modes=("sync", "async"), steps: int = 12, mb: float = 0.25):
    """Two processes race through ``steps`` steps in each mode; one outcome per mode."""
    import jmodule.serialization as jms

    for mode in modes:
        (directory / mode / "meet").mkdir(parents=True)
    args = [str(directory), ",".join(modes), str(steps), str(mb)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "manager", args[0], str(who), *args[1:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for who in (0, 1)
    ]
    reports = []
    for who, p in enumerate(procs):
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"writer {who} failed (exit {p.returncode}):\n{err[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    outcomes = []
    for mode in modes:
        lost = [{int(k): v for k, v in r[mode]["lost"].items()} for r in reports]
        ok = [set(range(steps)) - set(lost_w) for lost_w in lost]
        wrong = []
        for step in range(steps):
            winners = [who for who in (0, 1) if step in ok[who]]
            if len(winners) == 1:
                path = directory / mode / "ckpt" / str(step)
                try:
                    obj = jms.load(path)
                except jms.CheckpointError as e:
                    wrong.append(f"step {step}: {e}")
                    continue
                if not holds(obj, winners[0], step, mb):
                    wrong.append(f"step {step}: not writer {winners[0]}'s state")
        outcomes.append(
            RaceOutcome(
                mode,
                steps,
                sorted(ok[0] & ok[1]),
                sorted(set(range(steps)) - ok[0] - ok[1]),
                wrong,
                [m for lost_w in lost for m in lost_w.values()],
                hidden(directory / mode / "ckpt"),
            )
        )
    return outcomes


# --------------------------------------------------------------------------- exits


def exit_worker(directory: str, how: str, mb: float) -> None:
    """Save steps 0..3 in the background, then exit ``how``, never waiting."""
    from jmodule.checkpoint import CheckpointManager
    from jmodule.serialization import _directory

    atexit.register(print, "the script's own atexit handler ran", file=sys.stderr)
    manager = CheckpointManager(directory, max_to_keep=2)
    for step in range(EXIT_STEPS):
        if how == "fail" and step == EXIT_STEPS - 1:
            manager.wait_until_finished()  # only the last save is to fail

            def failing(*args, **kwargs):
                time.sleep(0.2)  # fail once the script has ended
                raise OSError(errno.EIO, "injected I/O error")

            _directory.write = failing
        manager.save(step, state(0, step, mb))
    if how == "exit":
        sys.exit(0)
    if how == "raise":
        raise RuntimeError("the training loop crashed")


@dataclasses.dataclass
class ExitOutcome:
    how: str
    returncode: int
    steps: list[int]  # complete steps on disk
    last_intact: bool  # the last step there is exactly what was saved
    stderr: str
    leftovers: list[str]


def exit_trial(directory: Path, how: str, mb: float = 4.0) -> ExitOutcome:
    """Run :func:`exit_worker` in a fresh process; what it left on disk."""
    import jmodule.serialization as jms
    from jmodule.checkpoint import CheckpointManager

    proc = subprocess.run(
        [sys.executable, __file__, "exit", str(directory), how, str(mb)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    leftovers = hidden(directory) if directory.exists() else []
    steps = CheckpointManager(directory, async_=False).all_steps() if directory.exists() else []
    intact = False
    if steps:
        intact = holds(jms.load(directory / str(steps[-1])), 0, steps[-1], mb)
    return ExitOutcome(how, proc.returncode, steps, intact, proc.stderr, leftovers)


# --------------------------------------------------------------------------- loads


@dataclasses.dataclass
class LoadOutcome:
    loads: int  # loads that returned
    errors: list[str]  # loads that raised (the first few, as repr)
    failed: int  # how many raised
    mixed: int  # returned something that is not one whole saved step
    out_of_order: int  # a load saw an older step than the one before it


def _loads_until(
    path: Path, stop: threading.Event | Path, mb: float, started: Path | None = None
) -> dict:
    """Load ``path`` until ``stop`` is set (an event) or exists (a file); what was seen.

    Loads at least once; touches ``started`` (if given) after each load.
    """
    import jmodule.serialization as jms

    seen, errors, failed, mixed = [], [], 0, 0
    stopped = stop.is_set if isinstance(stop, threading.Event) else stop.exists
    while not stopped() or not seen + errors:
        try:
            obj = jms.load(path)
        except Exception as e:  # counted: the figure is how often this happens
            failed += 1
            errors.append(repr(e)[:300])
            continue
        step = obj.get("step") if isinstance(obj, dict) else None
        if not isinstance(step, int) or not holds(obj, 0, step, mb):
            mixed += 1
        else:
            seen.append(step)
        if started is not None:
            started.touch()
    order = sum(b < a for a, b in itertools.pairwise(seen))
    return {"seen": seen, "errors": errors[:5], "failed": failed, "mixed": mixed, "order": order}


def load_worker(path: str, stop: str, out: str, mb: float) -> None:
    """Child process of :func:`load_race`: loads until ``stop`` exists, writes what it saw."""
    seen = _loads_until(Path(path), Path(stop), mb, started=Path(f"{out}.started"))
    Path(out).write_text(json.dumps(seen))


def load_race(
    directory: Path, saves: int = 24, mb: float = 0.25, process: bool = False
) -> LoadOutcome:
    """Overwrite ``directory/ckpt`` ``saves`` times while a thread (or a process) loads it."""
    import jmodule.serialization as jms

    path = directory / "ckpt"
    jms.save(state(0, 0, mb), path)
    if process:
        stop, out = directory / "stop", directory / "seen.json"
        started = Path(f"{out}.started")
        child = subprocess.Popen(
            [sys.executable, __file__, "load", str(path), str(stop), str(out), str(mb)],
            env=child_env(),
        )
        try:
            deadline = time.monotonic() + 120  # the child imports jax, then loads once
            while not started.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            for step in range(1, saves + 1):
                jms.save(state(0, step, mb), path, overwrite=True)
        finally:
            stop.touch()
            child.wait(timeout=300)
        seen = json.loads(out.read_text())
    else:
        done = threading.Event()
        box: dict = {}
        loader = threading.Thread(target=lambda: box.update(_loads_until(path, done, mb)))
        loader.start()
        try:
            for step in range(1, saves + 1):
                jms.save(state(0, step, mb), path, overwrite=True)
        finally:
            done.set()
            loader.join()
        seen = box
    return LoadOutcome(
        len(seen["seen"]), seen["errors"], seen["failed"], seen["mixed"], seen["order"]
    )


if __name__ == "__main__":
    if sys.argv[1] == "manager":
        manager_worker(
            sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
        )
    elif sys.argv[1] == "exit":
        exit_worker(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif sys.argv[1] == "load":
        load_worker(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
