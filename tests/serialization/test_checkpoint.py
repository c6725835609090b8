"""jm.checkpoint.CheckpointManager: steps, retention, background saves, crash leftovers."""

from __future__ import annotations

import gc
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule.serialization as jms
from jmodule.checkpoint import CheckpointManager
from jmodule.serialization import _atomic, _directory, _metafile


def _state(step: int) -> dict:
    return {"params": {"w": jnp.full((4, 4), float(step)), "b": jnp.arange(3) + step}, "step": step}


def _is_state(obj, step: int) -> bool:
    return (
        obj["step"] == step
        and bool((np.asarray(obj["params"]["w"]) == step).all())
        and bool((np.asarray(obj["params"]["b"]) == np.arange(3) + step).all())
    )


@pytest.mark.parametrize("async_", [True, False])
def test_save_restore_all_steps_latest_step(tmp_path, async_):
    with CheckpointManager(tmp_path, async_=async_) as manager:
        assert manager.all_steps() == [] and manager.latest_step() is None
        for step in (0, 5, 3):
            assert manager.save(step, _state(step)) is True
        manager.wait_until_finished()
        assert manager.all_steps() == [0, 3, 5] and manager.latest_step() == 5
        assert _is_state(manager.restore(), 5)
        assert _is_state(manager.restore(3), 3)
        restored = manager.restore(0, map_location=jnp.bfloat16)
        assert restored["params"]["w"].dtype == jnp.bfloat16


def test_max_to_keep_deletes_the_oldest(tmp_path):
    with CheckpointManager(tmp_path, max_to_keep=2) as manager:
        for step in range(5):
            manager.save(step, _state(step))
        manager.wait_until_finished()
        assert manager.all_steps() == [3, 4]
    assert sorted(os.listdir(tmp_path)) == ["3", "4"]


def test_save_interval_steps_and_force(tmp_path):
    with CheckpointManager(tmp_path, save_interval_steps=3, async_=False) as manager:
        saved = [step for step in range(8) if manager.save(step, _state(step))]
        assert saved == [step for step in range(8) if step % 3 == 0]
        assert manager.save(7, _state(7), force=True)
        assert manager.all_steps() == [*saved, 7]


def test_existing_step_needs_overwrite(tmp_path):
    with CheckpointManager(tmp_path, async_=False) as manager:
        manager.save(1, _state(1))
        with pytest.raises(jms.CheckpointExistsError, match="step 1 already exists"):
            manager.save(1, _state(2))
        manager.save(1, _state(2), overwrite=True)
        assert _is_state(manager.restore(1), 2)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="max_to_keep"):
        CheckpointManager(tmp_path, max_to_keep=0)
    with pytest.raises(ValueError, match="save_interval_steps"):
        CheckpointManager(tmp_path, save_interval_steps=0)
    with CheckpointManager(tmp_path) as manager:
        with pytest.raises(ValueError, match="non-negative int"):
            manager.save(-1, _state(0))
        with pytest.raises(jms.CheckpointNotFoundError, match="no complete checkpoint"):
            manager.restore()
        with pytest.raises(jms.CheckpointNotFoundError, match="no checkpoint of step 4"):
            manager.restore(4)


class _Gate:
    """Holds background writes until released, to observe what runs when."""

    def __init__(self, monkeypatch):
        self.release = threading.Event()
        self.started = []
        real = _directory.write

        def gated(prepared, path, overwrite=False):
            self.started.append(os.path.basename(path))
            assert self.release.wait(30), "test never released the write"
            return real(prepared, path, overwrite=overwrite)

        monkeypatch.setattr(_directory, "write", gated)


def test_async_save_returns_before_writing_and_snapshots_its_input(tmp_path, monkeypatch):
    gate = _Gate(monkeypatch)
    manager = CheckpointManager(tmp_path)
    host = np.arange(6.0)
    obj = {"host": host, "device": jnp.arange(6.0), "meta": [1, 2]}
    manager.save(0, obj)  # returns while the write is held back
    deadline = time.monotonic() + 10
    while not gate.started and time.monotonic() < deadline:
        time.sleep(0.001)
    assert gate.started == ["0"] and manager.all_steps() == []
    host[:] = -1  # the caller changes its buffers at once
    obj["meta"].append(3)
    donated = jax.jit(lambda x: x * 0, donate_argnums=0)(obj["device"])
    assert donated.shape == (6,)
    gate.release.set()
    manager.wait_until_finished()
    out = manager.restore(0)
    np.testing.assert_array_equal(np.asarray(out["host"]), np.arange(6.0))
    np.testing.assert_array_equal(np.asarray(out["device"]), np.arange(6.0))
    assert out["meta"] == [1, 2]
    manager.close()


def test_a_second_save_waits_for_the_first(tmp_path, monkeypatch):
    gate = _Gate(monkeypatch)
    manager = CheckpointManager(tmp_path)
    manager.save(0, _state(0))
    second_done = threading.Event()

    def second():
        manager.save(1, _state(1))
        second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not second_done.wait(0.3)  # blocked behind step 0
    assert gate.started == ["0"]
    gate.release.set()
    thread.join(30)
    assert second_done.is_set()
    manager.wait_until_finished()
    assert manager.all_steps() == [0, 1] and gate.started == ["0", "1"]
    manager.close()


def test_background_errors_surface_on_the_next_call(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(_directory, "write", broken)
    manager.save(0, _state(0))
    with pytest.raises(OSError, match="disk full"):
        manager.wait_until_finished()
    manager.save(1, _state(1))
    with pytest.raises(OSError, match="disk full"):
        manager.save(2, _state(2))  # step 1's error, raised once step 2's save has started
    monkeypatch.undo()
    with pytest.raises(OSError, match="disk full"):
        manager.save(3, _state(3))  # step 2's (the disk was still full), step 3 written
    manager.close()
    assert manager.all_steps() == [3]


def test_restore_picks_the_latest_complete_step(tmp_path):
    with CheckpointManager(tmp_path, async_=False) as manager:
        manager.save(1, _state(1))
        manager.save(2, _state(2))
    # A step whose metadata was never written (cannot happen through jm, but a copy
    # tool might leave one) is not complete and is skipped.
    jms.save(_state(9), tmp_path / "9")
    (tmp_path / "9" / _metafile.NAME).unlink()
    manager = CheckpointManager(tmp_path, async_=False)
    assert manager.all_steps() == [1, 2]
    assert _is_state(manager.restore(), 2)


# A failed Orbax read can leave its other reads in flight (see test_serialization_corrupt.py).
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_corrupted_latest_step_raises_instead_of_falling_back(tmp_path):
    with CheckpointManager(tmp_path, async_=False) as manager:
        manager.save(1, _state(1))
        manager.save(2, _state(2))
    data = [p for p in (tmp_path / "2" / _directory.ARRAYS / "d").iterdir()]
    target = max(data, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    target.write_bytes(bytes(raw))
    manager = CheckpointManager(tmp_path, async_=False)
    with pytest.raises(jms.CorruptCheckpointError, match=r"key 'params\.(w|b)'") as info:
        manager.restore()
    assert str(tmp_path / "2") in str(info.value)
    assert _is_state(manager.restore(1), 1)
    time.sleep(0.05)
    gc.collect()


def test_start_cleans_up_after_a_crash_and_next_save_restores_max_to_keep(tmp_path):
    with CheckpointManager(tmp_path, async_=False) as manager:
        for step in range(4):
            manager.save(step, _state(step))
    dead = _atomic.new_tag().replace(f"-{os.getpid()}-", "-999999999-")
    # What a process killed mid-save leaves: a half-written staging directory, a step
    # half-deleted by retention, and a step saved before the crash could prune.
    half = _atomic.sibling(tmp_path / "4", "tmp", dead)
    half.mkdir()
    (half / "partial").write_bytes(b"\0" * 100)
    os.rename(tmp_path / "0", _atomic.sibling(tmp_path / "0", "del", dead))
    manager = CheckpointManager(tmp_path, max_to_keep=2, async_=False)
    assert sorted(os.listdir(tmp_path)) == ["1", "2", "3"]
    assert manager.all_steps() == [1, 2, 3]
    manager.save(4, _state(4))
    assert manager.all_steps() == [3, 4]
    assert _is_state(manager.restore(), 4)


def test_start_finishes_an_overwrite_killed_between_renames(tmp_path):
    with CheckpointManager(tmp_path, async_=False) as manager:
        manager.save(7, _state(7))
    dead = _atomic.new_tag().replace(f"-{os.getpid()}-", "-999999999-")
    staging = _atomic.sibling(tmp_path / "7", "tmp", dead)
    jms.save(_state(70), staging)
    os.rename(tmp_path / "7", _atomic.sibling(tmp_path / "7", "old", dead))
    manager = CheckpointManager(tmp_path)
    assert manager.all_steps() == [7] and sorted(os.listdir(tmp_path)) == ["7"]
    assert _is_state(manager.restore(), 70)
