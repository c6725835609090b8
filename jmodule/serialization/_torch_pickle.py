"""Read PyTorch ``.pt`` / ``.bin`` files without PyTorch, refusing pickles that run code.

Both of ``torch.save``'s formats are read:

* zip (PyTorch >= 1.6): ``<archive>/data.pkl`` plus one ``<archive>/data/<key>``
  entry per storage (zip CRC-32s are checked on read);
* legacy (``_use_new_zipfile_serialization=False`` and PyTorch < 1.6): five
  pickles in a row (magic number, protocol, system info, the object, the
  storage keys), then each storage as an int64 element count and its bytes.

Safety: every pickle goes through :mod:`._torch_unpickler`, which refuses
anything but tensors, storages, ``OrderedDict`` and plain containers before a
single opcode runs. Tensors become numpy arrays honouring storage offsets and
strides (views, transposes, expanded tensors); tensors that share a storage
are cut from the same bytes; one tensor saved twice comes back as one array,
and containers the pickle shares (through its memo) stay shared.

Limits, so that a small hostile file cannot take the loader's memory: a
file's tensors may take at most :data:`MAX_EXPANSION` times the bytes of the
storages they view, or :data:`EXPANSION_FLOOR` bytes, whichever is more (a
tiny storage viewed with strides 0 as a huge shape is refused; PyTorch keeps
such a view as a view, jm gives each tensor its own array); a zip record
must hold exactly the bytes its storage needs, checked before it is inflated,
and a compressed record may not inflate to more than :data:`MAX_INFLATION`
times its compressed size once past :data:`INFLATION_FLOOR` (``torch.save``
never compresses). Only regular files are read.
"""

from __future__ import annotations

import collections
import io
import math
import os
import struct
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jmodule import _untrusted
from jmodule.serialization import _torch_unpickler as _u
from jmodule.serialization._errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsafePickleError,
)
from jmodule.serialization._map_location import MapLocation

_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001

#: A file's tensors may take at most this many times the bytes of its storages ...
MAX_EXPANSION = 16
#: ... or this many bytes, whichever is more.
EXPANSION_FLOOR = 64 << 20
#: A compressed zip record may inflate to at most this many times its compressed size ...
MAX_INFLATION = 100
#: ... once it inflates to more than this many bytes.
INFLATION_FLOOR = 16 << 20
_REMEDY = (
    "If you trust the file, load it with torch.load, make its tensors contiguous "
    "(t.contiguous()), and save them again with torch.save."
)


def _ascii(x: Any) -> Any:
    return x.decode("ascii") if isinstance(x, bytes) else x


def _storage_type(x: Any, source: str) -> np.dtype:
    if not isinstance(x, _u.StorageType):
        raise CorruptCheckpointError(f"'{source}' names a storage without a storage type")
    return x.dtype


def _read_zip(path: Path, f: Any) -> Any:
    try:
        zf = zipfile.ZipFile(f)
    except Exception as e:  # BadZipFile, OSError, ValueError, ...
        raise CorruptCheckpointError(f"'{path}' is a damaged zip archive: {e}") from None
    with zf:
        names = zf.namelist()
        pkls = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if not pkls:
            if any(n.endswith("constants.pkl") for n in names):
                raise CheckpointError(
                    f"'{path}' is a TorchScript archive (torch.jit.save); jm.load reads "
                    "torch.save files. Save the model's state_dict() with torch.save instead."
                )
            raise CorruptCheckpointError(f"'{path}' is a zip archive without a data.pkl")
        prefix = pkls[0][: -len("data.pkl")]
        if f"{prefix}constants.pkl" in names:
            raise CheckpointError(
                f"'{path}' is a TorchScript archive (torch.jit.save); jm.load reads torch.save "
                "files. Save the model's state_dict() with torch.save instead."
            )

        def info(name: str) -> zipfile.ZipInfo:
            try:
                found = zf.getinfo(prefix + name)
            except KeyError:
                raise CorruptCheckpointError(f"'{path}' has no record '{name}'") from None
            if (
                found.compress_type != zipfile.ZIP_STORED
                and found.file_size > INFLATION_FLOOR
                and found.file_size > MAX_INFLATION * found.compress_size
            ):
                raise CorruptCheckpointError(
                    f"'{path}' record '{name}' would inflate from {found.compress_size} to "
                    f"{found.file_size} bytes (more than {MAX_INFLATION}x); torch.save never "
                    f"compresses its records, so refusing it. {_REMEDY}"
                )
            return found

        def record(name: str, size: int | None = None) -> bytes:
            entry = info(name)
            limit = entry.file_size if size is None else size
            try:
                with zf.open(entry) as stream:  # inflates at most limit + 1 bytes
                    data = stream.read(limit + 1)
            except Exception as e:  # zipfile raises BadZipFile, RuntimeError, zlib.error, ...
                raise CorruptCheckpointError(f"'{path}' record '{name}' is damaged: {e}") from None
            if len(data) > limit:
                raise CorruptCheckpointError(
                    f"'{path}' record '{name}' holds more than the {limit} bytes it declares"
                )
            return data

        big = f"{prefix}byteorder" in names and record("byteorder", 16) == b"big"
        storages: dict[str, _u.Storage] = {}

        def persistent_load(pid: Any) -> _u.Storage:
            if not (isinstance(pid, tuple) and len(pid) == 5 and _ascii(pid[0]) == "storage"):
                raise CorruptCheckpointError(f"'{path}' has an unknown persistent id {pid!r}")
            _, stype, key, _location, numel = pid
            dtype = _storage_type(stype, str(path))
            key = str(_ascii(key))
            if key not in storages:
                if type(numel) is not int or numel < 0:
                    raise CorruptCheckpointError(f"'{path}' storage '{key}' has a bad size")
                nbytes = numel * dtype.itemsize
                declared = info(f"data/{key}").file_size  # before anything is inflated
                if declared != nbytes:
                    raise CorruptCheckpointError(
                        f"'{path}' is corrupted: storage '{key}' has {declared} bytes, expected "
                        f"{numel} x {dtype.itemsize}"
                    )
                storages[key] = _u.Storage(
                    dtype, numel, key, lambda k=key, n=nbytes: record(f"data/{k}", n)
                )
            return storages[key]

        obj = _u.unpickle(io.BytesIO(record("data.pkl")), str(path), persistent_load)
        held = sum(x.numel * x.dtype.itemsize for x in storages.values())
        return _convert(obj, path, big, held)


def _read_legacy(path: Path, data: bytes) -> Any:
    stream = io.BytesIO(data)

    def refuse(pid: Any) -> Any:
        raise CorruptCheckpointError(f"'{path}' has an unexpected persistent id")

    def next_pickle(persistent_load: Callable[[Any], Any] = refuse) -> Any:
        return _u.unpickle(stream, str(path), persistent_load)

    if next_pickle() != _MAGIC:
        raise CorruptCheckpointError(f"'{path}' is not a PyTorch file (bad magic number)")
    protocol = next_pickle()
    if protocol != _LEGACY_PROTOCOL:
        raise CorruptCheckpointError(f"'{path}' has unknown legacy protocol {protocol!r}")
    info = next_pickle()
    little = not isinstance(info, dict) or info.get("little_endian", True)
    roots: dict[str, _u.Storage] = {}
    views: dict[str, _u.StorageView] = {}

    def persistent_load(pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and _ascii(pid[0]) == "module":
            raise UnsafePickleError(
                f"'{path}' pickles a whole nn.Module (torch.save(model)). {_u.UNSAFE_HELP}"
            )
        if not (isinstance(pid, tuple) and len(pid) == 6 and _ascii(pid[0]) == "storage"):
            raise CorruptCheckpointError(f"'{path}' has an unknown persistent id {pid!r}")
        _, stype, key, _location, numel, view = pid
        dtype = _storage_type(stype, str(path))
        key = str(_ascii(key))
        if key not in roots:
            if type(numel) is not int or numel < 0:
                raise CorruptCheckpointError(f"'{path}' storage '{key}' has a bad size")
            roots[key] = _u.Storage(dtype, numel, key, lambda k=key: raw[k])
        if view is None:
            return roots[key]
        view_key, offset, view_numel = view
        views.setdefault(str(view_key), _u.StorageView(roots[key], offset, view_numel))
        return views[str(view_key)]

    raw: dict[str, bytes] = {}
    obj = next_pickle(persistent_load)
    keys = next_pickle()
    pos = stream.tell()
    if not isinstance(keys, list):
        raise CorruptCheckpointError(f"'{path}' has a corrupted storage key list")
    for key in map(str, keys):
        if key not in roots:
            raise CorruptCheckpointError(f"'{path}' lists storage '{key}' that nothing uses")
        if pos + 8 > len(data):
            raise CorruptCheckpointError(f"'{path}' is truncated in storage '{key}'")
        (numel,) = struct.unpack("<q", data[pos : pos + 8])
        nbytes = numel * roots[key].dtype.itemsize
        if numel != roots[key].numel or pos + 8 + nbytes > len(data):
            raise CorruptCheckpointError(f"'{path}' is truncated or corrupted in storage '{key}'")
        raw[key] = data[pos + 8 : pos + 8 + nbytes]
        pos += 8 + nbytes
    missing = set(roots) - set(raw)
    if missing:
        raise CorruptCheckpointError(f"'{path}' lacks the data of storage(s) {sorted(missing)}")
    return _convert(obj, path, not little, sum(map(len, raw.values())))


def _tensor_view(t: _u.Tensor) -> np.ndarray:
    """A read-only view of ``t``'s elements over its storage's bytes (nothing copied)."""
    storage = t.storage
    if not isinstance(storage, (_u.Storage, _u.StorageView)):
        raise ValueError("a tensor without a storage")
    size, stride, offset = t.size, t.stride, t.offset
    if not (
        isinstance(size, tuple)
        and isinstance(stride, tuple)
        and len(size) == len(stride)
        and all(type(n) is int and n >= 0 for n in (*size, *stride))
        and type(offset) is int
        and offset >= 0
    ):
        raise ValueError(f"a tensor with bad size {size!r}, stride {stride!r} or offset {offset!r}")
    base = storage.data()
    dtype = t.dtype if t.dtype is not None else storage.dtype
    if dtype != base.dtype:
        raw = base.view(np.uint8)
        if raw.size % dtype.itemsize:
            raise ValueError(f"storage of {raw.size} bytes cannot hold {dtype} elements")
        base = raw.view(dtype)
    if math.prod(size) == 0:
        return np.zeros(size, dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= base.size:
        raise ValueError(f"a tensor reaches element {last} of a storage of {base.size}")
    return np.lib.stride_tricks.as_strided(
        base[offset:], shape=size, strides=[s * dtype.itemsize for s in stride], writeable=False
    )


def _tensor_array(view: np.ndarray, t: _u.Tensor, big_endian: bool) -> np.ndarray:
    out = np.array(view)
    if big_endian:
        out = out.byteswap()
    meta = t.metadata
    if isinstance(meta, dict):
        if meta.get("conj"):
            out = np.conj(out)
        if meta.get("neg"):
            out = -out
    return out


def _convert(obj: Any, path: Path, big_endian: bool, held: int) -> Any:
    """Replace tensors (and bare storages, dtypes) by numpy arrays / dtypes.

    Each container is converted once: one the pickle shares (through its
    memo) is shared in the result, so a small pickle of a DAG stays small.
    ``held`` is the number of bytes of the file's storages; the arrays may
    take at most ``max(EXPANSION_FLOOR, MAX_EXPANSION * held)``.

    Raises:
        CorruptCheckpointError: malformed tensors, a container that contains
            itself, or arrays that would take more than the limit.
    """
    done: dict[int, Any] = {}
    active: set[int] = set()
    budget = max(EXPANSION_FLOOR, MAX_EXPANSION * held)
    spent = 0

    def spend(nbytes: int, key: str, how: str) -> None:
        nonlocal spent
        spent += nbytes
        if spent > budget:
            raise CorruptCheckpointError(
                f"'{path}' (key '{key}') would take {spent} bytes as arrays, more than jm reads "
                f"from a file whose storages hold {held} bytes (at most {MAX_EXPANSION}x that, "
                f"or {EXPANSION_FLOOR >> 20} MiB): {how}. PyTorch keeps such a view of a small "
                f"storage as a view; jm gives each tensor its own array. {_REMEDY}"
            )

    def array(x: Any, key: str) -> np.ndarray:
        try:
            if isinstance(x, _u.Tensor):
                view = _tensor_view(x)
                spend(
                    view.nbytes,
                    key,
                    f"it views a storage of {x.storage.numel} elements as shape {x.size} with "
                    f"strides {x.stride}",
                )
                return _tensor_array(view, x, big_endian)
            data = x.data()
            spend(data.nbytes, key, f"it is a storage of {data.nbytes} bytes")
            data = np.array(data)
            return data.byteswap() if big_endian else data
        except (ValueError, TypeError) as e:
            raise CorruptCheckpointError(f"'{path}' (key '{key}') is corrupted: {e}") from None

    def walk(x: Any, key: str) -> Any:
        if isinstance(x, (_u.Tensor, _u.Storage, _u.StorageView)):
            if id(x) not in done:
                done[id(x)] = array(x, key)
            return done[id(x)]
        if isinstance(x, _u.DType):
            return x.dtype
        if not isinstance(x, (dict, list, tuple, set, frozenset)):
            return x
        if id(x) in done:
            return done[id(x)]
        if id(x) in active:
            raise CorruptCheckpointError(
                f"'{path}' (key '{key}') holds a container that contains itself, which no "
                "state_dict does; refusing it."
            )
        active.add(id(x))
        try:
            out = container(x, key)
        finally:
            active.discard(id(x))
        done[id(x)] = out
        return out

    def container(x: Any, key: str) -> Any:
        if isinstance(x, dict):
            kind = collections.OrderedDict if isinstance(x, collections.OrderedDict) else dict
            out = kind((k, walk(v, _join(key, k))) for k, v in dict.items(x))
            meta = vars(x).get("_metadata") if hasattr(x, "__dict__") else None
            if meta is not None:
                out._metadata = walk(meta, _join(key, "_metadata"))
            return out
        return type(x)(walk(v, _join(key, i)) for i, v in enumerate(x))

    try:
        return walk(obj, "")
    except CheckpointError:
        raise
    except RecursionError:
        raise CorruptCheckpointError(f"'{path}' nests containers too deeply") from None
    except Exception as e:  # a hostile pickle can make odd objects out of allowed pieces
        raise CorruptCheckpointError(f"'{path}' holds malformed data: {e}") from None


def _join(prefix: str, key: Any) -> str:
    return str(key) if not prefix else f"{prefix}.{key}"


def is_torch_file(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a ``torch.save`` file (zip or legacy)."""
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def read_host(path: os.PathLike | str) -> Any:
    """The object in a PyTorch file, with tensors as numpy arrays.

    Raises:
        UnsafePickleError: the pickle refers to anything but tensors,
            storages, OrderedDict and plain containers (nothing is run).
        CorruptCheckpointError: the file is truncated or damaged.
        CheckpointError: a TorchScript archive or the pre-1.0 tar format.
    """
    path = Path(os.fspath(path))
    try:
        f = _untrusted.open_regular(path, CorruptCheckpointError)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no such file: '{path}'") from None
    with f:
        head = f.read(4)
        f.seek(0)
        if head.startswith(b"PK\x03\x04"):
            return _read_zip(path, f)
        data = f.read()
    if len(data) > 262 and data[257:262] == b"ustar":
        raise CheckpointError(
            f"'{path}' is in PyTorch's pre-1.0 tar format, which jm does not read; load it "
            "with torch.load and save it again with a current PyTorch."
        )
    if not data:
        raise CorruptCheckpointError(f"'{path}' is empty")
    return _read_legacy(path, data)


def read(path: os.PathLike | str, map_location: Any = None) -> Any:
    """Load a PyTorch file with tensors as ``jax.Array`` (see ``jm.load``)."""
    place = MapLocation(map_location)
    obj = read_host(path)
    if place.per_key:
        place.check_keys(_array_keys(obj, ""), path)
    done: dict[int, Any] = {}  # arrays and containers, each placed or rebuilt once

    def walk(x: Any, key: str) -> Any:
        if id(x) in done:
            return done[id(x)]
        if isinstance(x, np.ndarray):
            out = place.put(x, key)
        elif isinstance(x, dict):
            out = type(x)((k, walk(v, _join(key, k))) for k, v in x.items())
            meta = getattr(x, "_metadata", None)
            if meta is not None:
                out._metadata = meta
        elif isinstance(x, (list, tuple, set, frozenset)):
            out = type(x)(walk(v, _join(key, i)) for i, v in enumerate(x))
        else:
            return x
        done[id(x)] = out
        return out

    return walk(obj, "")


def _array_keys(x: Any, key: str, seen: set[int] | None = None) -> Iterator[str]:
    """The dotted keys of the arrays in ``x``, as :func:`read` names them (shared once)."""
    seen = set() if seen is None else seen
    if id(x) in seen:
        return
    if isinstance(x, np.ndarray):
        seen.add(id(x))
        yield key
    elif isinstance(x, dict):
        seen.add(id(x))
        for k, v in x.items():
            yield from _array_keys(v, _join(key, k), seen)
    elif isinstance(x, (list, tuple, set, frozenset)):
        seen.add(id(x))
        for i, v in enumerate(x):
            yield from _array_keys(v, _join(key, i), seen)


def read_flat(path: os.PathLike | str, verify: bool = True) -> dict[str, np.ndarray]:
    """A shard of a sharded ``.bin`` checkpoint: a flat ``{name: numpy array}``."""
    obj = read_host(path)
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items()
    ):
        raise CorruptCheckpointError(f"'{path}' is not a flat state_dict of tensors")
    return obj
