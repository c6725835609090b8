"""Devices, dtypes, meta construction: ``jm.device``, ``.to``/``.cuda``, ``device="meta"``."""

import os
import subprocess
import sys
import textwrap
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import nn
from jmodule._placement.device import single_device_sharding


def _bn_with_complex(lib):
    bn = lib.BatchNorm1d(2)
    zeros = (
        torch.zeros(2, dtype=torch.complex64) if lib is torch.nn else jnp.zeros(2, jnp.complex64)
    )
    bn.register_buffer("c", zeros)
    return bn


def _dtypes(module):
    return {k: str(v.dtype).replace("torch.", "") for k, v in module.state_dict().items()}


def _torch_dtypes(module):
    out = _dtypes(module)
    # JAX's default (x64 off) integer width is 32 bits: PyTorch's int64 counter is int32 here.
    return {k: ("int32" if v == "int64" else v) for k, v in out.items()}


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize(
    ("torch_cast", "jm_cast"),
    [
        (lambda m: m.to(torch.complex64), lambda m: m.to(jm.complex64)),
        (lambda m: m.to(torch.bfloat16), lambda m: m.to(jm.bfloat16)),
        (lambda m: m.half(), lambda m: m.half()),
        (lambda m: m.bfloat16(), lambda m: m.bfloat16()),
        (lambda m: m.half().float(), lambda m: m.half().float()),
        (lambda m: m.type(torch.float16), lambda m: m.type(jm.float16)),
        (lambda m: m.to("cpu", torch.float16), lambda m: m.to("cpu", jm.float16)),
        (
            lambda m: m.to(torch.zeros(1, dtype=torch.float16)),
            lambda m: m.to(jnp.zeros(1, jnp.float16)),
        ),
    ],
)
def test_dtype_casts_follow_pytorch_rules(torch_cast, jm_cast):
    ref = torch_cast(_bn_with_complex(torch.nn))
    got = jm_cast(_bn_with_complex(nn))
    assert _dtypes(got) == _torch_dtypes(ref)


@pytest.mark.torch
def test_to_integer_dtype_is_refused_like_pytorch():
    with pytest.raises(TypeError) as ours:
        nn.Linear(2, 2).to(jm.int32)
    with pytest.raises(TypeError) as theirs:
        torch.nn.Linear(2, 2).to(torch.int32)
    assert str(ours.value).split(", but")[0] == str(theirs.value).split(", but")[0]


def test_to_keeps_parameter_identity_and_values():
    model = nn.Linear(3, 2)
    weight = model.weight
    before = np.asarray(weight)
    assert model.to("cpu") is model
    assert model.weight is weight
    cpu = jax.devices("cpu")[0]
    model.to(cpu)
    model.to(single_device_sharding(cpu))  # a jax.sharding.Sharding
    model.to(jm.device("cpu"), non_blocking=True)
    model.to(memory_format=jm.channels_last)
    model.cpu()
    assert model.weight is weight
    np.testing.assert_array_equal(model.weight, before)
    assert model.weight.device == cpu


@pytest.mark.torch
def test_memory_format_accepts_torch_formats_and_rejects_junk():
    model = nn.Linear(2, 2)
    model.to(memory_format=torch.channels_last)
    model.to(torch.contiguous_format)
    with pytest.raises(TypeError, match="memory format"):
        model.to(memory_format="fast")


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.cuda(),
        lambda m: m.cuda(1),
        lambda m: m.to("cuda"),
        lambda m: m.to("cuda:1"),
        lambda m: m.to(0),
        lambda m: m.xpu(),
        lambda m: m.ipu(),
        lambda m: m.mtia(),
    ],
)
def test_unavailable_device_raises_listing_visible_devices(call):
    model = nn.Linear(2, 2)
    before = np.asarray(model.weight)
    with pytest.raises(jm.DeviceError, match=r"not available: JAX sees cpu:0"):
        call(model)
    np.testing.assert_array_equal(model.weight, before)


@pytest.mark.torch
def test_device_names_parse_like_pytorch():
    for name in ["cpu", "cuda", "cuda:1", "meta", "xpu:0"]:
        ours, theirs = jm.device(name), torch.device(name)
        assert (ours.type, ours.index) == (theirs.type, theirs.index)
        assert repr(ours) == repr(theirs)
        assert str(ours) == str(theirs)
    assert jm.device("cuda", 2) == "cuda:2"
    with pytest.raises(RuntimeError, match="Expected one of"):
        jm.device("cuad:0")
    with pytest.raises(RuntimeError, match="Invalid device string"):
        jm.device("cuda:x")
    assert jm.device("cpu").jax_device() == jax.devices("cpu")[0]


def test_jm_device_is_the_class_and_no_module_shares_its_name():
    """``jm.device`` is ``torch.device``'s counterpart; as ``import torch.device``
    fails, ``import jmodule.device`` finds no module (the module is
    ``jmodule._placement.device``)."""
    import importlib.machinery

    import jmodule
    from jmodule import device

    assert device is jm.device and isinstance(jm.device("cpu"), jm.device)
    # Look where the import system looks for jmodule's own submodules (a finder of an
    # editable install elsewhere on the machine may know other copies of the package).
    assert importlib.machinery.PathFinder.find_spec("jmodule.device", jmodule.__path__) is None
    assert importlib.machinery.PathFinder.find_spec("jmodule._placement", jmodule.__path__)
    assert type(jm.device("cpu")).__module__ == "jmodule._placement.device"


def test_double_without_x64_explains_how_to_enable_it():
    model = nn.Linear(2, 2)
    for call in (
        lambda: model.double(),
        lambda: model.to(jm.float64),
        lambda: model.type(jm.int64),
    ):
        with pytest.raises(jm.DtypeError, match="jax_enable_x64"):
            call()
    assert model.weight.dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.torch  # its script compares with torch
def test_with_x64_double_works_and_counters_are_int64():
    script = textwrap.dedent(
        """
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import torch
        import jmodule as jm
        bn = jm.nn.BatchNorm1d(3).double()
        assert bn.weight.dtype == jnp.float64, bn.weight.dtype
        assert bn.num_batches_tracked.dtype == jnp.int64, bn.num_batches_tracked.dtype
        ref = torch.nn.BatchNorm1d(3)
        bn.load_state_dict(ref.state_dict())  # int64 counter stays int64
        assert bn.num_batches_tracked.dtype == jnp.int64
        out = bn(jnp.ones((4, 3), jnp.float64))
        assert out.dtype == jnp.float64
        print("ok")
        """
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.torch
def test_int64_state_becomes_int32_without_x64():
    bn = nn.BatchNorm1d(3)
    bn.load_state_dict(torch.nn.BatchNorm1d(3).state_dict())
    assert bn.num_batches_tracked.dtype == jnp.int32


def test_dtype_aliases_are_jnp_dtypes():
    pairs = {
        jm.float32: jnp.float32,
        jm.float16: jnp.float16,
        jm.half: jnp.float16,
        jm.bfloat16: jnp.bfloat16,
        jm.float64: jnp.float64,
        jm.double: jnp.float64,
        jm.int32: jnp.int32,
        jm.int64: jnp.int64,
        jm.long: jnp.int64,
        jm.bool: jnp.bool_,
        jm.complex64: jnp.complex64,
        jm.complex128: jnp.complex128,
    }
    for ours, theirs in pairs.items():
        assert ours is theirs


class Big(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norm = nn.BatchNorm1d(width)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def test_meta_construction_allocates_nothing_then_to_empty_and_reset():
    tracemalloc.start()
    with jm.device("meta"):
        big = Big(width=100_000, depth=10)  # 10^11 parameters in abstract form
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n_params = sum(int(np.prod(p.shape)) for p in big.parameters())
    assert n_params > 10**11
    assert all(jm.is_meta(p) for p in big.parameters())
    assert all(jm.is_meta(b) for b in big.buffers())
    assert peak < 50 * 2**20
    with pytest.raises(RuntimeError, match="to_empty"):
        big.to("cpu")

    with jm.device("meta"):
        small = Big(width=8, depth=2)
    with pytest.raises(RuntimeError, match=r"meta device.*to_empty"):
        small(jnp.ones((4, 8)))
    small.to_empty(device="cpu")
    assert not any(jm.is_meta(p) for p in small.parameters())
    assert all(float(jnp.abs(p).sum()) == 0 for p in small.parameters())
    for module in small.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    weights = small.layers[0].weight
    bound = 1 / np.sqrt(8)
    assert float(jnp.abs(weights).max()) <= bound and float(jnp.abs(weights).sum()) > 0
    assert small(jnp.ones((4, 8))).shape == (4, 8)


def test_parameters_follow_default_device_context_and_device_argument():
    cpu = jax.devices("cpu")[0]
    with jm.device("cpu"):
        layer = nn.Linear(2, 2)
    assert layer.weight.device == cpu
    layer = nn.Linear(2, 2, device="cpu", dtype=jm.bfloat16)
    assert layer.weight.dtype == jnp.bfloat16
    with pytest.raises(jm.DeviceError):
        nn.Linear(2, 2, device="cuda")


def test_share_memory_is_a_documented_noop():
    model = nn.Linear(2, 2)
    assert model.share_memory() is model


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_casting_a_model_on_the_cpu_compiles_nothing_and_rounds_as_xla(dtype):
    from _monitoring import LOWER, counting

    tiny = float(np.finfo(np.float32).tiny)
    special = np.array(
        [0.1, -2.5e-8, tiny, 70000.0, np.inf, -np.inf, 1 / 3, 65519.0, -0.0, 3e-5], np.float32
    )
    model = nn.Sequential(nn.Linear(10, 7), nn.BatchNorm1d(7))
    model[0].weight.data = jnp.asarray(np.tile(special, (7, 1)))
    want = {
        k: jnp.asarray(v).astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
        for k, v in model.state_dict().items()
    }
    with counting(LOWER) as seen:
        model.to(dtype)
        model.float().to(dtype)  # back and forth
    assert seen == []
    for k, v in model.state_dict().items():
        assert v.dtype == want[k].dtype, k
        if jnp.issubdtype(want[k].dtype, jnp.floating):
            np.testing.assert_array_equal(
                np.asarray(v, np.float32), np.asarray(want[k], np.float32)
            )
