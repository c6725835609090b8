"""Real read-only and full filesystems for tests, in a private mount namespace.

:func:`run` runs ``python tests/serialization/_disk_faults.py KIND DIRECTORY`` with
``DIRECTORY`` made into

* ``readonly``: a read-only bind mount of itself (what was saved there stays
  readable; nothing can be written, not even by root);
* ``full``: a tmpfs of :data:`FULL_BYTES`;

inside ``unshare --mount`` (as root) or ``unshare --mount --map-root-user`` (an
unprivileged user namespace), so the mount is private to the child and
vanishes with it. Where neither works (a container without ``CAP_SYS_ADMIN``
and without user namespaces) the child fakes the filesystem instead: the
operations jm's writers use fail as the real layers fail (``OSError`` with
``EROFS``/``ENOSPC``, Orbax's ``ValueError: RESOURCE_EXHAUSTED ...
[os_error_code='28']``, safetensors' ``SafetensorError ... (os error 28)``).
The result says which was used.

The child runs the checks of :func:`readonly_checks` / :func:`full_checks`
and prints one JSON object: per check, the error raised (class, errno,
message, cause) or what was read, and what the directory holds afterwards.
"""

from __future__ import annotations

import builtins
import errno
import functools
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _save_races import child_env

FULL_BYTES = 2 * 2**20
MIB = 2**20


@functools.cache
def _unshare() -> list[str] | None:
    """An ``unshare`` command under which this user can mount, or ``None``."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    for cmd in (["unshare", "--mount"], ["unshare", "--mount", "--map-root-user"]):
        probe = [*cmd, "sh", "-c", 'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d"']
        try:
            if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
                return cmd
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def run(kind: str, directory: Path, fake: bool = False) -> dict:
    """Run the ``kind`` checks on ``directory`` made read-only / full; their results.

    The result's ``"how"`` is ``"mount"`` (a real filesystem) or ``"faked"``
    (asked for, or no mount namespace can be had here).
    """
    child = [sys.executable, __file__, kind, str(directory)]
    unshare = None if fake else _unshare()
    if unshare is not None:
        mount = {
            "readonly": 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0"',
            "full": f'mount -t tmpfs -o size={FULL_BYTES} tmpfs "$0"',
        }[kind]
        cmd = [*unshare, "sh", "-c", f'{mount} && exec "$@"', str(directory), *child]
        how = "mount"
    else:
        cmd, how = [*child, "--fake"], "faked"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} checks failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return {"how": how, **json.loads(proc.stdout.strip().splitlines()[-1])}


# ----------------------------------------------------------------------------- child


def _outcome(fn) -> dict:
    try:
        value = fn()
    except Exception as e:  # reported to the parent, which asserts
        return {
            "error": type(e).__name__,
            "mro": [c.__name__ for c in type(e).__mro__],
            "errno": getattr(e, "errno", None),
            "message": str(e),
            "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None,
            "needed": getattr(e, "needed", None),
            "free": getattr(e, "free", None),
        }
    return {"error": None, "value": value}


def _entries(d: Path) -> list[str]:
    """Everything under ``d``, as relative paths."""
    return sorted(str(Path(r, n).relative_to(d)) for r, ds, fs in os.walk(d) for n in ds + fs)


def readonly_checks(d: Path) -> dict:
    """Open, read and try to save in ``d`` (see ``test_checkpoint_disks.py``)."""
    import numpy as np

    import jmodule.serialization as jms
    from jmodule.checkpoint import CheckpointManager

    before = _entries(d)
    out: dict = {}
    manager = None

    def open_manager():
        nonlocal manager
        manager = CheckpointManager(d / "mgr")
        return manager.all_steps()

    out["open"] = _outcome(open_manager)
    out["restore"] = _outcome(lambda: int(manager.restore()["step"]))
    out["restore1"] = _outcome(lambda: int(manager.restore(1)["step"]))
    out["load_rolled_forward"] = _outcome(lambda: jms.load(d / "c")["v"])
    obj = {"step": 3, "w": np.ones(8, np.float32)}

    def save_async():
        manager.save(3, obj)  # starts; the background write fails
        manager.wait_until_finished()

    out["save_async"] = _outcome(save_async)
    out["save_sync"] = _outcome(lambda: CheckpointManager(d / "mgr", async_=False).save(3, obj))
    out["jm_save"] = _outcome(lambda: jms.save(obj, d / "new"))
    out["jm_save_safetensors"] = _outcome(lambda: jms.save({"w": obj["w"]}, d / "w.safetensors"))
    out["new_manager_dir"] = _outcome(lambda: CheckpointManager(d / "missing" / "run"))
    out["unchanged"] = _entries(d) == before
    out["entries"] = _entries(d)
    return out


def full_checks(d: Path) -> dict:
    """Saves that do not fit in ``d`` (:data:`FULL_BYTES`), each a different writer."""
    import jax.numpy as jnp
    import numpy as np

    import jmodule as jm
    import jmodule.jit
    import jmodule.serialization as jms
    from jmodule.checkpoint import CheckpointManager
    from jmodule.serialization import _directory

    def arrays(mb: float) -> dict:
        return {"w": np.ones(int(mb * MIB / 4), np.float32)}

    out: dict = {}

    def check(name: str, fn) -> None:
        out[name] = {**_outcome(fn), "entries": _entries(d)}

    check("orbax", lambda: jms.save(arrays(4), d / "a"))
    # The arrays fit; jmodule.json (with a long string) is what fills the disk.
    check("metadata", lambda: jms.save({**arrays(0.75), "notes": "x" * int(1.5 * MIB)}, d / "b"))
    jms.save(arrays(0.5), d / "c")

    def overwrite():
        jms.save(arrays(1.75), d / "c", overwrite=True)

    check("overwrite", overwrite)
    out["overwrite"]["old_kept"] = _outcome(lambda: int(jms.load(d / "c")["w"].size))
    shutil.rmtree(d / "c")
    check("safetensors", lambda: jms.save(arrays(4), d / "w.safetensors"))
    linear = jm.nn.Linear(1024, 1024)
    check("jit", lambda: jm.jit.save(jm.jit.trace(linear, jnp.ones((1, 1024))), d / "m.pt"))
    check("manager_sync", lambda: CheckpointManager(d / "m", async_=False).save(1, arrays(4)))
    manager = CheckpointManager(d / "m2")

    def manager_async():
        manager.save(1, arrays(4))
        manager.wait_until_finished()

    check("manager_async", manager_async)

    # A save that fits when it starts, while something else fills the disk.
    save_arrays = _directory._save_arrays

    def fill_then_save(staging, stored, *rest):
        with open(d / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                pass
        return save_arrays(staging, stored, *rest)

    out["free_at_start"] = shutil.disk_usage(d).free
    _directory._save_arrays = fill_then_save
    check("filled_during", lambda: jms.save(arrays(0.25), d / "f"))
    _directory._save_arrays = save_arrays
    (d / "filler").unlink()
    check("after", lambda: int(jms.save(arrays(0.25), d / "ok") or jms.load(d / "ok")["w"].size))
    return out


# ---------------------------------------------------------------------- faked fs


def _fake_readonly(root: Path) -> None:
    """Make every write under ``root`` fail with EROFS, as a read-only mount does."""
    import safetensors

    top = os.path.realpath(root)

    def inside(path, dir_fd=None) -> bool:
        if dir_fd is not None:
            return True  # shutil.rmtree's relative deletes; nothing else here uses dir_fd
        if isinstance(path, int):
            return False  # a descriptor already open (os.fdopen): its os.open was guarded
        return os.path.realpath(os.fspath(path)).startswith(top)

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

    def guard(fn, writes=lambda *a, **k: True):
        def wrapped(path, *args, **kwargs):
            if inside(path, kwargs.get("dir_fd")) and writes(*args, **kwargs):
                refuse(path)
            return fn(path, *args, **kwargs)

        return wrapped

    for name in ("mkdir", "rmdir", "unlink", "remove", "rename", "replace", "link"):
        setattr(os, name, guard(getattr(os, name)))
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    os.open = guard(os.open, lambda flags, *a, **k: bool(flags & write_flags))
    opener = guard(io.open, lambda mode="r", *a, **k: any(c in mode for c in "wax+"))
    builtins.open = io.open = opener
    serialize = safetensors.serialize_file

    def serialize_file(tensors, filename, *args, **kwargs):
        if inside(filename):
            raise safetensors.SafetensorError(
                "Error while serializing: I/O error: Read-only file system (os error 30)"
            )
        return serialize(tensors, filename, *args, **kwargs)

    safetensors.serialize_file = serialize_file


def _fake_full(root: Path) -> None:
    """Make ``root`` behave as a filesystem of :data:`FULL_BYTES`: each writer jm uses
    fails, as it does on a full disk, once what is under ``root`` would exceed it."""
    import safetensors

    from jmodule.jit import _format
    from jmodule.serialization import _directory, _metafile

    top = os.path.realpath(root)

    def used() -> int:
        return sum(os.path.getsize(Path(r, f)) for r, _, fs in os.walk(top) for f in fs)

    def fits(n: int) -> bool:
        return used() + n <= FULL_BYTES

    usage = shutil.disk_usage

    def disk_usage(path):
        if os.path.realpath(os.fspath(path)).startswith(top):
            return usage(path)._replace(total=FULL_BYTES, free=max(0, FULL_BYTES - used()))
        return usage(path)

    shutil.disk_usage = disk_usage
    save_arrays = _directory._save_arrays

    def fake_save_arrays(staging, stored, *rest):
        if not fits(sum(int(x.nbytes) for x in stored.values())):
            (staging / "arrays.orbax-checkpoint-tmp").mkdir()
            raise ValueError(
                f'RESOURCE_EXHAUSTED: Error writing "a0/c/0" in OCDBT database at local file '
                f"\"{staging}\": No space left on device [os_error_code='{errno.ENOSPC}']"
            )
        return save_arrays(staging, stored, *rest)

    _directory._save_arrays = fake_save_arrays
    metafile_write = _metafile.write

    def fake_metafile_write(directory, body):
        if not fits(len(json.dumps(body))):
            (directory / _metafile.NAME).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        metafile_write(directory, body)

    _metafile.write = fake_metafile_write
    serialize = safetensors.serialize_file

    def serialize_file(tensors, filename, *args, **kwargs):
        if not fits(sum(spec.data_len for spec in tensors.values())):
            Path(filename).write_bytes(b"partial")
            raise safetensors.SafetensorError(
                "Error while serializing: I/O error: No space left on device "
                f"(os error {errno.ENOSPC})"
            )
        return serialize(tensors, filename, *args, **kwargs)

    safetensors.serialize_file = serialize_file

    class FullFile(io.FileIO):
        def write(self, data):
            if not fits(len(data)):
                super().write(bytes(data[: len(data) // 2]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)

    real_open = builtins.open

    def fake_open(file, mode="r", *args, **kwargs):
        if "w" in mode and os.path.realpath(os.fspath(file)).startswith(top):
            return FullFile(file, "w")
        return real_open(file, mode, *args, **kwargs)

    _format.open = fake_open  # jm.jit.save's writer
    fsync = os.fsync

    def fake_fsync(fd):
        # The filler of "filled_during" writes until the disk is full.
        if os.path.realpath(f"/proc/self/fd/{fd}").endswith("/filler") and not fits(0):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    os.fsync = fake_fsync


if __name__ == "__main__":
    kind, where = sys.argv[1], Path(sys.argv[2])
    if "--fake" in sys.argv:
        (_fake_readonly if kind == "readonly" else _fake_full)(where)
    checks = readonly_checks if kind == "readonly" else full_checks
    print(json.dumps(checks(where)), flush=True)
