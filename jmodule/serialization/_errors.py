"""Errors raised when a checkpoint or weight file cannot be saved or loaded.

Every message names the file (and, where there is one, the key) and says
what to do about it.
"""

from __future__ import annotations

import os
import pickle


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


class UnsafePickleError(CheckpointError, pickle.UnpicklingError):
    """A PyTorch file holds a pickle that would run code on load.

    Raised before anything in the pickle runs. jm reads only tensors,
    storages, ``OrderedDict`` and plain Python containers and values.
    """


def where(path: os.PathLike | str, key: str | None = None) -> str:
    """``"'path'"`` or ``"'path' (key 'k')"`` for error messages."""
    text = f"'{os.fspath(path)}'"
    return text if key is None else f"{text} (key '{key}')"
