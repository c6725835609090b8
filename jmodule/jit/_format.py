"""The ``jm.jit`` program file: one file, every part checksummed, versioned.

Layout (all integers little-endian)::

    magic            8 bytes   b"\\x89JMJIT\\r\\n"
    format version   u32
    header length    u64
    header           JSON (utf-8): metadata and a table of parts
    header digest    32 bytes  sha256 of everything above
    parts            concatenated; each part's offset, length and sha256 are in the header

Part names are plain names: one or more components joined by ``/`` (jm
writes ``program``, ``state/0``, ``constant/0``, ``extra/0``), each of
letters, digits, ``_``, ``-`` and ``.``, not starting with ``.``; a name that
could be read as a path elsewhere (absolute, ``..``, a backslash, a NUL) is
refused (:func:`plain_part_name`).

Reading checks, in order: the magic, the format version, the header digest,
the header and its part names, the total length, then the sha256 of every
part, and only then hands anything to a parser. ``jax.export.deserialize``
can abort the process on a damaged artifact, so nothing reaches it
unverified. Digests guard against damage, not against a file rewritten on
purpose: only regular files are read, the header's JSON may nest at most
``MAX_JSON_DEPTH`` levels (a header jm writes is refused at save time if it
would nest deeper), ``_io.load`` checks the header's structure against the
program, and the program part is deserialized, parsed and lowered in a child
process with a time limit (``_validate.verify_program``) before this process
deserializes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from jmodule import _untrusted
from jmodule.jit._errors import IncompatibleVersionError, JitError, ProgramFileError
from jmodule.serialization._errors import saving

MAGIC = b"\x89JMJIT\r\n"
#: Version of this layout and of the metadata in the header.
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIQ")
_DIGEST = 32
_MAX_HEADER = 1 << 30
_PART_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*")
_MAX_PART_NAME = 255


def plain_part_name(name: object) -> bool:
    """Whether ``name`` is a part name a program file may hold (see the module docstring)."""
    return (
        isinstance(name, str)
        and len(name) <= _MAX_PART_NAME
        and _PART_NAME.fullmatch(name) is not None
    )


def encode(meta: Mapping[str, Any], parts: Mapping[str, bytes]) -> bytes:
    """The file's bytes for ``meta`` (JSON-able) and named binary ``parts``."""
    table = []
    offset = 0
    for name, data in parts.items():
        table.append(
            {
                "name": name,
                "offset": offset,
                "length": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        offset += len(data)
    header = json.dumps({"meta": meta, "parts": table, "data_length": offset}).encode()
    depth = _untrusted.json_depth(header)
    if depth > _untrusted.MAX_JSON_DEPTH:
        raise JitError(
            f"Cannot save the program: its description nests {depth} levels deep (deeply "
            f"nested inputs, outputs or extra state), more than the "
            f"{_untrusted.MAX_JSON_DEPTH} jm.jit.load reads. Flatten those structures."
        )
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header))
    digest = hashlib.sha256(prefix + header).digest()
    return b"".join([prefix, header, digest, *parts.values()])


def write(f: str | os.PathLike | BinaryIO, data: bytes) -> None:
    """Write ``data`` to a path (replacing it atomically) or a binary file object.

    A full disk raises ``jm.serialization.DiskFullError``, with nothing left behind.
    """
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        tmp = f"{path}.tmp-{os.getpid()}"
        with saving(Path(os.path.abspath(path)), lambda: len(data)):
            try:
                with open(tmp, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        return
    f.write(data)


def read_bytes(f: str | os.PathLike | BinaryIO) -> tuple[bytes, str]:
    """The bytes of a path or binary file object, and a name for messages."""
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        try:
            src = _untrusted.open_regular(path, ProgramFileError)
        except FileNotFoundError:
            raise FileNotFoundError(f"No jm.jit program file at '{path}'") from None
        with src:
            return src.read(), f"'{path}'"
    name = getattr(f, "name", None)
    where = f"'{name}'" if isinstance(name, str) else "the file object"
    data = f.read()
    if isinstance(data, str):
        raise TypeError(f"{where} is open in text mode; open it with 'rb'")
    return bytes(data), where


def decode(data: bytes, where: str) -> tuple[dict[str, Any], dict[str, memoryview]]:
    """``(meta, parts)`` of a program file, after verifying every checksum.

    Raises:
        ProgramFileError: not a program file, truncated, any checksum fails, or
            the header is not a well-formed table of parts (a part name that is
            not plain included).
        IncompatibleVersionError: written in a newer format.
    """
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        raise ProgramFileError(
            f"{where} is not a jm.jit program file (it does not start with the jm.jit "
            "signature). Save programs with jm.jit.save(script_module, f); checkpoints "
            "written by jm.save are read by jm.load."
        )
    if len(data) < _PREFIX.size:
        raise _truncated(where, len(data), _PREFIX.size)
    _, version, header_len = _PREFIX.unpack_from(data)
    if version > FORMAT_VERSION:
        raise IncompatibleVersionError(
            f"{where} was written in jm.jit program format {version}, newer than the "
            f"format {FORMAT_VERSION} this jmodule reads. Upgrade jmodule to load it."
        )
    if version < 1:
        raise ProgramFileError(f"{where} has an invalid format version ({version}).")
    if header_len > _MAX_HEADER:
        raise ProgramFileError(f"{where} is corrupted: its header length is invalid.")
    body = _PREFIX.size + header_len
    if len(data) < body + _DIGEST:
        raise _truncated(where, len(data), body + _DIGEST)
    if hashlib.sha256(data[:body]).digest() != data[body : body + _DIGEST]:
        raise ProgramFileError(
            f"{where} is corrupted: the checksum of its header does not match. The file "
            "was damaged after it was written; save it again."
        )
    header = _untrusted.loads_json(
        data[_PREFIX.size : body],
        f"the header of {where}",
        ProgramFileError,
        max_bytes=_MAX_HEADER,
        advice="It was rewritten or damaged; save the program again.",
    )
    try:
        if not isinstance(header, dict):
            raise TypeError("not an object")
        table = header["parts"]
        data_length = header["data_length"]
        meta = header["meta"]
        if not isinstance(meta, dict):
            raise TypeError("its metadata is not an object")
        if type(data_length) is not int or data_length < 0:
            raise ValueError(f"bad data length {data_length!r}")
        if not isinstance(table, list):
            raise TypeError("its table of parts is not a list")
        for entry in table:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("sha256"), str)
                and all(type(entry.get(k)) is int and entry[k] >= 0 for k in ("offset", "length"))
            ):
                raise ValueError(f"bad table entry {str(entry)[:100]}")
            if not plain_part_name(entry["name"]):
                raise ValueError(
                    f"a part is named {entry['name'][:60]!r}, which is not a plain part name "
                    "(a path, '..', a separator or a NUL)"
                )
        if len({entry["name"] for entry in table}) != len(table):
            raise ValueError("two parts have the same name")
    except (ValueError, KeyError, TypeError) as e:  # digests passed: a writer bug or a rewrite
        raise ProgramFileError(f"{where} has an unreadable header ({e}).") from None
    start = body + _DIGEST
    if len(data) < start + data_length:
        raise _truncated(where, len(data), start + data_length)
    if len(data) > start + data_length:
        raise ProgramFileError(
            f"{where} is corrupted: it has {len(data) - start - data_length} bytes after "
            "its last part."
        )
    view = memoryview(data)
    parts: dict[str, memoryview] = {}
    for entry in table:
        lo = start + entry["offset"]
        hi = lo + entry["length"]
        if hi > start + data_length:
            raise ProgramFileError(f"{where} is corrupted: part '{entry['name']}' is out of range.")
        chunk = view[lo:hi]
        if hashlib.sha256(chunk).hexdigest() != entry["sha256"]:
            raise ProgramFileError(
                f"{where} is corrupted: the checksum of part '{entry['name']}' does not "
                "match. The file was damaged after it was written; save it again."
            )
        parts[entry["name"]] = chunk
    return meta, parts


def _truncated(where: str, have: int, need: int) -> ProgramFileError:
    return ProgramFileError(
        f"{where} is truncated: it has {have} bytes, the program file needs at least "
        f"{need}. It was probably cut short while being written or copied."
    )
