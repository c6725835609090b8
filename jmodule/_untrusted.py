"""Reading files that may be hostile: regular files only, bounded sizes, bounded JSON.

Every reader of a file jm did not necessarily write itself (checkpoints,
weight files, sharded indexes, ``jm.jit`` program files) opens it with
:func:`open_regular` and parses JSON with :func:`loads_json`:

* Only regular files are opened, after following symlinks: a FIFO would
  block forever and a device such as ``/dev/zero`` never ends. The path is
  checked with ``os.stat`` first, opened with ``O_NONBLOCK`` (a FIFO swapped
  in after the check does not block the open) and checked again with
  ``os.fstat`` on what was opened.
* JSON is refused before the parser (which recurses, and raises a bare
  ``RecursionError`` on deep input) sees it if it is longer than the reader's
  limit or nests arrays and objects deeper than :data:`MAX_JSON_DEPTH`.

Each function takes the exception class to raise, so that every format
raises its own (``CorruptCheckpointError`` for checkpoints and weight files,
``ProgramFileError`` for program files). This module imports nothing of jm.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

#: The deepest nesting of JSON arrays and objects any reader accepts. Files jm
#: writes stay well below it: ``jm.save`` refuses objects nested more than 100
#: containers deep and ``jm.jit.save`` refuses a header nested deeper than this.
MAX_JSON_DEPTH = 256

Error = Callable[[str], Exception]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_FLAGS = os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_FLAGS |= getattr(os, "O_BINARY", 0)


def _not_regular(path: str | os.PathLike, mode: int, error: Error) -> Exception:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    link = ""
    if os.path.islink(path):
        link = f" (it is a symlink to '{os.path.realpath(path)}')"
    return error(
        f"'{os.fspath(path)}' is {kind}{link}, not a regular file; jm reads checkpoints, "
        "weight files and programs only from regular files (a pipe could block forever, a "
        "device never ends). Point it at the file itself, or copy the data into a file first."
    )


def check_regular(path: str | os.PathLike, error: Error) -> os.stat_result:
    """``os.stat(path)`` (following symlinks), refusing anything but a regular file.

    Raises:
        FileNotFoundError: nothing at ``path`` (or a dangling symlink).
        error: ``path`` is a directory, FIFO, device or socket.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode, error)
    return st


def open_regular(path: str | os.PathLike, error: Error) -> BinaryIO:
    """Open ``path`` for binary reading if it is a regular file; never blocks on a FIFO.

    Raises:
        FileNotFoundError: nothing at ``path``.
        error: ``path`` is not a regular file (checked before and after opening).
    """
    check_regular(path, error)
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped after the check
            raise _not_regular(path, st.st_mode, error)
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, error: Error, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, refusing one longer than ``limit``.

    Args:
        path: the file.
        error: the exception class to raise.
        limit: the most bytes read.
        what: what the file is, for the message (e.g. ``"a checkpoint index"``).

    Raises:
        FileNotFoundError: nothing at ``path``.
        error: not a regular file, or longer than ``limit``.
    """
    with open_regular(path, error) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise error(
            f"'{os.fspath(path)}' has {max(size, len(data))} bytes, more than the {limit} jm "
            f"reads as {what}; it is not one (or it is damaged)."
        )
    return data


# ---------------------------------------------------------------------------- JSON

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_OTHER = bytes(b for b in range(256) if b not in b'"[]{}')
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data`` (UTF-8).

    Brackets inside strings do not count. Exact for valid JSON; for invalid
    JSON, exact up to the first point where a parser would stop. Runs at
    memory speed: escapes are dropped, then everything but quotes and
    brackets, then adjacent quote pairs (which changes no bracket's side of
    a string); what is left is counted with numpy.
    """
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)  # an escaped quote does not end a string
    marks = data.translate(None, _OTHER).replace(b'""', b"")
    if not marks:
        return 0
    a = np.frombuffer(marks.translate(_STEPS), np.int8)
    if b'"' in marks:  # strings holding brackets: those brackets do not count
        quote = a == ord('"')
        a = np.where(quote | (np.cumsum(quote, dtype=np.int64) & 1).astype(bool), 0, a)
    return max(0, int(np.cumsum(a, dtype=np.int64).max()))


def loads_json(
    data: bytes,
    where: str,
    error: Error,
    *,
    max_bytes: int,
    max_depth: int = MAX_JSON_DEPTH,
    advice: str = "The file is damaged, or it was not written by the program it claims to be from.",
) -> Any:
    """Parse the UTF-8 JSON text ``data``, refusing what is too long or too deeply nested.

    Args:
        data: the JSON text.
        where: what it is, for the message (``"the safetensors header of '<path>'"``).
        error: the exception class to raise.
        max_bytes: the longest text accepted.
        max_depth: the deepest nesting of arrays and objects accepted.
        advice: what to do, appended to every message.

    Raises:
        error: ``data`` is longer than ``max_bytes``, not UTF-8, nested deeper
            than ``max_depth``, or not JSON.
    """
    if len(data) > max_bytes:
        raise error(
            f"{where} has {len(data)} bytes of JSON, more than the {max_bytes} jm reads. {advice}"
        )
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where} is not UTF-8 text ({e}). {advice}") from None
    data = bytes(data)
    depth = 0 if data.count(b"[") + data.count(b"{") <= max_depth else json_depth(data)
    if depth > max_depth:
        raise error(
            f"{where} nests JSON arrays and objects {depth} levels deep, more than the "
            f"{max_depth} jm reads. {advice}"
        )
    try:
        return json.loads(text)
    except RecursionError:  # called from deep in a stack: the parser itself ran out
        raise error(f"{where} nests JSON too deeply to parse here. {advice}") from None
    except ValueError as e:
        raise error(f"{where} is not valid JSON ({e}). {advice}") from None


def walk_regular(root: Path, error: Error) -> None:
    """Check that ``root`` is a directory holding only directories and regular files.

    Symlinks are followed for the check; symlinked directories are not
    descended into.

    Raises:
        error: naming the first entry that is a FIFO, device or socket.
    """
    mode = os.stat(root).st_mode
    if stat.S_ISREG(mode):
        raise error(f"'{root}' is a file where a directory was expected.")
    if not stat.S_ISDIR(mode):
        raise _not_regular(root, mode, error)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:  # a dangling symlink: the reader names it
                continue
            if not stat.S_ISREG(mode):
                raise _not_regular(path, mode, error)
