"""Write a dict of arrays as an Orbax PyTree checkpoint: Orbax's format, one TensorStore commit.

``orbax.checkpoint.PyTreeCheckpointHandler`` spends about 2 ms of Python per
array on top of the write itself (on 2 cores: a 100-array state_dict pays
0.2 s, a 1000-array one 2 s; the sharding metadata alone is written with one
sequential ``ts.open`` per array). This writes the very same checkpoint, with
Orbax's own pieces where Orbax makes them public, and nothing per array but
TensorStore's work:

* each array through the TensorStore spec Orbax writes it with
  (``orbax.checkpoint.type_handlers.get_json_tspec_write``: zarr3 in one
  OCDBT database, uncompressed, Orbax's OCDBT configuration) and Orbax's
  TensorStore context (OCDBT data files of :data:`TARGET_DATA_FILE_SIZE`,
  Orbax's ``ocdbt_target_data_file_size`` option), all in one atomic
  TensorStore transaction (what Orbax
  itself does when it is given no byte limit), written straight from the
  arrays' memory (no copy);
* the files beside the arrays as Orbax writes them: ``_METADATA`` (the tree),
  ``_sharding`` (each ``jax.Array``'s sharding, through Orbax's
  ``SingleDeviceShardingMetadata``), ``array_metadatas/process_0``,
  ``_CHECKPOINT_METADATA`` and ``commit_success.txt``.

Orbax reads the result like one of its own (``tests/serialization/test_checkpoint_orbax_format.py``
restores it with ``PyTreeCheckpointer``, with and without restore arguments,
reads its metadata, and compares every file with what Orbax writes for the
same arrays). Arrays sharded over several devices are left to Orbax's
handler (:func:`handles` says which).
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jmodule._placement.device import on_one_device

#: OCDBT's target data file size (Orbax's ``ocdbt_target_data_file_size`` save option).
#: Orbax's default on a local disk, 2 GiB, puts every array into one data file, written
#: by one thread; in files of 32 MiB TensorStore writes several at once (on 2 cores, a
#: 256 MiB / 100-array save: 0.74x the time; measured 16 MiB to 2 GiB, 1 to 1000
#: arrays, in one transaction, where no size was slower than the default).
TARGET_DATA_FILE_SIZE = 32 * 2**20
#: The PyTree handler whose checkpoints these are (named in ``_CHECKPOINT_METADATA``).
HANDLER = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"


def handles(arrays: Any) -> bool:
    """Whether every array is a numpy array or a ``jax.Array`` on a single device."""
    return all(
        isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and on_one_device(x.sharding))
        for x in arrays
    )


def _host(x: Any) -> np.ndarray:
    """The C-contiguous host data of ``x`` (a view for numpy and CPU arrays)."""
    return np.asarray(x, order="C")


def _value_metadata(x: Any) -> dict:
    if isinstance(x, jax.Array):
        return {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": list(x.shape)}
    return {"value_type": "np.ndarray", "skip_deserialize": False}


def _write_json(path: Path, obj: Any, compact: bool = False) -> None:
    """``obj`` as JSON; ``compact``: as TensorStore's json driver writes it (sorted keys)."""
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True) if compact else json.dumps(obj)
    path.write_text(text)


#: Per dtype and rank: an Orbax write spec to derive every array's from (its name, shape
#: and directory replaced), and whether a derived spec was checked against Orbax's own
#: (a template whose check failed is None: Orbax is asked for each array). Kept for the
#: process, not per save: Orbax's spec builder costs ~0.3 ms of Python per call, and
#: TensorStore 0.1.86's ``KvStore.Spec.to_json``, which it calls, leaks ~200 bytes of
#: Python objects per call (``benchmarks/soak.py``: 25,000 saves grew the process by
#: 800 MiB). A memo of values that are the same for every caller, not shared state.
_TEMPLATES: dict[tuple, tuple[dict | None, bool]] = {}


class _Specs:
    """Orbax's TensorStore write spec of each array, at a fraction of Orbax's cost.

    ``get_json_tspec_write``'s result depends on an array's name, shape and
    directory only through the key path, the shape fields and the two file
    paths, so it is called once per dtype and rank in a process
    (:data:`_TEMPLATES`), and for every other array of that dtype and rank the
    template's name, shape and directory are replaced: a copy checked against
    Orbax's own spec the first time, per dtype and rank (a group whose check
    fails asks Orbax for each array).
    """

    def __init__(self, ocp: Any, directory: Path, context: Any) -> None:
        self._ocp, self._directory, self._context = ocp, directory, context

    def orbax(self, name: str, data: np.ndarray) -> dict:
        """The spec Orbax itself writes ``data`` under ``name`` with."""
        handlers = self._ocp.type_handlers
        info = handlers.ParamInfo(
            name=name,
            parent_dir=self._directory,
            is_ocdbt_checkpoint=True,
            use_zarr3=True,
            use_compression=False,
            ts_context=self._context,
        )
        return handlers.get_json_tspec_write(
            info, use_ocdbt=True, global_shape=data.shape, local_shape=data.shape, dtype=data.dtype
        )

    def of(self, name: str, data: np.ndarray) -> dict:
        """The spec of ``data`` under ``name``: Orbax's, through a checked template."""
        group = (data.dtype.str, data.dtype.name, data.ndim)
        known = _TEMPLATES.get(group)
        if known is None:
            spec = self.orbax(name, data)
            _TEMPLATES[group] = (spec, False)
            return spec
        template, checked = known
        if template is None:
            return self.orbax(name, data)
        spec = _renamed(template, name, data.shape, self._directory)
        if not checked:
            if spec != json.loads(json.dumps(self.orbax(name, data))):  # tuples as lists
                _TEMPLATES[group] = (None, True)
                return self.orbax(name, data)
            _TEMPLATES[group] = (template, True)
        return spec


def _renamed(template: dict, name: str, shape: tuple, directory: Path) -> dict:
    """``template`` (an Orbax zarr3 write spec) for the array ``name`` of ``shape`` in
    ``directory``."""
    spec = json.loads(json.dumps(template))
    kvstore = spec["kvstore"]
    kvstore["path"] = name
    for part in ("base", "manifest"):
        if isinstance(kvstore.get(part), dict) and "path" in kvstore[part]:
            kvstore[part]["path"] = f"{directory}/"
    meta = spec["metadata"]
    meta["shape"] = list(shape)
    meta["chunk_grid"]["configuration"]["chunk_shape"] = list(shape)
    for codec in meta["codecs"]:
        if codec["name"] == "sharding_indexed":
            codec["configuration"]["chunk_shape"] = list(shape)
    return spec


class Writer:
    """One checkpoint's arrays being written; ``wait`` returns when they are committed.

    The arrays are handed to TensorStore at construction; the caller may do
    other work (checksums) before ``wait``. The arrays must not change until
    then (TensorStore reads them in place).
    """

    def __init__(self, directory: Path, stored: dict[str, Any]) -> None:
        import orbax.checkpoint as ocp  # on first use: importing Orbax takes 0.2 s
        import tensorstore as ts

        self._directory = directory
        self._stored = stored
        self._started = time.time_ns()
        directory.mkdir()
        context = ocp.type_handlers.get_ts_context(use_ocdbt=True)
        self._txn = ts.Transaction(atomic=True)
        for x in stored.values():  # start every device-to-host copy before the first wait
            if isinstance(x, jax.Array) and next(iter(x.devices())).platform != "cpu":
                x.copy_to_host_async()
        self._host = {name: _host(x) for name, x in stored.items()}
        try:
            self._start(ocp, ts, context)
        except BaseException:
            self._txn.abort()
            raise

    def _start(self, ocp: Any, ts: Any, context: Any) -> None:
        """Open every array in the transaction and start its write."""
        specs = _Specs(ocp, self._directory, context)
        opening = []
        for name, data in self._host.items():
            spec = specs.of(name, data)  # may be a template: changed in a copy
            kvstore = {**spec["kvstore"], "target_data_file_size": TARGET_DATA_FILE_SIZE}
            spec = {**spec, "kvstore": kvstore}
            opening.append(
                ts.open(spec, create=True, open=True, context=context, transaction=self._txn)
            )
        self._writes = []
        for future, data in zip(opening, self._host.values()):
            store = future.result()
            self._writes.append(store.write(data, can_reference_source_data_indefinitely=True))

    def wait(self) -> None:
        """Commit the arrays, then write the files Orbax writes beside them."""
        try:
            for w in self._writes:
                w.result()
            self._txn.commit_async().result()
        except BaseException:
            self._txn.abort()
            raise
        self._metadata_files()

    def _metadata_files(self) -> None:
        import orbax.checkpoint as ocp

        d = self._directory
        # In the order of the tree's leaves, as Orbax writes them (a dict's keys sorted).
        stored = {name: self._stored[name] for name in sorted(self._stored)}
        _write_json(
            d / "_METADATA",
            {
                "tree_metadata": {
                    str((name,)): {
                        "key_metadata": [{"key": name, "key_type": 2}],
                        "value_metadata": _value_metadata(x),
                    }
                    for name, x in stored.items()
                },
                "use_ocdbt": True,
                "use_zarr3": True,
                "store_array_data_equal_to_fill_value": True,
                "custom_metadata": None,
            },
        )
        on_device = {name: x for name, x in stored.items() if isinstance(x, jax.Array)}
        if on_device:
            sharding = ocp.metadata.SingleDeviceShardingMetadata.from_jax_sharding
            _write_json(
                d / "_sharding",
                {
                    base64.urlsafe_b64encode(name.encode()).decode(): sharding(
                        x.sharding
                    ).to_serialized_string()
                    for name, x in on_device.items()
                },
                compact=True,
            )
            (d / "array_metadatas").mkdir()
            _write_json(
                d / "array_metadatas" / "process_0",
                {
                    "array_metadatas": [
                        {
                            "array_metadata": {
                                "param_name": name,
                                "write_shape": list(x.shape),
                                "chunk_shape": list(x.shape),
                                "ext_metadata": None,
                            }
                        }
                        for name, x in on_device.items()
                    ]
                },
            )
        _write_json(
            d / "_CHECKPOINT_METADATA",
            {
                "item_handlers": HANDLER,
                "metrics": {},
                "performance_metrics": {},
                "init_timestamp_nsecs": self._started,
                "commit_timestamp_nsecs": time.time_ns(),
                "custom_metadata": {},
            },
        )
        (d / "commit_success.txt").write_text(f"Checkpoint commit was successful to {d}")
