"""A background save in flight when Python exits is finished, or its failure is loud.

Each trial is a real process (``tests/_save_races.py``) that saves steps 0-3
with ``CheckpointManager(max_to_keep=2)`` in the background and exits without
waiting: off the end of the script, through ``sys.exit(0)``, through an
uncaught exception, or with the last save failing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _save_races


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


def test_a_background_save_failing_at_exit_is_reported_and_the_exit_status_is_1(tmp_path):
    out = _save_races.exit_trial(tmp_path / "ckpt", "fail")
    assert out.returncode == 1
    assert f"the background save of step 3 to '{tmp_path / 'ckpt' / '3'}' failed" in out.stderr
    assert "OSError: [Errno 5] injected I/O error" in out.stderr
    assert "the script's own atexit handler ran" in out.stderr  # before the exit with 1
    assert out.steps == [1, 2] and out.leftovers == []


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
