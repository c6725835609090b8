"""A soak of everything together: threads training, background saves, a loader, a kill.

For ``--seconds`` (300 by default) a trainer process runs 4 threads, each
training its own model (Linear + BatchNorm1d + ReLU + Dropout + Linear, SGD
with momentum) with one shared ``jm.compile`` step; every 5 steps a thread
replaces its newest state (a copy) for a saver thread, which saves the four
models' newest states, whenever one is new, through one
``CheckpointManager(async_=True, max_to_keep=3)``.
A second process loads the latest checkpoint in a loop the whole time. Then
the trainer is started again, killed with SIGKILL while a save is in flight,
and a third trainer resumes from the latest complete step, trains and saves.

Every checkpoint carries a digest of its arrays, computed by the trainer
before saving: a load whose arrays do not match their digest (or whose parts
come from different saves) is *mixed*. After the run every step the trainer
last saved (the newest ``max_to_keep``) must be on disk and whole (*lost*
otherwise); after the kill the newest complete step must load, be whole, and
be no older than the last save the killed trainer saw finish.

Reported (README "Benchmarks" table, ``benchmarks/results/soak.json``): steps
run, saves, loads, errors (must be 0), checkpoints lost or mixed (must be 0),
and the trainer's resident memory after warm-up and at the end (flat within
10%).

Run: ``python benchmarks/soak.py [--seconds 300]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

THREADS, EVERY, KEEP = 4, 5, 3


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def digest(models: dict[str, dict[str, Any]]) -> str:
    """A digest of every array of the saved models, in a fixed order."""
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(models):
        for key in sorted(models[name]):
            a = np.ascontiguousarray(np.asarray(models[name][key]))
            h.update(f"{name}/{key}/{a.dtype}/{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# ----------------------------------------------------------------------------- trainer


def trainer(directory: str, seconds: float, resume: bool) -> None:
    """Train 4 models in 4 threads, saving through one async manager, for ``seconds``."""
    import jax.numpy as jnp
    import numpy as np

    import jmodule as jm
    import jmodule.nn.functional as F
    from jmodule import nn
    from jmodule.checkpoint import CheckpointManager

    def net(seed: int) -> nn.Module:
        jm.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10)
        )

    @jm.compile
    def step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    manager = CheckpointManager(directory, max_to_keep=KEEP, async_=True)
    models = [net(i) for i in range(THREADS)]
    start_step = 0
    if resume:
        latest = manager.latest_step()
        saved = manager.restore()
        if saved["digest"] != digest(saved["models"]):
            raise RuntimeError(f"the checkpoint of step {latest} resumed from is mixed")
        for i, m in enumerate(models):
            m.load_state_dict(saved["models"][str(i)])
        start_step = saved["step"]
        _say(event="resumed", step=start_step)
    opts = [jm.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in models]
    rng = np.random.default_rng(0)
    data = [
        (
            jnp.asarray(rng.standard_normal((16, 32)), jnp.float32),
            jnp.asarray(rng.integers(0, 10, 16)),
        )
        for _ in range(THREADS)
    ]
    stop = threading.Event()
    # Each thread's newest state (a copy: the donating step deletes what it replaces),
    # replaced every 5 steps; the saver saves the four newest whenever one is new.
    newest: dict[str, Any] = {}
    fresh = threading.Condition()
    counts = {"steps": [0] * THREADS, "saves": 0, "errors": 0}
    saved_steps: list[int] = []

    def train(i: int) -> None:
        try:
            n = 0
            while not stop.is_set():
                float(step(models[i], opts[i], *data[i]))
                n += 1
                counts["steps"][i] = n
                if n % EVERY == 0:
                    copy = {k: v.copy() for k, v in models[i].state_dict().items()}
                    with fresh:
                        newest[str(i)] = copy
                        fresh.notify()
        except BaseException:
            counts["errors"] += 1
            traceback.print_exc()
            stop.set()

    def save() -> None:
        number = start_step
        try:
            while not stop.is_set():
                with fresh:
                    fresh.wait(timeout=0.1)
                    if len(newest) < THREADS:
                        continue
                    models_now = dict(newest)
                number += EVERY
                _say(event="saving", step=number)
                manager.save(
                    number, {"step": number, "models": models_now, "digest": digest(models_now)}
                )
                counts["saves"] += 1
                saved_steps.append(number)
            manager.wait_until_finished()
        except BaseException:
            counts["errors"] += 1
            traceback.print_exc()
            stop.set()

    threads = [threading.Thread(target=train, args=(i,)) for i in range(THREADS)]
    saver = threading.Thread(target=save)
    for t in (*threads, saver):
        t.start()
    begin = time.perf_counter()
    warm = None
    rss: list[int] = []
    while time.perf_counter() - begin < seconds and not stop.is_set():
        time.sleep(0.5)
        now = time.perf_counter() - begin
        if warm is None and now > min(30.0, seconds / 5):
            warm = _rss_mib()
        if len(rss) < now // 10:
            rss.append(round(_rss_mib()))
    stop.set()
    for t in (*threads, saver):
        t.join()
    manager.close()
    end = _rss_mib()
    on_disk = manager.all_steps()
    expected = saved_steps[-KEEP:]
    _say(
        event="done",
        steps=sum(counts["steps"]),
        saves=counts["saves"],
        errors=counts["errors"],
        lost=sorted(set(expected) - set(on_disk)),
        on_disk=on_disk,
        rss_warm_mib=warm,
        rss_end_mib=end,
        rss_every_10s=rss,
    )


# ----------------------------------------------------------------------------- loader


def loader(directory: str, seconds: float) -> None:
    """Load the latest checkpoint in a loop; check each against its digest."""
    from jmodule.checkpoint import CheckpointManager
    from jmodule.serialization import CheckpointNotFoundError

    manager = CheckpointManager(directory, async_=False)
    loads = errors = mixed = empty = 0
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        try:
            saved = manager.restore()
        except CheckpointNotFoundError:
            empty += 1
            time.sleep(0.05)
            continue
        except Exception:
            errors += 1
            traceback.print_exc()
            continue
        loads += 1
        if saved["digest"] != digest(saved["models"]):
            mixed += 1
    _say(event="loader", loads=loads, errors=errors, mixed=mixed, empty=empty)


# ----------------------------------------------------------------------------- main


def _events(proc: subprocess.Popen) -> list[dict]:
    out = []
    for line in proc.stdout.read().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--role", choices=["trainer", "resume", "loader"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "loader":
        return loader(args.dir, args.seconds)
    if args.role:
        return trainer(args.dir, args.seconds, resume=args.role == "resume")

    import harness

    me = [sys.executable, __file__]
    checks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        # 1. The soak: trainer and loader together.
        print(f"soak: {args.seconds:.0f} s of 4 training threads, async saves and a loader")
        train = subprocess.Popen(
            [*me, "--role", "trainer", "--dir", d, "--seconds", str(args.seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        load = subprocess.Popen(
            [*me, "--role", "loader", "--dir", d, "--seconds", str(args.seconds + 5)],
            stdout=subprocess.PIPE,
            text=True,
        )
        train_events, load_events = _events(train), _events(load)
        train.wait(), load.wait()
        done = next(e for e in train_events if e["event"] == "done")
        loaded = next(e for e in load_events if e["event"] == "loader")
        print(json.dumps(done), json.dumps(loaded), sep="\n")
        growth = done["rss_end_mib"] / done["rss_warm_mib"] - 1
        checks += [
            {
                "check": "trainer: steps run, saves, errors (must be 0), exit status",
                "passed": done["errors"] == 0 and train.returncode == 0,
                "detail": f"{done['steps']} steps, {done['saves']} saves, "
                f"{done['errors']} errors, status {train.returncode}",
            },
            {
                "check": "loader: loads, errors and mixed checkpoints (must be 0)",
                "passed": loaded["errors"] == 0 and loaded["mixed"] == 0 and loaded["loads"] > 0,
                "detail": f"{loaded['loads']} loads, {loaded['errors']} errors, "
                f"{loaded['mixed']} mixed, status {load.returncode}",
            },
            {
                "check": f"the last {KEEP} saves are on disk (lost must be 0)",
                "passed": not done["lost"],
                "detail": f"lost {done['lost']}, on disk {done['on_disk']}",
            },
            {
                "check": "trainer memory after warm-up and at the end (flat within 10%)",
                "passed": growth <= 0.10,
                "detail": f"{done['rss_warm_mib']:.0f} MiB -> {done['rss_end_mib']:.0f} MiB "
                f"({growth:+.1%})",
            },
        ]
        # 2. SIGKILL mid-save, then a restart from the latest complete step.
        killed = subprocess.Popen(
            [*me, "--role", "resume", "--dir", d, "--seconds", "600"],
            stdout=subprocess.PIPE,
            text=True,
        )
        finished_before = None
        saving = 0
        for line in killed.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event["event"] == "saving":
                saving += 1
                if saving == 20:  # well into the run, a save just started: kill it
                    killed.send_signal(signal.SIGKILL)
                    break
                # Saving N waits for N - 5 first, so N - 10 has surely finished.
                finished_before = event["step"] - 2 * EVERY
        killed.wait()
        resumed = subprocess.run(
            [*me, "--role", "resume", "--dir", d, "--seconds", "10"],
            capture_output=True,
            text=True,
        )
        events = [json.loads(x) for x in resumed.stdout.splitlines() if x.startswith("{")]
        start = next((e["step"] for e in events if e["event"] == "resumed"), None)
        after = next((e for e in events if e["event"] == "done"), None)
        print("killed at save", saving, "resumed from", start, json.dumps(after))
        if resumed.returncode:
            print(resumed.stderr[-3000:])
        checks += [
            {
                "check": "SIGKILL mid-save, restart: resumes from a whole step no older than "
                "the last finished save",
                "passed": resumed.returncode == 0
                and start is not None
                and finished_before is not None
                and start >= finished_before,
                "detail": f"killed with signal {-killed.returncode} during save {saving}; "
                f"last finished save {finished_before}, resumed from {start}",
            },
            {
                "check": "after the restart: trains and saves, errors 0, nothing lost",
                "passed": after is not None and after["errors"] == 0 and not after["lost"],
                "detail": "no report"
                if after is None
                else f"{after['steps']} steps, {after['saves']} saves, errors "
                f"{after['errors']}, lost {after['lost']}",
            },
        ]
    for c in checks:
        print(f"CHECK {'PASS' if c['passed'] else 'FAIL'}: {c['check']}: {c['detail']}")
    harness.save_results("soak", {}, checks=checks)


if __name__ == "__main__":
    main()
