"""jm.save / jm.load with Orbax checkpoint directories: round trips, placement, atomicity."""

from __future__ import annotations

import collections
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _paths import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jmodule as jm
import jmodule.serialization as jms
from jmodule._placement.device import single_device_sharding
from jmodule.serialization import _atomic, _directory, _metafile

DTYPES = [
    jnp.float32,
    jnp.float16,
    jnp.bfloat16,
    jnp.int32,
    jnp.int8,
    jnp.uint8,
    jnp.int16,
    jnp.uint32,
    jnp.bool_,
    jnp.complex64,
    jnp.float8_e4m3fn,
]


def _random(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(dtype)
    if dtype == np.bool_:
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return jnp.asarray(rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype))
    values = rng.standard_normal(shape) * 3
    if jnp.issubdtype(dtype, jnp.complexfloating):
        values = values + 1j * rng.standard_normal(shape)
    return jnp.asarray(values.astype(np.complex64 if dtype.kind == "c" else np.float32)).astype(
        dtype
    )


def _same(a, b):
    """Same dtype, shape and bits."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_state_dict_round_trip_keeps_keys_order_dtypes_and_values(tmp_path):
    sd = collections.OrderedDict(
        (f"layer{i}.{dt.__name__}", _random((3, 5), dt, i)) for i, dt in enumerate(DTYPES)
    )
    sd["zz.first_inserted_last"] = _random((2,), jnp.float32, 99)
    sd["aa.scalar"] = jnp.asarray(2.5, jnp.bfloat16)
    sd["empty"] = jnp.zeros((0, 4), jnp.float16)
    jms.save(sd, tmp_path / "ckpt")
    out = jms.load(tmp_path / "ckpt")
    assert type(out) is collections.OrderedDict
    assert list(out) == list(sd)
    for k in sd:
        assert isinstance(out[k], jax.Array), k
        assert _same(out[k], sd[k]), k


def test_nested_object_with_plain_values_comes_back_identical(tmp_path):
    model = collections.OrderedDict(w=_random((4, 4), jnp.float32), b=_random((4,), jnp.bfloat16))
    model._metadata = collections.OrderedDict({"": {"version": 1}, "fc": {"version": 2}})
    obj = {
        "model": model,
        "optim": {"state": {0: {"step": 7, "exp_avg": _random((4,), jnp.float32, 3)}}, "lr": 1e-3},
        "epoch": 3,
        "big": 2**100,
        "loss": float("nan"),
        "neg_zero": -0.0,
        "inf": float("-inf"),
        "name": "résumé ☃",
        "flags": (True, False, None),
        "history": [1, [2.5, "x"], ()],
        "raw": b"\x00\xffbytes",
        "z": 1 + 2j,
        (1, "tuple key"): "ok",
        None: "none key",
    }
    jms.save(obj, tmp_path / "ckpt")
    out = jms.load(tmp_path / "ckpt")
    assert list(out) == list(obj)
    assert type(out["model"]) is collections.OrderedDict
    assert out["model"]._metadata == model._metadata
    assert _same(out["model"]["w"], model["w"]) and _same(out["model"]["b"], model["b"])
    state = out["optim"]["state"]
    assert list(state) == [0] and state[0]["step"] == 7
    assert _same(state[0]["exp_avg"], obj["optim"]["state"][0]["exp_avg"])
    for key in ("epoch", "big", "name", "flags", "history", "raw", "z", (1, "tuple key"), None):
        assert out[key] == obj[key] and type(out[key]) is type(obj[key]), key
    assert math.isnan(out["loss"])
    assert math.copysign(1, out["neg_zero"]) == -1 and out["inf"] == obj["inf"]
    assert type(out["history"][2]) is tuple and type(out["flags"][2]) is type(None)


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=plain)
def test_any_plain_value_round_trips_with_its_type(tmp_path_factory, value):
    path = tmp_path_factory.mktemp("plain") / "ckpt"
    jms.save({"v": value}, path)
    out = jms.load(path)["v"]

    def same(a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, dict):
            return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        return a == b

    assert same(out, value)


def test_parameters_are_saved_as_their_arrays(tmp_path):
    import jmodule as jm

    layer = jm.nn.Linear(3, 2)
    params = dict(layer.named_parameters())
    jms.save(params, tmp_path / "c")
    out = jms.load(tmp_path / "c")
    assert list(out) == ["weight", "bias"]
    for k, p in params.items():
        assert type(out[k]) is type(jnp.zeros(1)) and _same(out[k], p.data)


def test_numpy_inputs_come_back_as_jax_arrays_and_tied_arrays_stay_tied(tmp_path):
    shared = jnp.arange(6.0)
    obj = {"np": np.arange(6, dtype=np.int16).reshape(2, 3), "scalar": np.float32(1.5)}
    obj["a"] = shared
    obj["b"] = shared
    jms.save(obj, tmp_path / "c")
    out = jms.load(tmp_path / "c")
    assert isinstance(out["np"], jax.Array) and _same(out["np"], obj["np"])
    assert isinstance(out["scalar"], jax.Array) and out["scalar"].shape == ()
    assert float(out["scalar"]) == float(obj["scalar"])
    assert out["a"] is out["b"]


def test_int64_becomes_int32_with_x64_off(tmp_path):
    values = np.array([1, -5, 2**31 - 1], dtype=np.int64)
    jms.save({"n": values, "f": values.astype(np.float64)}, tmp_path / "c")
    out = jms.load(tmp_path / "c")
    assert out["n"].dtype == jnp.int32 and out["f"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out["n"]), values.astype(np.int32))
    np.testing.assert_array_equal(np.asarray(out["f"]), values.astype(np.float32))


def _run_subprocess(code: str, **env) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **env},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.torch
def test_x64_mode_keeps_int64_and_a_sharding_is_restored_onto_directly(tmp_path):
    import torch

    big = torch.tensor([2**40, -(2**35), 7], dtype=torch.int64)
    torch.save({"n": big, "d": big.double()}, tmp_path / "w.pt")
    code = f"""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import jmodule.serialization as jms
        assert jax.config.jax_enable_x64 and len(jax.devices()) == 2
        pt = jms.load("{tmp_path / "w.pt"}")
        assert pt["n"].dtype == jnp.int64 and pt["d"].dtype == jnp.float64
        assert np.asarray(pt["n"]).tolist() == {big.tolist()}
        assert np.asarray(pt["d"]).tolist() == {big.double().tolist()}
        x = jnp.arange(8, dtype=jnp.int64) + 2**40
        w = jnp.arange(16.0, dtype=jnp.float64).reshape(4, 4)
        jms.save({{"x": x, "w": w}}, "{tmp_path / "c"}")
        mesh = Mesh(np.array(jax.devices()), ("d",))
        sharding = NamedSharding(mesh, P("d"))
        out = jms.load("{tmp_path / "c"}", map_location=sharding)
        assert out["x"].dtype == jnp.int64 and (np.asarray(out["x"]) == np.asarray(x)).all()
        assert out["w"].dtype == jnp.float64 and (np.asarray(out["w"]) == np.asarray(w)).all()
        for a in out.values():
            assert a.sharding == sharding, a.sharding
            assert len({{s.device for s in a.addressable_shards}}) == 2
        print("ok")
    """
    out = _run_subprocess(
        code, JAX_ENABLE_X64="1", XLA_FLAGS="--xla_force_host_platform_device_count=2"
    )
    assert out.strip() == "ok"


def test_map_location_device_dtype_pair_array_and_callable(tmp_path):
    sd = {"w": _random((3,), jnp.float32), "h": _random((3,), jnp.bfloat16), "i": jnp.arange(3)}
    jms.save(sd, tmp_path / "c")
    cpu = jax.devices("cpu")[0]
    for spec in ("cpu", cpu, jm.device("cpu"), single_device_sharding(cpu)):
        out = jms.load(tmp_path / "c", map_location=spec)
        assert all(a.devices() == {cpu} for a in out.values())
        assert all(_same(out[k], sd[k]) for k in sd)
    for spec in (jnp.float16, ("cpu", jnp.float16), jnp.zeros(1, jnp.float16)):
        out = jms.load(tmp_path / "c", map_location=spec)
        assert out["w"].dtype == jnp.float16 and out["h"].dtype == jnp.float16
        assert out["i"].dtype == sd["i"].dtype  # integers only move, as in Module.to
        assert _same(out["w"], sd["w"].astype(jnp.float16))
    seen = []
    out = jms.load(tmp_path / "c", map_location=lambda a, key: seen.append(key) or a * 2)
    assert seen == list(sd) and _same(out["w"], sd["w"] * 2)


def test_default_placement_follows_a_device_context_but_not_meta(tmp_path):
    jms.save({"w": jnp.ones(3)}, tmp_path / "c")
    with jm.device("cpu"):
        assert jms.load(tmp_path / "c")["w"].devices() == {jax.devices("cpu")[0]}
    with jm.device("meta"):  # a meta context builds models; loading still reads data
        out = jms.load(tmp_path / "c")["w"]
    assert isinstance(out, jax.Array) and float(out.sum()) == 3.0


def test_map_location_meta_reads_no_data(tmp_path):
    sd = {"w": _random((3, 2), jnp.bfloat16)}
    jms.save(sd, tmp_path / "c")
    data = tmp_path / "c" / _directory.ARRAYS
    _atomic.rmtree(data)  # nothing is read: the data may as well be gone
    out = jms.load(tmp_path / "c", map_location="meta")
    assert out["w"] == jax.ShapeDtypeStruct((3, 2), jnp.bfloat16)


def test_map_location_refuses_integer_dtype_and_unknown_device(tmp_path):
    jms.save({"w": jnp.ones(2)}, tmp_path / "c")
    with pytest.raises(TypeError, match="floating point or complex"):
        jms.load(tmp_path / "c", map_location=jnp.int32)
    with pytest.raises(RuntimeError, match="not available"):
        jms.load(tmp_path / "c", map_location="cuda:7")
    with pytest.raises(TypeError, match="floating point or complex"):
        jms.load(tmp_path / "c", map_location=jnp.zeros(1, jnp.int32))  # as Module.to


@pytest.mark.torch
def test_map_location_reads_the_words_of_module_to(tmp_path):
    """One parser serves both: torch objects and complex-to-real casts behave as in ``to``."""
    import torch

    sd = {"w": _random((3,), jnp.float32), "i": jnp.arange(2)}
    jms.save(sd, tmp_path / "c")
    for spec in (torch.zeros(1, dtype=torch.float16), (torch.device("cpu"), torch.float16)):
        out = jms.load(tmp_path / "c", map_location=spec)
        assert out["w"].dtype == jnp.float16 and out["i"].dtype == sd["i"].dtype
        assert out["w"].devices() == {jax.devices("cpu")[0]}
    jms.save({"z": jnp.ones(2, jnp.complex64)}, tmp_path / "z")
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        out = jms.load(tmp_path / "z", map_location=jnp.float32)
    assert out["z"].dtype == jnp.float32 and _same(out["z"], jnp.ones(2))
    model = jm.nn.Linear(2, 2)
    model.register_buffer("z", jnp.ones(2, jnp.complex64))
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        model.to(torch.float32)
    assert model.z.dtype == jnp.float32


def test_existing_path_needs_overwrite_and_overwrite_replaces(tmp_path):
    path = tmp_path / "c"
    jms.save({"v": 1}, path)
    with pytest.raises(jms.CheckpointExistsError, match="overwrite=True") as info:
        jms.save({"v": 2}, path)
    assert isinstance(info.value, FileExistsError) and str(path) in str(info.value)
    assert jms.load(path) == {"v": 1}
    jms.save({"v": 2}, path, overwrite=True)
    assert jms.load(path) == {"v": 2}
    _atomic.settle()  # the replaced checkpoint is deleted in the background
    assert _atomic.leftovers(path) == []


def test_overwrite_refuses_a_directory_that_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "mine"
    path.mkdir()
    (path / "notes.txt").write_text("precious")
    with pytest.raises(jms.CheckpointError, match="not a jmodule checkpoint"):
        jms.save({"v": 1}, path, overwrite=True)
    assert (path / "notes.txt").read_text() == "precious"


def test_unsupported_values_name_their_key(tmp_path):
    class Thing:
        pass

    with pytest.raises(TypeError, match=r"'model\.fc\.extra' of type Thing"):
        jms.save({"model": {"fc.extra": Thing()}}, tmp_path / "c")
    loop: list = []
    loop.append(loop)
    with pytest.raises(TypeError, match="contains itself"):
        jms.save({"x": loop}, tmp_path / "c")
    with pytest.raises(TypeError, match="dtype object"):
        jms.save({"x": np.array([object()])}, tmp_path / "c")
    with pytest.raises(TypeError, match="'w': it is a meta array"):
        jms.save({"w": jax.ShapeDtypeStruct((2,), jnp.float32)}, tmp_path / "c")
    assert not (tmp_path / "c").exists() and os.listdir(tmp_path) == []


def test_pickle_suffix_is_refused_with_advice(tmp_path):
    # .pt/.pth/.bin get PyTorch's zip format (test_save_pt.py); general pickles do not.
    with pytest.raises(ValueError, match=r"does not write general pickles.*model\.pt"):
        jms.save({"w": jnp.ones(2)}, tmp_path / "model.pkl")
    assert os.listdir(tmp_path) == []


def test_metadata_round_trips(tmp_path):
    jms.save({"w": jnp.ones(2)}, tmp_path / "c", metadata={"commit": "abc", "note": "x"})
    assert jms.read_metadata(tmp_path / "c") == {"commit": "abc", "note": "x"}


def test_every_array_has_a_checksum_that_is_verified(tmp_path):
    sd = collections.OrderedDict((f"w{i}", _random((256,), jnp.float32, i)) for i in range(3))
    jms.save(sd, tmp_path / "c")
    body = _metafile.read(tmp_path / "c")
    assert [e["key"] for e in body["arrays"]] == list(sd)
    assert all(e["crc32"].startswith("crc32c:") for e in body["arrays"])
    # Flip one bit of w1 (and only w1) inside Orbax's data files: w1 is named.
    target = np.asarray(sd["w1"]).tobytes()
    flipped = _flip_first_occurrence(tmp_path / "c" / _directory.ARRAYS, target[40:56])
    assert flipped is not None, "w1's bytes were not found in the data files"
    with pytest.raises(jms.CorruptCheckpointError, match=r"'w1'") as info:
        jms.load(tmp_path / "c")
    assert str(tmp_path / "c") in str(info.value) and "'w0'" not in str(info.value)
    out = jms.load(tmp_path / "c", verify=False)  # the damage is real: verify=False sees it
    assert not _same(out["w1"], sd["w1"]) and _same(out["w0"], sd["w0"])


def _flip_first_occurrence(root: Path, needle: bytes) -> Path | None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            data = bytearray(p.read_bytes())
            at = data.find(needle)
            if at >= 0:
                data[at + 3] ^= 0x10
                p.write_bytes(bytes(data))
                return p
    return None


def _interrupted_overwrite(tmp_path, after_first_rename: bool, new_complete: bool = True):
    """Recreate, by hand, the disk state of an overwrite killed at one of its renames."""
    path = tmp_path / "c"
    jms.save({"v": "old"}, path)
    tag = _atomic.new_tag().replace(f"-{os.getpid()}-", "-999999999-")  # a writer that died
    staging = _atomic.sibling(path, "tmp", tag)
    jms.save({"v": "new"}, staging)
    if not new_complete:
        (staging / _metafile.NAME).unlink()
    if after_first_rename:
        os.rename(path, _atomic.sibling(path, "old", tag))
    return path


def test_overwrite_killed_before_renames_leaves_old(tmp_path):
    path = _interrupted_overwrite(tmp_path, after_first_rename=False)
    assert jms.load(path) == {"v": "old"}
    jms.save({"v": "third"}, path, overwrite=True)  # the dead writer's staging is removed
    _atomic.settle()
    assert jms.load(path) == {"v": "third"} and _atomic.leftovers(path) == []


def test_overwrite_killed_between_renames_still_loads_and_is_finished(tmp_path):
    path = _interrupted_overwrite(tmp_path, after_first_rename=True)
    assert not path.exists()
    assert jms.load(path) == {"v": "new"}  # readers roll forward without writing
    assert not path.exists()
    with pytest.raises(jms.CheckpointExistsError):
        jms.save({"v": "x"}, path)  # the save repairs first: the checkpoint exists
    assert jms.load(path) == {"v": "new"} and _atomic.leftovers(path) == []


def test_overwrite_killed_between_renames_with_incomplete_new_keeps_old(tmp_path):
    path = _interrupted_overwrite(tmp_path, after_first_rename=True, new_complete=False)
    assert jms.load(path) == {"v": "old"}
    _atomic.repair(path)
    assert jms.load(path) == {"v": "old"} and _atomic.leftovers(path) == []


def test_leftovers_of_a_live_writer_are_left_alone(tmp_path):
    path = tmp_path / "c"
    staging = _atomic.sibling(path, "tmp", _atomic.new_tag())  # this (live) process
    staging.mkdir()
    jms.save({"v": 1}, path)
    assert staging.exists()


def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(_metafile, "write", broken)
    with pytest.raises(OSError, match="disk full"):
        jms.save({"w": jnp.ones(4)}, tmp_path / "c")
    assert os.listdir(tmp_path) == []


def test_a_directory_is_loadable_only_once_complete(tmp_path):
    path = tmp_path / "c"
    jms.save({"w": jnp.ones(4)}, path)
    (path / _metafile.NAME).unlink()  # as if the last write never happened
    with pytest.raises(jms.CorruptCheckpointError, match="not a complete jmodule checkpoint"):
        jms.load(path)


def _per_key_files(tmp_path):
    """The same state in jm's format, safetensors and a PyTorch file."""
    import torch

    sd = {
        "fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "fc.bias": np.ones(2, np.float32),
        "steps": np.arange(3, dtype=np.int32),
    }
    jms.save({k: jnp.asarray(v) for k, v in sd.items()}, tmp_path / "ckpt")
    jms.save({k: jnp.asarray(v) for k, v in sd.items()}, tmp_path / "w.safetensors")
    torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, tmp_path / "w.pt")
    return sd, [tmp_path / "ckpt", tmp_path / "w.safetensors", tmp_path / "w.pt"]


@pytest.mark.torch
def test_map_location_dict_places_some_keys_on_their_own(tmp_path):
    sd, paths = _per_key_files(tmp_path)
    for path in paths:
        got = jms.load(path, map_location={"fc.weight": jnp.bfloat16})
        assert got["fc.weight"].dtype == jnp.bfloat16, path
        assert got["fc.bias"].dtype == jnp.float32 and got["steps"].dtype == jnp.int32
        for k, v in sd.items():
            np.testing.assert_array_equal(np.asarray(got[k], np.float32), v.astype(np.float32))
        # a default for the rest, and the dict for the exceptions
        got = jms.load(path, map_location=(jnp.float16, {"fc.bias": jnp.bfloat16}))
        assert got["fc.weight"].dtype == jnp.float16 and got["fc.bias"].dtype == jnp.bfloat16
        assert got["steps"].dtype == jnp.int32  # integers keep their dtype


@pytest.mark.torch
def test_map_location_dict_names_keys_the_file_lacks(tmp_path):
    _, paths = _per_key_files(tmp_path)
    for path in paths:
        with pytest.raises(ValueError, match=r"'fc\.wieght' \(did you mean 'fc\.weight'\?\)"):
            jms.load(path, map_location={"fc.wieght": jnp.bfloat16})
        with pytest.raises(ValueError, match="remapping"):
            jms.load(path, map_location={"cuda:1": "cpu"})
        with pytest.raises(TypeError, match="callable or 'meta'"):
            jms.load(path, map_location={"fc.weight": "meta"})
