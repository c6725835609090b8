"""Read PyTorch ``.pt`` / ``.bin`` files without PyTorch, refusing pickles that run code.

Both of ``torch.save``'s formats are read:

* zip (PyTorch >= 1.6): ``<archive>/data.pkl`` plus one ``<archive>/data/<key>``
  entry per storage (zip CRC-32s are checked on read);
* legacy (``_use_new_zipfile_serialization=False`` and PyTorch < 1.6): five
  pickles in a row (magic number, protocol, system info, the object, the
  storage keys), then each storage as an int64 element count and its bytes.

Safety: before a pickle is unpickled, every global it refers to is checked
against a short list (tensor rebuild functions, storage and dtype names,
``OrderedDict``, ``set``, ``_codecs.encode``), and each is mapped to jm's own
stand-in, never to PyTorch's function. Anything else raises
:class:`UnsafePickleError` before a single opcode runs. Tensors become numpy
arrays honouring storage offsets and strides; tensors that share a storage
are cut from the same bytes.
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import pickletools
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from jmodule.serialization._errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsafePickleError,
)
from jmodule.serialization._placement import Placement

_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001

_DTYPE_NAMES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
    "complex64": "complex64", "cfloat": "complex64",
    "complex128": "complex128", "cdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
}  # fmt: skip
_STORAGE_NAMES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UntypedStorage": "uint8",
}  # fmt: skip


class _Frozen:
    """Stand-ins refuse pickle's BUILD, so a pickle cannot rewrite their fields."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise UnsafePickleError("the pickle tries to set the state of a tensor or storage")


class _DType(_Frozen):
    __slots__ = ("dtype",)

    def __init__(self, name: str):
        self.dtype = jnp.dtype(name)


class _StorageType(_DType):
    __slots__ = ()


class _Storage(_Frozen):
    """A storage: ``numel`` elements of ``dtype``, read on first use."""

    __slots__ = ("_data", "dtype", "fetch", "key", "numel")

    def __init__(self, dtype: np.dtype, numel: int, key: str, fetch: Callable[[], bytes]):
        self.dtype, self.numel, self.key, self.fetch = dtype, numel, key, fetch
        self._data: np.ndarray | None = None

    def data(self) -> np.ndarray:
        if self._data is None:
            raw = self.fetch()
            if len(raw) != self.numel * self.dtype.itemsize:
                raise ValueError(
                    f"storage '{self.key}' has {len(raw)} bytes, expected "
                    f"{self.numel} x {self.dtype.itemsize}"
                )
            self._data = np.frombuffer(raw, dtype=self.dtype)
        return self._data


class _StorageView(_Frozen):
    """A slice of a storage (legacy format's ``view_metadata``)."""

    __slots__ = ("base", "numel", "offset")

    def __init__(self, base: _Storage, offset: int, numel: int):
        self.base, self.offset, self.numel = base, offset, numel

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    def data(self) -> np.ndarray:
        full = self.base.data()
        if not (0 <= self.offset and self.offset + self.numel <= full.size):
            raise ValueError(f"storage view out of bounds of storage '{self.base.key}'")
        return full[self.offset : self.offset + self.numel]


class _Tensor(_Frozen):
    __slots__ = ("dtype", "metadata", "offset", "size", "storage", "stride")

    def __init__(self, storage, offset, size, stride, dtype=None, metadata=None):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.dtype, self.metadata = dtype, metadata


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _Tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):  # fmt: skip
    return _Tensor(storage, storage_offset, size, stride, metadata=metadata)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):  # fmt: skip
    if not isinstance(dtype, _DType):
        raise ValueError("_rebuild_tensor_v3 without a torch dtype")
    return _Tensor(storage, storage_offset, size, stride, dtype=dtype.dtype, metadata=metadata)


def _rebuild_parameter(data, requires_grad, backward_hooks):
    return data


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    return data


def _encode(text, encoding="latin1"):
    """``_codecs.encode`` as protocol-2 pickles use it for ``bytes`` (str -> bytes only)."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "ascii"):
        raise UnsafePickleError("_codecs.encode used for something other than bytes")
    return text.encode(encoding)


def _size(*args):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("_codecs", "encode"): _encode,
    ("torch", "Size"): _size,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
    **{("torch", n): _StorageType(d) for n, d in _STORAGE_NAMES.items()},
    ("torch.storage", "UntypedStorage"): _StorageType("uint8"),
    **{("torch", n): _DType(d) for n, d in _DTYPE_NAMES.items()},
}

_UNSAFE_HELP = (
    "jm reads only tensors, storages, OrderedDict and plain containers from PyTorch files, "
    "and refuses anything else because unpickling it can run arbitrary code. If you trust the "
    "file, load it with torch.load(path, weights_only=False), save obj.state_dict() (or the "
    "plain dict) with torch.save, and load that."
)


def _refuse(source: str, module: str, name: str) -> UnsafePickleError:
    return UnsafePickleError(
        f"'{source}' refers to {module}.{name}, which jm will not load. {_UNSAFE_HELP}"
    )


_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
               "BINSTRING", "SHORT_BINSTRING"}  # fmt: skip
_MEMO_PUT = {"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_FORBIDDEN = {"EXT1", "EXT2", "EXT4"}


def _vet(stream: io.BytesIO, source: str) -> None:
    """Check every global the pickle at ``stream``'s position uses; leave the position there.

    Raises:
        UnsafePickleError: a global outside the allowed list, or one whose
            name cannot be read without running the pickle.
        CorruptCheckpointError: not a well-formed pickle.
    """
    memo: dict[int, Any] = {}
    recent: list[Any] = []  # values of the last pushes (str, or None for anything else)
    start = stream.tell()
    try:
        for op, arg, _ in pickletools.genops(stream):
            name = op.name
            if name in _FORBIDDEN:
                raise UnsafePickleError(f"'{source}' uses the pickle extension registry ({name})")
            if name in ("GLOBAL", "INST"):
                module, _, attr = arg.partition(" ")
                if (module, attr) not in _ALLOWED:
                    raise _refuse(source, module, attr)
            elif name == "STACK_GLOBAL":
                module, attr = recent[-2:] if len(recent) >= 2 else (None, None)
                if not (isinstance(module, str) and isinstance(attr, str)):
                    raise UnsafePickleError(f"'{source}' builds a global name at run time")
                if (module, attr) not in _ALLOWED:
                    raise _refuse(source, module, attr)
            if name in _MEMO_PUT:
                memo[len(memo) if name == "MEMOIZE" else arg] = recent[-1] if recent else None
            elif name in _MEMO_GET:
                recent.append(memo.get(arg))
            elif name in _STRING_OPS:
                recent.append(arg if isinstance(arg, str) else arg.decode("latin1"))
            elif name != "PROTO" and name != "FRAME":
                recent.append(None)
            del recent[:-2]
    except UnsafePickleError:
        raise
    except Exception as e:
        raise CorruptCheckpointError(f"'{source}' holds a corrupted pickle: {e}") from None
    stream.seek(start)


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream: io.BytesIO, source: str, persistent_load: Callable[[Any], Any]):
        super().__init__(stream)
        self._source = source
        self._persistent = persistent_load

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _refuse(self._source, module, name) from None

    def persistent_load(self, pid: Any) -> Any:
        return self._persistent(pid)


def _unpickle(stream: io.BytesIO, source: str, persistent_load: Callable[[Any], Any]) -> Any:
    """Vet, then unpickle, the pickle at ``stream``'s position (which ends after it)."""
    _vet(stream, source)
    try:
        return _Unpickler(stream, source, persistent_load).load()
    except (UnsafePickleError, CheckpointError):
        raise
    except Exception as e:
        raise CorruptCheckpointError(
            f"'{source}' holds a corrupted pickle: {type(e).__name__}: {e}"
        ) from None


def _ascii(x: Any) -> Any:
    return x.decode("ascii") if isinstance(x, bytes) else x


def _storage_type(x: Any, source: str) -> np.dtype:
    if not isinstance(x, _StorageType):
        raise CorruptCheckpointError(f"'{source}' names a storage without a storage type")
    return x.dtype


def _read_zip(path: Path) -> Any:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
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

        def record(name: str) -> bytes:
            try:
                return zf.read(prefix + name)
            except KeyError:
                raise CorruptCheckpointError(f"'{path}' has no record '{name}'") from None
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
                raise CorruptCheckpointError(f"'{path}' record '{name}' is damaged: {e}") from None

        big = f"{prefix}byteorder" in names and record("byteorder") == b"big"
        storages: dict[str, _Storage] = {}

        def persistent_load(pid: Any) -> _Storage:
            if not (isinstance(pid, tuple) and len(pid) == 5 and _ascii(pid[0]) == "storage"):
                raise CorruptCheckpointError(f"'{path}' has an unknown persistent id {pid!r}")
            _, stype, key, _location, numel = pid
            dtype = _storage_type(stype, str(path))
            key = str(_ascii(key))
            if key not in storages:
                if type(numel) is not int or numel < 0:
                    raise CorruptCheckpointError(f"'{path}' storage '{key}' has a bad size")
                storages[key] = _Storage(dtype, numel, key, lambda k=key: record(f"data/{k}"))
            return storages[key]

        obj = _unpickle(io.BytesIO(record("data.pkl")), str(path), persistent_load)
        return _convert(obj, path, big)


def _read_legacy(path: Path, data: bytes) -> Any:
    stream = io.BytesIO(data)

    def refuse(pid: Any) -> Any:
        raise CorruptCheckpointError(f"'{path}' has an unexpected persistent id")

    def next_pickle(persistent_load: Callable[[Any], Any] = refuse) -> Any:
        return _unpickle(stream, str(path), persistent_load)

    if next_pickle() != _MAGIC:
        raise CorruptCheckpointError(f"'{path}' is not a PyTorch file (bad magic number)")
    protocol = next_pickle()
    if protocol != _LEGACY_PROTOCOL:
        raise CorruptCheckpointError(f"'{path}' has unknown legacy protocol {protocol!r}")
    info = next_pickle()
    little = not isinstance(info, dict) or info.get("little_endian", True)
    roots: dict[str, _Storage] = {}
    views: dict[str, _StorageView] = {}

    def persistent_load(pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and _ascii(pid[0]) == "module":
            raise UnsafePickleError(
                f"'{path}' pickles a whole nn.Module (torch.save(model)). {_UNSAFE_HELP}"
            )
        if not (isinstance(pid, tuple) and len(pid) == 6 and _ascii(pid[0]) == "storage"):
            raise CorruptCheckpointError(f"'{path}' has an unknown persistent id {pid!r}")
        _, stype, key, _location, numel, view = pid
        dtype = _storage_type(stype, str(path))
        key = str(_ascii(key))
        if key not in roots:
            if type(numel) is not int or numel < 0:
                raise CorruptCheckpointError(f"'{path}' storage '{key}' has a bad size")
            roots[key] = _Storage(dtype, numel, key, lambda k=key: raw[k])
        if view is None:
            return roots[key]
        view_key, offset, view_numel = view
        views.setdefault(str(view_key), _StorageView(roots[key], offset, view_numel))
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
    return _convert(obj, path, not little)


def _tensor_array(t: _Tensor, big_endian: bool) -> np.ndarray:
    storage = t.storage
    if not isinstance(storage, (_Storage, _StorageView)):
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
    view = np.lib.stride_tricks.as_strided(
        base[offset:], shape=size, strides=[s * dtype.itemsize for s in stride], writeable=False
    )
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


def _convert(obj: Any, path: Path, big_endian: bool) -> Any:
    """Replace tensors (and bare storages, dtypes) by numpy arrays / dtypes."""
    done: dict[int, Any] = {}

    def walk(x: Any, key: str) -> Any:
        if isinstance(x, (_Tensor, _Storage, _StorageView)):
            if id(x) not in done:
                try:
                    if isinstance(x, _Tensor):
                        done[id(x)] = _tensor_array(x, big_endian)
                    else:
                        data = np.array(x.data())
                        done[id(x)] = data.byteswap() if big_endian else data
                except (ValueError, TypeError) as e:
                    raise CorruptCheckpointError(
                        f"'{path}' (key '{key}') is corrupted: {e}"
                    ) from None
            return done[id(x)]
        if isinstance(x, _DType):
            return x.dtype
        if isinstance(x, dict):
            out = type(x)((k, walk(v, _join(key, k))) for k, v in x.items())
            meta = getattr(x, "_metadata", None)
            if meta is not None:
                out._metadata = walk(meta, _join(key, "_metadata"))
            return out
        if isinstance(x, (list, tuple, set, frozenset)):
            return type(x)(walk(v, _join(key, i)) for i, v in enumerate(x))
        return x

    try:
        return walk(obj, "")
    except RecursionError:
        raise CorruptCheckpointError(f"'{path}' nests containers too deeply") from None


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
    if not path.exists():
        raise CheckpointNotFoundError(f"no such file: '{path}'")
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK\x03\x04"):
        return _read_zip(path)
    data = path.read_bytes()
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
    place = Placement(map_location)
    obj = read_host(path)
    placed: dict[int, Any] = {}

    def walk(x: Any, key: str) -> Any:
        if isinstance(x, np.ndarray):
            if id(x) not in placed:
                placed[id(x)] = place.put(x, key)
            return placed[id(x)]
        if isinstance(x, dict):
            out = type(x)((k, walk(v, _join(key, k))) for k, v in x.items())
            meta = getattr(x, "_metadata", None)
            if meta is not None:
                out._metadata = meta
            return out
        if isinstance(x, (list, tuple, set, frozenset)):
            return type(x)(walk(v, _join(key, i)) for i, v in enumerate(x))
        return x

    return walk(obj, "")


def read_flat(path: os.PathLike | str, verify: bool = True) -> dict[str, np.ndarray]:
    """A shard of a sharded ``.bin`` checkpoint: a flat ``{name: numpy array}``."""
    obj = read_host(path)
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items()
    ):
        raise CorruptCheckpointError(f"'{path}' is not a flat state_dict of tensors")
    return obj
