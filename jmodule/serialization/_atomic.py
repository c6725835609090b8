"""Commit a finished checkpoint directory by renaming it into place.

A save writes everything into a hidden sibling ``.<name>.jm-tmp-<tag>`` and
renames it to ``<name>`` only once complete and flushed, so ``<name>`` either
does not exist or is whole. Overwriting renames the old checkpoint aside to
``.<name>.jm-old-<tag>`` first, then the new one in, then deletes the old::

    killed before the first rename   -> <name> is the old checkpoint
    killed between the two renames   -> <name> is missing; old and new are
                                        both whole on the side: readers use
                                        the new one, the next save renames
                                        it into place
    killed after the second rename   -> <name> is the new checkpoint

``<tag>`` names the writer (host hash, pid, random), so leftovers of a writer
that died are told apart from those of one still writing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import NamedTuple

from jmodule.serialization import _metafile

_HOST = hashlib.blake2s(socket.gethostname().encode(), digest_size=4).hexdigest()
_LEFTOVER = re.compile(
    r"^\.(?P<name>.+)\.jm-(?P<kind>tmp|old|del)-(?P<tag>[0-9a-f]{8}-\d+-[0-9a-f]+)$"
)


class Leftover(NamedTuple):
    """A hidden sibling left by a save or delete: its kind, writer tag and path."""

    kind: str
    tag: str
    path: Path


def new_tag() -> str:
    """A tag naming this process and this save."""
    return f"{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"


def sibling(final: Path, kind: str, tag: str) -> Path:
    """The hidden sibling of ``final`` of ``kind`` (``tmp``, ``old`` or ``del``)."""
    return final.parent / f".{final.name}.jm-{kind}-{tag}"


def leftovers(final: Path) -> list[Leftover]:
    """Hidden siblings of ``final`` that saves and deletes left behind."""
    try:
        names = os.listdir(final.parent)
    except FileNotFoundError:
        return []
    out = []
    for entry in sorted(names):
        m = _LEFTOVER.match(entry)
        if m and m["name"] == final.name:
            out.append(Leftover(m["kind"], m["tag"], final.parent / entry))
    return out


def leftover_names(directory: Path) -> set[str]:
    """Names of the checkpoints in ``directory`` that have hidden leftovers."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    return {m["name"] for m in map(_LEFTOVER.match, names) if m}


def owner_alive(tag: str) -> bool | None:
    """Whether the writer of ``tag`` still runs (``None``: another host, unknown)."""
    host, pid, _ = tag.split("-")
    if host != _HOST:
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename or a new file) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    """Flush one file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` to disk."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(Path(dirpath))


def rmtree(path: Path) -> None:
    """Delete ``path`` (a directory or file) if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        path.unlink()


def commit(staging: Path, final: Path, tag: str, replace: bool) -> None:
    """Rename the finished ``staging`` to ``final``; see the module docstring.

    Args:
        staging: the complete, flushed checkpoint (``sibling(final, "tmp", tag)``).
        final: where it goes.
        tag: the tag of this save.
        replace: ``final`` exists and is to be replaced.
    """
    parent = final.parent
    if replace:
        aside = sibling(final, "old", tag)
        os.rename(final, aside)
        fsync_dir(parent)
        os.rename(staging, final)
        fsync_dir(parent)
        rmtree(aside)
    else:
        os.rename(staging, final)
        fsync_dir(parent)


def readable(final: Path) -> Path | None:
    """The directory a reader should load for ``final``, changing nothing.

    ``final`` itself when it exists; after an overwrite killed between its two
    renames, the new checkpoint if it is complete, else the old one.
    """
    if final.exists():
        return final
    found = leftovers(final)
    for old in (x for x in found if x.kind == "old"):
        new = sibling(final, "tmp", old.tag)
        if _metafile.is_complete(new):
            return new
        if _metafile.is_complete(old.path):
            return old.path
    return None


def repair(final: Path) -> None:
    """Finish or undo interrupted saves of ``final`` by dead writers; drop their debris.

    Leftovers of writers still running (or on other hosts) are left alone.
    """
    found = leftovers(final)
    for old in (x for x in found if x.kind == "old"):
        if owner_alive(old.tag) is not False:
            continue
        new = sibling(final, "tmp", old.tag)
        if not final.exists():
            source = new if _metafile.is_complete(new) else old.path
            os.rename(source, final)
            fsync_dir(final.parent)
        rmtree(old.path)
    for item in leftovers(final):
        if item.kind in ("tmp", "del") and owner_alive(item.tag) is False:
            rmtree(item.path)


def delete(final: Path) -> None:
    """Delete the checkpoint ``final``: hide it with one rename, then remove it."""
    hidden = sibling(final, "del", new_tag())
    os.rename(final, hidden)
    fsync_dir(final.parent)
    rmtree(hidden)
