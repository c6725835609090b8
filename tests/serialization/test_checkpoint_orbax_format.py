"""jm.save's own writer of Orbax checkpoints writes exactly what Orbax writes, and Orbax reads it.

``jmodule/serialization/_orbax_writer.py`` writes a checkpoint directory's
``arrays/`` (single process; numpy and single-device arrays) without going
through ``PyTreeCheckpointHandler``. Every file is compared here with what
Orbax itself writes for the same arrays, in the same test, and Orbax's own
restore and metadata read what jm wrote.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

import jmodule.serialization as jms
from jmodule.serialization import _directory


def _state() -> dict:
    rng = np.random.default_rng(0)
    return {
        "w": jnp.asarray(rng.standard_normal((5, 7), dtype=np.float32)),
        "b": jnp.asarray(rng.standard_normal(7), jnp.bfloat16),
        "h": jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float16),
        "step": jnp.asarray(3, jnp.int32),
        "scale": jnp.float32(0.5),
        "mask": np.array([[True, False], [False, True]]),
        "ids": np.arange(12, dtype=np.int8).reshape(3, 4),
        "u": np.arange(5, dtype=np.uint8),
        "host16": np.ones((3,), ml_dtypes.bfloat16),
        "i64": jnp.arange(4),
        # More arrays of the same dtypes and ranks (the writer derives their specs
        # from the first one's): every one is compared with Orbax's.
        "w2": jnp.asarray(rng.standard_normal((3, 9), dtype=np.float32)),
        "w3": jnp.ones((1, 1), jnp.float32),
        "b2": jnp.ones((11,), jnp.bfloat16),
        "ids2": np.zeros((2, 2), np.int8),
        "n3": np.ones((4, 1, 2), np.float32),
        "n3b": np.ones((2, 5, 3), np.float32),
        "scale2": jnp.float32(-1.0),
    }


def _orbax_dir(tmp_path, stored: dict):
    """The directory Orbax's own PyTreeCheckpointHandler writes for ``stored``."""
    path = tmp_path / "orbax"
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**_directory.ORBAX_OPTIONS))
    try:
        checkpointer.save(path, args=ocp.args.PyTreeSave(stored))
    finally:
        checkpointer.close()
    return path


def _stored_as_jm_names(state: dict) -> dict:
    """The ``{"a<i>": array}`` dict jm hands to the array writer for ``state``."""
    return {f"a{i}": x for i, x in enumerate(state.values())}


def _kvstore(path) -> ts.KvStore:
    return ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path}/"}).result()


def _files(path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


def test_every_metadata_file_and_every_array_spec_equal_orbaxs_own(tmp_path):
    state = _state()
    jms.save(state, tmp_path / "jm")
    mine = tmp_path / "jm" / "arrays"
    theirs = _orbax_dir(tmp_path, _stored_as_jm_names(state))
    for name in ("_METADATA", "_sharding", "array_metadatas/process_0"):
        assert (mine / name).read_text() == (theirs / name).read_text(), name
    ours_meta = json.loads((mine / "_CHECKPOINT_METADATA").read_text())
    their_meta = json.loads((theirs / "_CHECKPOINT_METADATA").read_text())
    assert set(ours_meta) == set(their_meta)
    assert ours_meta["item_handlers"] == their_meta["item_handlers"]
    assert ours_meta["init_timestamp_nsecs"] <= ours_meta["commit_timestamp_nsecs"]
    assert (mine / "commit_success.txt").exists() == (theirs / "commit_success.txt").exists()
    assert (mine / "manifest.ocdbt").is_file()
    # The same keys in the OCDBT database, the same zarr3 metadata and the same bytes.
    kv_mine, kv_theirs = _kvstore(mine), _kvstore(theirs)
    keys = kv_theirs.list().result()
    assert sorted(kv_mine.list().result()) == sorted(keys)
    for key in keys:
        a, b = kv_mine.read(key).result().value, kv_theirs.read(key).result().value
        if key.endswith(b"zarr.json"):
            assert json.loads(a) == json.loads(b), key
        else:
            assert a == b, key
    # Orbax's other files (its per-process OCDBT it merges away) are the only extras.
    extra = _files(theirs) - _files(mine)
    assert all(f.startswith(("ocdbt.process_0/", "d/")) for f in extra), extra


def test_orbax_restores_what_jm_wrote_with_and_without_restore_arguments(tmp_path):
    state = _state()
    jms.save(state, tmp_path / "c")
    arrays = tmp_path / "c" / "arrays"
    names = _stored_as_jm_names(state)
    theirs = _orbax_dir(tmp_path, names)
    # Without restore arguments Orbax takes each jax.Array's sharding from `_sharding`
    # (and warns that it does so, for its own checkpoints as for these).
    with pytest.warns(UserWarning, match="Sharding info not provided"):
        plain = ocp.PyTreeCheckpointer().restore(arrays)
    with pytest.warns(UserWarning, match="Sharding info not provided"):
        reference = ocp.PyTreeCheckpointer().restore(theirs)
    assert set(plain) == set(names)
    for name, x in names.items():
        assert type(plain[name]) is type(reference[name]), name
        assert plain[name].dtype == x.dtype and plain[name].shape == x.shape, name
        np.testing.assert_array_equal(np.asarray(plain[name]), np.asarray(x))
        if isinstance(x, jax.Array):
            assert plain[name].sharding == x.sharding
    as_numpy = ocp.PyTreeCheckpointer().restore(
        arrays,
        args=ocp.args.PyTreeRestore(
            restore_args={k: ocp.RestoreArgs(restore_type=np.ndarray) for k in names}
        ),
    )
    for name, x in names.items():
        assert isinstance(as_numpy[name], np.ndarray)
        np.testing.assert_array_equal(as_numpy[name], np.asarray(x))
    metadata = ocp.PyTreeCheckpointHandler().metadata(arrays).tree
    for name, x in names.items():
        assert tuple(metadata[name].shape) == x.shape and metadata[name].dtype == x.dtype


def test_single_device_saves_do_not_go_through_orbaxs_handler(tmp_path, monkeypatch):
    # The point of the writer: no per-array Python of PyTreeCheckpointHandler.
    def refuse(*args, **kwargs):
        raise AssertionError("PyTreeCheckpointHandler.save was called")

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "save", refuse)
    state = {f"layer{i}.weight": jnp.full((3, 2), float(i)) for i in range(300)}
    jms.save(state, tmp_path / "c")
    back = jms.load(tmp_path / "c")
    assert list(back) == list(state)
    for key, x in state.items():
        np.testing.assert_array_equal(np.asarray(back[key]), np.asarray(x))


def test_a_failing_write_leaves_nothing_and_raises(tmp_path, monkeypatch):
    # TensorStore refusing mid-write (here: an array it cannot store) aborts the
    # transaction; the staging directory is removed and the error reaches the caller.
    from jmodule.serialization import _orbax_writer

    real = _orbax_writer.Writer._start

    def fail_after_opening(self, ocp_, ts_, context):
        real(self, ocp_, ts_, context)
        raise OSError("injected failure after the writes started")

    monkeypatch.setattr(_orbax_writer.Writer, "_start", fail_after_opening)
    with pytest.raises(OSError, match="injected"):
        jms.save({"w": jnp.ones((4, 4))}, tmp_path / "c")
    assert list(tmp_path.iterdir()) == []


def _assert_as_orbax_writes_it(tmp_path, saved, state: dict) -> None:
    """Every array spec of ``saved`` equals Orbax's own for ``state``, and it loads back."""
    theirs = _orbax_dir(tmp_path, _stored_as_jm_names(state))
    kv_mine, kv_theirs = _kvstore(saved / "arrays"), _kvstore(theirs)
    for i in range(len(state)):
        key = f"a{i}/zarr.json"
        assert json.loads(kv_mine.read(key).result().value) == json.loads(
            kv_theirs.read(key).result().value
        )
    back = jms.load(saved)
    for key, x in state.items():
        np.testing.assert_array_equal(np.asarray(back[key]), np.asarray(x))


def test_a_spec_template_that_disagrees_with_orbax_is_not_used(tmp_path, monkeypatch):
    # The writer checks its first derived spec per dtype and rank against Orbax's own;
    # were the derivation wrong (a future Orbax), each array gets Orbax's spec.
    from jmodule.serialization import _orbax_writer

    real = _orbax_writer._renamed

    def wrong(template, name, shape, directory):
        spec = real(template, name, shape, directory)
        spec["metadata"]["chunk_grid"]["configuration"]["chunk_shape"] = [1] * len(shape)
        return spec

    monkeypatch.setattr(_orbax_writer, "_renamed", wrong)
    monkeypatch.setattr(_orbax_writer, "_TEMPLATES", {})  # checked again in this process
    state = {f"p{i}": jnp.full((i + 2, 3), float(i)) for i in range(4)}
    jms.save(state, tmp_path / "jm")
    _assert_as_orbax_writes_it(tmp_path, tmp_path / "jm", state)


def test_orbaxs_spec_builder_runs_once_per_dtype_and_rank_in_a_process(tmp_path, monkeypatch):
    # Orbax's builder costs ~0.3 ms of Python per call and TensorStore's to_json inside
    # it leaks: later saves derive every spec from the process's checked templates
    # (benchmarks/soak.py's memory figure).
    from jmodule.serialization import _orbax_writer

    monkeypatch.setattr(_orbax_writer, "_TEMPLATES", {})
    calls = []
    real = _orbax_writer._Specs.orbax

    def counted(self, name, data):
        calls.append((data.dtype.name, data.ndim))
        return real(self, name, data)

    monkeypatch.setattr(_orbax_writer._Specs, "orbax", counted)
    state = {f"p{i}": jnp.full((i + 2, 3), float(i)) for i in range(3)} | {
        "b": jnp.ones(5),
        "c": jnp.zeros(7),
    }
    jms.save(state, tmp_path / "first")
    first = list(calls)
    assert sorted(set(first)) == [("float32", 1), ("float32", 2)]
    for n in range(3):
        jms.save(state, tmp_path / f"again{n}")
    assert calls == first  # no call for later saves, into other directories
    _assert_as_orbax_writes_it(tmp_path, tmp_path / "again2", state)


def test_numpy_arrays_of_ml_dtypes_round_trip(tmp_path):
    # numpy calls bfloat16, float8 and int4 arrays kind "V"; they used to be refused.
    state = {
        "bf16": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3),
        "f8": np.linspace(-2, 2, 5).astype(ml_dtypes.float8_e4m3fn),
        "i4": np.arange(-3, 4).astype(ml_dtypes.int4),
    }
    jms.save(state, tmp_path / "c")
    back = jms.load(tmp_path / "c")
    for key, x in state.items():
        assert back[key].dtype == x.dtype
        np.testing.assert_array_equal(
            np.asarray(back[key]).astype(np.float32), x.astype(np.float32)
        )
    # A structured numpy dtype (also kind "V") stays refused, naming the key.
    with pytest.raises(TypeError, match="'rec'"):
        jms.save({"rec": np.zeros(2, [("a", np.int32)])}, tmp_path / "d")


def test_typed_prng_keys_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(TypeError, match=r"'gen'.*key_data.*wrap_key_data"):
        jms.save({"gen": jax.random.key(0)}, tmp_path / "c")
    assert not (tmp_path / "c").exists()
    # Raw uint32 keys are plain arrays.
    jms.save({"gen": jax.random.PRNGKey(0)}, tmp_path / "raw")
    np.testing.assert_array_equal(
        np.asarray(jms.load(tmp_path / "raw")["gen"]), np.asarray(jax.random.PRNGKey(0))
    )


def _mmap_metrics() -> dict[str, int]:
    found = ts.experimental_collect_matching_metrics(
        "/tensorstore/file/mmap", include_zero_metrics=True
    )
    return {m["name"].rsplit("/", 1)[-1]: m["values"][0]["value"] for m in found}


def test_load_maps_the_data_files_and_keeps_no_mapping(tmp_path):
    # TensorStore's memmap file mode: each array is copied once, from the page cache
    # into its own buffer (no intermediate read buffer). The arrays returned are
    # copies: once jm.load returns nothing is mapped, so a later truncation or
    # deletion of the files cannot touch them.
    rng = np.random.default_rng(1)
    state = {
        "big": rng.standard_normal((512, 1024), dtype=np.float32),
        "small": rng.standard_normal(10, dtype=np.float32),
    }
    jms.save(state, tmp_path / "ck")
    before = _mmap_metrics()
    loaded = jms.load(tmp_path / "ck")
    after = _mmap_metrics()
    assert after["mmap_count"] > before["mmap_count"]
    assert after["mmap_bytes"] - before["mmap_bytes"] >= state["big"].nbytes
    assert after["mmap_active"] == 0
    for f in (tmp_path / "ck" / "arrays" / "d").iterdir():
        f.write_bytes(b"")
    for key, value in state.items():
        np.testing.assert_array_equal(np.asarray(loaded[key]), value)
