"""Read-only directories and full disks, made real where this machine allows.

``tests/serialization/_disk_faults.py`` runs the checks in a child process under a read-only
bind mount / a 2 MiB tmpfs in a private mount namespace (``unshare``, as root
or in a user namespace); where no mount can be made, and in the ``faked``
variant always, the child makes the writers fail as those filesystems do.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import jmodule.serialization as jms
from jmodule.checkpoint import CheckpointManager
from jmodule.serialization import _atomic

sys.path.insert(0, str(Path(__file__).parent))
import _disk_faults

MODES = ["real", "faked"]


def _dead_tag() -> str:
    return _atomic.new_tag().replace(f"-{os.getpid()}-", "-999999999-")  # a writer that died


def _readonly_fixture(d: Path) -> list[str]:
    """Steps 1 and 2 with a dead writer's leftovers; an overwrite of ``c`` killed between
    its renames. Returns the leftovers."""
    with CheckpointManager(d / "mgr", async_=False) as manager:
        for step in (1, 2):
            manager.save(step, {"step": step, "w": np.full(16, step, np.float32)})
    staging = _atomic.sibling(d / "mgr" / "3", "tmp", _dead_tag())  # a save killed mid-way
    staging.mkdir()
    (staging / "part").write_bytes(b"half")
    tag = _dead_tag()
    jms.save({"v": "old"}, _atomic.sibling(d / "c", "old", tag))
    jms.save({"v": "new"}, _atomic.sibling(d / "c", "tmp", tag))
    return sorted(n for n in os.listdir(d / "mgr") + os.listdir(d) if ".jm-" in n)


def _not_writable(out: dict, where: Path) -> None:
    assert out["error"] == "NotWritableError", out
    assert {"CheckpointError", "OSError"} <= set(out["mro"]), out
    assert out["errno"] == errno.EROFS, out
    assert str(where) in out["message"] and "save to a writable directory" in out["message"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_read_only_directory_with_leftovers_restores_and_refuses_saves(tmp_path, mode):
    leftovers = _readonly_fixture(tmp_path)
    assert len(leftovers) == 3
    out = _disk_faults.run("readonly", tmp_path, fake=mode == "faked")
    assert out["open"] == {"error": None, "value": [1, 2]}, out["open"]
    assert out["restore"]["value"] == 2 and out["restore1"]["value"] == 1
    assert out["load_rolled_forward"]["value"] == "new"  # read without writing anything
    for name, where in [
        ("save_async", tmp_path / "mgr" / "3"),
        ("save_sync", tmp_path / "mgr" / "3"),
        ("jm_save", tmp_path / "new"),
        ("jm_save_safetensors", tmp_path / "w.safetensors"),
        ("new_manager_dir", tmp_path / "missing" / "run"),
    ]:
        _not_writable(out[name], where)
    assert out["unchanged"], out["entries"]
    # Writable again: the next manager tidies what the dead writers left.
    CheckpointManager(tmp_path / "mgr")
    jms.load(tmp_path / "c")
    assert [n for n in os.listdir(tmp_path / "mgr") if ".jm-" in n] == []


def _disk_full(out: dict, where: Path, cause: str) -> None:
    assert out["error"] == "DiskFullError", out
    assert {"CheckpointError", "OSError"} <= set(out["mro"]), out
    assert out["errno"] == errno.ENOSPC and out["cause"] in cause.split("|"), out
    assert f"cannot save '{where}': the disk is full" in out["message"], out
    assert "Nothing was left behind" in out["message"]
    sizes = r"Saving it takes about [\d.]+ [KMG]iB; [\d.]+ ([KMG]iB|bytes) are free there"
    assert re.search(sizes, out["message"]), out
    assert out["needed"] > 0 and out["free"] <= _disk_faults.FULL_BYTES, out


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_full_disk_raises_disk_full_error_from_every_writer_and_leaves_nothing(tmp_path, mode):
    out = _disk_faults.run("full", tmp_path, fake=mode == "faked")
    mib = 2**20
    for name, where, cause, needed in [
        ("orbax", tmp_path / "a", "ValueError", 4 * mib),  # Orbax: RESOURCE_EXHAUSTED
        ("metadata", tmp_path / "b", "OSError", 2.25 * mib),  # jmodule.json, written last
        ("overwrite", tmp_path / "c", "ValueError", 1.75 * mib),
        ("safetensors", tmp_path / "w.safetensors", "SafetensorError", 4 * mib),
        ("jit", tmp_path / "m.pt", "OSError", 4 * mib),
        ("manager_sync", tmp_path / "m" / "1", "ValueError", 4 * mib),
        ("manager_async", tmp_path / "m2" / "1", "ValueError", 4 * mib),
        # Orbax's write, or (on a real tmpfs) creating its first directory, fails.
        ("filled_during", tmp_path / "f", "ValueError|OSError", 0.25 * mib),
    ]:
        _disk_full(out[name], where, cause)
        assert needed <= out[name]["needed"] < needed + 64 * 1024, (name, out[name])
        assert not any(".jm-" in e or ".tmp-" in e for e in out[name]["entries"]), out[name]
    assert "about 4.0 MiB" in out["orbax"]["message"]
    assert "An overwrite keeps the old checkpoint" in out["overwrite"]["message"]
    assert out["overwrite"]["old_kept"]["value"] == 0.5 * mib // 4  # the old one still loads
    # The disk filled while that save was writing: it had room when it started.
    assert out["free_at_start"] > 0.25 * mib and out["filled_during"]["free"] < 0.25 * mib
    assert out["after"]["error"] is None  # with room again, saving works
    assert out["after"]["entries"] == [
        "m",
        "m2",
        "ok",
        "ok/arrays",
        *[e for e in out["after"]["entries"] if e.startswith("ok/arrays/")],
        "ok/jmodule.json",
    ], out["after"]["entries"]
