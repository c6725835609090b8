"""safetensors files and Hugging Face sharded checkpoints."""

from __future__ import annotations

import collections
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
from _torch import safetensors_torch, torch

import jmodule.serialization as jms


def _sd():
    rng = np.random.default_rng(0)
    return collections.OrderedDict(
        [
            ("z.last_but_first", jnp.asarray(rng.standard_normal((3, 4), dtype=np.float32))),
            ("a.bf16", jnp.asarray(rng.standard_normal(5, dtype=np.float32)).astype(jnp.bfloat16)),
            (
                "m.half",
                jnp.asarray(rng.standard_normal((2, 2), dtype=np.float32)).astype(jnp.float16),
            ),
            ("count", jnp.asarray(7, jnp.int32)),
            ("mask", jnp.asarray([True, False])),
            ("empty", jnp.zeros((0, 3), jnp.float32)),
            ("wide", np.arange(4, dtype=np.int64) * 2**33),
        ]
    )


def _bits(x):
    x = np.asarray(x)
    return x.dtype, x.shape, x.tobytes()


def test_round_trip_keeps_order_dtypes_shapes_and_metadata(tmp_path):
    sd = _sd()
    path = tmp_path / "w.safetensors"
    jms.save(sd, path, metadata={"format": "pt", "note": "hello"})
    out = jms.load(path)
    assert list(out) == list(sd)
    for k, v in sd.items():
        assert isinstance(out[k], jax.Array), k
        if k == "wide":  # int64 -> int32 with x64 off, as everywhere in JAX
            assert out[k].dtype == jnp.int32
            np.testing.assert_array_equal(np.asarray(out[k]), v.astype(np.int32))
        else:
            assert _bits(out[k]) == _bits(v), k
    assert jms.read_metadata(path) == {"format": "pt", "note": "hello"}


@pytest.mark.torch
def test_files_jm_writes_are_read_by_the_safetensors_library_and_torch(tmp_path):
    sd = _sd()
    path = tmp_path / "w.safetensors"
    jms.save(sd, path, metadata={"format": "pt"})
    loaded = safetensors_torch.load_file(path)
    assert sorted(loaded) == sorted(sd)
    assert loaded["a.bf16"].dtype == torch.bfloat16
    np.testing.assert_array_equal(
        loaded["a.bf16"].float().numpy(), np.asarray(sd["a.bf16"]).astype(np.float32)
    )
    assert loaded["count"].shape == () and int(loaded["count"]) == int(sd["count"])
    with safetensors.safe_open(path, framework="pt") as f:
        assert f.metadata()["format"] == "pt"


@pytest.mark.torch
def test_files_written_by_torch_load(tmp_path):
    ref = {
        "w": torch.randn(4, 3),
        "b": torch.randn(3).bfloat16(),
        "h": torch.randn(2).half(),
        "i": torch.arange(3, dtype=torch.int32),
    }
    path = tmp_path / "torch.safetensors"
    safetensors_torch.save_file(ref, path, metadata={"format": "pt"})
    out = jms.load(path)
    assert sorted(out) == list(out)  # no jm order entry: sorted, as safetensors lists them
    for k, t in ref.items():
        expected = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        got = np.asarray(out[k])
        assert str(got.dtype) == str(t.dtype).removeprefix("torch."), k
        np.testing.assert_array_equal(got.astype(expected.dtype), expected)
    assert jms.read_metadata(path) == {"format": "pt"}


def test_map_location_applies(tmp_path):
    path = tmp_path / "w.safetensors"
    jms.save(_sd(), path)
    out = jms.load(path, map_location=jnp.bfloat16)
    assert out["z.last_but_first"].dtype == jnp.bfloat16 and out["count"].dtype == jnp.int32
    meta = jms.load(path, map_location="meta")
    assert meta["m.half"] == jax.ShapeDtypeStruct((2, 2), jnp.float16)


def test_refusals(tmp_path):
    path = tmp_path / "w.safetensors"
    with pytest.raises(TypeError, match="'model' of type dict"):
        jms.save({"model": {"w": jnp.ones(2)}}, path)
    with pytest.raises(TypeError, match="holds only arrays"):
        jms.save({"epoch": 3}, path)
    with pytest.raises(TypeError, match="reserved"):
        jms.save({"w": jnp.ones(2)}, path, metadata={"jmodule.order": "[]"})
    with pytest.raises(TypeError, match="str to str"):
        jms.save({"w": jnp.ones(2)}, path, metadata={"n": 1})
    assert not path.exists()
    jms.save({"w": jnp.ones(2)}, path)
    with pytest.raises(jms.CheckpointExistsError, match="overwrite=True"):
        jms.save({"w": jnp.zeros(2)}, path)
    jms.save({"w": jnp.zeros(2)}, path, overwrite=True)
    assert float(jms.load(path)["w"][0]) == 0.0
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


def _write_sharded(tmp_path, sd, writer, suffix, index_name):
    keys = list(sd)
    shards = {"a": keys[: len(keys) // 2], "b": keys[len(keys) // 2 :]}
    weight_map = {}
    for i, (tag, names) in enumerate(shards.items()):
        file = f"model-{i + 1:05d}-of-00002.{suffix}"
        writer({k: sd[k] for k in names}, tmp_path / file)
        weight_map.update({k: file for k in names})
    index = {"metadata": {"total_size": "123"}, "weight_map": weight_map}
    (tmp_path / index_name).write_text(json.dumps(index))
    return tmp_path / index_name, weight_map


def _torch_sd():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2)
    )
    return model.state_dict()


@pytest.mark.torch
@pytest.mark.parametrize(
    "suffix, index_name, writer",
    [
        ("safetensors", "model.safetensors.index.json", safetensors_torch.save_file),
        ("bin", "pytorch_model.bin.index.json", torch.save),
    ],
)
def test_sharded_checkpoints_load_as_one_state_dict(tmp_path, suffix, index_name, writer):
    sd = _torch_sd()
    index, weight_map = _write_sharded(tmp_path, sd, writer, suffix, index_name)
    out = jms.load(index)
    assert list(out) == list(weight_map)
    for k, t in sd.items():
        np.testing.assert_array_equal(
            np.asarray(out[k]), t.numpy().astype(np.asarray(out[k]).dtype)
        )
    assert out["1.num_batches_tracked"].dtype == jnp.int32
    assert jms.read_metadata(index) == {"total_size": "123"}


@pytest.mark.torch
def test_sharded_checkpoint_errors(tmp_path):
    sd = _torch_sd()
    index, weight_map = _write_sharded(
        tmp_path, sd, safetensors_torch.save_file, "safetensors", "m.safetensors.index.json"
    )
    original = json.loads(index.read_text())

    def with_map(weight_map):
        index.write_text(json.dumps({**original, "weight_map": weight_map}))

    with_map({**weight_map, "extra.weight": "model-00003-of-00002.safetensors"})
    with pytest.raises(jms.CorruptCheckpointError, match="which is missing"):
        jms.load(index)
    with_map({**weight_map, "extra.weight": weight_map["0.weight"]})
    with pytest.raises(jms.CorruptCheckpointError, match=r"missing \['extra.weight'\]"):
        jms.load(index)
    with_map({k: v for k, v in weight_map.items() if k != "0.bias"})
    with pytest.raises(jms.CorruptCheckpointError, match=r"unexpected \['0.bias'\]"):
        jms.load(index)
    with_map({"0.weight": "../outside.safetensors"})
    with pytest.raises(jms.CorruptCheckpointError, match="outside its own directory"):
        jms.load(index)
    index.write_text("{not json")
    with pytest.raises(jms.CorruptCheckpointError, match="not a valid checkpoint index") as info:
        jms.load(index)
    assert str(index) in str(info.value)
