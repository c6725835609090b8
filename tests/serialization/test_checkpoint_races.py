"""Racing saves: without overwrite exactly one wins, with it the last is kept; nothing is lost.

Real threads and real processes (``tests/serialization/_save_races.py``); deterministic
interleavings pin the window in which a save used to replace another.
``benchmarks/save_races.py`` runs the same scenarios many times.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import jmodule.serialization as jms
from jmodule.checkpoint import CheckpointManager
from jmodule.serialization import _atomic, _directory

sys.path.insert(0, str(Path(__file__).parent))
import _save_races


def test_two_threads_saving_one_new_path_exactly_one_wins(tmp_path):
    for trial in range(8):
        d = tmp_path / str(trial)
        d.mkdir()
        out = _save_races.thread_trial(d)
        assert sorted(out.results) == ["exists", "ok"], out
        assert out.on_disk == out.results.index("ok") and out.intact, out
        assert out.leftovers == []


def _paused(monkeypatch, slow: str, until: threading.Event) -> None:
    """Make the thread named ``slow`` wait for ``until`` before Orbax writes its arrays."""
    save_arrays = _directory._save_arrays

    def wait_then_save(staging, stored, *rest):
        if threading.current_thread().name == slow:
            assert until.wait(60)
        return save_arrays(staging, stored, *rest)

    monkeypatch.setattr(_directory, "_save_arrays", wait_then_save)


def test_a_save_that_finds_its_path_taken_at_commit_loses_and_leaves_nothing(tmp_path, monkeypatch):
    # A passes the existence check, then B saves the same path from start to end,
    # then A commits: A must lose (it used to replace B's checkpoint and succeed).
    path = tmp_path / "ckpt"
    b_done = threading.Event()
    _paused(monkeypatch, "A", b_done)
    errors = []

    def a():
        try:
            jms.save({"who": "A", "w": np.zeros(4)}, path)
        except Exception as e:  # checked below
            errors.append(e)

    thread = threading.Thread(target=a, name="A")
    thread.start()
    jms.save({"who": "B", "w": np.ones(4)}, path)
    b_done.set()
    thread.join(60)
    (error,) = errors
    assert isinstance(error, jms.CheckpointExistsError) and isinstance(error, FileExistsError)
    assert str(path) in str(error) and "another writer" in str(error)
    assert jms.load(path)["who"] == "B"
    assert _save_races.hidden(tmp_path) == []


def test_racing_overwrites_all_succeed_and_the_last_to_commit_is_kept(tmp_path, monkeypatch):
    # A moves the old checkpoint aside, then B (finding no checkpoint) commits, then
    # A's rename meets B's checkpoint: A drops the old one, moves B's aside, commits.
    path = tmp_path / "ckpt"
    jms.save({"who": "old"}, path)
    b_done, a_moved = threading.Event(), threading.Event()
    fsync_dir = _atomic.fsync_dir

    def pause_a_after_its_first_rename(p):
        fsync_dir(p)
        first = p == tmp_path and not a_moved.is_set()  # not the flushes of A's staging
        if threading.current_thread().name == "A" and first:
            a_moved.set()
            assert b_done.wait(60)

    monkeypatch.setattr(_atomic, "fsync_dir", pause_a_after_its_first_rename)
    errors = []

    def a():
        try:
            jms.save({"who": "A"}, path, overwrite=True)
        except Exception as e:  # checked below
            errors.append(e)

    thread = threading.Thread(target=a, name="A")
    thread.start()
    assert a_moved.wait(60)
    jms.save({"who": "B"}, path, overwrite=True)
    b_done.set()
    thread.join(60)
    assert errors == []
    assert jms.load(path)["who"] == "A"
    _atomic.settle()  # the replaced checkpoints are deleted in the background
    assert _save_races.hidden(tmp_path) == []


def test_two_threads_overwriting_both_succeed(tmp_path):
    for trial in range(6):
        d = tmp_path / str(trial)
        d.mkdir()
        out = _save_races.thread_trial(d, overwrite=True)
        assert out.results == ["ok", "ok"] and out.on_disk in (0, 1) and out.intact, out
        assert out.leftovers == []


@pytest.mark.slow
def test_two_managers_in_two_processes_never_both_save_a_step(tmp_path):
    for out in _save_races.manager_race(tmp_path, ("sync", "async"), steps=12):
        assert out.both_ok == [] and out.none_ok == [], out
        assert out.wrong == [] and out.leftovers == [], out
        # Exactly one loser per step, told which step and why.
        assert len(out.messages) == out.steps, out
        for message in out.messages:
            assert "already exists" in message or "by another writer" in message, message


def test_a_step_lost_to_another_manager_names_the_step(tmp_path, monkeypatch):
    rival = CheckpointManager(tmp_path, async_=False)
    for async_ in (False, True):
        step = int(async_)
        manager = CheckpointManager(tmp_path, async_=async_)
        # The rival commits the step after this manager checked it is free.
        monkeypatch.setattr(_directory, "_save_arrays", _saving_rival_first(rival, step, tmp_path))
        if async_:
            manager.save(step, {"who": "mine"})
            with pytest.raises(jms.CheckpointExistsError, match=rf"step {step} was saved to"):
                manager.wait_until_finished()
        else:
            with pytest.raises(jms.CheckpointExistsError, match=rf"step {step} was saved to"):
                manager.save(step, {"who": "mine"})
        monkeypatch.undo()
        assert rival.restore(step)["who"] == "rival"
        manager.close()
    assert _save_races.hidden(tmp_path) == []


def _saving_rival_first(rival: CheckpointManager, step: int, directory: Path):
    """A ``_save_arrays`` that first lets ``rival`` save ``step`` to the same directory."""
    save_arrays = _directory._save_arrays
    state = {"done": False}

    def rival_then_save(staging, stored, *rest):
        if not state["done"] and staging.parent == directory:
            state["done"] = True
            rival.save(step, {"who": "rival"})
        return save_arrays(staging, stored, *rest)

    return rival_then_save


def test_deleting_a_step_another_manager_deleted_is_a_no_op(tmp_path):
    jms.save({"v": 1}, tmp_path / "3")
    _atomic.delete(tmp_path / "3")
    _atomic.delete(tmp_path / "3")  # a second manager pruning the same step
    assert list(tmp_path.iterdir()) == []


def _state(value: float) -> dict:
    return {f"w{i}": np.full((64, 64 + i), value, np.float32) for i in range(4)}


def _whole(loaded: dict) -> float:
    """The one value every array of a loaded ``_state`` holds (fails on a mixture)."""
    values = {float(v) for x in loaded.values() for v in np.unique(np.asarray(x))}
    assert len(values) == 1, values
    return values.pop()


def test_a_load_whose_checkpoint_is_replaced_midway_returns_the_new_one_whole(
    tmp_path, monkeypatch
):
    # The load has read jmodule.json of the old checkpoint when an overwrite renames
    # the new one into place: it used to read the new arrays against the old
    # checksums (or the old names) and report the checkpoint as corrupt.
    path = tmp_path / "ckpt"
    jms.save(_state(1.0), path)
    read_direct = _directory._read_direct
    calls = []

    def overwrite_first(src, *rest):
        if not calls:
            jms.save(_state(2.0), path, overwrite=True)
        calls.append(src)
        return read_direct(src, *rest)

    monkeypatch.setattr(_directory, "_read_direct", overwrite_first)
    assert _whole(jms.load(path)) == 2.0
    assert len(calls) == 2


def test_a_corrupt_checkpoint_that_nobody_replaces_is_read_once(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    jms.save(_state(1.0), path)
    for f in (path / "arrays" / "d").iterdir():
        f.write_bytes(f.read_bytes()[:100])
    read_direct = _directory._read_direct
    calls = []
    monkeypatch.setattr(_directory, "_read_direct", lambda *a: calls.append(1) or read_direct(*a))
    with pytest.raises(jms.CorruptCheckpointError):
        jms.load(path)
    assert calls == [1]


@pytest.mark.slow
@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_loads_while_another_saver_overwrites_see_whole_checkpoints_in_order(tmp_path, process):
    out = _save_races.load_race(tmp_path, saves=16, process=process)
    assert out.failed == 0, out.errors
    assert out.mixed == 0 and out.out_of_order == 0
    assert out.loads > 0


def test_an_unverified_load_whose_checkpoint_is_replaced_midway_is_not_a_mixture(
    tmp_path, monkeypatch
):
    # Without checksums nothing fails: the old tree (keys w*) would come back holding
    # the new checkpoint's arrays (saved under keys v*). The load starts over instead.
    path = tmp_path / "ckpt"
    jms.save(_state(1.0), path)
    renamed = {k.replace("w", "v"): v for k, v in _state(2.0).items()}
    read_direct = _directory._read_direct
    calls = []

    def overwrite_first(src, *rest):
        if not calls:
            jms.save(renamed, path, overwrite=True)
        calls.append(src)
        return read_direct(src, *rest)

    monkeypatch.setattr(_directory, "_read_direct", overwrite_first)
    loaded = jms.load(path, verify=False)
    assert sorted(loaded) == sorted(renamed)
    assert _whole(loaded) == 2.0
    assert len(calls) == 2


# ------------------------------------------------ background failures, racing threads


def _racing_manager_trial(root: Path, trial: int, callers: str) -> tuple[list, list[int]]:
    """Two threads save at once through one async manager, one of them a save that fails
    in the background (an overwrite of a directory that is not a checkpoint); then both
    call ``callers`` ('wait', 'close' or 'save': the next call of each thread).
    Returns every error raised, by any call, and the complete steps on disk."""
    d = root / str(trial)
    (d / "5").mkdir(parents=True)
    (d / "5" / "notes.txt").write_text("not a checkpoint")
    manager = CheckpointManager(d, async_=True)
    start = threading.Barrier(2)
    raised: list[BaseException] = []
    lock = threading.Lock()

    def thread(step: int, overwrite: bool) -> None:
        calls = [
            lambda: manager.save(step, {"w": np.full(64, step)}, overwrite=overwrite),
            {
                "wait": manager.wait_until_finished,
                "close": manager.close,
                "save": lambda: manager.save(100 + step, {"w": np.zeros(2)}),
            }[callers],
            manager.wait_until_finished,
        ]
        start.wait()
        for call in calls:
            try:
                call()
            except Exception as e:  # counted below
                with lock:
                    raised.append(e)

    threads = [
        threading.Thread(target=thread, args=(5, True)),
        threading.Thread(target=thread, args=(6, False)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        manager.close()
    except Exception as e:  # a failure nobody took yet would show here: counted too
        raised.append(e)
    return raised, manager.all_steps()


@pytest.mark.parametrize("callers", ["wait", "close", "save"])
def test_a_failed_background_save_raises_exactly_once_whichever_thread_waits(tmp_path, callers):
    for trial in range(5):
        raised, steps = _racing_manager_trial(tmp_path / callers, trial, callers)
        failures = [e for e in raised if "not a jmodule checkpoint" in str(e)]
        assert len(failures) == 1, (trial, raised)
        assert [e for e in raised if e not in failures] == [], (trial, raised)
        assert 6 in steps and 5 not in steps, (trial, steps)


def test_a_save_that_raises_an_earlier_failure_still_saves_its_own_step(tmp_path):
    """The order that made the racing test above flaky, forced: step 5's background save
    fails before step 6's save is called. save(6) raises step 5's error (once), and step 6
    is written all the same."""
    import concurrent.futures

    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "notes.txt").write_text("not a checkpoint")
    manager = CheckpointManager(tmp_path, async_=True)
    manager.save(5, {"w": np.full(4, 5.0)}, overwrite=True)
    concurrent.futures.wait(manager._pending)  # step 5's save has failed; nobody took it yet
    with pytest.raises(jms.CheckpointError, match="not a jmodule checkpoint"):
        manager.save(6, {"w": np.full(4, 6.0)})
    manager.wait_until_finished()  # nothing more to raise
    assert manager.all_steps() == [6]
    np.testing.assert_array_equal(manager.restore(6)["w"], np.full(4, 6.0))
    # An earlier error is not lost when the save that takes it fails on its own account.
    manager2 = CheckpointManager(tmp_path / "m2", async_=True)
    (tmp_path / "m2" / "1").mkdir()
    (tmp_path / "m2" / "1" / "notes.txt").write_text("not a checkpoint")
    manager2.save(1, {"w": np.zeros(2)}, overwrite=True)
    concurrent.futures.wait(manager2._pending)
    (tmp_path / "m2" / "2").mkdir()
    with pytest.raises(jms.CheckpointExistsError):
        manager2.save(2, {"w": np.zeros(2)})  # step 2 exists: this call's own error
    with pytest.raises(jms.CheckpointError, match="not a jmodule checkpoint"):
        manager2.wait_until_finished()  # step 1's, raised by the next call
    manager2.close()
    manager.close()


def test_an_interrupted_background_save_stops_the_next_save_before_it_starts(tmp_path, monkeypatch):
    """A KeyboardInterrupt is not an earlier failure to report after saving: the save that
    meets it raises it at once and writes nothing."""
    import concurrent.futures

    manager = CheckpointManager(tmp_path, async_=True)
    real = _directory.write

    def interrupted(prepared, path, overwrite=False):
        if Path(path).name == "0":
            raise KeyboardInterrupt
        return real(prepared, path, overwrite=overwrite)

    monkeypatch.setattr(_directory, "write", interrupted)
    manager.save(0, {"w": np.zeros(2)})
    concurrent.futures.wait(manager._pending)
    with pytest.raises(KeyboardInterrupt):
        manager.save(1, {"w": np.ones(2)})
    manager.wait_until_finished()
    assert manager.all_steps() == []
    manager.save(2, {"w": np.ones(2)})
    manager.close()
    assert manager.all_steps() == [2]
