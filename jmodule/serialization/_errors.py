"""Errors raised when a checkpoint or weight file cannot be saved or loaded.

Every message names the file (and, where there is one, the key) and says
what to do about it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path


class CheckpointError(Exception):
    """A checkpoint or weight file could not be saved or loaded."""


class CorruptCheckpointError(CheckpointError):
    """The file is damaged, truncated, incomplete or in no format jm reads.

    Raised instead of returning wrong numbers: a checksum that does not match,
    metadata that does not parse, a data file that is shorter than its header
    says.
    """


class CheckpointExistsError(CheckpointError, FileExistsError):
    """``jm.save`` was asked to write over an existing checkpoint without ``overwrite=True``."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """There is no checkpoint at the given path."""


class _OSCheckpointError(CheckpointError, OSError):
    """A :class:`CheckpointError` that is also the ``OSError`` the operating system raised."""

    def __init__(self, message: str, path: str = "", code: int = 0):
        super().__init__(message)
        self.errno, self.filename = code, path
        self.strerror = os.strerror(code) if code else message

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return type(self), (self.args[0], self.filename, self.errno), self.__dict__


class DiskFullError(_OSCheckpointError):
    """The disk (or the user's quota) filled up while a checkpoint or weight file was written.

    Raised by ``jm.save``, ``CheckpointManager.save``, safetensors and
    ``jm.jit.save`` files alike, whichever layer met the full disk (Orbax,
    the safetensors writer, a plain write or fsync). Nothing half-written is
    left behind: the partial save is removed before this is raised.

    Attributes:
        errno: ``errno.ENOSPC`` (``errno.EDQUOT`` for a full quota).
        filename: the path that was being saved.
        needed: about how many bytes the file or checkpoint takes (or ``None``).
        free: bytes free on that filesystem once the partial save was removed.
    """

    needed: int | None = None
    free: int | None = None


class NotWritableError(_OSCheckpointError):
    """A checkpoint or weight file cannot be saved where asked: a read-only
    filesystem, or no permission to write there. Loading from there still works.

    Attributes:
        errno: the operating system's code (``EROFS``, ``EACCES`` or ``EPERM``).
        filename: the path that was being saved.
    """


class UnsafePickleError(CheckpointError, pickle.UnpicklingError):
    """A PyTorch file holds a pickle that would run code on load.

    Raised before anything in the pickle runs. jm reads only tensors,
    storages, ``OrderedDict`` and plain Python containers and values.
    """


def where(path: os.PathLike | str, key: str | None = None) -> str:
    """``"'path'"`` or ``"'path' (key 'k')"`` for error messages."""
    text = f"'{os.fspath(path)}'"
    return text if key is None else f"{text} (key '{key}')"


# ------------------------------------------------------------------ write failures

_FULL = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())
_DENIED = {errno.EROFS, errno.EACCES, errno.EPERM}
#: How Orbax (TensorStore) and safetensors (Rust) spell an OS error code in their messages.
_CODE_IN_TEXT = re.compile(r"os_error_code='(\d+)'|\(os error (\d+)\)|\[Errno (\d+)\]")


def os_error_code(error: BaseException) -> int | None:
    """The OS error code behind ``error``: its own ``errno``, one named in its text
    (Orbax raises ``ValueError: RESOURCE_EXHAUSTED: ... [os_error_code='28']``,
    safetensors ``SafetensorError: ... (os error 28)``), or its cause's."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error.errno
        m = _CODE_IN_TEXT.search(str(error))
        if m:
            return int(next(g for g in m.groups() if g))
        if error.__cause__ is not None or error.__suppress_context__:
            error = error.__cause__
        else:
            error = error.__context__
    return None


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(p).free
    return None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def write_failure(
    error: BaseException, path: Path, needed: int | None, keeps_old: bool = False
) -> CheckpointError | None:
    """The jm error for ``error``, raised while saving ``path``: a full disk or a
    place that cannot be written; ``None`` for any other error (re-raise it as it is).

    Call it once the partial save is removed: the free space it reports is what
    a retry would find.

    Args:
        error: what the write raised.
        path: the checkpoint or file being saved.
        needed: about how many bytes it takes.
        keeps_old: an overwrite, which keeps the old checkpoint until the new one
            is complete, so both must fit.
    """
    if isinstance(error, CheckpointError):
        return None
    code = os_error_code(error)
    if code in _FULL:
        free = _free_bytes(path.parent)
        size = ""
        if needed is not None:
            size = f" Saving it takes about {_size(needed)}"
            size += "." if free is None else f"; {_size(free)} are free there."
            if keeps_old:
                size += " An overwrite keeps the old checkpoint until the new one is complete."
        full = DiskFullError(
            f"cannot save '{path}': the disk is full ({os.strerror(code)}).{size} Nothing "
            "was left behind (the partial save was removed). Free some space (delete old "
            "checkpoints, or keep fewer with CheckpointManager(max_to_keep=...)) or save "
            "to another disk.",
            os.fspath(path),
            code,
        )
        full.needed, full.free = needed, free
        return full
    if code in _DENIED:
        return NotWritableError(
            f"cannot save '{path}': '{path.parent}' cannot be written ({os.strerror(code)}). "
            "Checkpoints there can still be loaded; save to a writable directory instead.",
            os.fspath(path),
            code,
        )
    return None


@contextlib.contextmanager
def saving(path: Path, needed: Callable[[], int | None], keeps_old: bool = False) -> Iterator[None]:
    """Turn a full disk or an unwritable place met while saving ``path`` into
    :class:`DiskFullError` / :class:`NotWritableError` (see :func:`write_failure`).

    ``needed`` is called only on failure. The block must remove its own partial
    output before the error leaves it.
    """
    try:
        yield
    except Exception as error:
        translated = write_failure(error, path, needed(), keeps_old)
        if translated is None:
            raise
        raise translated from error
