"""The restricted unpickler for PyTorch files: only tensors, storages and plain data.

Before a pickle is unpickled, :func:`unpickle` checks every global it refers
to (``GLOBAL``/``INST`` names, and ``STACK_GLOBAL`` names that must be plain
strings pushed just before) against :data:`ALLOWED`: tensor rebuild
functions, storage and dtype names, ``OrderedDict``, ``set``, ``frozenset``,
``torch.Size`` and ``_codecs.encode``. Each maps to jm's own stand-in, never
to PyTorch's function; anything else raises :class:`UnsafePickleError` before
a single opcode runs. The stand-ins only record what they are given
(:class:`Tensor`, :class:`Storage`); the reader turns those into arrays.
"""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jmodule.serialization._errors import (
    CheckpointError,
    CorruptCheckpointError,
    UnsafePickleError,
)

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


class DType(_Frozen):
    __slots__ = ("dtype",)

    def __init__(self, name: str):
        self.dtype = jnp.dtype(name)


class StorageType(DType):
    __slots__ = ()


class Storage(_Frozen):
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


class StorageView(_Frozen):
    """A slice of a storage (legacy format's ``view_metadata``)."""

    __slots__ = ("base", "numel", "offset")

    def __init__(self, base: Storage, offset: int, numel: int):
        self.base, self.offset, self.numel = base, offset, numel

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    def data(self) -> np.ndarray:
        full = self.base.data()
        if not (0 <= self.offset and self.offset + self.numel <= full.size):
            raise ValueError(f"storage view out of bounds of storage '{self.base.key}'")
        return full[self.offset : self.offset + self.numel]


class Tensor(_Frozen):
    __slots__ = ("dtype", "metadata", "offset", "size", "storage", "stride")

    def __init__(self, storage, offset, size, stride, dtype=None, metadata=None):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.dtype, self.metadata = dtype, metadata


def _rebuild_tensor(storage, storage_offset, size, stride):
    return Tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):  # fmt: skip
    return Tensor(storage, storage_offset, size, stride, metadata=metadata)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):  # fmt: skip
    if not isinstance(dtype, DType):
        raise ValueError("_rebuild_tensor_v3 without a torch dtype")
    return Tensor(storage, storage_offset, size, stride, dtype=dtype.dtype, metadata=metadata)


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


ALLOWED: dict[tuple[str, str], Any] = {
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
    **{("torch", n): StorageType(d) for n, d in _STORAGE_NAMES.items()},
    ("torch.storage", "UntypedStorage"): StorageType("uint8"),
    **{("torch", n): DType(d) for n, d in _DTYPE_NAMES.items()},
}

UNSAFE_HELP = (
    "jm reads only tensors, storages, OrderedDict and plain containers from PyTorch files, "
    "and refuses anything else because unpickling it can run arbitrary code. If you trust the "
    "file, load it with torch.load(path, weights_only=False), save obj.state_dict() (or the "
    "plain dict) with torch.save, and load that."
)


def _refuse(source: str, module: str, name: str) -> UnsafePickleError:
    return UnsafePickleError(
        f"'{source}' refers to {module}.{name}, which jm will not load. {UNSAFE_HELP}"
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
                if (module, attr) not in ALLOWED:
                    raise _refuse(source, module, attr)
            elif name == "STACK_GLOBAL":
                module, attr = recent[-2:] if len(recent) >= 2 else (None, None)
                if not (isinstance(module, str) and isinstance(attr, str)):
                    raise UnsafePickleError(f"'{source}' builds a global name at run time")
                if (module, attr) not in ALLOWED:
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
    except Exception as e:  # genops raises ValueError and friends on damaged input
        raise CorruptCheckpointError(f"'{source}' holds a corrupted pickle: {e}") from None
    stream.seek(start)


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream: io.BytesIO, source: str, persistent_load: Callable[[Any], Any]):
        super().__init__(stream)
        self._source = source
        self._persistent = persistent_load

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise _refuse(self._source, module, name) from None

    def persistent_load(self, pid: Any) -> Any:
        return self._persistent(pid)


def unpickle(stream: io.BytesIO, source: str, persistent_load: Callable[[Any], Any]) -> Any:
    """Vet, then unpickle, the pickle at ``stream``'s position (which ends after it)."""
    _vet(stream, source)
    try:
        return _Unpickler(stream, source, persistent_load).load()
    except (UnsafePickleError, CheckpointError):
        raise
    except Exception as e:  # a damaged pickle fails in many ways
        raise CorruptCheckpointError(
            f"'{source}' holds a corrupted pickle: {type(e).__name__}: {e}"
        ) from None
