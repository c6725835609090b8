"""jm.jit.save / jm.jit.load: one checksummed, versioned file; loaded programs need no class."""

import collections
import copy
import io
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule as jm
import jmodule.jit
from jmodule import nn
from jmodule.jit import _format


class Net(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.drop(jax.nn.relu(self.bn(self.fc1(x)))))


def _x(n=8, seed=1):
    return jax.random.normal(jax.random.key(seed), (n, 6))


def _roundtrip(sm, **load_kwargs):
    buf = io.BytesIO()
    sm.save(buf)
    buf.seek(0)
    return jm.jit.load(buf, **load_kwargs)


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------- round trips


def test_loaded_program_matches_original_and_keeps_its_keys(tmp_path):
    model = Net().eval()
    sm = jm.jit.trace(model, _x())
    path = tmp_path / "net.jmjit"
    jm.jit.save(sm, path)
    loaded = jm.jit.load(path)
    assert isinstance(loaded, jm.jit.ScriptModule) and isinstance(loaded, nn.Module)
    _close(loaded(_x()), model(_x()))
    assert list(loaded.state_dict()) == list(model.state_dict())
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[k], v, err_msg=k)
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert repr(loaded) == repr(sm)
    assert loaded.original_name == "Net"


def test_save_method_and_function_write_the_same_program(tmp_path):
    sm = jm.jit.trace(Net().eval(), _x())
    sm.save(tmp_path / "a")
    jm.jit.save(sm, os.fspath(tmp_path / "b"))
    with open(tmp_path / "c", "wb") as f:
        sm.save(f)
    for name in "abc":
        _close(jm.jit.load(tmp_path / name)(_x()), sm(_x()))
    with open(tmp_path / "c", "rb") as f:
        _close(jm.jit.load(f)(_x()), sm(_x()))


def test_training_mode_program_keeps_updating_buffers_after_load():
    model = Net(p=0.3)
    sm = jm.jit.script(copy.deepcopy(model))
    sm(_x())
    loaded = _roundtrip(sm)
    jm.manual_seed(11)
    want = [sm(_x(seed=s)) for s in range(3)]
    jm.manual_seed(11)
    got = [loaded(_x(seed=s)) for s in range(3)]
    for a, b in zip(got, want):
        _close(a, b)
    assert int(loaded.state_dict()["bn.num_batches_tracked"]) == 4
    for k, v in sm.state_dict().items():
        np.testing.assert_allclose(loaded.state_dict()[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    assert jm.compile_stats(loaded).num_traces == 1  # no retrace call after call


def test_load_state_dict_parameters_and_to_work_on_loaded_programs():
    sm = jm.jit.trace(Net().eval(), _x())
    loaded = _roundtrip(sm)
    other = Net().eval()
    loaded.load_state_dict(other.state_dict())
    _close(loaded(_x()), other(_x()))
    params = list(loaded.parameters())
    assert len(params) == 6 and all(p.requires_grad for p in params)
    assert loaded.to("cpu") is loaded
    _close(loaded(_x()), other(_x()))
    assert jm.jit.load(io.BytesIO(_bytes(sm)), map_location="cpu")(_x()).shape == (8, 3)
    loaded.to(jnp.bfloat16)
    with pytest.raises(jm.jit.JitError, match=r"'fc1.weight' is bfloat16\[8, 6\].*cannot change"):
        loaded(_x())
    loaded.float()  # bfloat16 rounding stays; loading the weights again undoes it
    loaded.load_state_dict(other.state_dict())
    _close(loaded(_x()), other(_x()))


def test_loaded_program_cannot_change_mode():
    loaded = _roundtrip(jm.jit.trace(Net(), _x()))
    loaded.eval()
    with pytest.raises(jm.jit.JitError, match=r"saved with the root module in training mode"):
        loaded(_x())
    loaded.train()
    assert loaded(_x()).shape == (8, 3)


def test_loaded_views_and_code_reexecute_on_the_loaded_module():
    sm = jm.jit.trace(Net().eval(), _x())
    loaded = _roundtrip(sm)
    assert loaded.graph == sm.graph and loaded.inlined_graph == sm.inlined_graph
    code, constants = loaded.code_with_constants
    assert code == sm.code == loaded.code
    namespace = {"CONSTANTS": constants}
    exec(code, namespace)
    _close(namespace["forward"](loaded.module, _x()), sm(_x()))


def test_loaded_root_hooks_run_and_submodules_do_not_run_alone():
    loaded = _roundtrip(jm.jit.trace(Net().eval(), _x()))
    plain = loaded(_x())
    handle = loaded.register_forward_hook(lambda mod, args, out: out * 2)
    _close(loaded(_x()), plain * 2)
    handle.remove()
    _close(loaded(_x()), plain)
    with pytest.raises(jm.jit.JitError, match="only the loaded root module can be called"):
        loaded.module.fc1(_x())


def test_loaded_program_can_be_saved_again_with_its_new_state():
    sm = jm.jit.script(Net())
    sm(_x())
    loaded = _roundtrip(sm)
    loaded(_x())
    again = _roundtrip(loaded)
    for k, v in loaded.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[k], v, err_msg=k)
    clone = copy.deepcopy(again)
    _close(clone(_x()), again(_x()))


def test_pytree_inputs_outputs_and_static_arguments_round_trip():
    Pair = collections.namedtuple("Pair", ["lo", "hi"])

    class Tree(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, batch, *, scale, tag="a"):
            h = self.fc(batch["x"]) * scale
            return {"pair": Pair(h.min(-1), h.max(-1)), "list": [h, batch["ys"][1]], "tag": None}

    model = Tree()
    batch = {"x": jnp.ones((2, 3)), "ys": (jnp.zeros(2), jnp.arange(2.0))}
    sm = jm.jit.trace(model, (batch,), example_kwarg_inputs={"scale": 2.0})
    loaded = _roundtrip(sm)
    got = loaded(batch, scale=2.0)
    want = model(batch, scale=2.0)
    assert got["pair"].lo.shape == (2,) and got["pair"]._fields == ("lo", "hi")
    assert got["tag"] is None
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        _close(a, b)
    with pytest.raises(TypeError, match=r"compile-time constant.*must be 2.0 \(got 3.0\)"):
        loaded(batch, scale=3.0)
    with pytest.raises(TypeError, match=r"must be a dict with keys \['x', 'ys'\]"):
        loaded({"x": jnp.ones((2, 3))}, scale=2.0)


def test_tied_weights_non_persistent_buffers_and_extra_state_round_trip():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(4, 4)
            self.dec = nn.Linear(4, 4)
            self.dec.weight = self.enc.weight
            self.register_buffer("scale", jnp.full((4,), 2.0), persistent=False)
            self.steps = 7

        def forward(self, x):
            return self.dec(self.enc(x)) * self.scale

        def get_extra_state(self):
            return {"steps": self.steps}

        def set_extra_state(self, state):
            self.steps = state["steps"]

    model = Tied()
    x = jnp.ones((2, 4))
    loaded = _roundtrip(jm.jit.trace(model, x))
    assert list(loaded.state_dict()) == list(model.state_dict())
    assert "scale" not in loaded.state_dict()
    assert loaded.state_dict()["_extra_state"] == {"steps": 7}
    assert len(list(loaded.parameters())) == 3  # enc.weight, enc.bias, dec.bias: tied once
    assert loaded.module.dec.weight is loaded.module.enc.weight
    np.testing.assert_array_equal(loaded.get_buffer("scale"), model.scale)
    _close(loaded(x), model(x))
    new_weight = jnp.eye(4)
    loaded.module.enc.weight.data = new_weight
    model.enc.weight.data = new_weight
    _close(loaded(x), model(x))


def test_extra_files_round_trip_as_torch_jit_does():
    sm = jm.jit.trace(Net().eval(), _x())
    buf = io.BytesIO()
    sm.save(buf, _extra_files={"meta.json": '{"epoch": 3}', "raw.bin": b"\x00\x01"})
    buf.seek(0)
    extra = {"meta.json": "", "raw.bin": "", "absent.txt": "keep"}
    jm.jit.load(buf, _extra_files=extra)
    assert extra == {"meta.json": b'{"epoch": 3}', "raw.bin": b"\x00\x01", "absent.txt": "keep"}


@pytest.mark.slow
def test_dynamic_batch_program_serves_any_batch():
    model = Net().eval()
    loaded = _roundtrip(jm.jit.trace(model, _x(), dynamic_batch=True))
    for n in (1, 3, 17):
        _close(loaded(_x(n)), model(_x(n)))
    assert "x:f32[batch,6]" in loaded.graph


def test_dynamic_batch_training_program_requires_two_samples():
    model = Net()
    loaded = _roundtrip(jm.jit.trace(copy.deepcopy(model), _x(), dynamic_batch=True))
    _close(loaded(_x(5)), model(_x(5)))
    with pytest.raises(jm.jit.JitError, match=r"batch >= 2.*got a batch of 1"):
        loaded(_x(1))


def test_save_refuses_what_it_cannot_store():
    with pytest.raises(TypeError, match="takes a ScriptModule"):
        jm.jit.save(Net(), io.BytesIO())
    with pytest.raises(jm.jit.NotTracedError, match="no program to save"):
        jm.jit.script(Net()).save(io.BytesIO())

    class WithDtype(nn.Module):
        def forward(self, x, dtype):
            return x.astype(dtype)

    sm = jm.jit.trace(WithDtype(), (_x(), jnp.float16))
    with pytest.raises(jm.jit.JitError, match="only bool, int, float, complex, str and None"):
        sm.save(io.BytesIO())


# --------------------------------------------------------------------- damaged files


def _bytes(sm):
    buf = io.BytesIO()
    sm.save(buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def saved():
    return _bytes(jm.jit.trace(Net().eval(), _x()))


def test_foreign_and_text_files_are_refused(tmp_path, saved):
    with pytest.raises(jm.jit.ProgramFileError, match=r"not a jm\.jit program file"):
        jm.jit.load(io.BytesIO(b"PK\x03\x04 a torch zip"))
    with pytest.raises(jm.jit.ProgramFileError, match=r"not a jm\.jit program file"):
        jm.jit.load(io.BytesIO(b""))
    (tmp_path / "f").write_bytes(saved)
    with open(tmp_path / "f", encoding="latin-1") as f, pytest.raises(TypeError, match="'rb'"):
        jm.jit.load(f)
    with pytest.raises(FileNotFoundError, match=r"No jm\.jit program file"):
        jm.jit.load(tmp_path / "missing")


def test_truncated_and_flipped_files_raise_before_deserializing(saved):
    with pytest.raises(jm.jit.ProgramFileError, match="is truncated"):
        jm.jit.load(io.BytesIO(saved[: len(saved) // 2]))
    with pytest.raises(jm.jit.ProgramFileError, match="is truncated"):
        jm.jit.load(io.BytesIO(saved[:15]))
    flipped = bytearray(saved)
    flipped[-10] ^= 0x40
    with pytest.raises(jm.jit.ProgramFileError, match="checksum of part"):
        jm.jit.load(io.BytesIO(bytes(flipped)))
    flipped = bytearray(saved)
    flipped[40] ^= 0x01
    with pytest.raises(jm.jit.ProgramFileError, match="checksum of its header"):
        jm.jit.load(io.BytesIO(bytes(flipped)))
    with pytest.raises(jm.jit.ProgramFileError, match="bytes after its last part"):
        jm.jit.load(io.BytesIO(saved + b"\x00"))


def _rewrite(saved, **changes):
    meta, parts = _format.decode(saved, "test")
    meta.update(changes)
    return _format.encode(meta, {k: bytes(v) for k, v in parts.items()})


def test_versions_are_checked_with_clear_messages(saved):
    newer = bytearray(saved)
    newer[8:12] = (_format.FORMAT_VERSION + 1).to_bytes(4, "little")
    with pytest.raises(jm.jit.IncompatibleVersionError, match="newer than the format 1"):
        jm.jit.load(io.BytesIO(bytes(newer)))
    bad = _rewrite(saved, calling_convention_version=99, jax_version="9.9")
    with pytest.raises(jm.jit.IncompatibleVersionError, match=r"calling convention 99.*jax 9\.9"):
        jm.jit.load(io.BytesIO(bad))
    bad = _rewrite(saved, serialization_version=10**6)
    with pytest.raises(jm.jit.IncompatibleVersionError, match="serialization version 1000000"):
        jm.jit.load(io.BytesIO(bad))
    other = "big" if sys.byteorder == "little" else "little"
    with pytest.raises(jm.jit.IncompatibleVersionError, match="endian"):
        jm.jit.load(io.BytesIO(_rewrite(saved, byteorder=other)))
    meta, _ = _format.decode(saved, "test")
    assert meta["format_version"] == _format.FORMAT_VERSION
    assert meta["jax_version"] == jax.__version__
    assert meta["platforms"] == ["cpu", "cuda"]
    json.dumps(meta)


_FUZZ_WORKER = textwrap.dedent(
    """
    import json, sys
    import jax.numpy as jnp
    import jmodule.jit as jit
    for path in sys.argv[1:]:
        try:
            jit.load(path)(jnp.ones((8, 6)))
            result = "loaded"
        except jit.ProgramFileError as e:
            result = type(e).__name__
        except Exception as e:
            result = "other: " + type(e).__name__ + ": " + str(e)[:200]
        print(json.dumps({"path": path, "result": result}), flush=True)
    """
)


def _env():
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.slow
def test_fuzzed_files_never_kill_the_process_or_load(tmp_path, saved):
    rng = np.random.default_rng(1234)
    header_end = 20 + int.from_bytes(saved[12:20], "little") + 32
    cuts = [0, 5, 9, 16, 20, 30, header_end - 20, header_end - 1, header_end + 3]
    cuts += sorted(rng.integers(header_end, len(saved), 3).tolist())
    flips = [0, 9, 13, 25, header_end - 5]  # magic, version, header length, header, digest
    flips += sorted(rng.integers(header_end, len(saved), 7).tolist())  # program and state
    paths = []
    for i, n in enumerate(cuts):
        paths.append(tmp_path / f"cut{i}")
        paths[-1].write_bytes(saved[:n])
    for i, pos in enumerate(flips):
        data = bytearray(saved)
        data[pos] ^= 1 << int(rng.integers(0, 8))
        paths.append(tmp_path / f"flip{i}")
        paths[-1].write_bytes(bytes(data))
    assert len(paths) == 24
    results = []
    for batch in (paths[0:8], paths[8:16], paths[16:24]):  # 3 interpreters, 8 loads each
        proc = subprocess.run(
            [sys.executable, "-c", _FUZZ_WORKER, *map(str, batch)],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        results += [json.loads(line)["result"] for line in proc.stdout.splitlines()]
    assert len(results) == 24
    assert set(results) <= {"ProgramFileError", "IncompatibleVersionError"}, results


# --------------------------------------------------------------------- no class needed

_MODEL_SOURCE = textwrap.dedent(
    """
    import jax
    from jmodule import nn

    class SecretNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 8)
            self.bn = nn.BatchNorm1d(8)
            self.fc2 = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc2(jax.nn.gelu(self.bn(self.fc1(x))))
    """
)

_LOADER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jmodule as jm
    import jmodule.jit
    path, x_path, out_path = sys.argv[1:]
    x = np.load(x_path)
    loaded = jm.jit.load(path)
    outs = [np.asarray(loaded(x)) for _ in range(2)]
    np.savez(out_path, out0=outs[0], out1=outs[1],
             **{"sd." + k: np.asarray(v) for k, v in loaded.state_dict().items()})
    print(json.dumps({
        "defining_module_imported": any("secret_model_def" in m for m in sys.modules),
        "keys": list(loaded.state_dict()),
        "repr": repr(loaded),
    }))
    """
)


@pytest.mark.slow
def test_loads_in_a_fresh_interpreter_without_the_defining_module(tmp_path):
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    (source_dir / "secret_model_def.py").write_text(_MODEL_SOURCE)
    sys.path.insert(0, str(source_dir))
    try:
        import secret_model_def

        model = secret_model_def.SecretNet()
    finally:
        sys.path.remove(str(source_dir))
        sys.modules.pop("secret_model_def", None)
    x = np.asarray(_x())
    sm = jm.jit.script(copy.deepcopy(model))
    sm(x)  # train mode: the saved program updates the batch-norm statistics
    sm.save(tmp_path / "secret.jmjit")
    np.save(tmp_path / "x.npy", x)
    want = [np.asarray(sm(x)) for _ in range(2)]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOADER,
            str(tmp_path / "secret.jmjit"),
            str(tmp_path / "x.npy"),
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=str(tmp_path),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["defining_module_imported"] is False
    assert report["keys"] == list(model.state_dict())
    assert report["repr"] == repr(sm)
    got = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(got["out0"], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["out1"], want[1], rtol=1e-6, atol=1e-6)
    for k, v in sm.state_dict().items():
        np.testing.assert_allclose(got["sd." + k], v, rtol=1e-6, atol=1e-7, err_msg=k)
