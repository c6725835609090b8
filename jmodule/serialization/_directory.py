"""jm's checkpoint directory: arrays through Orbax, everything else in ``jmodule.json``.

Layout of a committed checkpoint ``ckpt/``::

    ckpt/arrays/         an Orbax PyTree checkpoint (OCDBT, zarr3, no compression)
                         of {"a0": array, "a1": array, ...}
    ckpt/jmodule.json    the tree skeleton, each array's key, dtype, shape and
                         checksum (CRC-32C; CRC-32 in checkpoints written before),
                         user metadata; written last, SHA-256 guarded

Saving in a single process writes ``arrays/`` with :mod:`._orbax_writer`:
Orbax's own files and TensorStore specs, the arrays in one TensorStore commit,
without ``PyTreeCheckpointHandler``'s ~2 ms of Python per array (arrays
sharded over several devices still go through Orbax's handler).
Loading reads the arrays with TensorStore, through the spec Orbax reads them
with, straight into their target placement (Orbax's own restore in a job of
several processes), and checks each against its checksum.

Zero-size arrays (which Orbax refuses) live only in ``jmodule.json``.

In a job of several ``jax.distributed`` processes every process calls
``jm.save`` with the same path on a shared filesystem: the staging directory
is named by process 0, each process writes (through Orbax) and checksums only
the shards it holds, the checksum tables are gathered, and process 0 writes
``jmodule.json`` and commits once every process's data is on disk. Loading
checks, in each process, the saved shards its own shards cover.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _untrusted
from jmodule._placement.device import on_one_device
from jmodule.serialization import _atomic, _checksum, _errors, _metafile, _orbax_writer, _tree
from jmodule.serialization._errors import (
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
)
from jmodule.serialization._map_location import MapLocation

ARRAYS = "arrays"
FORMAT = "jmodule.checkpoint"
#: The options of the Orbax ``PyTreeCheckpointHandler`` that writes ``arrays/``.
ORBAX_OPTIONS = {"use_ocdbt": True, "use_zarr3": True, "use_compression": False}
_MAX_NAMED = 8


@dataclasses.dataclass
class Prepared:
    """What a save writes, fixed at the moment ``save`` was called."""

    tree: dict
    keys: list[str]
    arrays: list[Any]
    metadata: dict[str, str]


def _on_cpu(x: jax.Array) -> bool:
    return all(d.platform == "cpu" for d in x.sharding.device_set)


def _check_dtype(x: Any, key: str) -> Any:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        raise TypeError(
            f"cannot save '{key}': it is a typed PRNG key array ({x.dtype}), which has no "
            "array checkpoint format. Save jax.random.key_data(key) and rebuild the key "
            "with jax.random.wrap_key_data(data) after loading."
        )
    if isinstance(x, np.ndarray):
        # ml_dtypes' types (bfloat16, float8_*, int4) are kind "V" too, and are arrays.
        if x.dtype.kind in "OUSMm" or (
            x.dtype.kind == "V" and x.dtype.type.__module__ != "ml_dtypes"
        ):
            raise TypeError(
                f"cannot save '{key}': numpy arrays of dtype {x.dtype} have no array "
                "checkpoint format; use a list or a str instead."
            )
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
    return x


def prepare(obj: Any, metadata: dict[str, str] | None = None, snapshot: bool = False) -> Prepared:
    """Flatten ``obj`` and, with ``snapshot``, copy its arrays so later changes do not leak in.

    The snapshot of arrays on the CPU is an asynchronously dispatched on-device
    copy (returns at once); arrays on accelerators are copied to host memory
    (as Orbax does) so that a checkpoint in flight never doubles device memory.
    """
    tree, leaves = _tree.flatten(obj)
    keys = [k for k, _ in leaves]
    arrays = [_check_dtype(x, k) for k, x in leaves]
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise TypeError("metadata must be a dict of str to str")
    if snapshot:
        on_cpu = [i for i, x in enumerate(arrays) if isinstance(x, jax.Array) and _on_cpu(x)]
        copies = jax.device_put([arrays[i] for i in on_cpu], may_alias=False)
        for i, c in zip(on_cpu, copies):
            arrays[i] = c
        elsewhere = [x for x in arrays if isinstance(x, jax.Array) and not _on_cpu(x)]
        for x in elsewhere:
            x.copy_to_host_async()
        arrays = [
            np.array(x)
            if isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and not _on_cpu(x))
            else x
            for x in arrays
        ]
    return Prepared(tree, keys, arrays, dict(metadata or {}))


def _is_checkpoint_or_empty(path: Path) -> bool:
    if path.is_dir() and not path.is_symlink():
        return (path / _metafile.NAME).exists() or not any(path.iterdir())
    return False


def _checker():
    import orbax.checkpoint as ocp  # on first use: importing Orbax takes 0.2 s

    handler = ocp.PyTreeCheckpointHandler(**ORBAX_OPTIONS)
    return ocp, ocp.Checkpointer(handler)


def multiprocess() -> bool:
    """Whether this is one of several ``jax.distributed`` processes (starts no backend if not)."""
    return jax.distributed.is_initialized() and jax.process_count() > 1


def _prepare_target(final: Path, overwrite: bool) -> None:
    """Create ``final``'s parent, repair leftovers, check ``final`` may be written.

    Raises:
        CheckpointExistsError: ``final`` exists and ``overwrite`` is false.
        CheckpointError: ``overwrite`` would delete something that is not a
            jm checkpoint.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    _atomic.repair(final)
    if final.exists() or final.is_symlink():
        if not overwrite:
            raise CheckpointExistsError(
                f"'{final}' already exists; pass overwrite=True to replace it (atomically: "
                "the old checkpoint stays loadable until the new one is complete)."
            )
        if not _is_checkpoint_or_empty(final):
            raise CheckpointError(
                f"refusing to overwrite '{final}': it is not a jmodule checkpoint (no "
                f"{_metafile.NAME} inside). Remove it yourself if you mean to replace it."
            )


def _save_arrays(
    staging: Path, stored: dict[str, Any], alongside: Callable[[], Any] = lambda: None
) -> Any:
    """Write ``stored`` (name -> array) as the Orbax checkpoint ``staging/arrays``.

    In a single process, arrays that are numpy or on one device are written by
    :mod:`._orbax_writer` (Orbax's format in one TensorStore commit) and
    ``alongside`` runs while TensorStore writes; otherwise ``alongside`` runs
    first and Orbax's ``PyTreeCheckpointHandler`` writes.

    Returns:
        What ``alongside`` returned.
    """
    if stored and not multiprocess() and _orbax_writer.handles(stored.values()):
        writer = _orbax_writer.Writer(staging / ARRAYS, stored)
        try:
            return alongside()
        finally:
            writer.wait()
    result = alongside()
    if stored:
        ocp, checkpointer = _checker()
        try:
            checkpointer.save(staging / ARRAYS, args=ocp.args.PyTreeSave(stored))
        finally:
            checkpointer.close()
    return result


def _size(prepared: Prepared) -> int:
    """About how many bytes the checkpoint of ``prepared`` takes on disk."""
    return sum(int(x.nbytes) for x in prepared.arrays) + len(json.dumps(prepared.tree))


def _taken(final: Path) -> CheckpointExistsError:
    return CheckpointExistsError(
        f"'{final}' was saved by another writer while this save was writing it; this save "
        "was discarded and the other one kept (exactly one of racing saves to a new path "
        "succeeds). Pass overwrite=True to replace it, or save to another path."
    )


def write(prepared: Prepared, path: os.PathLike | str, overwrite: bool = False) -> Path:
    """Write ``prepared`` as a committed checkpoint at ``path``; see the module docstring.

    Raises:
        CheckpointExistsError: ``path`` exists and ``overwrite`` is false, also
            when another save committed it while this one was writing.
        CheckpointError: ``overwrite`` would delete something that is not a
            jm checkpoint.
        DiskFullError: the disk filled up; nothing is left behind.
        NotWritableError: ``path``'s directory cannot be written.
    """
    final = Path(os.path.abspath(os.fspath(path)))
    with _errors.saving(final, lambda: _size(prepared), keeps_old=overwrite and final.exists()):
        if multiprocess():
            return _write_processes(prepared, final, overwrite)
        return _write_here(prepared, final, overwrite)


def _write_here(prepared: Prepared, final: Path, overwrite: bool) -> Path:
    """:func:`write` in a single process."""
    _prepare_target(final, overwrite)
    tag = _atomic.new_tag()
    staging = _atomic.sibling(final, "tmp", tag)
    staging.mkdir()
    try:
        arrays = prepared.arrays
        stored = {f"a{i}": x for i, x in enumerate(arrays) if x.size > 0}
        # A sharded array gets one checksum per distinct shard, taken from the device
        # holding it: nothing is gathered into one buffer.
        pieces = [_pieces(x, key) for key, x in zip(prepared.keys, arrays)]
        pending = [x for x, p in zip(arrays, pieces) for x in ([x] if p is None else p[1])]
        flat = _save_arrays(staging, stored, lambda: _checksum.many(pending))
        crcs, shard_crcs, at = [], [], 0
        for p in pieces:
            n = 1 if p is None else len(p[1])
            crcs.append(flat[at] if p is None else "per shard")
            table = None if p is None else [[b, c] for b, c in zip(p[0], flat[at : at + n])]
            shard_crcs.append(table)
            at += n
        _metafile.write(staging, _body(prepared, crcs, shard_crcs))
        _atomic.fsync_tree(staging)
        try:
            _atomic.commit(staging, final, tag, overwrite)
        except FileExistsError:
            raise _taken(final) from None
    except BaseException:
        _atomic.rmtree(staging)
        raise
    return final


def _body(prepared: Prepared, crcs: list[str], shard_crcs: list[list | None]) -> dict:
    """The contents of ``jmodule.json`` for ``prepared`` with these checksums."""
    entries = [
        {
            "key": key,
            "dtype": jnp.dtype(x.dtype).name,
            "shape": list(x.shape),
            "crc32": crc,
            "stored": f"a{i}" if x.size > 0 else None,
            **({} if shards is None else {"shards": shards}),
        }
        for i, (key, x, crc, shards) in enumerate(
            zip(prepared.keys, prepared.arrays, crcs, shard_crcs)
        )
    ]
    return {
        "format": FORMAT,
        "tree": prepared.tree,
        "arrays": entries,
        "metadata": prepared.metadata,
        "jax_version": jax.__version__,
    }


# ------------------------------------------------------------------ several processes


def _broadcast_text(text: str) -> str:
    """Process 0's ``text``, in every process (two small collectives)."""
    from jax.experimental import multihost_utils

    data = np.frombuffer(text.encode(), np.uint8)
    n = int(multihost_utils.broadcast_one_to_all(np.array(len(data), np.int32)))
    buf = np.zeros(n, np.uint8)
    if jax.process_index() == 0:
        buf[:] = data
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))).decode()


def _all_agree(ok: bool) -> bool:
    """Whether ``ok`` holds in every process (a collective; also a barrier)."""
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.array([int(ok)], np.int32))
    return bool(np.all(np.asarray(flags)))


def _leader_step(step: Any) -> dict:
    """Run ``step()`` (returning a JSON-able dict) in process 0; its outcome in every process.

    Returns:
        ``{"error": None, **step()}``, or ``{"error": kind, "message": text}``
        if ``step`` raised there (process 0 then re-raises its own exception).
    """
    outcome: dict = {}
    failure: BaseException | None = None
    if jax.process_index() == 0:
        try:
            outcome = {"error": None, **step()}
        except Exception as e:
            failure = e
            kind = "exists" if isinstance(e, CheckpointExistsError) else "other"
            outcome = {"error": kind, "message": f"{type(e).__name__}: {e}"}
    outcome = json.loads(_broadcast_text(json.dumps(outcome)))
    if failure is not None:
        raise failure
    return outcome


def _leader_error(outcome: dict, final: Path) -> Exception:
    if outcome["error"] == "exists":
        return CheckpointExistsError(f"(on process 0) {outcome['message']}")
    return CheckpointError(f"saving '{final}' failed on process 0: {outcome['message']}")


def _regions(x: Any) -> list[tuple] | None:
    """The distinct shard bounds of a multi-process sharded ``x``, in global device order."""
    if not isinstance(x, jax.Array) or x.sharding.is_fully_replicated:
        return None
    seen: dict[tuple, None] = {}
    for index in x.sharding.devices_indices_map(x.shape).values():
        seen.setdefault(_bounds(index, x.shape), None)
    return list(seen)


def _bounds(index: tuple, shape: tuple) -> tuple:
    return tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))


def _global_checksums(arrays: list[Any]) -> tuple[list[str], list[list | None]]:
    """Whole-array and per-shard checksums of ``arrays``, gathered from every process.

    Each distinct shard is checksummed by the one process holding its
    ``replica_id == 0`` copy; whole arrays (numpy, replicated) by process 0.
    """
    from jax.experimental import multihost_utils

    leader = jax.process_index() == 0
    regions = [_regions(x) for x in arrays]
    slots, work, at = [], [], 0
    for x, rs in zip(arrays, regions):
        if rs is None:
            if leader:
                data = x.addressable_data(0) if isinstance(x, jax.Array) else x
                slots.append(at)
                work.append(data)
            at += 1
            continue
        where = {b: at + i for i, b in enumerate(rs)}
        for shard in x.addressable_shards:
            if shard.replica_id == 0:
                slots.append(where[_bounds(shard.index, x.shape)])
                work.append(shard.data)
        at += len(rs)
    table = np.zeros((max(at, 1), 2), np.uint32)  # (have, crc) per region
    for slot, crc in zip(slots, _checksum.many(work)):
        table[slot] = (1, int(crc.partition(":")[2], 16))
    gathered = np.asarray(multihost_utils.process_allgather(table)).reshape(-1, *table.shape)
    have = gathered[..., 0].sum(axis=0)
    if at and not np.all(have[:at] == 1):
        raise CheckpointError(
            "the processes do not agree on which of them holds which shard of the arrays "
            f"being saved ({int(np.sum(have[:at] != 1))} shard(s) held by none or several); "
            "do all processes call jm.save with the same object?"
        )
    crc_of = [
        f"{_checksum.ALGORITHM}:{int(c):08x}" for c in gathered[..., 1].sum(axis=0, dtype=np.uint64)
    ]
    crcs, shard_crcs, at = [], [], 0
    for rs in regions:
        if rs is None:
            crcs.append(crc_of[at])
            shard_crcs.append(None)
            at += 1
        else:
            crcs.append("per shard")
            shard_crcs.append([[b, crc_of[at + i]] for i, b in enumerate(rs)])
            at += len(rs)
    return crcs, shard_crcs


def _fsync_own(root: Path) -> None:
    """Flush what this process wrote under ``root``: its Orbax ``ocdbt.process_<i>``
    directory, and (process 0) everything outside such directories."""
    me = f"ocdbt.process_{jax.process_index()}"
    for dirpath, dirnames, filenames in os.walk(root):
        part = Path(dirpath).relative_to(root).parts
        owner = next((p for p in part if p.startswith("ocdbt.process_")), None)
        if owner is None and jax.process_index() != 0:
            continue
        if owner is not None and owner != me:
            dirnames.clear()
            continue
        for name in filenames:
            _atomic.fsync_file(os.path.join(dirpath, name))
        _atomic.fsync_dir(Path(dirpath))


def _write_processes(prepared: Prepared, final: Path, overwrite: bool) -> Path:
    """:func:`write`, called by every process of a multi-process job with the same path."""
    leader = jax.process_index() == 0

    def start() -> dict:
        _prepare_target(final, overwrite)
        tag = _atomic.new_tag()
        _atomic.sibling(final, "tmp", tag).mkdir()
        return {"tag": tag}

    outcome = _leader_step(start)
    if outcome["error"] is not None:
        raise _leader_error(outcome, final)
    tag = outcome["tag"]
    staging = _atomic.sibling(final, "tmp", tag)
    # Arrays each process holds whole (numpy, single-device) are saved from process
    # 0's copy, as Orbax saves numpy arrays; as jax arrays every process would write them.
    arrays = [
        np.asarray(x) if isinstance(x, jax.Array) and x.is_fully_addressable else x
        for x in prepared.arrays
    ]
    prepared = dataclasses.replace(prepared, arrays=arrays)
    try:
        crcs, shard_crcs = _global_checksums(arrays)
        stored = {f"a{i}": x for i, x in enumerate(arrays) if x.size > 0}
        _save_arrays(staging, stored)
        ok = True
        try:
            _fsync_own(staging)
        except OSError:
            ok = False
        if not _all_agree(ok):
            raise CheckpointError(f"flushing '{staging}' to disk failed in some process")

        def finish() -> dict:
            _metafile.write(staging, _body(prepared, crcs, shard_crcs))
            _atomic.fsync_dir(staging)
            try:
                _atomic.commit(staging, final, tag, overwrite)
            except FileExistsError:
                raise _taken(final) from None
            return {}

        outcome = _leader_step(finish)
        if outcome["error"] is not None:
            raise _leader_error(outcome, final)
    except BaseException:
        if leader:
            _atomic.rmtree(staging)
        raise
    return final


@dataclasses.dataclass
class _Entry:
    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    crc32: str
    stored: str | None
    #: For a sharded array: ``(((start, stop) per dimension), crc32)`` per distinct shard.
    shards: tuple | None = None


def _pieces(x: Any, key: str) -> tuple[list, list] | None:
    """The distinct shards of a sharded ``x``: (their index bounds, their data), or None.

    None for numpy arrays, single-device and fully replicated arrays (one
    checksum of one copy covers them).

    Raises:
        CheckpointError: ``x`` spans devices of several processes.
    """
    if not isinstance(x, jax.Array) or len(x.sharding.device_set) == 1:
        return None
    if x.sharding.is_fully_replicated:
        return None
    if not x.is_fully_addressable:
        raise CheckpointError(
            f"cannot save '{key}': it is sharded over devices of several processes, but "
            "jax.distributed is not initialized in this process (jm.distributed.init())."
        )
    seen: dict[tuple, Any] = {}
    for shard in x.addressable_shards:
        bounds = tuple(sl.indices(n)[:2] for sl, n in zip(shard.index, x.shape))
        seen.setdefault(bounds, shard.data)
    return list(seen), list(seen.values())


def _entries(body: dict, src: Path) -> list[_Entry]:
    try:
        if body.get("format") != FORMAT:
            raise ValueError(f"format is {body.get('format')!r}")
        out = []
        for e in body["arrays"]:
            shape = tuple(e["shape"])
            if not all(type(n) is int and n >= 0 for n in shape):
                raise ValueError(f"bad shape {shape}")
            if not (isinstance(e["key"], str) and isinstance(e["crc32"], str)):
                raise ValueError("bad key or checksum")
            if e["stored"] is not None and not isinstance(e["stored"], str):
                raise ValueError("bad array name")
            shards = None
            if "shards" in e:
                shards = tuple(
                    (tuple((int(a), int(b)) for a, b in bounds), str(crc))
                    for bounds, crc in e["shards"]
                )
                if any(len(bounds) != len(shape) for bounds, _ in shards):
                    raise ValueError(f"bad shard table for {e['key']!r}")
            out.append(
                _Entry(e["key"], jnp.dtype(e["dtype"]), shape, e["crc32"], e["stored"], shards)
            )
        return out
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptCheckpointError(
            f"'{src / _metafile.NAME}' is corrupted: its array table does not parse ({e})"
        ) from None


def _host_restored(entry: _Entry) -> bool:
    return jax.dtypes.canonicalize_dtype(entry.dtype) != entry.dtype


def _source(final: Path) -> Path:
    src = _atomic.readable(final)
    if src is None:
        raise CheckpointNotFoundError(f"no checkpoint at '{final}': the path does not exist")
    if src.is_dir() and not (src / _metafile.NAME).exists():
        try:
            empty = not any(src.iterdir())
        except FileNotFoundError:  # renamed away by an overwrite: read() starts over
            raise CheckpointNotFoundError(f"'{final}' was removed while being read") from None
        if empty:
            raise CorruptCheckpointError(
                f"'{final}' is an empty directory, not a checkpoint (an interrupted copy?)"
            )
        if (src / "_CHECKPOINT_METADATA").exists() or (src / "_METADATA").exists():
            raise CorruptCheckpointError(
                f"'{final}' is an Orbax checkpoint that jm.save did not write (it has no "
                f"{_metafile.NAME} with checksums); read it with orbax.checkpoint directly."
            )
    return src


def _unreadable(
    src: Path, keys: dict[str, str], error: BaseException, key: str | None = None
) -> CorruptCheckpointError:
    """The error for arrays of ``src`` that cannot be read.

    It names ``key``, else the keys whose stored names (``keys``: stored name
    -> key) the text of ``error`` mentions.
    """
    text = str(error)
    names = re.findall(r"(?<![\w.])(a\d+)/|name=(a\d+)\b", text)
    named = (
        [key] if key is not None else sorted({keys[n] for pair in names for n in pair if n in keys})
    )
    which = f" (key {', '.join(repr(k) for k in named)})" if named else ""
    short = text if len(text) < 600 else text[:600] + " ..."
    return CorruptCheckpointError(
        f"cannot read the arrays of '{src}'{which}: {type(error).__name__}: {short}"
    )


def _aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-ordered host array whose data starts on a 64-byte boundary.

    JAX places such an array on a CPU device without copying it.
    """
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + 64, np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at : at + n].view(dtype).reshape(shape)


#: TensorStore's file mode for reading: data files are mapped into memory (read-only),
#: not read into buffers of TensorStore's own.
_MAPPED = {"file_io_mode": {"mode": "memmap"}}


def _read_direct(
    src: Path, entries: list[_Entry], place: MapLocation, verify: bool
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """Read the stored arrays with TensorStore, straight into their target placement.

    Opens each array with the TensorStore spec and context Orbax itself reads
    it with (``orbax.checkpoint.type_handlers``), so this is Orbax's read of
    Orbax's format, less its per-array Python machinery. Each distinct shard
    of the target sharding is read once into a 64-byte aligned host buffer
    (which a CPU device then uses without a copy) and placed on its devices.
    With ``verify``, the checksum of each whole array read is computed while
    the next ones are read.

    Returns:
        ``(stored name -> array, stored name -> checksum of the bytes read)``,
        or ``None`` if some target sharding spans other processes (Orbax
        restores those).

    Raises:
        CorruptCheckpointError: an array cannot be read.
    """
    import orbax.checkpoint as ocp  # on first use: importing Orbax takes 0.2 s
    import tensorstore as ts

    wanted = [e for e in entries if e.stored is not None]
    targets = [None if _host_restored(e) else place.sharding(e.shape, e.key) for e in wanted]
    if any(t is not None and not t.is_fully_addressable for t in targets):
        return None
    keys = {e.stored: e.key for e in wanted}
    # Orbax allows 128 file reads at once, for remote storage; a local file (mostly
    # from the page cache) reads faster with about one per core (on 2 cores: ~20%).
    orbax_context = ocp.type_handlers.get_ts_context(
        use_ocdbt=True, file_io_concurrency_limit=max(4, os.cpu_count() or 1)
    )
    # TensorStore maps the data files (its "memmap" file mode) instead of reading
    # them into buffers of its own: each array is then copied once, from the page
    # cache into its destination, and no intermediate buffer is page-faulted in
    # (256 MiB / 100 arrays on 2 cores, unverified: 150 ms -> 81-97 ms). The arrays
    # returned never point into a mapping (they are copies), so nothing of a
    # checkpoint stays mapped after the load.
    context = ts.Context({**orbax_context.spec.to_json(), **_MAPPED})

    def spec(name: str) -> dict:
        info = ocp.type_handlers.ParamInfo(
            name=name,
            parent_dir=src / ARRAYS,
            is_ocdbt_checkpoint=True,
            use_zarr3=True,
            ts_context=context,
        )
        return ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=True)

    def done(future: Any, e: _Entry) -> Any:
        try:
            return future.result()
        except Exception as error:  # any failure to read is a damaged checkpoint
            raise _unreadable(src, keys, error, e.key) from None

    opening = [ts.open(spec(e.stored), open=True, read=True, context=context) for e in wanted]
    reads = []  # (entry, target, [(bounds, host buffer, future)] per region)
    for e, target, future in zip(wanted, targets, opening):
        store = done(future, e)
        dtype = np.dtype(store.dtype.numpy_dtype)
        if tuple(store.shape) != e.shape or dtype != e.dtype:
            target = None  # read as stored, to the host: _verify names the mismatch
        if target is None or on_one_device(target):
            regions = [tuple((0, n) for n in store.shape)]
        else:
            by_device = target.addressable_devices_indices_map(e.shape)
            regions = list(dict.fromkeys(_bounds(i, e.shape) for i in by_device.values()))
        parts = []
        for bounds in regions:
            buf = _aligned(tuple(b - a for a, b in bounds), dtype)
            view = store[tuple(slice(a, b) for a, b in bounds)][ts.d[:].translate_to[0]]
            parts.append((bounds, buf, ts.array(buf, copy=False, write=True).write(view)))
        reads.append((e, target, parts))
    out: dict[str, Any] = {}
    # Two checksum threads: one falls behind TensorStore's reads from the page cache
    # (a 256 MiB / 100-array load on 2 cores: 170 ms against 180 ms with one).
    with _checksum.Batch(2) as batch:
        summed = []
        for e, target, parts in reads:
            for _, _, future in parts:
                done(future, e)
            algorithm = _checksum.algorithm_of(e.crc32)
            if verify and len(parts) == 1 and e.shards is None and algorithm is not None:
                batch.add(parts[0][1], algorithm)  # while the next arrays are read
                summed.append(e.stored)
            out[e.stored] = _placed(e, target, parts)
        sums = dict(zip(summed, batch.results()))
    return out, sums


def _placed(e: _Entry, target: Any, parts: list) -> Any:
    """The array read into ``parts`` (``(bounds, host buffer, done)`` per region) on ``target``."""
    if target is None:
        return parts[0][1]
    if on_one_device(target):
        return jax.device_put(parts[0][1], target)
    data = {bounds: buf for bounds, buf, _ in parts}
    shards = [
        jax.device_put(data[_bounds(index, e.shape)], device)
        for device, index in target.addressable_devices_indices_map(e.shape).items()
    ]
    return jax.make_array_from_single_device_arrays(e.shape, target, shards)


def _read_arrays(src: Path, entries: list[_Entry], place: MapLocation) -> dict[str, Any]:
    """Restore the stored arrays through Orbax (used where :func:`_read_direct` does not)."""
    wanted = [e for e in entries if e.stored is not None]
    if not wanted:
        return {}
    ocp, checkpointer = _checker()
    args = {}
    for e in wanted:
        if _host_restored(e):
            args[e.stored] = ocp.RestoreArgs(restore_type=np.ndarray)
        else:
            # No global_shape: Orbax restores what is stored, and _verify names any key
            # whose shape differs from the one jmodule.json recorded.
            args[e.stored] = ocp.ArrayRestoreArgs(sharding=place.sharding(e.shape, e.key))
    try:
        restored = checkpointer.restore(
            src / ARRAYS, args=ocp.args.PyTreeRestore(restore_args=args)
        )
    except Exception as error:  # any failure to read is a damaged checkpoint
        raise _unreadable(src, {e.stored: e.key for e in wanted}, error) from None
    finally:
        checkpointer.close()
    if not isinstance(restored, dict) or set(restored) != {e.stored for e in wanted}:
        raise CorruptCheckpointError(
            f"'{src / ARRAYS}' does not hold the arrays {_metafile.NAME} lists"
        )
    return restored


def _contains(box: tuple, region: tuple) -> bool:
    return all(a <= c and d <= b for (a, b), (c, d) in zip(box, region))


def _gather_region(x: jax.Array, region: tuple) -> jax.Array:
    """``x[region]`` replicated on ``x``'s devices (a collective: every process calls it)."""
    devices = np.array(sorted(x.sharding.device_set, key=lambda d: (d.process_index, d.id)))
    everywhere = jax.sharding.NamedSharding(
        jax.sharding.Mesh(devices, ("all",)), jax.sharding.PartitionSpec()
    )
    index = tuple(slice(a, b) for a, b in region)
    return jax.jit(lambda a: a[index], out_shardings=everywhere)(x)


def _spread_checks(x: jax.Array, regions: tuple) -> list[tuple[Any, str]]:
    """``(data, crc)`` pairs this process checks for ``x``, which spans several processes.

    Each saved region is checked once, by the process of the first device (in
    the sharding's global order) whose shard contains it, on that shard's
    data. A region no single shard contains (the new sharding cuts across the
    saved shards) is gathered, replicated, with a collective and checked by
    process 0.
    """
    boxes = [(d, _bounds(i, x.shape)) for d, i in x.sharding.devices_indices_map(x.shape).items()]
    local = {s.device: s for s in x.addressable_shards}
    me = jax.process_index()
    out = []
    for bounds, crc in regions:
        want = bounds if bounds is not None else tuple((0, n) for n in x.shape)
        owner = next(((d, box) for d, box in boxes if _contains(box, want)), None)
        if owner is None:
            whole = _gather_region(x, want)
            if me == 0:
                out.append((whole.addressable_data(0), crc))
        elif owner[0].process_index == me:
            data, box = local[owner[0]].data, owner[1]
            if box != want:
                data = data[tuple(slice(a - s, b - s) for (a, b), (s, _) in zip(want, box))]
            out.append((data, crc))
    return out


def _verify(
    src: Path, entries: list[_Entry], values: list[Any], known: dict[int, str] | None = None
) -> None:
    """Compare each array (or each saved shard's region of it) with its saved checksum.

    Each checksum is recomputed with the algorithm it names (``crc32c``, or
    ``crc32`` in checkpoints written before). ``known`` gives checksums
    already computed of whole arrays (entry index -> checksum of its bytes).
    A saved shard is checked on its region of the restored array, whatever
    its new sharding: only that region comes to the host. Arrays spread over
    several processes are checked shard by shard where their shards are (see
    :func:`_spread_checks`), and every process learns of every mismatch.

    Raises:
        CorruptCheckpointError: naming the arrays whose data or shape is wrong.
    """
    known = known or {}
    problems: dict[int, str] = {}
    work, owners = [], []
    for i, (e, x) in enumerate(zip(entries, values)):
        if tuple(x.shape) != e.shape or np.dtype(x.dtype) != e.dtype:
            problems[i] = f"{e.key} (read {tuple(x.shape)} {x.dtype}, saved {e.shape} {e.dtype})"
            continue
        regions = e.shards or ((None, e.crc32),)
        if any(_checksum.algorithm_of(crc) is None for _, crc in regions):
            problems[i] = f"{e.key} (a checksum of a kind jm does not know)"
            continue
        if i in known:
            if known[i] != e.crc32:
                problems[i] = e.key
            continue
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            checks = _spread_checks(x, regions)
        else:
            checks = [
                (x if b is None else x[tuple(slice(lo, hi) for lo, hi in b)], crc)
                for b, crc in regions
            ]
        for data, crc in checks:
            work.append(data)
            owners.append((i, crc))
    crcs = _checksum.many(work, [_checksum.algorithm_of(want) for _, want in owners])
    for (i, want), got in zip(owners, crcs):
        if got != want:
            problems.setdefault(i, entries[i].key)
    if multiprocess():
        from jax.experimental import multihost_utils

        flags = np.zeros(max(len(entries), 1), np.int32)
        flags[list(problems)] = 1
        seen = np.asarray(multihost_utils.process_allgather(flags)).reshape(-1, len(flags))
        for i in np.flatnonzero(seen.max(axis=0)[: len(entries)]):
            problems.setdefault(int(i), entries[int(i)].key)
    bad = [problems[i] for i in sorted(problems)]
    if bad:
        named = ", ".join(f"'{k}'" for k in bad[:_MAX_NAMED])
        more = f" and {len(bad) - _MAX_NAMED} more" if len(bad) > _MAX_NAMED else ""
        raise CorruptCheckpointError(
            f"'{src}' is corrupted: the data of {len(bad)} array(s) does not match the "
            f"checksum saved with it: {named}{more}. Restore this checkpoint from a copy or "
            "load an earlier one."
        )


#: Loads of a path that a save keeps replacing (``overwrite=True``) start over at most this often.
_REPLACED_RETRIES = 8


def _identity(final: Path) -> tuple[Path, int, int] | None:
    """Which directory ``final`` reads from now: its path and inode, or ``None``."""
    src = _atomic.readable(final)
    if src is None:
        return None
    try:
        st = os.stat(src)
    except OSError:
        return None
    return src, st.st_dev, st.st_ino


def read(path: os.PathLike | str, map_location: Any = None, verify: bool = True) -> Any:
    """Load the checkpoint at ``path``; see :func:`jmodule.serialization.load`.

    A save that replaces ``path`` (``overwrite=True``) while this reads it
    renames another directory into place: a load during which the directory
    it started from was replaced starts over on the new one, whether it failed
    or not (unverified, the old tree could have come back with the new
    arrays), so it returns the old checkpoint or the new one, whole, never an
    error or a mixture made of the two. A failure with the directory
    unchanged is raised as it is.
    """
    final = Path(os.path.abspath(os.fspath(path)))
    place = MapLocation(map_location)
    # In a job of several processes every one must take the same path: no retry.
    tries = 1 if multiprocess() else _REPLACED_RETRIES
    for attempt in range(tries):
        started = _identity(final)
        last = attempt + 1 == tries
        try:
            out = _read_once(final, place, verify)
        except CheckpointError:
            if last or _identity(final) == started:
                raise
            continue
        if last or _identity(final) == started:
            return out
    raise AssertionError("unreachable")  # pragma: no cover


def _read_once(final: Path, place: MapLocation, verify: bool) -> Any:
    src = _source(final)
    body = _metafile.read(src)
    entries = _entries(body, src)
    place.check_keys((e.key for e in entries), src)
    if place.meta:
        arrays = [
            place.finish(
                jax.ShapeDtypeStruct(e.shape, jax.dtypes.canonicalize_dtype(e.dtype)), e.key
            )
            for e in entries
        ]
    else:
        try:  # TensorStore / Orbax would block on a FIFO and read a device without end
            _untrusted.walk_regular(src / ARRAYS, CorruptCheckpointError)
        except FileNotFoundError:
            pass  # the reader names what is missing
        direct = _read_direct(src, entries, place, verify) if not multiprocess() else None
        restored, sums = direct if direct is not None else (_read_arrays(src, entries, place), {})
        values = [
            restored[e.stored] if e.stored is not None else np.zeros(e.shape, e.dtype)
            for e in entries
        ]
        if verify:
            known = {i: sums[e.stored] for i, e in enumerate(entries) if e.stored in sums}
            _verify(src, entries, values, known)
        arrays = []
        for e, x in zip(entries, values):
            if isinstance(x, np.ndarray):
                arrays.append(place.put(x, e.key))
            else:
                arrays.append(place.finish(x, e.key))
    try:
        return _tree.unflatten(body["tree"], arrays)
    except (KeyError, ValueError) as e:
        raise CorruptCheckpointError(
            f"'{src / _metafile.NAME}' is corrupted: its tree does not parse ({e})"
        ) from None


def user_metadata(path: os.PathLike | str) -> dict[str, str]:
    """The ``metadata`` dict saved with the checkpoint at ``path``."""
    final = Path(os.path.abspath(os.fspath(path)))
    body = _metafile.read(_source(final))
    meta = body.get("metadata", {})
    return dict(meta) if isinstance(meta, dict) else {}
