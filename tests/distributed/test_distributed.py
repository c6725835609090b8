"""Scale-out (issue 7): sharding, meta init, SyncBatchNorm, processes.

This process has one device. The 8-device checks live in ``_dist_eight.py``
and run once, in their own pytest process with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (JAX reads it when it
starts); each of them is reported here as a test of its own. The
two-process test starts ``_dist_process.py`` twice.
"""

import ast
import gc
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dist_models import BIG_CONFIG, Big, as_float, batch, classifier, run_steps, values
from _paths import ROOT
from _torch import torch

import jmodule as jm
import jmodule.distributed as dist
import jmodule.optim
from jmodule import nn
from jmodule.serialization import _metafile

HERE = Path(__file__).parent
EIGHT = HERE / "_dist_eight.py"


def _env(devices: int) -> dict:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    return env


# ------------------------------------------------------------------ 8 simulated devices


def _eight_device_tests() -> list[str]:
    tree = ast.parse(EIGHT.read_text())
    return [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]


@pytest.fixture(scope="module")
def eight_device_results(tmp_path_factory):
    """Run ``_dist_eight.py`` once on 8 devices: {test name: failure text or None}."""
    report = tmp_path_factory.mktemp("dist") / "eight.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(EIGHT),
            "-o",
            "addopts=",  # one serial run, whatever the ini options (e.g. xdist's -n)
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
        ],
        cwd=ROOT,
        env=_env(8),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if not report.exists():
        pytest.fail(f"the 8-device run did not report:\n{proc.stdout}\n{proc.stderr}")
    results = {}
    for case in ET.parse(report).iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            results[case.get("name")] = "skipped (skips are not allowed here)"
        else:
            results[case.get("name")] = None if problem is None else problem.text or "failed"
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", _eight_device_tests())
def test_on_eight_devices(name, eight_device_results):
    cases = {k: v for k, v in eight_device_results.items() if k.split("[")[0] == name}
    assert cases, f"{name} did not run on 8 devices"
    failed = {k: v for k, v in cases.items() if v is not None}
    if failed:
        pytest.fail("\n\n".join(f"{k}:\n{v}" for k, v in failed.items()), pytrace=False)


# ------------------------------------------------------------------ two processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_importing_jmodule_leaves_jax_backends_unstarted():
    """jax.distributed.initialize must run before JAX starts its backends; if
    ``import jmodule`` started them, ``jm.distributed.init()`` could never work."""
    code = (
        "import traceback\n"
        "from jax._src import xla_bridge\n"
        "first = []\n"
        "original = xla_bridge.backends\n"
        "def spy():\n"
        "    first.extend(f'{f.filename}:{f.lineno}' for f in traceback.extract_stack()"
        " if '/jmodule/' in f.filename)\n"
        "    xla_bridge.backends = original\n"
        "    return original()\n"
        "xla_bridge.backends = spy\n"
        "import jmodule, jmodule.distributed, jmodule.optim, jmodule.serialization\n"
        "print(repr(first[-1:]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(1), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    started_by = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert started_by == [], (
        f"import jmodule started JAX's backends (at {started_by[0]}), so "
        "jm.distributed.init() (jax.distributed.initialize) cannot run afterwards"
    )


def _run_two(script: str, args: list[list[str]], logdir: Path) -> None:
    """Run ``script`` as ranks 0 and 1 of a two-process job; fail with a log if one fails.

    When one process fails, the other (waiting in a collective) is stopped at once.
    """
    port = _free_port()
    procs, logs = [], [logdir / f"rank{rank}.log" for rank in range(2)]
    for rank in range(2):
        env = _env(1)
        env.pop("XLA_FLAGS")  # the helper asks for 2 devices itself
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
        with open(logs[rank], "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / script), *args[rank]],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"process {rank} failed:\n{logs[rank].read_text()}"


@pytest.mark.slow
def test_two_processes_agree_with_one(tmp_path):
    _run_two("_dist_process.py", [[str(tmp_path / f"{rank}.npz")] for rank in range(2)], tmp_path)
    got = [np.load(tmp_path / f"{rank}.npz") for rank in range(2)]

    x, y = batch()
    for layout in ("dp", "fsdp", "meta"):
        jm.manual_seed(0)
        ref = classifier()
        losses, _ = run_steps(ref, jm.optim.Adam(ref.parameters(), lr=1e-2), x, y)
        expected = {"loss": np.array([as_float(v) for v in losses]), **values(ref)}
        for rank, result in enumerate(got):
            for key, want in expected.items():
                np.testing.assert_allclose(
                    result[f"{layout}/{key}"],
                    want,
                    rtol=2e-5,
                    atol=2e-6,
                    err_msg=f"{layout} {key} on process {rank}",
                )


# Orbax leaves reads in flight when one fails; see
# tests/serialization/test_serialization_corrupt.py.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_two_processes_save_one_checkpoint(tmp_path):
    """Both processes jm.save FSDP-sharded training state to one path, each writing its
    own shards; both load it back across both processes (in the helper), and one
    process alone loads it onto one device here."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "saved.npz"
    _run_two("_dist_ckpt_process.py", [[str(ckpt), str(out)]] * 2, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no debris
    saved = dict(np.load(out))
    loaded = jm.load(ckpt)
    assert loaded["epoch"] == 3
    leaves = jax.tree_util.tree_leaves_with_path(loaded)
    got = {jax.tree_util.keystr(k): v for k, v in leaves}
    assert got.keys() == saved.keys()
    for key, want in saved.items():
        np.testing.assert_array_equal(np.asarray(got[key]), want, err_msg=key)
    assert all(v.devices() == {jax.devices()[0]} for v in got.values() if isinstance(v, jax.Array))
    shards = {e["key"]: e.get("shards") for e in _metafile.read(ckpt)["arrays"]}
    sharded = [k for k, s in shards.items() if s]
    assert sharded  # per-shard checksums from both processes
    assert all(len(shards[k]) > 1 for k in sharded)

    # a flipped byte in the Orbax data file the processes' databases were merged into
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    data = max((copy / "arrays" / "d").iterdir(), key=lambda f: f.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    names = "|".join(re.escape(f"'{k}'") for k in shards)
    with pytest.raises(jm.serialization.CorruptCheckpointError, match=names):
        jm.load(copy)
    time.sleep(0.05)  # let Orbax's other reads finish and be collected inside this test
    gc.collect()


# ------------------------------------------------------------------ init()


@pytest.fixture
def initialize_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(
        jax.distributed, "initialize", lambda *args, **kwargs: calls.append((args, kwargs))
    )
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(var, raising=False)
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    return calls


def test_init_reads_jax_then_torchrun_environment(initialize_calls, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    dist.init()
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.2:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    dist.init(local_device_ids=[0])
    dist.init("10.0.0.3:99", 8, 5, initialization_timeout=10)
    assert initialize_calls == [
        (("10.0.0.1:29500", 4, 3), {"local_device_ids": None}),
        (("10.0.0.2:1234", 2, 1), {"local_device_ids": [0]}),
        (("10.0.0.3:99", 8, 5), {"local_device_ids": None, "initialization_timeout": 10}),
    ]


def test_init_rejects_malformed_environment(initialize_calls, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="environment variable WORLD_SIZE='two' is not an integer"):
        dist.init()
    assert initialize_calls == []


def test_init_after_jax_started_says_to_call_it_first():
    jnp.zeros(1)  # this process's backends are running
    with pytest.raises(RuntimeError, match="must run before anything uses JAX devices"):
        dist.init("127.0.0.1:1", 1, 0)
    assert dist.get_rank() == 0
    assert dist.get_world_size() == 1
    assert not dist.is_initialized()


# ------------------------------------------------------------------ meta init


def test_meta_init_of_a_310b_parameter_model_takes_no_memory():
    tracemalloc.start()
    start = time.perf_counter()
    with jm.device("meta"):
        model = Big(**BIG_CONFIG)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    params = list(model.parameters())
    count = sum(math.prod(p.shape) for p in params)
    assert count > 300e9
    assert all(jm.is_meta(p) for p in params)
    # Python objects only (~400 modules); the float32 weights would take 1.24 TB
    assert peak < 8 * 2**20
    print(
        f"\nmeta init: {count / 1e9:.1f}B parameters, {elapsed * 1e3:.0f} ms, "
        f"{peak / 2**20:.2f} MiB traced peak"
    )
    for m in model.modules():  # initialising abstract parameters is a no-op
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    assert all(jm.is_meta(p) for p in model.parameters())


# ------------------------------------------------------------------ SyncBatchNorm (1 device)


@pytest.mark.torch
@pytest.mark.parametrize("training", [True, False])
def test_sync_batchnorm_without_an_axis_matches_torch(training):
    x = np.random.default_rng(0).standard_normal((6, 3, 5)).astype(np.float32)
    ref = torch.nn.SyncBatchNorm(3, momentum=None).train(training)
    got = nn.SyncBatchNorm(3, momentum=None).train(training)
    for _ in range(2):
        want = ref(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(np.asarray(got(jnp.asarray(x))), want, rtol=1e-5, atol=1e-5)
    for name, value in ref.state_dict().items():
        np.testing.assert_allclose(np.asarray(got.state_dict()[name]), value.numpy(), rtol=1e-5)
    assert repr(got) == repr(ref)


def test_sync_batchnorm_averages_over_a_named_axis():
    x = np.random.default_rng(0).standard_normal((4, 6, 3)).astype(np.float32)  # 4 replicas
    x[0] += 3.0
    sync = nn.SyncBatchNorm(3, process_group="replica")
    per_replica = jax.vmap(lambda xs: jm.func.functional_call(sync, {}, xs), axis_name="replica")
    out = np.asarray(per_replica(jnp.asarray(x)))
    whole = np.asarray(nn.BatchNorm1d(3)(jnp.asarray(x.reshape(24, 3)))).reshape(4, 6, 3)
    np.testing.assert_allclose(out, whole, rtol=1e-5, atol=1e-5)


def test_convert_sync_batchnorm_shares_state_and_mode():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False), nn.BatchNorm1d(4))
    net[2].eval()
    weight, stats = net[2].weight, net[1].running_mean
    out = nn.SyncBatchNorm.convert_sync_batchnorm(net, process_group="dp")
    assert out is net
    assert [type(m).__name__ for m in out] == ["Linear", "SyncBatchNorm", "SyncBatchNorm"]
    assert out[2].weight is weight and out[1].running_mean is stats
    assert out[1].weight is None and out[1].process_group == "dp"
    assert not out[2].training and out[1].training
    assert list(out.state_dict()) == list(
        nn.Sequential(
            nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False), nn.BatchNorm1d(4)
        ).state_dict()
    )
    single = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(2))
    assert type(single) is nn.SyncBatchNorm


def test_sync_batchnorm_input_errors():
    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        nn.SyncBatchNorm(3)(jnp.ones(3))
    with pytest.raises(ValueError, match="expected input with 3 channels in dimension 1"):
        nn.SyncBatchNorm(3)(jnp.ones((2, 4, 5, 5)))


# ------------------------------------------------------------------ meshes, docs


def test_make_mesh_shapes_and_errors():
    mesh = dist.make_mesh({"data": -1, "model": 1})
    assert dict(mesh.shape) == {"data": 1, "model": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    assert dist.make_mesh((1,), ("x",)).axis_names == ("x",)
    with pytest.raises(ValueError, match=r"needs 2 devices, but 1 are given .*XLA_FLAGS"):
        dist.make_mesh({"data": 2})
    with pytest.raises(ValueError, match="one name per axis"):
        dist.make_mesh((1, 1), ("data",))
    with pytest.raises(ValueError, match="at most one axis size may be -1"):
        dist.make_mesh({"a": -1, "b": -1})


def test_shard_batch_and_shard_type_errors():
    mesh = dist.make_mesh()
    with pytest.raises(ValueError, match="mesh axis 'model' is not in the mesh"):
        dist.shard_batch(jnp.ones((2, 2)), mesh, axis="model")
    with pytest.raises(ValueError, match="dimension 0 of an array of shape"):
        dist.shard_batch(jnp.ones(()), mesh)
    with pytest.raises(TypeError, match=r"expected a jax.sharding.Mesh \(see jm.distributed"):
        dist.shard(nn.Linear(2, 2), "data")
    with pytest.raises(TypeError, match=r"rules are \(pattern, PartitionSpec\) pairs"):
        dist.shard(nn.Linear(2, 2), mesh, ["*.weight"])
