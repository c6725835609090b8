"""A background save in flight when Python exits is finished, or its failure is loud.

Each trial is a real process (``tests/serialization/_save_races.py``) that saves steps 0-3
with ``CheckpointManager(max_to_keep=2)`` in the background and exits without
waiting: off the end of the script, through ``sys.exit(0)``, through an
uncaught exception, or with the last save failing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _save_races


@pytest.mark.slow
@pytest.mark.parametrize("how", ["end", "exit", "raise"])
def test_the_last_background_save_is_on_disk_after_exit(tmp_path, how):
    out = _save_races.exit_trial(tmp_path / "ckpt", how)
    assert out.steps == [2, 3] and out.last_intact, out
    assert out.leftovers == []
    assert "the script's own atexit handler ran" in out.stderr
    if how == "raise":
        assert out.returncode == 1 and "the training loop crashed" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
    assert "jm.checkpoint" not in out.stderr  # nothing failed


@pytest.mark.slow
def test_a_background_save_failing_at_exit_is_reported_and_the_exit_status_is_1(tmp_path):
    out = _save_races.exit_trial(tmp_path / "ckpt", "fail")
    assert out.returncode == 1
    assert f"the background save of step 3 to '{tmp_path / 'ckpt' / '3'}' failed" in out.stderr
    assert "OSError: [Errno 5] injected I/O error" in out.stderr
    assert "the script's own atexit handler ran" in out.stderr  # before the exit with 1
    assert out.steps == [1, 2] and out.leftovers == []


@pytest.mark.slow
def test_a_forked_child_does_not_wait_for_its_parents_saves(tmp_path):
    # The child has none of the parent's threads: waiting for their saves would hang it.
    script = textwrap.dedent(
        """
        import concurrent.futures, os, sys, time
        from jmodule.serialization import _inflight

        never = concurrent.futures.Future()
        _inflight.track(never, "step 0 to 'x'")
        pid = os.fork()
        if pid == 0:
            _inflight.finish_all()
            os._exit(7)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            sys.exit("the child hung")
        _inflight.forget(never)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=_save_races.child_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "7"


@pytest.mark.slow
def test_saves_and_loads_in_an_atexit_handler_work(tmp_path):
    # By then concurrent.futures takes no new work on any Python, and Python 3.12 starts no
    # new thread: saving falls back to the calling thread (jmodule/serialization/_threads.py).
    script = textwrap.dedent(
        """
        import atexit, sys
        import numpy as np
        import jmodule as jm
        from jmodule.checkpoint import CheckpointManager

        d = sys.argv[1]
        big = {"w": np.arange(1 << 20, dtype=np.float32), "b": np.ones(3, np.float32)}

        def at_exit():
            jm.save(big, d + "/plain")
            jm.save(big, d + "/plain", overwrite=True)  # the old one is discarded
            got = jm.load(d + "/plain")  # checksums verified
            assert np.array_equal(np.asarray(got["w"]), big["w"])
            manager = CheckpointManager(d + "/mgr", max_to_keep=1)  # async_ by default
            manager.save(0, big)
            manager.save(1, big)
            manager.wait_until_finished()
            assert manager.all_steps() == [1], manager.all_steps()
            jm.save(big, d + "/w.safetensors")
            jm.save(big, d + "/w.pt")
            for name in ("w.safetensors", "w.pt"):
                assert np.array_equal(np.asarray(jm.load(d + "/" + name)["w"]), big["w"])
            print("all saved", file=sys.stderr)

        atexit.register(at_exit)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=_save_races.child_env(),
        timeout=300,
    )
    assert proc.returncode == 0 and "all saved" in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert _save_races.hidden(tmp_path) == [] and _save_races.hidden(tmp_path / "mgr") == []


def test_where_no_thread_can_start_saving_and_loading_run_on_the_calling_thread(
    tmp_path, monkeypatch
):
    # What Python 3.12 does while it exits, on any Python: Thread.start refuses.
    import numpy as np

    import jmodule as jm
    from jmodule.checkpoint import CheckpointManager
    from jmodule.serialization import _checksum

    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    arrays = [np.full(1000 + i, i, np.float32) for i in range(6)]
    assert _checksum.many(arrays) == [_checksum.digest(a) for a in arrays]
    with _checksum.Batch(2) as batch:
        for a in arrays:
            batch.add(a)
        assert batch.results() == [_checksum.digest(a) for a in arrays]
    manager = CheckpointManager(tmp_path / "mgr", max_to_keep=1)
    manager.save(0, {"w": arrays[0]})
    manager.save(1, {"w": arrays[1]})
    manager.wait_until_finished()
    assert manager.all_steps() == [1]
    assert _save_races.hidden(tmp_path / "mgr") == []  # step 0 deleted here, not on a thread
    jm.save({"w": arrays[2]}, tmp_path / "plain")
    jm.save({"w": arrays[3]}, tmp_path / "plain", overwrite=True)
    assert np.array_equal(np.asarray(jm.load(tmp_path / "plain")["w"]), arrays[3])


def test_checksum_threads_raise_the_error_of_any_share():
    import numpy as np

    from jmodule.serialization import _checksum

    arrays = [np.ones(10 * (i + 1), np.float32) for i in range(3)]
    for bad in range(3):  # the share run here, or one on a thread, fails
        names = ["crc32c"] * 3
        names[bad] = "md5"
        with pytest.raises(KeyError, match="md5"):
            _checksum.many(arrays, names)
        with pytest.raises(KeyError, match="md5"), _checksum.Batch(2) as batch:
            for a, name in zip(arrays, names):
                batch.add(a, name)
            batch.results()
