"""jm checkpoints stay Orbax checkpoints: Orbax opens them, old ones still verify, and
the fast read path (TensorStore into the target placement) gives what was saved."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _paths import ROOT

import jmodule.serialization as jms
from jmodule._placement.device import single_device_sharding
from jmodule.serialization import _atomic, _checksum, _directory, _metafile

#: Written by jm before checkpoints used CRC-32C (``"crc32:..."`` checksums): see
#: ``_old_state`` for what it holds.
OLD = Path(__file__).parent / "data" / "crc32_checkpoint"


def _old_state() -> collections.OrderedDict:
    """What ``OLD`` was saved from (the same seeded generator, in the same order)."""
    rng = np.random.default_rng(14)
    return collections.OrderedDict(
        [
            ("fc.weight", jnp.asarray(rng.standard_normal((16, 8), dtype=np.float32))),
            (
                "fc.bias",
                jnp.asarray(rng.standard_normal(16, dtype=np.float32)).astype(jnp.bfloat16),
            ),
            ("steps", jnp.asarray(rng.integers(0, 100, 5), dtype=jnp.int32)),
            ("epoch", 3),
        ]
    )


def _state(seed: int = 0) -> collections.OrderedDict:
    rng = np.random.default_rng(seed)
    return collections.OrderedDict(
        [
            ("a.weight", jnp.asarray(rng.standard_normal((64, 32), dtype=np.float32))),
            ("a.bias", jnp.asarray(rng.standard_normal(64, dtype=np.float32))),
            ("b.scale", jnp.asarray(rng.standard_normal(7, dtype=np.float32)).astype(jnp.float16)),
            ("b.count", jnp.asarray(rng.integers(0, 2**20, (3, 5)), dtype=jnp.int32)),
            ("empty", jnp.zeros((0, 4), jnp.float32)),
        ]
    )


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _flip(root: Path, needle: bytes) -> bool:
    """Flip one bit of ``needle`` wherever it occurs in the files under ``root``.

    Small arrays are stored inline in OCDBT's tree nodes, of which Orbax keeps a
    per-process copy besides the merged one, so the same bytes can be in several files.
    """
    found = False
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            data = bytearray(p.read_bytes())
            at = data.find(needle)
            if at >= 0:
                data[at + len(needle) // 2] ^= 0x04
                p.write_bytes(bytes(data))
                found = True
    return found


def test_orbax_restores_the_arrays_of_a_jm_checkpoint(tmp_path):
    import orbax.checkpoint as ocp

    sd = _state()
    jms.save(sd, tmp_path / "c")
    body = _metafile.read(tmp_path / "c")
    stored = {e["stored"]: e["key"] for e in body["arrays"] if e["stored"] is not None}
    # Restored the way Orbax's documentation does: onto a sharding given per array.
    device = single_device_sharding(jax.devices()[0])
    target = {
        name: jax.ShapeDtypeStruct(tuple(sd[key].shape), sd[key].dtype, sharding=device)
        for name, key in stored.items()
    }
    restore_args = {name: ocp.ArrayRestoreArgs(sharding=device) for name in stored}
    with ocp.PyTreeCheckpointer() as checkpointer:
        plain = checkpointer.restore(
            tmp_path / "c" / _directory.ARRAYS,
            args=ocp.args.PyTreeRestore(restore_args=restore_args),
        )
    with ocp.StandardCheckpointer() as checkpointer:
        standard = checkpointer.restore(tmp_path / "c" / _directory.ARRAYS, target)
    for out in (plain, standard):
        assert set(out) == set(stored)
        for name, key in stored.items():
            assert _same(out[name], sd[key]), key


def test_new_checkpoints_carry_crc32c_and_it_matches_the_saved_bytes(tmp_path):
    import google_crc32c

    sd = _state()
    jms.save(sd, tmp_path / "c")
    entries = {e["key"]: e["crc32"] for e in _metafile.read(tmp_path / "c")["arrays"]}
    for key, x in sd.items():
        data = np.asarray(x).tobytes()
        assert entries[key] == f"crc32c:{google_crc32c.value(data):08x}", key


def test_a_checkpoint_with_crc32_checksums_still_loads_and_verifies(tmp_path):
    entries = _metafile.read(OLD)["arrays"]
    assert all(e["crc32"].startswith("crc32:") for e in entries)
    want = _old_state()
    for e in entries:  # the stored checksums are zlib's CRC-32 of the arrays
        assert e["crc32"] == f"crc32:{zlib.crc32(np.asarray(want[e['key']]).tobytes()):08x}"
    out = jms.load(OLD)
    assert list(out) == list(want) and out["epoch"] == want["epoch"]
    for key in ("fc.weight", "fc.bias", "steps"):
        assert _same(out[key], want[key]), key

    copy = tmp_path / "old"
    shutil.copytree(OLD, copy)
    assert _flip(copy / _directory.ARRAYS, np.asarray(want["fc.weight"]).tobytes()[64:96])
    with pytest.raises(jms.CorruptCheckpointError, match=r"'fc\.weight'") as info:
        jms.load(copy)
    assert str(copy) in str(info.value) and "'fc.bias'" not in str(info.value)


def test_a_checksum_of_an_unknown_kind_is_refused(tmp_path):
    import hashlib
    import json

    jms.save(_state(), tmp_path / "c")
    body = _metafile.read(tmp_path / "c")
    body["arrays"][0]["crc32"] = "md4:00000000"
    data = json.dumps(body).encode()
    header = f"{_metafile.MAGIC} 1 sha256={hashlib.sha256(data).hexdigest()} bytes={len(data)}\n"
    (tmp_path / "c" / _metafile.NAME).write_bytes(header.encode() + data)
    with pytest.raises(jms.CorruptCheckpointError, match="a checksum of a kind jm does not know"):
        jms.load(tmp_path / "c")
    assert _same(jms.load(tmp_path / "c", verify=False)["a.weight"], _state()["a.weight"])


def test_loaded_arrays_are_jax_arrays_that_can_be_donated(tmp_path):
    sd = _state(3)
    jms.save(sd, tmp_path / "c")
    out = jms.load(tmp_path / "c")
    for key, x in sd.items():
        assert isinstance(out[key], jax.Array) and _same(out[key], x), key
    step = jax.jit(lambda w: w * 2 + 1, donate_argnums=0)
    want = np.asarray(sd["a.weight"]) * 2 + 1
    assert np.array_equal(np.asarray(step(out["a.weight"])), want)
    again = jms.load(tmp_path / "c")  # the file is untouched by the donation
    assert _same(again["a.weight"], sd["a.weight"])


def test_checksums_of_each_algorithm_match_their_library():
    import google_crc32c

    data = np.random.default_rng(1).integers(0, 256, 10_000, dtype=np.uint8)
    assert _checksum.digest(data) == f"crc32c:{google_crc32c.value(data.tobytes()):08x}"
    assert _checksum.digest(data, "crc32") == f"crc32:{zlib.crc32(data.tobytes()):08x}"
    assert _checksum.many([data, data[:10]], ["crc32", "crc32c"]) == [
        _checksum.digest(data, "crc32"),
        _checksum.digest(data[:10], "crc32c"),
    ]
    assert _checksum.algorithm_of("crc32c:0") == "crc32c"
    assert _checksum.algorithm_of("crc32:0") == "crc32"
    assert _checksum.algorithm_of("per shard") is None


@pytest.mark.slow
def test_overwrite_deletes_the_old_checkpoint_and_a_normal_exit_leaves_nothing(tmp_path):
    path = tmp_path / "c"
    jms.save(_state(1), path)
    jms.save(_state(2), path, overwrite=True)
    assert _same(jms.load(path)["a.weight"], _state(2)["a.weight"])
    _atomic.settle()
    assert _atomic.leftovers(path) == [] and sorted(os.listdir(tmp_path)) == ["c"]
    # A script that overwrites and exits at once: Python waits for the deletion.
    code = textwrap.dedent(
        f"""
        import jax.numpy as jnp
        import jmodule.serialization as jms
        jms.save({{"w": jnp.arange(3000.0)}}, {str(path)!r}, overwrite=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert sorted(os.listdir(tmp_path)) == ["c"]
    assert _same(jms.load(path)["w"], jnp.arange(3000.0))


@pytest.mark.slow
def test_sharded_saves_and_loads_onto_any_placement_are_verified(tmp_path):
    code = textwrap.dedent(
        f"""
        import os
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import jmodule.serialization as jms
        from jmodule.serialization import _directory
        assert len(jax.devices()) == 4
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
        rows, cols, whole = (NamedSharding(mesh, P(*s)) for s in (("a",), (None, "b"), ()))
        # Shards of over 1 KiB: smaller values are stored compressed, inside OCDBT's tree.
        w = jax.device_put(jnp.arange(256.0 * 16).reshape(256, 16), rows)
        v = jax.device_put(jnp.arange(40, dtype=jnp.int32).reshape(4, 10), cols)
        path = {str(tmp_path / "c")!r}
        jms.save({{"w": w, "v": v}}, path)
        for where in (rows, cols, whole, jax.devices()[3]):
            out = jms.load(path, map_location=where)
            for key, x in (("w", w), ("v", v)):
                assert np.array_equal(np.asarray(out[key]), np.asarray(x)), (key, where)
                want = where if isinstance(where, NamedSharding) else None
                if want is not None:
                    assert out[key].sharding == want, (key, out[key].sharding)
                else:
                    assert out[key].devices() == {{where}}, out[key].devices()
        # One saved shard of w damaged: named whichever placement reads it.
        needle = np.asarray(w)[140:144].tobytes()
        flipped = 0
        for dirpath, _, files in os.walk(os.path.join(path, _directory.ARRAYS)):
            for name in files:
                p = os.path.join(dirpath, name)
                data = bytearray(open(p, "rb").read())
                at = data.find(needle)
                if at >= 0:
                    data[at + 5] ^= 1
                    open(p, "wb").write(bytes(data))
                    flipped += 1
        assert flipped, "the shard's bytes were not found in the data files"
        for where in (rows, cols, whole):
            try:
                jms.load(path, map_location=where)
            except jms.CorruptCheckpointError as e:
                assert "'w'" in str(e) and "'v'" not in str(e), str(e)
            else:
                raise AssertionError("a damaged shard loaded")
        print("ok")
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
