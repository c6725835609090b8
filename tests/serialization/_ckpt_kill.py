"""Kill-mid-save trials: a process saving checkpoints is SIGKILLed at a random moment.

Used by ``tests/serialization/test_checkpoint_kill.py`` (a few dozen small trials) and
``benchmarks/kill_mid_save.py`` (hundreds of ~100 MB trials).

A worker saves in a loop, logging ``begin N`` / ``end N`` around each save,
in one of three modes:

* ``overwrite``: ``jm.save(state(N), path, overwrite=True)`` to one path;
* ``fresh``: ``jm.save(state(N), dir/cN)`` to a new path each time;
* ``manager``: ``CheckpointManager(max_to_keep=2, async_=True).save(N, state(N))``.

After the kill, the parent checks that every checkpoint that loads is
complete and equal to ``state(N)`` for its own ``N``, that no completed
checkpoint was lost, that the manager restores the latest complete step, and
that the next save (or manager start) cleans up and keeps ``max_to_keep``.

Workers are forked from a "zygote" process that has imported jax, Orbax and
jmodule but not started a JAX backend, so a trial costs a fork instead of a
Python start-up. Should importing ever start a backend (forking would then be
unsafe), each worker is a fresh process instead.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODES = ("overwrite", "manager", "fresh")
MAX_TO_KEEP = 2
N_ARRAYS = 8


def base_arrays(mb: float, seed: int) -> list[np.ndarray]:
    """The random float32 arrays (``mb`` MiB in all) every state is built from."""
    rng = np.random.default_rng(seed)
    per = max(1, int(mb * 2**20 / 4 / N_ARRAYS))
    return [rng.standard_normal(per, dtype=np.float32) for _ in range(N_ARRAYS)]


def state(version: int, base: list) -> dict:
    """The object saved as version ``version``: arrays, a bfloat16 array and plain values."""
    import jax.numpy as jnp

    params = collections.OrderedDict(
        (f"layer{i}.weight", jnp.asarray(b) + version) for i, b in enumerate(base)
    )
    params["scale"] = jnp.full((3,), version % 128, jnp.bfloat16)  # exact in bfloat16
    return {"params": params, "version": version, "note": f"v{version}", "hist": [version, 0.5]}


def matches(loaded: object, version: int, base: list) -> bool:
    """Whether ``loaded`` is exactly ``state(version)``."""
    if not isinstance(loaded, dict) or loaded.get("version") != version:
        return False
    if loaded.get("note") != f"v{version}" or loaded.get("hist") != [version, 0.5]:
        return False
    params = loaded["params"]
    keys = [f"layer{i}.weight" for i in range(len(base))] + ["scale"]
    if not isinstance(params, collections.OrderedDict) or list(params) != keys:
        return False
    for b, k in zip(base, keys):
        if not np.array_equal(np.asarray(params[k]), b + np.float32(version)):
            return False
    scale = np.asarray(params["scale"])
    return scale.dtype.name == "bfloat16" and bool(
        (scale.astype(np.float32) == version % 128).all()
    )


# ----------------------------------------------------------------------------- worker


def _die_at(point: str) -> None:
    """Make this process SIGKILL itself at ``point`` of the next commit.

    ``rename1`` / ``rename2``: just before the first / second ``os.rename`` of
    jm's commit protocol (for an overwrite: before moving the old checkpoint
    aside / between the two renames; for a manager step: before the step is
    renamed into place / before an old step is hidden for deletion);
    ``drop``: just before a hidden old checkpoint is deleted.
    """
    from jmodule.serialization import _atomic

    calls = {"rename": 0}
    rename, rmtree = os.rename, _atomic.rmtree
    # Only jm's own renames count (Orbax renames its temporary directory too).
    own_os = types.ModuleType("os")
    own_os.__dict__.update(os.__dict__)

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def fatal_rename(src, dst):
        calls["rename"] += 1
        if point == f"rename{calls['rename']}":
            die()
        return rename(src, dst)

    def fatal_rmtree(path):
        if point == "drop" and (".jm-old-" in str(path) or ".jm-del-" in str(path)):
            die()
        return rmtree(path)

    own_os.rename = fatal_rename
    _atomic.os = own_os
    _atomic.rmtree = fatal_rmtree


def worker(mode: str, directory: str, mb: float, seed: int, die_at: str = "") -> None:
    """Save forever in ``mode`` under ``directory`` (until killed)."""
    import jmodule.serialization as jms
    from jmodule.checkpoint import CheckpointManager

    d = Path(directory)
    base = base_arrays(mb, seed)
    log = open(d / "log", "a", buffering=1)
    # Version 0 is saved before "ready": later saves then overwrite (or follow) a complete
    # checkpoint, and Orbax's first-use start-up is not what the kill lands in.
    manager = None
    first = time.perf_counter()
    if mode == "manager":
        manager = CheckpointManager(d / "mgr", max_to_keep=MAX_TO_KEEP, async_=True)
        manager.save(0, state(0, base))
        manager.wait_until_finished()
    else:
        jms.save(state(0, base), d / ("ckpt" if mode == "overwrite" else "c0"))
    if die_at:
        _die_at(die_at)
    log.write(f"begin 0 {first}\nend 0 {time.perf_counter()}\nready\n")
    version = 1
    parent = os.getppid()
    while os.getppid() == parent:  # stop if the harness went away without killing us
        obj = state(version, base)
        log.write(f"begin {version} {time.perf_counter()}\n")
        if mode == "overwrite":
            jms.save(obj, d / "ckpt", overwrite=True)
        elif mode == "fresh":
            jms.save(obj, d / f"c{version}")
        else:
            manager.save(version, obj)  # returns after the previous step is on disk
            if version > 1:
                log.write(f"end {version - 1} {time.perf_counter()}\n")
            version += 1
            continue
        log.write(f"end {version} {time.perf_counter()}\n")
        version += 1


def zygote() -> None:
    """Serve ``fork MODE DIR MB SEED [DIE_AT]`` / ``reap PID`` / ``quit`` on stdin."""
    # Everything a worker needs is imported once here and shared by every fork. Forking
    # is safe only while no JAX backend has started (none does on import); if one has,
    # the harness starts a fresh process per worker instead.
    import jax
    import jax.numpy  # noqa: F401
    import orbax.checkpoint  # noqa: F401
    import safetensors  # noqa: F401
    from jax._src import xla_bridge

    import jmodule.checkpoint
    import jmodule.serialization  # noqa: F401

    can_fork = not xla_bridge.backends_are_initialized()
    print("ready" if can_fork else "nofork", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    worker(args[0], args[1], float(args[2]), int(args[3]), *args[4:])
                finally:
                    os._exit(1)
            print(pid, flush=True)
        elif cmd == "reap":
            _, status = os.waitpid(int(args[0]), 0)
            print(status, flush=True)
        else:
            return


# ----------------------------------------------------------------------------- parent


@dataclasses.dataclass
class Outcome:
    """What one trial found."""

    mode: str
    die_at: str  # "" for a kill at a random moment, else the commit step it died at
    mid_save: bool  # the kill landed between "begin N" and "end N"
    completed: int  # saves that had finished before the kill
    loaded: list[int]  # versions of the checkpoints on disk that loaded and were correct
    problems: list[str]


class Harness:
    """Runs trials; one zygote serves them all. Use as a context manager."""

    def __init__(self, workdir: Path, mb: float, seed: int = 0):
        self.workdir, self.mb, self.seed = Path(workdir), mb, seed
        self.base = base_arrays(mb, seed)
        self.window = 1.0  # seconds after "ready" in which the kill lands; adapted
        self.durations: list[float] = []
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.env = env
        self.zygote = subprocess.Popen(
            [sys.executable, __file__, "zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.can_fork = self.zygote.stdout.readline().strip() == "ready"

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.zygote.poll() is None:
            self.zygote.stdin.write("quit\n")
            self.zygote.stdin.flush()
            self.zygote.wait(timeout=30)
        self.zygote.stdin.close()
        self.zygote.stdout.close()

    def _start(self, mode: str, d: Path, die_at: str) -> tuple[int, subprocess.Popen | None]:
        args = [mode, str(d), str(self.mb), str(self.seed)] + ([die_at] if die_at else [])
        if self.can_fork:
            self.zygote.stdin.write("fork " + " ".join(args) + "\n")
            self.zygote.stdin.flush()
            return int(self.zygote.stdout.readline()), None
        proc = subprocess.Popen([sys.executable, __file__, "worker", *args], env=self.env)
        return proc.pid, proc

    def _kill(self, pid: int, proc: subprocess.Popen | None, kill: bool = True) -> None:
        if kill:
            os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait()
        else:
            self.zygote.stdin.write(f"reap {pid}\n")
            self.zygote.stdin.flush()
            self.zygote.stdout.readline()

    def trial(self, mode: str, rng: random.Random, die_at: str = "") -> Outcome:
        """Start a worker, kill it at a random moment (or let it die at ``die_at``), check."""
        d = self.workdir / f"trial-{mode}-{rng.randrange(10**9)}"
        d.mkdir(parents=True)
        pid, proc = self._start(mode, d, die_at)
        log = d / "log"
        deadline = time.monotonic() + 120
        while not (log.exists() and "ready" in log.read_text()):
            if time.monotonic() > deadline:
                self._kill(pid, proc)
                raise RuntimeError(f"worker in {d} never became ready")
            time.sleep(0.005)
        if not die_at:
            time.sleep(rng.uniform(0, self.window))
        self._kill(pid, proc, kill=not die_at)
        lines = log.read_text().split("\n")
        events = [ln.split() for ln in lines if ln.startswith(("begin", "end"))]
        begun = {int(e[1]): float(e[2]) for e in events if e[0] == "begin"}
        ended = {int(e[1]): float(e[2]) for e in events if e[0] == "end"}
        if mode != "manager":
            self.durations += [ended[v] - begun[v] for v in ended]
        else:
            self.durations += [ended[0] - begun[0]]
            self.durations += [ended[v] - ended[v - 1] for v in ended if v > 1]
        if self.durations:
            self.window = 3.0 * float(np.median(self.durations[-20:]))
        done = max(ended, default=-1)
        last = max(begun, default=-1)
        mid = bool(events) and events[-1][0] == "begin"
        check = {"overwrite": self._overwrite, "fresh": self._fresh, "manager": self._manager}
        problems, loaded = check[mode](d, done, last)
        shutil.rmtree(d, ignore_errors=True)
        return Outcome(mode, die_at, mid, len(ended), loaded, problems)

    def _load(self, path: Path, version: int | None, problems: list[str]) -> int | None:
        import jmodule.serialization as jms

        try:
            obj = jms.load(path)
        except jms.CheckpointError as e:
            problems.append(f"{path.name} does not load: {e}")
            return None
        got = obj.get("version") if isinstance(obj, dict) else None
        if version is not None and got != version:
            problems.append(f"{path.name} holds version {got}, expected {version}")
        if not isinstance(got, int) or not matches(obj, got, self.base):
            problems.append(f"{path.name} loads but is not exactly state({got})")
            return None
        return got

    def _hidden(self, d: Path) -> list[str]:
        return sorted(n for n in os.listdir(d) if ".jm-" in n)

    def _overwrite(self, d: Path, done: int, last: int) -> tuple[list[str], int]:
        import jmodule.serialization as jms
        from jmodule.serialization import _atomic

        problems: list[str] = []
        path = d / "ckpt"
        loaded = []
        if _atomic.readable(path) is None:
            if done >= 0:
                problems.append(f"overwrite lost both checkpoints (version {done} was complete)")
        else:
            got = self._load(path, None, problems)
            if got is not None:
                loaded.append(got)
                if got not in (done, last) or got < done:
                    problems.append(f"ckpt holds version {got}; completed {done}, started {last}")
        jms.save(state(10**6, self.base), path, overwrite=True)  # repairs, then replaces
        _atomic.settle()  # the replaced checkpoint is deleted in the background
        self._load(path, 10**6, problems)
        if self._hidden(d):
            problems.append(f"leftovers after the next save: {self._hidden(d)}")
        return problems, loaded

    def _fresh(self, d: Path, done: int, last: int) -> tuple[list[str], int]:
        import jmodule.serialization as jms
        from jmodule.serialization import _atomic

        problems: list[str] = []
        loaded = []
        for v in range(last + 1):
            path = d / f"c{v}"
            if _atomic.readable(path) is None:
                if v <= done:
                    problems.append(f"completed checkpoint c{v} is missing")
                continue
            if self._load(path, v, problems) is not None:
                loaded.append(v)
        if last >= 0 and _atomic.readable(d / f"c{last}") is None:
            jms.save(state(last, self.base), d / f"c{last}")  # the interrupted one, again
            self._load(d / f"c{last}", last, problems)
        if self._hidden(d):
            problems.append(f"leftovers after the next save: {self._hidden(d)}")
        return problems, loaded

    def _manager(self, d: Path, done: int, last: int) -> tuple[list[str], int]:
        from jmodule.checkpoint import CheckpointManager

        problems: list[str] = []
        manager = CheckpointManager(d / "mgr", max_to_keep=MAX_TO_KEEP, async_=True)
        if self._hidden(d / "mgr"):
            problems.append(f"leftovers after manager start: {self._hidden(d / 'mgr')}")
        steps = manager.all_steps()
        loaded = [s for s in steps if self._load(d / "mgr" / str(s), s, problems) is not None]
        if done >= 0 and done not in steps:
            problems.append(f"completed step {done} is missing (steps {steps})")
        if steps:
            latest = manager.restore()
            if not matches(latest, steps[-1], self.base):
                problems.append(f"restore() is not the latest complete step {steps[-1]}")
        elif done >= 0:
            problems.append("no steps left")
        manager.save(last + 1, state(last + 1, self.base))
        manager.wait_until_finished()
        kept = manager.all_steps()
        if len(kept) > MAX_TO_KEEP or kept[-1] != last + 1:
            problems.append(f"after the next save the steps are {kept}")
        manager.close()
        return problems, loaded


DIE_AT = ("rename1", "rename2", "drop")


def run(trials: int, mb: float, workdir: Path, seed: int = 0, log=None) -> list[Outcome]:
    """Run ``trials`` random kills cycling through the modes, then one death at each
    commit step (:data:`DIE_AT`) in each mode that has it."""
    rng = random.Random(seed)
    plan = [(MODES[i % len(MODES)], "") for i in range(trials)]
    plan += [(mode, point) for mode in ("overwrite", "manager") for point in DIE_AT]
    outcomes = []
    with Harness(workdir, mb, seed) as harness:
        for i, (mode, point) in enumerate(plan):
            outcome = harness.trial(mode, rng, point)
            outcomes.append(outcome)
            if log is not None:
                log(i, outcome, harness)
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    """A per-mode table of the outcomes."""
    rows = []
    for mode in MODES:
        sel = [o for o in outcomes if o.mode == mode and not o.die_at]
        if sel:
            rows.append(
                f"{mode:>9}: {len(sel)} trials, {sum(o.mid_save for o in sel)} killed mid-save, "
                f"{sum(o.completed for o in sel)} saves completed before kills, "
                f"{sum(len(o.loaded) for o in sel)} checkpoints loaded and correct, "
                f"{sum(bool(o.problems) for o in sel)} with problems"
            )
    for o in outcomes:
        if o.die_at:
            rows.append(
                f"{o.mode:>9}: died at {o.die_at}: loaded and correct: {o.loaded}, "
                f"problems: {o.problems or 'none'}"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote()
    elif sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:])
