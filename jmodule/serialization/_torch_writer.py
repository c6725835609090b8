"""Write PyTorch's zip format (``torch.save``'s, PyTorch >= 1.6) without PyTorch.

What ``torch.load(path, weights_only=True)`` reads back: tensors (every
dtype torch has a storage type for: float16/bfloat16/float32/float64,
complex, int8/16/32/64, uint8, bool), dicts (``OrderedDict`` included, with
a state_dict's ``_metadata``), lists, tuples, ``int``, ``float``, ``bool``,
``str``, ``None``. Parameters are saved as plain tensors, numpy scalars as
0-d tensors. Anything else raises ``TypeError`` naming its key.

The archive is laid out as ``torch.save`` lays it out:
``<name>/data.pkl`` (a protocol-2 pickle whose tensors are
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False,
OrderedDict())`` and whose storages are persistent ids ``("storage",
torch.<Type>Storage, key, "cpu", numel)``), ``<name>/data/<key>`` (each
storage's raw little-endian bytes, its record aligned to 64 bytes),
``byteorder``, ``version``, ``.format_version``, ``.storage_alignment`` and
``.data/serialization_id``; every record is stored uncompressed. The pickle
is written opcode by opcode here (no ``pickle.Pickler``: it would look the
torch globals up), so nothing imports torch.

One array saved under several keys is one storage (torch loads the tensors
sharing it, as it saves them).
"""

from __future__ import annotations

import collections
import io
import os
import re
import secrets
import struct
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jmodule._lowering import state
from jmodule.serialization import _atomic
from jmodule.serialization._errors import CheckpointExistsError
from jmodule.serialization._tree import MAX_DEPTH

#: numpy dtype name -> torch storage class name.
_STORAGE = {
    "float16": "HalfStorage",
    "bfloat16": "BFloat16Storage",
    "float32": "FloatStorage",
    "float64": "DoubleStorage",
    "complex64": "ComplexFloatStorage",
    "complex128": "ComplexDoubleStorage",
    "int8": "CharStorage",
    "int16": "ShortStorage",
    "int32": "IntStorage",
    "int64": "LongStorage",
    "uint8": "ByteStorage",
    "bool": "BoolStorage",
}
_ALIGN = 64
#: Nesting deeper than this is refused, as for every jm.save (no state_dict nests so deep).
_MAX_DEPTH = MAX_DEPTH


class _Pickle:
    """A protocol-2 pickle of plain containers and tensors, emitted opcode by opcode."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        #: Per saved object's id: its storage key, host array and the object (kept
        #: alive, so that ids stay unique while writing).
        self.storages: dict[int, tuple[str, np.ndarray, Any]] = {}
        self.memo: dict[str, int] = {}
        self.out.write(b"\x80\x02")  # PROTO 2

    def w(self, b: bytes) -> None:
        self.out.write(b)

    def put(self) -> int:
        """Memoize the top of the stack (BINPUT/LONG_BINPUT); its memo index."""
        i = len(self.memo)
        self.w(b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i))
        return i

    def get(self, i: int) -> None:
        self.w(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))

    def glob(self, module: str, name: str) -> None:
        key = f"{module}\n{name}\n"
        if key in self.memo:
            self.get(self.memo[key])
            return
        self.w(b"c" + key.encode("ascii"))
        self.memo[key] = self.put()

    def str_(self, s: str) -> None:
        b = s.encode("utf-8", "surrogatepass")
        self.w(b"X" + struct.pack("<I", len(b)) + b)

    def int_(self, n: int) -> None:
        if 0 <= n < 256:
            self.w(b"K" + bytes([n]))
        elif 0 <= n < 65536:
            self.w(b"M" + struct.pack("<H", n))
        elif -(2**31) <= n < 2**31:
            self.w(b"J" + struct.pack("<i", n))
        else:
            raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
            self.w(b"\x8a" + bytes([len(raw)]) + raw)

    def tuple_(self, items: list[Any], key: str, depth: int) -> None:
        if not items:
            self.w(b")")
            return
        if len(items) <= 3:
            for v in items:
                self.value(v, key, depth)
            self.w(b"\x85\x86\x87"[len(items) - 1 : len(items)])
            return
        self.w(b"(")
        for v in items:
            self.value(v, key, depth)
        self.w(b"t")

    def ordered_dict(self) -> None:
        self.glob("collections", "OrderedDict")
        self.w(b")R")  # OrderedDict()

    def items(self, pairs: list[tuple[Any, Any]], key: str, depth: int) -> None:
        for start in range(0, len(pairs), 1000):  # as pickle batches SETITEMS
            self.w(b"(")
            for k, v in pairs[start : start + 1000]:
                self.value(k, key, depth)
                self.value(v, _join(key, k), depth)
            self.w(b"u")

    def tensor(self, x: Any, key: str) -> None:
        found = self.storages.get(id(x))
        if found is None:
            a = _host(x, key)
            if a.dtype.name not in _STORAGE:
                raise TypeError(
                    f"cannot save '{key}' (dtype {a.dtype}) to a PyTorch file: torch has no "
                    f"storage type for it (jm writes {', '.join(_STORAGE)})."
                )
            found = self.storages[id(x)] = (str(len(self.storages)), a, x)
        skey, a, _ = found
        kind = _STORAGE[a.dtype.name]
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.w(b"(")  # the arguments
        self.w(b"(")  # the persistent id
        self.str_("storage")
        self.glob("torch", kind)
        self.str_(skey)
        self.str_("cpu")
        self.int_(a.size)
        self.w(b"tQ")  # TUPLE, BINPERSID
        self.int_(0)
        self.tuple_(list(a.shape), key, 0)
        self.tuple_(list(_strides(a.shape)), key, 0)
        self.w(b"\x89")  # requires_grad=False
        self.ordered_dict()  # backward_hooks
        self.w(b"tR")

    def value(self, x: Any, key: str, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise TypeError(
                f"cannot save '{key}': it is nested more than {_MAX_DEPTH} containers deep "
                "(or contains itself)"
            )
        depth += 1
        if x is None:
            self.w(b"N")
        elif x is True:
            self.w(b"\x88")
        elif x is False:
            self.w(b"\x89")
        elif type(x) is int or (isinstance(x, int) and not isinstance(x, (bool, np.integer))):
            self.int_(int(x))
        elif isinstance(x, float) and not isinstance(x, np.floating):
            self.w(b"G" + struct.pack(">d", float(x)))
        elif isinstance(x, str):
            self.str_(str(x))
        elif state.is_cell(x) or isinstance(x, (jax.Array, np.ndarray, np.generic)):
            self.tensor(x, key)
        elif "_jm_tensor" in type(x).__dict__:  # a jm.Tensor: its array
            self.tensor(x.array, key)
        elif isinstance(x, jax.ShapeDtypeStruct):
            raise TypeError(f"cannot save '{key}': it is a meta array (shape and dtype, no data)")
        elif isinstance(x, Mapping):
            pairs = list(x.items())
            for k, _ in pairs:
                if not (k is None or isinstance(k, (str, int, float, tuple))):
                    raise TypeError(
                        f"cannot save '{key}' to a PyTorch file: key {k!r} of type "
                        f"{type(k).__name__} (keys may be str, int, float, tuples of them, None)"
                    )
            if isinstance(x, collections.OrderedDict):
                self.ordered_dict()
            elif type(x) is dict:
                self.w(b"}")
            else:
                raise _unsupported(x, key)
            self.items(pairs, key, depth)
            meta = getattr(x, "_metadata", None) if type(x) is not dict else None
            if meta is not None:  # a state_dict's versions, as torch pickles them: BUILD
                self.w(b"}")
                self.str_("_metadata")
                self.value(meta, _join(key, "_metadata"), depth)
                self.w(b"sb")
        elif type(x) is list:
            self.w(b"]")
            for start in range(0, len(x), 1000):
                self.w(b"(")
                for i, v in enumerate(x[start : start + 1000], start):
                    self.value(v, _join(key, i), depth)
                self.w(b"e")
        elif type(x) is tuple:
            self.tuple_(list(x), key, depth)
        else:
            raise _unsupported(x, key)


def _unsupported(x: Any, key: str) -> TypeError:
    return TypeError(
        f"cannot save '{key or '<root>'}' of type {type(x).__name__} to a PyTorch file, which "
        "jm writes weights-only (what torch.load(..., weights_only=True) reads): arrays, "
        "dict/OrderedDict, list, tuple, int, float, bool, str and None. Save other objects with "
        "jm.save to a directory (an Orbax checkpoint)."
    )


def _join(prefix: str, key: Any) -> str:
    return str(key) if not prefix else f"{prefix}.{key}"


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _host(x: Any, key: str) -> np.ndarray:
    v = state.peek(x) if state.is_cell(x) else x
    if isinstance(v, jax.ShapeDtypeStruct):
        raise TypeError(f"cannot save '{key}': it is on the meta device (no data)")
    if isinstance(v, jax.core.Tracer):
        raise TypeError(f"cannot save '{key}': it is a traced value (inside jm.compile/jax.jit)")
    a = np.asarray(v, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if sys.byteorder == "big":
        a = a.byteswap()  # torch's files are little-endian (its "byteorder" record)
    return a


def _archive_name(final: Path) -> str:
    stem = final.name.split(".")[0]
    return stem if re.fullmatch(r"[A-Za-z0-9_]{1,64}", stem) else "archive"


def _record(zf: zipfile.ZipFile, name: str, data: bytes | memoryview) -> None:
    """One stored record, its data aligned to :data:`_ALIGN` bytes (as torch aligns)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    start = zf.fp.tell() + 30 + len(name.encode())
    pad = -start % _ALIGN
    if pad:  # an extra field of kind "FB" (torch's) holding zeros
        pad = pad + _ALIGN if pad < 4 else pad
        info.extra = b"FB" + struct.pack("<H", pad - 4) + bytes(pad - 4)
    with zf.open(info, "w", force_zip64=len(data) > 0x7FFF0000) as f:
        f.write(data)


def encode(obj: Any) -> tuple[bytes, list[tuple[str, np.ndarray]]]:
    """``obj``'s ``data.pkl`` and its storages ``(key, array)``, in key order."""
    p = _Pickle()
    p.value(obj, "")
    p.w(b".")
    return p.out.getvalue(), [(k, a) for k, a, _ in p.storages.values()]


def write(obj: Any, path: os.PathLike | str, overwrite: bool = False) -> Path:
    """Write ``obj`` as a PyTorch zip file at ``path``, atomically.

    Everything goes to a hidden sibling, is flushed to disk and then linked
    (or, with ``overwrite``, renamed) into place, so ``path`` is either the
    old file (or nothing) or the whole new one. The hidden file of a save
    that was killed is removed by the next save to ``path``.

    Raises:
        TypeError: ``obj`` holds something a weights-only file cannot (named by key).
        CheckpointExistsError: the file exists and ``overwrite`` is false.
    """
    final = Path(os.path.abspath(os.fspath(path)))
    if final.exists() and not overwrite:
        raise CheckpointExistsError(
            f"'{final}' already exists; pass overwrite=True to replace it (atomically)."
        )
    pickle_bytes, storages = encode(obj)  # TypeError before anything is written
    name = _archive_name(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _atomic.repair(final)  # temporary files of killed saves (their writers are gone)
    tmp = _atomic.sibling(final, "tmp", _atomic.new_tag())
    try:
        with open(tmp, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                _record(zf, f"{name}/data.pkl", pickle_bytes)
                _record(zf, f"{name}/.format_version", b"1")
                _record(zf, f"{name}/.storage_alignment", str(_ALIGN).encode())
                _record(zf, f"{name}/byteorder", b"little")
                for key, a in storages:
                    _record(zf, f"{name}/data/{key}", memoryview(a.reshape(-1).view(np.uint8)))
                _record(zf, f"{name}/version", b"3\n")
                ident = "".join(str(secrets.randbelow(10)) for _ in range(40))
                _record(zf, f"{name}/.data/serialization_id", ident.encode())
            f.flush()
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
        _atomic.fsync_dir(final.parent)
    finally:
        _atomic.rmtree(tmp)
    return final


def nbytes(obj: Any) -> int | None:
    """About how many bytes the file of ``obj`` takes (for a full disk's message)."""
    try:
        _, storages = encode(obj)
    except TypeError:
        return None
    return sum(a.nbytes + 2 * _ALIGN for _, a in storages) + 4096
