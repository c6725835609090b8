"""safetensors files (one, or a Hugging Face sharded set) through the safetensors library.

jm adds two metadata entries when it writes a file, both ignored by other
readers and hidden from :func:`read_metadata`: ``jmodule.order`` (the key
order, which the format does not keep) and ``jmodule.checksums`` (each
tensor's CRC-32, dtype and shape, verified when present).
"""

from __future__ import annotations

import collections
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jmodule import _untrusted
from jmodule.serialization import _atomic, _checksum
from jmodule.serialization._errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
)
from jmodule.serialization._map_location import MapLocation

ORDER = "jmodule.order"
CRC = "jmodule.checksums"
_RESERVED = "jmodule."
_MAX_HEADER = 100_000_000  # the safetensors library's own limit
#: The largest ``*.index.json`` jm reads.
MAX_INDEX_BYTES = 64 << 20


def _fatal(e: BaseException) -> bool:
    return isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit))


def _host(x: Any, key: str) -> np.ndarray:
    if "_jm_tensor" in type(x).__dict__:  # a jm.Tensor: its array
        x = x.array
    if not isinstance(x, (jax.Array, np.ndarray, np.generic)):
        raise TypeError(
            f"cannot save '{key}' of type {type(x).__name__} to safetensors, which holds only "
            "arrays; save other values with jm.save to a directory (an Orbax checkpoint)."
        )
    a = np.asarray(x, order="C")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return a


def write(
    obj: Mapping[str, Any],
    path: os.PathLike | str,
    metadata: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a flat ``{name: array}`` mapping as a safetensors file, atomically.

    Raises:
        TypeError: ``obj`` is not a flat mapping of str to arrays, or
            ``metadata`` is not str to str or uses the ``jmodule.`` prefix.
        CheckpointExistsError: the file exists and ``overwrite`` is false.
    """
    from safetensors import TensorSpec, serialize_file

    final = Path(os.path.abspath(os.fspath(path)))
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
        raise TypeError(
            "safetensors holds a flat mapping of str names to arrays (a state_dict); for nested "
            "objects save to a directory (an Orbax checkpoint) instead."
        )
    meta = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise TypeError("safetensors metadata must map str to str")
    if any(k.startswith(_RESERVED) for k in meta):
        raise TypeError(f"metadata keys starting with {_RESERVED!r} are reserved for jmodule")
    if final.exists() and not overwrite:
        raise CheckpointExistsError(
            f"'{final}' already exists; pass overwrite=True to replace it (atomically)."
        )
    arrays = {k: _host(v, k) for k, v in obj.items()}
    crcs = _checksum.crc32_many(list(arrays.values()))()
    meta[ORDER] = json.dumps(list(arrays))
    meta[CRC] = json.dumps(
        {k: [c, a.dtype.name, list(a.shape)] for (k, a), c in zip(arrays.items(), crcs)}
    )
    specs = {
        k: TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
        for k, a in arrays.items()
    }
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _atomic.sibling(final, "tmp", _atomic.new_tag())
    try:
        serialize_file(specs, tmp, metadata=meta)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, final)
        else:
            try:
                os.link(tmp, final)  # fails if the file appeared meanwhile: never clobber
            except FileExistsError:
                raise CheckpointExistsError(f"'{final}' already exists") from None
            except OSError:  # a filesystem without hard links
                os.rename(tmp, final)
            _atomic.rmtree(tmp)
        _atomic.fsync_dir(final.parent)
    finally:
        _atomic.rmtree(tmp)
    del arrays  # kept alive until here: TensorSpec holds raw pointers
    return final


def looks_like(head: bytes, size: int) -> bool:
    """Whether a file that starts with ``head`` (and has ``size`` bytes) is safetensors."""
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 0 < n <= min(_MAX_HEADER, size - 8) and head[8:9] == b"{"


def _header(path: Path) -> dict:
    with _untrusted.open_regular(path, CorruptCheckpointError) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise CorruptCheckpointError(
                f"'{path}' is truncated: {size} bytes, no safetensors header"
            )
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise CorruptCheckpointError(
                f"'{path}' is truncated or corrupted: its header says {n} bytes of JSON, the "
                f"file has {size - 8} after the length"
            )
        raw = f.read(n)
    header = _untrusted.loads_json(
        raw, f"the safetensors header of '{path}'", CorruptCheckpointError, max_bytes=_MAX_HEADER
    )
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"'{path}' has a corrupted safetensors header: not an object")
    return header


def _jm_meta(path: Path, meta: dict[str, str], keys: list[str]) -> tuple[list[str], dict]:
    """(key order, checksums) from jm's metadata entries, if present and consistent."""
    order, crcs = sorted(keys), {}

    def entry(name: str) -> Any:
        return _untrusted.loads_json(
            str(meta[name]).encode(),
            f"the '{name}' metadata of '{path}'",
            CorruptCheckpointError,
            max_bytes=_MAX_HEADER,
        )

    try:
        if ORDER in meta:
            saved = entry(ORDER)
            if not (isinstance(saved, list) and sorted(saved) == sorted(keys)):
                raise ValueError("key order does not list the file's tensors")
            order = saved
        if CRC in meta:
            crcs = entry(CRC)
            if not (isinstance(crcs, dict) and set(crcs) == set(keys)):
                raise ValueError("checksums do not list the file's tensors")
            if not all(isinstance(v, list) and len(v) == 3 for v in crcs.values()):
                raise ValueError("malformed checksums")
    except (ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"'{path}' has corrupted jmodule metadata: {e}") from None
    return order, crcs


def read_metadata(path: os.PathLike | str) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file, without jm's own entries."""
    path = Path(os.fspath(path))
    meta = _header(path).get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"'{path}' has a corrupted safetensors header: bad metadata")
    return {k: v for k, v in meta.items() if not k.startswith(_RESERVED)}


def read_host(path: os.PathLike | str, verify: bool = True) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as numpy arrays, in saved order.

    Raises:
        CorruptCheckpointError: the file is truncated, its header is corrupted,
            or a jm-written checksum does not match.
    """
    from safetensors import safe_open

    path = Path(os.fspath(path))
    try:
        _header(path)  # clear errors for the common damage before the library sees it
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no such file: '{path}'") from None
    try:
        with safe_open(path, framework="np") as f:
            meta = f.metadata() or {}
            keys = list(f.keys())
            order, crcs = _jm_meta(path, meta, keys)
            out = {k: f.get_tensor(k) for k in order}
    except CorruptCheckpointError:
        raise
    except BaseException as e:  # the library raises SafetensorError, and panics on some input
        if _fatal(e):
            raise
        raise CorruptCheckpointError(
            f"'{path}' is not a valid safetensors file: {type(e).__name__}: {e}"
        ) from None
    if verify and crcs:
        got = _checksum.crc32_many(list(out.values()))()
        bad = [
            k for (k, a), c in zip(out.items(), got) if crcs[k] != [c, a.dtype.name, list(a.shape)]
        ]
        if bad:
            raise CorruptCheckpointError(
                f"'{path}' is corrupted: the data, dtype or shape of "
                f"{', '.join(repr(k) for k in bad[:8])} does not match the checksum jm saved "
                "with it"
            )
    return out


def read(path: os.PathLike | str, map_location: Any = None, verify: bool = True) -> dict:
    """Load a safetensors file as ``{name: jax.Array}`` (see ``jm.load``)."""
    place = MapLocation(map_location)
    host = read_host(path, verify)
    place.check_keys(host, path)
    return {k: place.put(a, k) for k, a in host.items()}


def is_index(path: Path) -> bool:
    """Whether ``path`` names a sharded-checkpoint index (``*.index.json``)."""
    return path.name.endswith(".index.json")


def read_index_json(path: Path) -> dict:
    """The parsed ``*.index.json`` at ``path`` (a JSON object).

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        CorruptCheckpointError: not a regular file, too long, too deeply
            nested, or not a JSON object.
    """
    try:
        raw = _untrusted.read_regular(
            path, CorruptCheckpointError, MAX_INDEX_BYTES, "a checkpoint index"
        )
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no such file: '{path}'") from None
    index = _untrusted.loads_json(
        raw,
        f"the checkpoint index '{path}'",
        CorruptCheckpointError,
        max_bytes=MAX_INDEX_BYTES,
        advice="It is not a valid checkpoint index; download or write it again.",
    )
    if not isinstance(index, dict):
        raise CorruptCheckpointError(f"'{path}' is not a valid checkpoint index: not an object")
    return index


def _shard_path(index: Path, name: str) -> Path:
    """Where the shard ``name`` of ``index`` is: a relative path inside the index's directory.

    The name may not leave the directory (``..``, an absolute path, a drive or
    backslash); the file it names may be a symlink to anywhere (a Hugging Face
    hub cache links each shard to ``../../blobs/<hash>``).
    """
    parts = name.split("/")
    if (
        not name
        or "\\" in name
        or "\0" in name
        or name.startswith("/")
        or (os.name == "nt" and ":" in name)
        or any(p in ("", "..") for p in parts)
    ):
        raise CorruptCheckpointError(
            f"'{index}' names the shard '{name}' outside its own directory; refusing it (shard "
            "names are file names relative to the index, without '..')"
        )
    return index.parent.joinpath(*parts)


def read_index(
    path: os.PathLike | str, map_location: Any, verify: bool, read_shard: Any
) -> collections.OrderedDict:
    """Load a Hugging Face sharded checkpoint from its ``*.index.json``.

    Args:
        path: the index file.
        map_location: as for ``jm.load``.
        verify: check checksums where the shards have them.
        read_shard: ``read_shard(path) -> {name: numpy array}`` for one shard file.

    Raises:
        CorruptCheckpointError: the index does not parse, names a missing shard
            or a shard outside its directory, or a shard does not hold exactly
            the tensors the index assigns to it. Shards may be symlinks (a
            Hugging Face hub cache's ``snapshots/<rev>/`` links them into
            ``blobs/``); the names in the index may not leave its directory.
    """
    path = Path(os.path.abspath(os.fspath(path)))  # not resolved: shards sit beside the link
    index = read_index_json(path)
    try:
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise ValueError("weight_map is not a mapping of str to str")
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptCheckpointError(f"'{path}' is not a valid checkpoint index: {e}") from None
    by_shard: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(key)
    tensors: dict[str, np.ndarray] = {}
    for shard, keys in by_shard.items():
        file = _shard_path(path, shard)
        if not file.exists():
            raise CorruptCheckpointError(f"'{path}' names the shard '{shard}', which is missing")
        loaded = read_shard(file, verify)
        if set(loaded) != set(keys):
            missing = sorted(set(keys) - set(loaded))[:8]
            extra = sorted(set(loaded) - set(keys))[:8]
            raise CorruptCheckpointError(
                f"shard '{file}' does not match '{path}': missing {missing}, unexpected {extra}"
            )
        tensors.update(loaded)
    place = MapLocation(map_location)
    place.check_keys(weight_map, path)
    return collections.OrderedDict((k, place.put(tensors[k], k)) for k in weight_map)
