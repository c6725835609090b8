"""Commit a finished checkpoint directory by renaming it into place.

A save writes everything into a hidden sibling ``.<name>.jm-tmp-<tag>`` and
renames it to ``<name>`` only once complete and flushed, so ``<name>`` either
does not exist or is whole.

Without ``overwrite`` that one ``rename(2)`` is also what makes racing saves
safe. POSIX renames a directory onto an existing path only if that path is an
empty directory; onto a non-empty one it fails (``ENOTEMPTY`` or ``EEXIST``),
onto anything else with ``ENOTDIR``. A checkpoint is never empty (it holds
``jmodule.json``), so of several writers racing for one new name exactly one
rename succeeds and every other one fails and is told the name is taken,
whatever the interleaving: threads, processes, and hosts sharing a filesystem
whose rename is atomic. (Checking for ``<name>`` before writing only fails
early.) A save that loses leaves nothing behind: the caller removes its staging.

Overwriting renames the old checkpoint aside to ``.<name>.jm-old-<tag>``
first, then the new one in, then deletes the old, in a background thread
(deleting hundreds of MB takes about as long as a third of writing them; the
save returns once the new checkpoint is in place, and :func:`settle` waits for
the deletions)::

    killed before the first rename   -> <name> is the old checkpoint
    killed between the two renames   -> <name> is missing; old and new are
                                        both whole on the side: readers use
                                        the new one, the next save renames
                                        it into place
    killed after the second rename   -> <name> is the new checkpoint (and the
                                        old one, on the side, is removed by the
                                        next save or manager start)

If another overwriting writer commits between those two renames, the second
one fails as above; this writer then deletes the checkpoint it moved aside
(``<name>`` holds a newer, complete one) and starts over: the last writer wins.

``<tag>`` names the writer (host hash, pid, random), so leftovers of a writer
that died are told apart from those of one still writing. Leftovers that
cannot be removed (a read-only directory) are left for readers to skip.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
import threading
from pathlib import Path
from typing import NamedTuple

from jmodule.serialization import _metafile, _threads

_HOST = hashlib.blake2s(socket.gethostname().encode(), digest_size=4).hexdigest()
#: ``rename(2)`` errors that mean the destination exists (and is not an empty directory).
_TAKEN = frozenset({errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR})
#: Errors that leave a leftover where it is: a read-only filesystem, no permission,
#: or another process repairing the same leftover at the same moment.
_STUCK = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, *_TAKEN})
#: Rounds of an overwrite that other overwriting writers keep beating to the name.
_ROUNDS = 100
#: Name (prefix) of the threads deleting replaced checkpoints; see :func:`settle`.
_DISCARDING = "jm-discard"
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


def rmtree(path: Path) -> bool:
    """Delete ``path`` (a directory or file) if it exists; whether it is gone.

    Best effort: never raises (it runs while other errors propagate).
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.unlink()
    return not (path.exists() or path.is_symlink())


def discard(path: Path) -> None:
    """Delete ``path`` (hidden, no longer needed) in a background thread.

    The thread is not a daemon: Python waits for it before exiting, so a
    process that ends normally leaves nothing behind; one killed meanwhile
    leaves a hidden leftover that :func:`repair` removes. While Python exits
    (no new thread), it deletes here.
    """
    thread = threading.Thread(target=rmtree, args=(path,), name=f"{_DISCARDING} {path.name}")
    if not _threads.start(thread):
        rmtree(path)


def settle() -> None:
    """Wait until the deletions this process started with :func:`discard` are done."""
    for thread in threading.enumerate():
        if thread.name.startswith(_DISCARDING) and thread is not threading.current_thread():
            thread.join()


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def commit(staging: Path, final: Path, tag: str, overwrite: bool) -> None:
    """Rename the finished ``staging`` to ``final``; see the module docstring.

    Args:
        staging: the complete, flushed checkpoint (``sibling(final, "tmp", tag)``).
        final: where it goes.
        tag: the tag of this save.
        overwrite: replace what is at ``final``; without it ``final`` must not
            exist when the rename happens (an empty directory is replaced).

    Raises:
        FileExistsError: ``overwrite`` is false and ``final`` exists (another
            writer committed first). ``staging`` is left for the caller to remove.
    """
    parent = final.parent
    aside = sibling(final, "old", tag)
    for _ in range(_ROUNDS):
        moved = False
        if overwrite and _exists(final):
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                pass  # another writer moved it aside first
            else:
                moved = True
                fsync_dir(parent)
        try:
            os.rename(staging, final)
        except OSError as e:
            if e.errno not in _TAKEN:
                if moved:  # e.g. the disk is full: put the old checkpoint back
                    with contextlib.suppress(OSError):
                        os.rename(aside, final)
                        fsync_dir(parent)
                raise
            if not _exists(final):
                continue  # deleted meanwhile: try again
            if not overwrite:
                raise FileExistsError(
                    errno.EEXIST, "another save committed a checkpoint there first", str(final)
                ) from None
            if moved:
                rmtree(aside)  # final holds another writer's newer checkpoint
            continue
        fsync_dir(parent)
        if moved:
            discard(aside)
        return
    raise FileExistsError(
        errno.EEXIST, f"other saves kept committing there ({_ROUNDS} rounds)", str(final)
    )


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


def repair(final: Path) -> list[Leftover]:
    """Finish or undo interrupted saves of ``final`` by dead writers; drop their debris.

    Leftovers of writers still running (or on other hosts) are left alone, and
    so are those this process cannot change (a read-only directory, no
    permission): :func:`readable` still finds the right checkpoint among them.

    Returns:
        The dead writers' leftovers that could not be repaired or removed.
    """
    stuck: list[Leftover] = []
    for old in (x for x in leftovers(final) if x.kind == "old"):
        if owner_alive(old.tag) is not False:
            continue
        new = sibling(final, "tmp", old.tag)
        if not final.exists():
            source = new if _metafile.is_complete(new) else old.path
            try:
                os.rename(source, final)
            except OSError as e:
                if e.errno not in _STUCK:
                    raise
                if not final.exists():  # neither put back nor rolled forward: keep both
                    stuck += [old, Leftover("tmp", old.tag, new)] if new.exists() else [old]
                    continue
            else:
                fsync_dir(final.parent)
        if not rmtree(old.path):
            stuck.append(old)
    kept = {x.path for x in stuck}
    for item in leftovers(final):
        if item.kind in ("tmp", "del") and item.path not in kept and owner_alive(item.tag) is False:
            if not rmtree(item.path):
                stuck.append(item)
    return stuck


def delete(final: Path) -> None:
    """Delete the checkpoint ``final``: hide it with one rename, then remove it.

    Nothing happens if it is already gone (another process deleted it).
    """
    hidden = sibling(final, "del", new_tag())
    try:
        os.rename(final, hidden)
    except FileNotFoundError:
        return
    fsync_dir(final.parent)
    rmtree(hidden)
