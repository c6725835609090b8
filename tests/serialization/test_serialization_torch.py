"""PyTorch .pt/.bin files read without PyTorch, checked against files real PyTorch wrote."""

from __future__ import annotations

import collections
import io
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _paths import ROOT
from _torch import torch

import jmodule.serialization as jms

FORMATS = {"zip": {}, "legacy": {"_use_new_zipfile_serialization": False}}


def _expected(t: torch.Tensor) -> np.ndarray:
    """What jm should produce for tensor ``t`` with x64 off."""
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(jnp.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.float().numpy().astype(jnp.float8_e4m3fn)
    value = t.numpy()
    return value.astype(jax.dtypes.canonicalize_dtype(value.dtype))


def _check(out, t: torch.Tensor, key: str) -> None:
    assert isinstance(out, jax.Array), key
    expected = _expected(t)
    got = np.asarray(out)
    assert got.dtype == expected.dtype and got.shape == expected.shape, key
    assert got.tobytes() == expected.tobytes(), key


def _tensors():
    torch.manual_seed(0)
    base = torch.randn(6, 5)
    shared = torch.arange(24, dtype=torch.float32)
    c = torch.randn(3, dtype=torch.complex64)
    return collections.OrderedDict(
        [
            ("float", base),
            ("double", base.double()),
            ("half", base.half()),
            ("bfloat16", base.bfloat16()),
            ("int64", torch.tensor([1, -2, 2**31 - 1])),
            ("int32", torch.arange(4, dtype=torch.int32)),
            ("int8", torch.tensor([-128, 0, 127], dtype=torch.int8)),
            ("uint8", torch.tensor([0, 255], dtype=torch.uint8)),
            ("bool", torch.tensor([True, False, True])),
            ("complex", c),
            ("float8", base.to(torch.float8_e4m3fn)),
            ("uint16", torch.tensor([0, 7, 65535], dtype=torch.int32).to(torch.uint16)),
            ("transposed", base.t()),
            ("sliced", base[1:5:2, 2:]),
            ("offset_view", shared[7:19].view(3, 4)),
            ("other_view", shared.view(4, 6)[:, ::3]),
            ("expanded", torch.arange(3.0).expand(4, 3)),
            ("as_strided", torch.as_strided(shared, (3, 3), (5, 2), 1)),
            ("bf16_strided", base.bfloat16().t()[::2]),
            ("scalar", torch.tensor(3.5)),
            ("empty", torch.zeros(0, 4)),
            ("conj", c.conj()),
            ("neg", torch.randn(3, dtype=torch.complex64).conj().imag),
        ]
    )


@pytest.fixture(scope="module", params=list(FORMATS))
def torch_file(request, tmp_path_factory):
    tensors = _tensors()
    obj = {
        "state_dict": tensors,
        "param": torch.nn.Parameter(torch.ones(2, 2)),
        "epoch": 3,
        "lr": 0.5,
        "name": "run-1",
        "flags": (True, None),
        "ids": [1, 2, 3],
        "raw": b"\x00\x01",
        "set": {1, 2},
    }
    path = tmp_path_factory.mktemp(request.param) / "model.pt"
    torch.save(obj, path, **FORMATS[request.param])
    return path, obj


@pytest.mark.torch
def test_every_dtype_and_layout_matches_torch(torch_file):
    path, obj = torch_file
    out = jms.load(path)
    sd = out["state_dict"]
    assert type(sd) is collections.OrderedDict and list(sd) == list(obj["state_dict"])
    for key, t in obj["state_dict"].items():
        _check(sd[key], t, key)
    _check(out["param"], obj["param"], "param")


@pytest.mark.torch
def test_plain_values_come_back(torch_file):
    path, obj = torch_file
    out = jms.load(path)
    for key in ("epoch", "lr", "name", "flags", "ids", "raw", "set"):
        assert out[key] == obj[key] and type(out[key]) is type(obj[key]), key


@pytest.mark.torch
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_state_dict_metadata_and_shared_tensors(tmp_path, fmt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    sd = model.state_dict()
    tied = torch.randn(5, 2)
    sd["tied_a"] = tied
    sd["tied_b"] = tied  # one tensor twice: one array twice
    path = tmp_path / "sd.pt"
    torch.save(sd, path, **FORMATS[fmt])
    out = jms.load(path)
    assert out._metadata == sd._metadata  # the versions load_state_dict hooks read
    assert out["tied_a"] is out["tied_b"]
    assert out["1.num_batches_tracked"].dtype == jnp.int32
    for key, t in sd.items():
        _check(out[key], t, key)


@pytest.mark.torch
def test_pickle_protocol_4_is_read(tmp_path):
    tensors = {"w": torch.randn(3, 2).t(), "b": torch.ones(2).bfloat16()}
    path = tmp_path / "p4.pt"
    torch.save(tensors, path, pickle_protocol=4)
    out = jms.load(path)
    for key, t in tensors.items():
        _check(out[key], t, key)


@pytest.mark.torch
def test_map_location(tmp_path):
    t = {"w": torch.randn(3), "i": torch.arange(3)}
    path = tmp_path / "m.pt"
    torch.save(t, path)
    out = jms.load(path, map_location=("cpu", jnp.bfloat16))
    assert out["w"].dtype == jnp.bfloat16 and out["i"].dtype == jnp.int32
    keys = []
    jms.load(path, map_location=lambda a, key: keys.append(key) or a)
    assert keys == ["w", "i"]
    # What PyTorch code passes: torch.device and torch.dtype objects.
    out = jms.load(path, map_location=torch.device("cpu"))
    assert out["w"].devices() == {jax.devices("cpu")[0]}
    assert jms.load(path, map_location=torch.float16)["w"].dtype == jnp.float16
    # A dict places keys of its own; PyTorch's device remapping is refused with advice.
    out = jms.load(path, map_location={"w": torch.float16})
    assert out["w"].dtype == jnp.float16 and out["i"].dtype == jnp.int32
    with pytest.raises(ValueError, match=r"'cuda:0'.*device-to-device remapping"):
        jms.load(path, map_location={"cuda:0": "cpu"})


@pytest.mark.torch
def test_big_endian_files_are_byteswapped(tmp_path):
    source = tmp_path / "little.pt"
    t = {"w": torch.randn(4, 3), "h": torch.randn(5).half()}
    torch.save(t, source)
    # Rewrite it the way a big-endian machine would have written it.
    with zipfile.ZipFile(source) as z:
        prefix = z.namelist()[0].split("/")[0]
        records = {info.filename: z.read(info) for info in z.infolist()}
    storage_of = {"w": "data/0", "h": "data/1"}
    for key, name in storage_of.items():
        arr = np.frombuffer(records[f"{prefix}/{name}"], dtype=_expected(t[key]).dtype)
        records[f"{prefix}/{name}"] = arr.byteswap().tobytes()
    records[f"{prefix}/byteorder"] = b"big"
    target = tmp_path / "big.pt"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:
        for name, data in records.items():
            z.writestr(name, data)
    out = jms.load(target)
    for key in t:
        _check(out[key], t[key], key)


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.torch
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("protocol", [2, 4])
def test_pickles_that_run_code_are_refused_before_anything_runs(tmp_path, fmt, protocol):
    marker = tmp_path / "pwned"
    obj = {"fine": torch.ones(2), "evil": _RunsCode(marker), "later": torch.zeros(3)}
    path = tmp_path / "evil.pt"
    torch.save(obj, path, pickle_protocol=protocol, **FORMATS[fmt])
    with pytest.raises(jms.UnsafePickleError, match=r"posix\.mkdir") as info:
        jms.load(path)
    assert isinstance(info.value, pickle.UnpicklingError)
    assert str(path) in str(info.value) and "weights_only=False" in str(info.value)
    assert not marker.exists()


@pytest.mark.torch
def test_whole_module_pickles_are_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(jms.UnsafePickleError, match=r"torch\.nn\.modules\.linear\.Linear"):
        jms.load(path)


def test_hand_built_pickles_with_hidden_globals_are_refused(tmp_path):
    """A global whose name is computed at run time cannot be checked, so it is refused."""
    # STACK_GLOBAL fed by something other than two plain strings (here a call result).
    crafted = (
        b"\x80\x04"
        b"\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94"  # fine so far
        b"\x8c\x02os\x94\x8c\x06system\x94\x93\x94"  # os.system via STACK_GLOBAL
        b"\x8c\x04true\x94\x85\x94R\x94."
    )
    legacy = tmp_path / "crafted.pt"
    legacy.write_bytes(crafted)
    with pytest.raises(jms.UnsafePickleError, match=r"os\.system"):
        jms.load(legacy)
    computed = b"\x80\x04\x8c\x0bcollections\x8c\x0bOrderedDict\x86\x8c\x01x\x93."
    (tmp_path / "computed.pt").write_bytes(computed)
    with pytest.raises(jms.UnsafePickleError, match="at run time"):
        jms.load(tmp_path / "computed.pt")


@pytest.mark.torch
def test_torchscript_archives_are_named(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with pytest.raises(jms.CheckpointError, match="TorchScript"):
        jms.load(path)


@pytest.mark.slow
@pytest.mark.torch
def test_reading_needs_no_torch(tmp_path):
    t = {"w": torch.randn(3, 2).t(), "b": torch.ones(2).bfloat16()}
    torch.save(t, tmp_path / "a.pt")
    torch.save(t, tmp_path / "b.pt", _use_new_zipfile_serialization=False)
    code = f"""
import sys
sys.modules["torch"] = None  # any import of torch now fails
import numpy as np
import jmodule.serialization as jms
for name in ("a.pt", "b.pt"):
    out = jms.load("{tmp_path}/" + name)
    print(name, np.asarray(out["w"]).tolist(), np.asarray(out["b"]).astype(np.float32).tolist())
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = f"{t['w'].numpy().tolist()} {t['b'].float().numpy().tolist()}"
    assert result.stdout.splitlines() == [f"a.pt {expected}", f"b.pt {expected}"]


@pytest.mark.torch
def test_legacy_storage_views_slice_their_root_storage(tmp_path):
    """Legacy files may hold storage views (view_metadata); they slice their root storage."""
    from jmodule.serialization import _torch_pickle

    root = np.arange(10, dtype=np.float32)
    buffer = io.BytesIO()
    pickle.dump(0x1950A86A20F9469CFC6C, buffer, protocol=2)
    pickle.dump(1001, buffer, protocol=2)
    pickle.dump({"little_endian": True}, buffer, protocol=2)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, tuple) and obj and obj[0] == "storage-ref":
                return ("storage", torch.FloatStorage, "root", "cpu", 10, obj[1])
            return None

    view = ("storage-ref", ("v1", 2, 6))
    Pickler(buffer, protocol=2).dump({"t": _Rebuild(view, 1, (2, 2), (2, 1))})
    pickle.dump(["root"], buffer, protocol=2)
    buffer.write(np.int64(10).tobytes() + root.tobytes())
    path = tmp_path / "views.pt"
    path.write_bytes(buffer.getvalue())
    out = _torch_pickle.read(path)
    view_data = root[2:8]
    np.testing.assert_array_equal(np.asarray(out["t"]), view_data[1:5].reshape(2, 2))


class _Rebuild:
    """Pickles as torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)
