"""``jm.save(obj, "x.pt")``: PyTorch's zip format, written without PyTorch, read by
``torch.load(path, weights_only=True)``; and both directions of the round trip."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from shared_models import resnet18

import jmodule as jm
import jmodule.serialization as jms
from jmodule import nn
from jmodule.serialization import _torch_writer

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ["float32", "float16", "bfloat16", "int32", "int8", "int16", "uint8", "bool"]
DTYPES += ["complex64"]


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _array(dtype: str, shape=(2, 3), seed=0) -> jax.Array:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) * 10
    if dtype == "bool":
        return jnp.asarray(a > 0)
    if dtype == "complex64":
        return jnp.asarray(a + 1j * np.flip(a), jnp.complex64)
    return jnp.asarray(a).astype(getattr(jnp, dtype))


def _same(t: torch.Tensor, a) -> None:
    a = np.asarray(a)
    want_dtype = "bfloat16" if a.dtype == jnp.bfloat16 else a.dtype.name
    assert str(t.dtype).split(".")[-1] == want_dtype
    assert tuple(t.shape) == a.shape
    got = a.astype(np.float32) if a.dtype == jnp.bfloat16 else a
    np.testing.assert_array_equal(_np(t), got)


@pytest.mark.torch
@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_load_weights_only_reads_every_dtype(tmp_path, dtype, suffix):
    arrays = {"a": _array(dtype), "scalar": _array(dtype, ()), "empty": _array(dtype, (0, 3))}
    jm.save(arrays, tmp_path / f"w{suffix}")
    got = torch.load(tmp_path / f"w{suffix}", weights_only=True)
    assert list(got) == list(arrays)
    for k, a in arrays.items():
        _same(got[k], a)


@pytest.mark.torch
def test_containers_numbers_strings_and_none_come_back_as_torch_loads_them(tmp_path):
    sd = collections.OrderedDict(w=jnp.ones((2, 2)), b=jnp.zeros(2, jnp.bfloat16))
    sd._metadata = collections.OrderedDict({"": {"version": 1}})
    obj = {
        "model": sd,
        "step": 7,
        "big": 2**40,
        "neg": -(2**70),
        "lr": 0.125,
        "name": "héllo",
        "done": True,
        "nothing": None,
        "history": [1.5, 2, "x", None, [jnp.arange(3)]],
        "pair": (1, jnp.full((1,), 3.0)),
        "long_tuple": (1, 2, 3, 4, 5),
        "empty": ((), [], {}),
        3: {"by_int": np.float32(2.5)},
        ("a", 1): "tuple key",
        "np": np.arange(4, dtype=np.int16),
    }
    jm.save(obj, tmp_path / "ckpt.pt")
    got = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert list(got) == list(obj)
    assert type(got["model"]) is collections.OrderedDict and got["model"]._metadata == sd._metadata
    _same(got["model"]["w"], sd["w"])
    _same(got["model"]["b"], sd["b"])
    for key in ("step", "big", "neg", "lr", "name", "done", "nothing", ("a", 1)):
        assert got[key] == obj[key] and type(got[key]) is type(obj[key])
    assert got["history"][:4] == [1.5, 2, "x", None]
    _same(got["history"][4][0], obj["history"][4][0])
    assert isinstance(got["pair"], tuple) and got["pair"][0] == 1
    _same(got["pair"][1], obj["pair"][1])
    assert got["long_tuple"] == (1, 2, 3, 4, 5) and got["empty"] == ((), [], {})
    _same(got[3]["by_int"], np.asarray(np.float32(2.5)))  # numpy scalars: 0-d tensors
    _same(got["np"], obj["np"])
    # jm.load reads its own file back, with the same containers.
    back = jm.load(tmp_path / "ckpt.pt")
    assert type(back["model"]) is collections.OrderedDict
    assert back["model"]._metadata == sd._metadata
    assert back["history"][:4] == [1.5, 2, "x", None] and back["long_tuple"] == (1, 2, 3, 4, 5)
    np.testing.assert_array_equal(np.asarray(back["pair"][1]), [3.0])
    assert back["model"]["b"].dtype == jnp.bfloat16


@pytest.mark.torch
def test_one_array_under_two_keys_is_one_storage_torch_shares(tmp_path):
    w = jnp.arange(6.0).reshape(2, 3)
    jm.save({"a": w, "b": w, "c": jnp.arange(6.0).reshape(2, 3)}, tmp_path / "tied.pt")
    got = torch.load(tmp_path / "tied.pt", weights_only=True)
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    assert got["a"].untyped_storage().data_ptr() != got["c"].untyped_storage().data_ptr()


@pytest.mark.torch
def test_records_are_laid_out_as_torch_save_lays_them_out(tmp_path):
    jm.save({"w": jnp.ones(5), "v": jnp.ones(3, jnp.int8)}, tmp_path / "model.pt")
    torch.save({"w": torch.ones(5), "v": torch.ones(3, dtype=torch.int8)}, tmp_path / "ref.pt")
    ours = zipfile.ZipFile(tmp_path / "model.pt")
    ref = zipfile.ZipFile(tmp_path / "ref.pt")

    def names(z, prefix):
        return sorted(n[len(prefix) :] for n in z.namelist())

    assert names(ours, "model/") == names(ref, "ref/")
    for info in ours.infolist():
        assert info.compress_type == zipfile.ZIP_STORED
        if "/data/" in info.filename:  # each storage aligned as torch aligns it (64 bytes)
            with open(tmp_path / "model.pt", "rb") as f:
                f.seek(info.header_offset + 26)
                n, m = np.frombuffer(f.read(4), "<u2")
            assert (info.header_offset + 30 + n + m) % 64 == 0
    assert ours.read("model/byteorder") == ref.read("ref/byteorder")
    assert ours.read("model/version") == ref.read("ref/version")


@pytest.mark.torch
def test_parameters_and_a_models_state_dict_load_into_torch(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model[1](jnp.ones((2, 4)))  # count a batch
    jm.save({"sd": model.state_dict(), "p": model[0].weight}, tmp_path / "m.pt")
    got = torch.load(tmp_path / "m.pt", weights_only=True)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    assert ref.load_state_dict(got["sd"]).missing_keys == []
    assert got["sd"]._metadata == ref.state_dict()._metadata
    _same(got["p"], model[0].weight)
    assert int(ref[1].num_batches_tracked) == 1


@pytest.mark.slow
@pytest.mark.torch
def test_a_resnet_saved_by_jm_runs_in_torch_with_the_same_outputs(tmp_path):
    jm.manual_seed(1)
    ours = resnet18(jm.nn)
    ours.train()
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    ours(jnp.asarray(x))  # move the running statistics off their initial values
    ours.eval()
    jm.save(ours.state_dict(), tmp_path / "resnet.pth")
    ref = resnet18(torch.nn)
    result = ref.load_state_dict(torch.load(tmp_path / "resnet.pth", weights_only=True))
    assert result.missing_keys == [] and result.unexpected_keys == []
    ref.eval()
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(x))), want, rtol=1e-4, atol=1e-4)


@pytest.mark.torch
def test_torch_save_to_jm_load_and_back(tmp_path):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ckpt = {"model": ref.state_dict(), "epoch": 2, "note": "x"}
    torch.save(ckpt, tmp_path / "torch.pt")
    loaded = jm.load(tmp_path / "torch.pt")
    ours = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    assert ours.load_state_dict(loaded["model"]).missing_keys == []
    jm.save(loaded, tmp_path / "again.pt")
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    assert again["epoch"] == 2 and again["note"] == "x"
    assert again["model"]._metadata == ckpt["model"]._metadata
    for k, v in ckpt["model"].items():
        want = v.numpy()
        got = again["model"][k]
        if k.endswith("num_batches_tracked") and not jax.config.read("jax_enable_x64"):
            assert got.dtype == torch.int32  # int64 is int32 with x64 off (README: 64-bit types)
        else:
            assert got.dtype == v.dtype
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.torch
def test_views_torch_writes_still_load(tmp_path):
    base = torch.arange(24.0).reshape(4, 6)
    views = {
        "t": base.t(),
        "slice": base[1:3, ::2],
        "row": base[2],
        "expanded": torch.ones(3, 1).expand(3, 4),
        "base": base,
    }
    torch.save(views, tmp_path / "views.pt")
    got = jm.load(tmp_path / "views.pt")
    for k, v in views.items():
        np.testing.assert_array_equal(np.asarray(got[k]), v.numpy())
    jm.save(got, tmp_path / "views_again.pt", overwrite=True)
    again = torch.load(tmp_path / "views_again.pt", weights_only=True)
    for k, v in views.items():
        np.testing.assert_array_equal(again[k].numpy(), v.numpy())


@pytest.mark.slow
@pytest.mark.torch
def test_written_without_importing_torch(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "import jax.numpy as jnp, jmodule as jm\n"
        "jm.save({'w': jnp.ones((2, 3), jnp.bfloat16), 'n': 4}, sys.argv[1])\n"
        "assert jm.load(sys.argv[1])['n'] == 4\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "w.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    got = torch.load(tmp_path / "w.pt", weights_only=True)
    assert got["n"] == 4 and got["w"].dtype == torch.bfloat16 and tuple(got["w"].shape) == (2, 3)


def _nested(n):
    x: list = []
    for _ in range(n):
        x = [x]
    return x


def _loop():
    x: list = []
    x.append(x)
    return x


def test_what_a_weights_only_file_cannot_hold_is_refused_before_writing(tmp_path):
    cases = [
        ({"f": lambda: 0}, "'f' of type function"),
        ({"s": {1, 2}}, "'s' of type set"),
        ({"u": jnp.ones(2, jnp.uint32)}, "'u' .*dtype uint32"),
        ({"m": jax.ShapeDtypeStruct((2,), jnp.float32)}, "'m': it is a meta array"),
        ({object(): 1}, "key <object"),
        ({"b": b"bytes"}, "'b' of type bytes"),
        ({"deep": _nested(101)}, "nested more than 100 containers deep"),
        ({"loop": _loop()}, "contains itself"),
    ]
    for obj, message in cases:
        with pytest.raises(TypeError, match=message):
            jm.save(obj, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="carry no metadata"):
        jm.save({"w": jnp.ones(1)}, tmp_path / "bad.pt", metadata={"a": "b"})
    assert os.listdir(tmp_path) == []


@pytest.mark.torch
def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path):
    path = tmp_path / "w.pt"
    jm.save({"v": 1}, path)
    with pytest.raises(jms.CheckpointExistsError, match="overwrite=True"):
        jm.save({"v": 2}, path)
    assert torch.load(path, weights_only=True) == {"v": 1}
    jm.save({"v": 2}, path, overwrite=True)
    assert torch.load(path, weights_only=True) == {"v": 2}
    assert os.listdir(tmp_path) == ["w.pt"]


@pytest.mark.torch
def test_a_failure_mid_write_leaves_the_old_file_and_no_leftovers(tmp_path, monkeypatch):
    path = tmp_path / "w.pt"
    jm.save({"v": jnp.zeros(3)}, path)
    real = _torch_writer._record
    calls = []

    def failing(zf, name, data):
        calls.append(name)
        if "/data/" in name:
            raise OSError("disk went away")
        real(zf, name, data)

    monkeypatch.setattr(_torch_writer, "_record", failing)
    with pytest.raises(OSError, match="disk went away"):
        jm.save({"v": jnp.ones(3)}, path, overwrite=True)
    assert calls and os.listdir(tmp_path) == ["w.pt"]
    np.testing.assert_array_equal(torch.load(path, weights_only=True)["v"].numpy(), 0.0)


_KILL_WORKER = """
import sys, jax.numpy as jnp, jmodule as jm
path = sys.argv[1]
base = jnp.arange(1 << 20, dtype=jnp.float32)
n = 0
while True:
    jm.save({"n": n, "a": base + n, "b": base * 0 + n}, path, overwrite=True)
    print(n, flush=True)
    n += 1
"""


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("delay", [0.3, 1.1])
def test_a_save_killed_at_any_moment_leaves_old_or_new_never_partial(tmp_path, delay):
    path = tmp_path / "w.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    with subprocess.Popen(
        [sys.executable, "-c", _KILL_WORKER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            first = proc.stdout.readline()  # one save done: the worker is in its loop
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            rest, err = proc.communicate()
    assert first.strip() == "0", err
    done = [int(n) for n in (first + rest).split()]
    visible = [n for n in os.listdir(tmp_path) if not n.startswith(".")]
    assert visible == ["w.pt"]
    got = torch.load(path, weights_only=True)
    n = got["n"]
    assert n in (done[-1], done[-1] + 1)  # the last completed save, or one just renamed
    np.testing.assert_array_equal(got["a"][:4].numpy(), np.arange(4) + n)
    np.testing.assert_array_equal(got["b"][-4:].numpy(), np.full(4, n))
    jm.save({"n": -1}, path, overwrite=True)  # the next save works, and tidies up
    assert torch.load(path, weights_only=True) == {"n": -1}
    assert os.listdir(tmp_path) == ["w.pt"]


@pytest.mark.torch
def test_a_nesting_torch_reads_is_kept(tmp_path):
    jm.save({"deep": _nested(90)}, tmp_path / "deep.pt")
    got = torch.load(tmp_path / "deep.pt", weights_only=True)["deep"]
    for _ in range(90):
        (got,) = got
    assert got == []


@pytest.mark.slow
@pytest.mark.torch
def test_a_training_checkpoint_resumes_in_torch(tmp_path):
    """model + optimizer + epoch in one .pt: torch's model and AdamW load it and take the
    next step to the same weights as jm's."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    ours = nn.Linear(3, 2)
    ours.load_state_dict(ref.state_dict())
    opt = jm.optim.AdamW(ours.parameters(), lr=0.1)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    jm.backward(lambda: (ours(jnp.asarray(x)) ** 2).sum())
    opt.step()
    jm.save({"model": ours.state_dict(), "opt": opt.state_dict(), "epoch": 1}, tmp_path / "c.pt")
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    assert ckpt["epoch"] == 1
    ref.load_state_dict(ckpt["model"])
    t_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    t_opt.load_state_dict(ckpt["opt"])
    t_opt.zero_grad()
    (ref(torch.from_numpy(x)) ** 2).sum().backward()
    t_opt.step()
    opt.zero_grad()
    jm.backward(lambda: (ours(jnp.asarray(x)) ** 2).sum())
    opt.step()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters()):
        np.testing.assert_allclose(
            np.asarray(q), p.detach().numpy(), rtol=1e-5, atol=1e-5, err_msg=name
        )
