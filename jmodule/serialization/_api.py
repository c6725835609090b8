"""``jm.save`` / ``jm.load``: one entry point for every format jm reads and writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from jmodule import _untrusted
from jmodule._lowering import tracebacks as _tracebacks
from jmodule.serialization import _directory, _errors, _safetensors, _torch_pickle, _torch_writer
from jmodule.serialization._errors import CorruptCheckpointError

#: Paths that get a PyTorch zip file (``torch.save``'s format, weights only).
_TORCH_SUFFIXES = (".pt", ".pth", ".bin")
#: Paths of general pickles, which jm does not write.
_PICKLE_SUFFIXES = (".pkl", ".pickle")


@_tracebacks.entry
def save(
    obj: Any,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    metadata: dict[str, str] | None = None,
) -> None:
    """Save a state_dict (or nested dicts of them and plain values) to ``path``.

    A path ending in ``.safetensors`` gets a safetensors file (a flat mapping
    of names to arrays only). A path ending in ``.pt``, ``.pth`` or ``.bin``
    gets a PyTorch zip file, ``torch.save``'s format, written without
    PyTorch and weights only: what ``torch.load(path, weights_only=True)``
    reads (arrays of every dtype torch has, bfloat16 and float16 included;
    dict, ``OrderedDict`` with a state_dict's ``_metadata``, list, tuple,
    int, float, bool, str, None); other objects raise ``TypeError``. Unlike
    ``torch.save``, an existing file is replaced only with ``overwrite=True``.
    Any other path becomes an Orbax checkpoint
    directory: arrays of every dtype (bfloat16 and float16 included), plain
    Python values (``int``, ``float``, ``str``, ``bool``, ``None``, lists,
    tuples, ``bytes``), keys, key order and ``OrderedDict`` come back exactly,
    and every array carries a CRC-32 that :func:`load` checks.

    The save is atomic and durable: everything is written to a hidden sibling,
    flushed to disk and renamed into place. A save killed at any moment never
    leaves a partial checkpoint: ``load(path)`` then gives the previous
    checkpoint (nothing, for a first save) or, once it was complete, the new
    one; the next save to ``path`` tidies up what the killed one left.
    (Orbax's own ``force=True`` deletes the old checkpoint before writing.)

    Saves racing for one new ``path`` (threads, processes) never overwrite
    each other without ``overwrite=True``: exactly one succeeds, the others
    raise :class:`~jmodule.serialization.CheckpointExistsError`. With
    ``overwrite=True`` they all succeed and the last to finish is kept.

    In a job of several ``jax.distributed`` processes, every process calls
    ``save`` with the same ``obj`` structure and the same ``path`` on a shared
    filesystem: each writes only the shards it holds (nothing is gathered),
    and process 0 commits once all are on disk. A process that fails before
    the others reach the next collective leaves them waiting for it, as with
    any collective.

    Args:
        obj: what to save; numpy scalars are saved as 0-d arrays.
        path: a directory to create, or a ``.safetensors`` or ``.pt``/``.pth``/``.bin``
            file.
        overwrite: replace an existing checkpoint at ``path`` (atomically).
        metadata: str-to-str notes stored with the checkpoint; read them back
            with :func:`read_metadata` (PyTorch files carry none: ``ValueError``).

    Raises:
        CheckpointExistsError: ``path`` exists and ``overwrite`` is false (or
            another save created it meanwhile).
        DiskFullError: the disk filled up; the message gives the size needed
            and the space free, and nothing half-written is left behind.
        NotWritableError: ``path``'s directory is read-only or not ours to write.
        TypeError: ``obj`` holds a value jm cannot store (its key is named).
        ValueError: ``path`` ends in ``.pkl``/``.pickle``: jm does not write
            general pickles; or ``metadata`` for a PyTorch file.

    >>> import tempfile, jax.numpy as jnp, jmodule as jm
    >>> d = tempfile.mkdtemp()
    >>> jm.save({"w": jnp.ones((2, 2)), "epoch": 3}, f"{d}/ckpt")
    >>> jm.load(f"{d}/ckpt")["epoch"]
    3
    >>> jm.save({"w": jnp.ones((2, 2))}, f"{d}/w.pt")  # torch.load(..., weights_only=True) reads it
    >>> jm.load(f"{d}/w.pt")["w"].shape
    (2, 2)
    """
    p = Path(os.fspath(path))
    if p.suffix == ".safetensors":
        final = Path(os.path.abspath(p))
        # The writer removes its temporary file before an error leaves it.
        with _errors.saving(final, lambda: _nbytes(obj), keeps_old=overwrite and final.exists()):
            _safetensors.write(obj, p, metadata=metadata, overwrite=overwrite)
        return
    if p.suffix in _TORCH_SUFFIXES:
        if metadata is not None:
            raise ValueError(
                f"PyTorch files carry no metadata ('{p}'): save to "
                f"'{p.with_suffix('.safetensors')}' or to a directory (an Orbax checkpoint) "
                "to keep it."
            )
        final = Path(os.path.abspath(p))
        with _errors.saving(
            final, lambda: _torch_writer.nbytes(obj), keeps_old=overwrite and final.exists()
        ):
            _torch_writer.write(obj, p, overwrite=overwrite)
        return
    if p.suffix in _PICKLE_SUFFIXES:
        raise ValueError(
            f"jm.save does not write general pickles ('{p}'): pickles run code when loaded. "
            f"Save to '{p.with_suffix('.pt')}' (PyTorch's weights-only format), to a directory "
            f"(an Orbax checkpoint, e.g. '{p.with_suffix('')}') or to "
            f"'{p.with_suffix('.safetensors')}'."
        )
    _directory.write(_directory.prepare(obj, metadata), p, overwrite=overwrite)


def _nbytes(obj: Any) -> int | None:
    """About how many bytes the safetensors file of ``obj`` takes."""
    try:
        return sum(int(v.nbytes) for v in obj.values())
    except (AttributeError, TypeError):
        return None


def _kind(p: Path) -> str:
    try:
        st = os.stat(p)  # one look: an overwrite may rename a directory into place meanwhile
    except FileNotFoundError:
        return "directory"  # possibly an overwrite between its renames (or killed there)
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if _safetensors.is_index(p):
        return "index"
    with _untrusted.open_regular(p, CorruptCheckpointError) as f:
        head = f.read(16)
        size = os.fstat(f.fileno()).st_size
    if _safetensors.looks_like(head, size):
        return "safetensors"
    if _torch_pickle.is_torch_file(head):
        return "torch"
    if p.suffix == ".safetensors":
        return "safetensors"  # damaged: let the reader say how
    raise CorruptCheckpointError(
        f"'{p}' is in no format jm reads (an Orbax checkpoint directory from jm.save, "
        ".safetensors, a *.index.json of shards, or a PyTorch .pt/.bin file)"
    )


def _read_shard(path: Path, verify: bool) -> dict:
    with _untrusted.open_regular(path, CorruptCheckpointError) as f:
        head = f.read(16)
    if _torch_pickle.is_torch_file(head):
        return _torch_pickle.read_flat(path)
    return _safetensors.read_host(path, verify)


@_tracebacks.entry
def load(path: str | os.PathLike, map_location: Any = None, *, verify: bool = True) -> Any:
    """Load what :func:`save` wrote, or a safetensors / PyTorch weight file.

    Reads jm's Orbax checkpoint directories (checking every array's CRC-32),
    ``.safetensors`` files, Hugging Face sharded checkpoints (the
    ``*.safetensors.index.json`` or ``pytorch_model.bin.index.json`` file),
    and PyTorch ``.pt``/``.bin`` files in both of ``torch.save``'s formats
    without PyTorch, refusing any pickle that would run code. Arrays come back
    as ``jax.Array``; 64-bit data becomes 32-bit while JAX's x64 mode is off,
    as everywhere in JAX.

    Files are treated as untrusted: only regular files are read (a symlink
    to one is fine, e.g. a Hugging Face hub cache's ``snapshots/<rev>/``
    links into ``blobs/``; shard names in an index may not leave its
    directory); JSON (headers, indexes, ``jmodule.json``) may nest at most
    256 levels; containers a pickle shares stay shared; a PyTorch file's
    tensors may take at most 16x the bytes of its storages (or 64 MiB); and
    a compressed zip record is refused before it inflates past what its
    storage needs. Each refusal is a :class:`CorruptCheckpointError`.

    A checkpoint directory's data files and ``.safetensors`` files are read
    through read-only memory maps (TensorStore's and safetensors' own), and
    the arrays returned are copies, so nothing stays mapped. As with any
    mapped read (``numpy.load(mmap_mode=...)``, ``torch.load(mmap=True)``),
    a file truncated by another process *while* it is being loaded ends this
    process with ``SIGBUS``; jm itself never rewrites a checkpoint's files in
    place (a save writes a new directory beside and renames it). A file
    truncated before the load is a :class:`CorruptCheckpointError`. A load
    racing a ``save(..., overwrite=True)`` of the same path (another thread
    or process) returns the old checkpoint or the new one, whole.

    Args:
        path: the checkpoint directory or file.
        map_location: where arrays land, as ``Module.to`` takes it: a device
            (``"cpu"``, ``"cuda:1"``, ``jax.Device``), a ``jax.sharding.Sharding``
            (arrays are restored straight onto it), a dtype (floating and
            complex arrays are cast), a ``(device, dtype)`` pair, an array (its
            sharding and dtype), ``"meta"`` (``jax.ShapeDtypeStruct`` only,
            nothing read), or a callable ``fn(array, key) -> array`` (``key``
            is the dotted path, e.g. ``"model.fc.weight"``); ``torch.device``
            and ``torch.dtype`` objects work too. A dict ``{key: placement}``
            gives some keys their own device, sharding, dtype or pair (e.g.
            ``{"fc.weight": NamedSharding(mesh, P("model"))}``; with a tuple,
            ``(default, {key: placement})``); a key the file lacks raises.
            Default: the device of the enclosing ``with jm.device(...)``
            block (not ``"meta"``), else JAX's default device (this
            process's first device, in a job of several processes: each
            loads a whole copy, as ``torch.load`` does).
        verify: check checksums (jm's checkpoints and jm-written safetensors).
            Verification reads arrays back to host memory: free on the CPU,
            one device-to-host copy on accelerators.

    Returns:
        The saved object, with the container types and key order it had.

    Raises:
        CheckpointNotFoundError: nothing at ``path``.
        CorruptCheckpointError: damaged, truncated or unrecognised input, or
            a path (or a file inside a checkpoint) that is not a regular file
            (a FIFO, a device); the message names the file (and the key, for a
            checksum mismatch).
        UnsafePickleError: a PyTorch pickle that would run code.

    >>> import tempfile, jax.numpy as jnp, jmodule as jm
    >>> d = tempfile.mkdtemp()
    >>> jm.save({"w": jnp.ones(2, jnp.bfloat16)}, f"{d}/ckpt")
    >>> jm.load(f"{d}/ckpt", map_location=jnp.float32)["w"].dtype
    dtype('float32')
    """
    p = Path(os.fspath(path))
    kind = _kind(p)
    if kind == "directory":
        return _directory.read(p, map_location, verify)
    if kind == "index":
        return _safetensors.read_index(p, map_location, verify, _read_shard)
    if kind == "safetensors":
        return _safetensors.read(p, map_location, verify)
    return _torch_pickle.read(p, map_location)


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``metadata`` saved with a checkpoint or safetensors file.

    For a sharded index, the index's own ``"metadata"`` entry.

    >>> import tempfile, jax.numpy as jnp, jmodule as jm
    >>> f = tempfile.mkdtemp() + "/w.safetensors"
    >>> jm.save({"w": jnp.ones(2)}, f, metadata={"format": "pt"})
    >>> jm.serialization.read_metadata(f)
    {'format': 'pt'}
    """
    p = Path(os.fspath(path))
    kind = _kind(p)
    if kind == "directory":
        return _directory.user_metadata(p)
    if kind == "safetensors":
        return _safetensors.read_metadata(p)
    if kind == "index":
        meta = _safetensors.read_index_json(p).get("metadata") or {}
        if not isinstance(meta, dict):
            raise CorruptCheckpointError(f"'{p}' is not a valid checkpoint index: bad metadata")
        return {str(k): str(v) for k, v in meta.items()}
    return {}  # PyTorch files carry none
