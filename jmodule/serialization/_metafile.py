"""``jmodule.json``: a checkpoint's own description, guarded by a SHA-256.

The file is one header line, then a JSON body::

    jmodule-checkpoint 1 sha256=<hex of body> bytes=<body length>
    {"tree": ..., "arrays": [...], ...}

It is written last, so a directory that has a valid one is complete. The
hash makes a flipped bit anywhere in it (a digit of a stored Python value,
a shape, a checksum) an error rather than a silently different result.

It is read only if it is a regular file of at most :data:`MAX_BYTES` bytes
whose body nests at most ``MAX_JSON_DEPTH`` levels (see ``jmodule._untrusted``):
the hash is no defence against a file rewritten on purpose.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from jmodule import _untrusted
from jmodule.serialization._errors import CorruptCheckpointError

NAME = "jmodule.json"
MAGIC = "jmodule-checkpoint"
VERSION = 1
#: The largest ``jmodule.json`` jm writes or reads.
MAX_BYTES = 1 << 30


def write(directory: Path, body: dict[str, Any]) -> None:
    """Write ``directory/jmodule.json`` and flush it to disk."""
    data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_BYTES:
        raise ValueError(
            f"cannot save '{directory}': its description ({NAME}: the tree and its plain "
            f"Python values) would take {len(data)} bytes, more than the {MAX_BYTES} jm.load "
            "reads; store large Python data (long lists of numbers) as arrays instead."
        )
    digest = hashlib.sha256(data).hexdigest()
    header = f"{MAGIC} {VERSION} sha256={digest} bytes={len(data)}\n".encode()
    with open(directory / NAME, "wb") as f:
        f.write(header + data)
        f.flush()
        os.fsync(f.fileno())


def read(directory: Path) -> dict[str, Any]:
    """The verified body of ``directory/jmodule.json``.

    Raises:
        CorruptCheckpointError: the file is missing, truncated or altered, not
            a regular file, too long or too deeply nested.
    """
    path = directory / NAME
    try:
        raw = _untrusted.read_regular(
            path, CorruptCheckpointError, MAX_BYTES + 200, "a checkpoint's " + NAME
        )
    except FileNotFoundError:
        raise CorruptCheckpointError(
            f"'{directory}' is not a complete jmodule checkpoint: it has no {NAME} (the file "
            "jm.save writes last). It may be an interrupted save or another program's directory."
        ) from None
    except OSError as e:
        raise CorruptCheckpointError(f"cannot read '{path}': {e}") from None
    header, _, data = raw.partition(b"\n")
    fields = header.decode("ascii", "replace").split(" ")
    try:
        magic, version, digest, size = fields
        if magic != MAGIC:
            raise ValueError
        version_no = int(version)
        digest = digest.removeprefix("sha256=")
        size_no = int(size.removeprefix("bytes="))
    except ValueError:
        raise CorruptCheckpointError(
            f"'{path}' is corrupted: its first line is not a jmodule checkpoint header"
        ) from None
    if version_no > VERSION:
        raise CorruptCheckpointError(
            f"'{path}' was written by a newer jmodule (format {version_no}; this one reads up "
            f"to {VERSION}). Upgrade jmodule to load it."
        )
    if len(data) != size_no:
        raise CorruptCheckpointError(
            f"'{path}' is truncated or corrupted: its body has {len(data)} bytes, the header "
            f"says {size_no}"
        )
    if hashlib.sha256(data).hexdigest() != digest:
        raise CorruptCheckpointError(
            f"'{path}' is corrupted: its SHA-256 does not match the one in its header"
        )
    body = _untrusted.loads_json(
        data,
        f"'{path}'",
        CorruptCheckpointError,
        max_bytes=MAX_BYTES,
        advice="It is corrupted or was rewritten; restore the checkpoint from a copy.",
    )
    if not isinstance(body, dict):
        raise CorruptCheckpointError(f"'{path}' is corrupted: its body is not an object")
    return body


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` holds a checkpoint whose metadata verifies."""
    try:
        read(directory)
    except CorruptCheckpointError:
        return False
    return True
