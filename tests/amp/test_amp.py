"""``jm.autocast`` and ``jm.amp.GradScaler`` against torch's, live.

The op lists come from torch: the CPU policy is whatever ``torch.autocast("cpu")``
does to each op (run here op by op, output dtypes compared), and the set of ops
with a CPU policy is the set of aten ops with an ``AutocastCPU`` kernel in
torch's dispatcher. The CUDA lists are read from torch's own table,
``torch/include/ATen/autocast_mode.h`` in the installed wheel (the
``AT_FORALL_*`` macros ``autocast_mode.cpp`` registers for CUDA), checked
against the dispatcher's ``AutocastCUDA`` kernels.
"""

from __future__ import annotations

import itertools
import pickle
import re
import threading
import warnings
from pathlib import Path

import _torch
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from amp_cases import CASES, FUNCTION_CASES, Arrays
from torch_ref import dtype_name

import jmodule as jm
import jmodule.nn.functional as JF
from jmodule import _torch_functions
from jmodule.amp import _autocast

TF = torch.nn.functional

# ----------------------------------------------------------------------------- torch's tables

HEADER = (
    Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if _torch.INSTALLED
    else None
)
MACROS = {
    "AT_FORALL_LOWER_PRECISION_FP": "lower",
    "AT_FORALL_FP32": "fp32",
    "AT_FORALL_FP32_SET_OPT_DTYPE": "fp32_set_opt_dtype",
    # norm's two overloads (fp32_append_dtype: the op runs and returns float32, as above)
    "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE": "fp32_set_opt_dtype",
    "AT_FORALL_PROMOTE": "promote",
}


def _header_table() -> dict[str, str]:
    """``{aten op: policy}`` from the ``AT_FORALL_*`` op lists of torch's autocast header."""
    text = HEADER.read_text()
    table = {}
    for macro, policy in MACROS.items():
        body = re.search(rf"#define {macro}\(_\)(.*?)\n\n", text + "\n\n", re.S)
        assert body is not None, macro
        for entry in re.findall(r"_\(\s*(?:ADD_NS\()?(\w+)", body.group(1)):
            table[entry] = policy
    return table


def _kernel_ops(key: str) -> set[str]:
    """The aten ops (overload names dropped) with a kernel for dispatch key ``key``."""
    names = torch._C._dispatch_get_all_op_names()
    return {
        n.split("::")[1].split(".")[0]
        for n in names
        if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, key)
    }


@pytest.mark.torch
def test_cuda_lists_are_torchs_header_table():
    assert HEADER.exists(), f"torch's autocast header is not in the wheel: {HEADER}"
    table = _header_table()
    assert table == _autocast.CUDA
    # The header's lists are the ones torch registers for CUDA: each op has a kernel there.
    assert set(table) <= _kernel_ops("AutocastCUDA")
    # softmax/layer_norm/exp stay float32 on CUDA (and not on CPU).
    assert {table["softmax"], table["layer_norm"], table["exp"]} <= {"fp32", "fp32_set_opt_dtype"}


@pytest.mark.torch
def test_cpu_ops_are_those_with_a_torch_autocast_cpu_kernel():
    assert set(_autocast.CPU) == _kernel_ops("AutocastCPU")
    assert not {"softmax", "layer_norm", "exp", "sum"} & set(_autocast.CPU)


# ----------------------------------------------------------------------------- op by op, CPU

# (case, input dtype) pairs torch itself refuses under CPU autocast: nothing to compare.
TORCH_REFUSES = {
    ("bilinear", "bfloat16"),  # "All tensors must have the same dtype" (bilinear not cast)
    ("pdist", "bfloat16"),  # "pdist" not implemented for 'BFloat16'
}

# Every op of torch's CPU lists that jmodule implements, and the cases calling it.
CPU_LISTED = {
    "linear": ["linear", "linear_nobias"],
    "prelu": ["prelu"],
    "conv1d": ["conv1d"],
    "conv2d": ["conv2d"],
    "conv3d": ["conv3d"],
    "conv_transpose1d": ["conv_transpose1d"],
    "conv_transpose2d": ["conv_transpose2d"],
    "conv_transpose3d": ["conv_transpose3d"],
    "scaled_dot_product_attention": ["scaled_dot_product_attention"],
    "bmm": ["affine_grid"],
    "avg_pool3d": ["avg_pool3d", "lp_pool3d", "local_response_norm"],
    "max_pool3d": ["max_pool3d"],
    "adaptive_avg_pool3d": ["adaptive_avg_pool3d"],
    "adaptive_max_pool3d": ["adaptive_max_pool3d", "adaptive_max_pool3d_indices"],
    "max_unpool2d": ["max_unpool1d", "max_unpool2d"],
    "max_unpool3d": ["max_unpool3d"],
    "reflection_pad1d": ["pad_reflect1d"],
    "reflection_pad2d": ["pad_reflect2d"],
    "replication_pad1d": ["pad_replicate1d"],
    "replication_pad2d": ["pad_replicate2d"],
    "replication_pad3d": ["pad_replicate3d"],
    "grid_sampler": ["grid_sample", "grid_sample_f32_grid"],
    "mse_loss": ["mse_loss"],
    "l1_loss": ["l1_loss"],
    "smooth_l1_loss": ["smooth_l1_loss"],
    "huber_loss": ["huber_loss"],
    "poisson_nll_loss": ["poisson_nll_loss"],
    "nll_loss": ["nll_loss"],
    "nll_loss2d": ["nll_loss2d"],
    "cross_entropy_loss": ["cross_entropy", "cross_entropy_probs", "cross_entropy_none"],
    "binary_cross_entropy": ["binary_cross_entropy"],
    "binary_cross_entropy_with_logits": ["binary_cross_entropy_with_logits"],
    "kl_div": ["kl_div"],
    "soft_margin_loss": ["soft_margin_loss"],
    "multi_margin_loss": ["multi_margin_loss"],
    "multilabel_margin_loss": ["multilabel_margin_loss"],
    "hinge_embedding_loss": ["hinge_embedding_loss"],
    "cosine_embedding_loss": ["cosine_embedding_loss"],
    "margin_ranking_loss": ["margin_ranking_loss"],
    "triplet_margin_loss": ["triplet_margin_loss"],
    "ctc_loss": ["ctc_loss"],
    "mkldnn_rnn_layer": ["LSTM"],
    "_native_multi_head_attention": ["MultiheadAttention"],
}


def _dtypes(out):
    if isinstance(out, (tuple, list)):
        return [d for x in out for d in _dtypes(x)]
    return [] if out is None else [dtype_name(out)]


def _module_cases():
    def rnn(kind):
        return lambda nn: getattr(nn, kind)(3, 4, batch_first=True), (2, 5, 3)

    def cell(kind):
        return lambda nn: getattr(nn, kind)(3, 4), (2, 3)

    return {
        "LSTM": rnn("LSTM"),
        "GRU": rnn("GRU"),
        "RNN": rnn("RNN"),
        "LSTMCell": cell("LSTMCell"),
        "GRUCell": cell("GRUCell"),
        "RNNCell": cell("RNNCell"),
        "MultiheadAttention": (lambda nn: nn.MultiheadAttention(8, 2, batch_first=True), (2, 4, 8)),
        # In training mode (torch's fused CPU path for an encoder layer is taken only in
        # eval mode without gradients, which jmodule has no notion of).
        "TransformerEncoderLayer": (
            lambda nn: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
            (2, 4, 8),
        ),
    }


MODULES = _module_cases()


@pytest.mark.torch
def test_every_cpu_listed_op_jmodule_implements_has_a_case():
    ids = {name for name, _ in CASES} | set(MODULES)
    assert set(CPU_LISTED) <= _kernel_ops("AutocastCPU") | {"bmm"}
    assert {c for cases in CPU_LISTED.values() for c in cases} <= ids
    # Each listed op is on jmodule's CPU table, with a policy.
    assert all(_autocast.CPU.get(op) for op in CPU_LISTED)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("name", "call"), [pytest.param(n, c, id=n) for n, c in CASES])
def test_op_output_dtypes_match_torch_cpu_autocast(name, call, dtype):
    if (name, dtype) in TORCH_REFUSES:
        with torch.autocast("cpu"), pytest.raises(RuntimeError):
            call(TF, Arrays(True, dtype, torch.nn))
        return
    with torch.autocast("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _dtypes(call(TF, Arrays(True, dtype, torch.nn)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # First outside autocast: the ops' eager jax.jit caches must not serve the
        # program traced here to the call inside the region. (Mixed dtypes that only
        # autocast reconciles are refused outside it, by torch and jmodule alike.)
        try:
            call(TF, Arrays(True, dtype, torch.nn))
        except RuntimeError:
            pass
        else:
            call(JF, Arrays(False, dtype, jm.nn))
        with jm.autocast("cpu"):
            got = _dtypes(call(JF, Arrays(False, dtype, jm.nn)))
    assert got == want


def _torch_autocast_call(ref, args):
    """``ref(*args)`` inside torch's CPU autocast region.

    Under autocast torch runs ``nn.LSTM`` as oneDNN's ``mkldnn_rnn_layer`` in bfloat16,
    every floating argument cast. On CPUs whose oneDNN has no bfloat16 LSTM for a float32
    input (AMD Zen 3, for one) torch 2.13 raises instead of answering; torch's answer
    is then the one for the arguments autocast casts them to, which it gives there."""
    try:
        return ref(*args)
    except RuntimeError as e:
        if "primitive descriptor for the LSTM forward" not in str(e):
            raise
        return ref(*[a.to(torch.bfloat16) for a in args])


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(MODULES))
def test_layer_output_dtypes_match_torch_cpu_autocast(name, train, dtype):
    make, shape = MODULES[name]
    if name == "TransformerEncoderLayer" and not train:
        train = True
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ref, ours = make(torch.nn).train(train), make(jm.nn).train(train)
    tx, jx = torch.from_numpy(x).to(getattr(torch, dtype)), jnp.asarray(x, dtype=dtype)
    n = 3 if name == "MultiheadAttention" else 1
    with torch.autocast("cpu"), torch.set_grad_enabled(train):
        want = _dtypes(_torch_autocast_call(ref, [tx] * n))
    with jm.autocast("cpu"):
        got = _dtypes(ours(*[jx] * n))
    assert got == want
    assert all(p.dtype == jnp.float32 for p in ours.parameters())  # parameters keep theirs


# ----------------------------------------------------------------------------- semantics


def _tiny(side):
    nn = side

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 16)
            self.ln = nn.LayerNorm(16)
            self.fc2 = nn.Linear(16, 5)

        def forward(self, x):
            return self.fc2(self.ln(nn.functional.gelu(self.fc1(x))))

    return Net()


def _pair():
    torch.manual_seed(0)
    ref, ours = _tiny(torch.nn), _tiny(jm.nn)
    ours.load_state_dict(ref.state_dict())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = rng.integers(0, 5, 8)
    return ref, ours, x, y


def _torch_loss(ref, x, y, amp):
    with torch.autocast("cpu", enabled=amp):
        logits = ref(torch.from_numpy(x))
        loss = TF.cross_entropy(logits, torch.from_numpy(y))
    return logits, loss


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_loss_and_gradients_match_torch_cpu_autocast(compiled):
    ref, ours, x, y = _pair()
    t_logits, t_loss = _torch_loss(ref, x, y, amp=True)
    t_loss.backward()
    _, t_loss32 = _torch_loss(ref, x, y, amp=False)
    gap = abs(t_loss.item() - t_loss32.item())  # what bfloat16 autocast moves torch's loss by
    assert gap > 0

    def step(model, x, y):
        model.zero_grad()
        with jm.autocast("cpu"):
            logits = model(x)
            loss = jm.backward(lambda: JF.cross_entropy(model(x), y))
        return logits, loss

    fn = jm.compile(step) if compiled else step
    logits, loss = fn(ours, jnp.asarray(x), jnp.asarray(y, dtype=jnp.int32))
    assert logits.dtype == jnp.bfloat16 and t_logits.dtype == torch.bfloat16
    assert loss.dtype == jnp.float32 and t_loss.dtype == torch.float32
    assert abs(float(loss) - t_loss.item()) <= gap
    for (k, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
        assert q.dtype == jnp.float32 and q.grad.dtype == jnp.float32, k
        g, want = np.asarray(q.grad), p.grad.numpy()
        # bfloat16 rounding of the matmul inputs: a few bfloat16 ulps of the gradient's scale
        assert np.max(np.abs(g - want)) <= 8 * 2.0**-8 * np.max(np.abs(want)), k


@pytest.mark.torch
def test_nested_disabled_region_and_decorator():
    x, w = jnp.ones((2, 3)), jnp.ones((4, 3))
    tx, tw = torch.ones(2, 3), torch.ones(4, 3)

    @jm.autocast("cpu")
    def ours():
        inner = None
        with jm.autocast("cpu", enabled=False):
            inner = JF.linear(x, w)
        return JF.linear(x, w), inner

    @torch.autocast("cpu")
    def ref():
        with torch.autocast("cpu", enabled=False):
            inner = TF.linear(tx, tw)
        return TF.linear(tx, tw), inner

    assert _dtypes(ours()) == _dtypes(ref())
    assert JF.linear(x, w).dtype == jnp.float32  # nothing leaks out of the region
    assert not jm.amp.is_autocast_enabled("cpu")


@pytest.mark.torch
def test_dtype_options_match_torch():
    for dtype in ("float16", "bfloat16"):
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            want = TF.linear(torch.ones(2, 3), torch.ones(4, 3))
        with jm.autocast("cpu", dtype=getattr(jnp, dtype)):
            got = JF.linear(jnp.ones((2, 3)), jnp.ones((4, 3)))
        assert dtype_name(got) == dtype_name(want)
    assert jm.amp.get_autocast_dtype("cpu") == jnp.bfloat16
    assert jm.amp.get_autocast_dtype("cuda") == jnp.float16
    assert str(torch.get_autocast_dtype("cpu")) == "torch.bfloat16"


@pytest.mark.torch
def test_unsupported_dtype_and_missing_cuda_warn_and_disable_as_torch():
    with pytest.warns(UserWarning) as want, torch.autocast("cpu", dtype=torch.float64):
        t = TF.linear(torch.ones(2, 3), torch.ones(4, 3))
    with pytest.warns(UserWarning) as got, jm.autocast("cpu", dtype=jnp.float32):
        j = JF.linear(jnp.ones((2, 3)), jnp.ones((4, 3)))
    # The first line names the problem; the second lists the dtypes in torch's spelling.
    assert (dtype_name(j), str(got[0].message).split("\n")[0]) == (
        dtype_name(t),
        str(want[0].message).split("\n")[0],
    )
    if torch.cuda.is_available() or jm.amp._autocast._cuda_available():
        return  # the CPU-only behaviour below is what is being compared
    with pytest.warns(UserWarning) as want:
        torch.autocast("cuda")
    with pytest.warns(UserWarning) as got:
        region = jm.autocast("cuda")
    assert str(got[0].message) == str(want[0].message)
    with region:
        assert not jm.amp.is_autocast_enabled("cuda")
    with pytest.raises(ValueError, match="'cpu' and 'cuda'"):
        jm.autocast("tpu")


def test_regions_are_per_thread():
    seen = {}

    def other():
        seen["enabled"] = jm.amp.is_autocast_enabled("cpu")
        seen["dtype"] = JF.linear(jnp.ones((1, 2)), jnp.ones((3, 2))).dtype

    with jm.autocast("cpu"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert jm.amp.is_autocast_enabled("cpu")
    assert seen == {"enabled": False, "dtype": jnp.float32}


@pytest.mark.slow
@pytest.mark.torch
def test_cuda_policy_from_torchs_table(monkeypatch):
    """Ops cast by CUDA's lists (read from torch's header) when JAX computes on a GPU.

    This machine has no GPU: the device type JAX computes on is patched to "cuda"
    so the CUDA lists are applied; what each op must do is read from the header.
    """
    monkeypatch.setattr(_autocast, "_platform", lambda: "cuda")
    monkeypatch.setattr(_autocast, "_cuda_available", lambda: True)
    table = _header_table()
    expect = {"lower": "float16", "fp32": "float32", "fp32_set_opt_dtype": "float32"}
    x16, x32 = jnp.ones((2, 3), jnp.float16), jnp.ones((2, 3), jnp.float32)
    calls = {
        "linear": lambda: JF.linear(x32, jnp.ones((4, 3))),
        "softmax": lambda: JF.softmax(x16, dim=-1),
        "log_softmax": lambda: JF.log_softmax(x16, dim=-1),
        "layer_norm": lambda: JF.layer_norm(x16, (3,)),
        "group_norm": lambda: JF.group_norm(jnp.ones((2, 4, 3), jnp.float16), 2),
        "rms_norm": lambda: JF.rms_norm(x16, (3,)),
        "softplus": lambda: JF.softplus(x16),
        "mse_loss": lambda: JF.mse_loss(x16, x16),
        "cosine_similarity": lambda: JF.cosine_similarity(x16, x16),
        "norm": lambda: JF.normalize(x16),
        "upsample_nearest2d": lambda: JF.interpolate(jnp.ones((1, 1, 2, 2), jnp.float16), 4),
        "lstm_cell": lambda: JF.lstm_cell(x32, (jnp.ones((2, 4)),) * 2, *_cell_weights())[0],
    }
    with jm.autocast("cuda"):
        for op, call in calls.items():
            assert dtype_name(call()) == expect[table[op]], op
        # promote: the widest floating input; bilinear is on CUDA's promote list
        out = JF.bilinear(x16, x32, jnp.ones((5, 3, 3), jnp.float16))
        assert table["bilinear"] == "promote" and out.dtype == jnp.float32
        # not on CUDA's lists: follows its input (CPU's losses list does not apply)
        assert "ctc_loss" not in table and JF.relu(x16).dtype == jnp.float16


def _cell_weights():
    return jnp.ones((16, 3)), jnp.ones((16, 4)), jnp.ones(16), jnp.ones(16)


def test_compiled_function_traced_outside_autocast_retraces_inside():
    model = jm.nn.Linear(3, 2)
    x = jnp.ones((4, 3))

    @jm.compile
    def forward(m, x):
        return JF.mse_loss(m(x), jnp.zeros((4, 2))), m(x)

    loss, out = forward(model, x)
    assert out.dtype == jnp.float32
    with jm.autocast("cpu"):
        loss, out = forward(model, x)
        assert out.dtype == jnp.bfloat16 and loss.dtype == jnp.float32
        forward(model, x)
        with jm.autocast("cpu", enabled=False):
            assert forward(model, x)[1].dtype == jnp.float32
    assert forward(model, x)[1].dtype == jnp.float32
    stats = jm.compile_stats(forward)
    assert stats.num_traces == 2  # one program per autocast state, each reused
    assert stats.reasons[1] == "autocast changed: off -> cpu bfloat16"

    model.compile()
    assert model(x).dtype == jnp.float32
    with jm.autocast("cpu"):
        assert model(x).dtype == jnp.bfloat16
    assert model(x).dtype == jnp.float32
    assert jm.compile_stats(model).num_traces == 2


@pytest.mark.slow
@pytest.mark.torch
def test_autocast_region_inside_a_compiled_training_step():
    torch.manual_seed(0)
    ref, ours = _tiny(torch.nn), _tiny(jm.nn)
    ours.load_state_dict(ref.state_dict())
    opt = jm.optim.SGD(ours.parameters(), lr=0.1)
    t_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    _, _, x, y = _pair()

    @jm.compile
    def step(model, opt, x, y):
        opt.zero_grad()
        with jm.autocast("cpu"):
            loss = jm.backward(lambda: JF.cross_entropy(model(x), y))
        opt.step()
        return loss

    loss = step(ours, opt, jnp.asarray(x), jnp.asarray(y, dtype=jnp.int32))
    t_opt.zero_grad()
    _, t_loss = _torch_loss(ref, x, y, amp=True)
    t_loss.backward()
    t_opt.step()
    _, t_loss32 = _torch_loss(ref, x, y, amp=False)
    assert abs(float(loss) - t_loss.item()) <= abs(t_loss.item() - t_loss32.item())
    assert all(p.dtype == jnp.float32 for p in ours.parameters())


# ----------------------------------------------------------------------------- GradScaler

GRADS = [  # per step: the gradient's multiplier (inf and nan steps are skipped)
    [1.0, 2.0, 3.0],
    [np.inf, 1.0, 1.0],
    [0.5, 0.5, 0.5],
    [1.0, 1.0, 1.0],
    [2.0, -2.0, 2.0],
    [np.nan, 0.0, 0.0],
    [1.0, -1.0, 1.0],
    [0.25, 1.0, -1.0],
]
# Options exact in float32 (jmodule's optimizers hold them as float32 arrays).
OPTS = {"SGD": {"lr": 0.125, "momentum": 0.875}, "Adam": {"lr": 0.125, "betas": (0.875, 0.9921875)}}


def _torch_run(opt_name, clip):
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))
    opt = getattr(torch.optim, opt_name)([w], **OPTS[opt_name])
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    trace = []
    for g in GRADS:
        opt.zero_grad()
        scaler.scale((w * w * torch.tensor(g, dtype=torch.float64)).sum()).backward()
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([w], 1.0)
        scaler.step(opt)
        scaler.update()
        trace.append((w.detach().numpy().copy(), scaler.get_scale(), scaler._get_growth_tracker()))
    return trace, scaler.state_dict(), opt.state_dict()


def _jm_run(opt_name, clip, compiled):
    model = jm.nn.Module()
    model.w = jm.nn.Parameter(jnp.array([1.0, -2.0, 3.0], dtype=jnp.float64))
    opt = getattr(jm.optim, opt_name)(model.parameters(), **OPTS[opt_name])
    scaler = jm.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)

    def step(model, opt, scaler, g):
        opt.zero_grad()
        jm.backward(lambda: scaler.scale((model.w * model.w * g).sum()))
        if clip:
            scaler.unscale_(opt)
            jm.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    fn = jm.compile(step) if compiled else step
    trace = []
    for g in GRADS:
        fn(model, opt, scaler, jnp.asarray(g, dtype=jnp.float64))
        trace.append((np.asarray(model.w.data), scaler.get_scale(), scaler._get_growth_tracker()))
    return trace, scaler.state_dict(), opt.state_dict(), fn


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale_clip_step"])
@pytest.mark.parametrize("opt_name", list(OPTS))
def test_grad_scaler_sequence_matches_torch(opt_name, clip, compiled):
    with jax.enable_x64(True):
        want, want_sd, want_opt = _torch_run(opt_name, clip)
        got, got_sd, got_opt, fn = _jm_run(opt_name, clip, compiled)
    scales = [8.0] + [s for _, s, _ in want]
    moves = [b / a for a, b in itertools.pairwise(scales)]
    assert 0.5 in moves and 2.0 in moves  # the run backs off and grows
    for step, ((w_t, s_t, g_t), (w_j, s_j, g_j)) in enumerate(zip(want, got)):
        np.testing.assert_allclose(w_j, w_t, rtol=1e-10, atol=1e-12, err_msg=f"step {step}")
        assert (s_j, g_j) == (s_t, g_t), step
    assert got_sd == want_sd
    if opt_name == "Adam":  # steps skipped do not count
        assert float(got_opt["state"][0]["step"]) == float(want_opt["state"][0]["step"])
    if compiled:  # the scale is an input: changing it never recompiles
        assert jm.compile_stats(fn).num_traces == 1


@pytest.mark.torch
def test_grad_scaler_state_dict_round_trips_with_torch():
    ref = torch.amp.GradScaler("cpu", init_scale=4.0, growth_factor=3.0, growth_interval=7)
    ours = jm.amp.GradScaler("cpu", init_scale=4.0, growth_factor=3.0, growth_interval=7)
    assert ours.state_dict() == ref.state_dict()
    saved = dict(ref.state_dict(), scale=0.5, _growth_tracker=3)
    ref.load_state_dict(saved)
    ours.load_state_dict(saved)
    assert ours.state_dict() == ref.state_dict()
    assert (ours.get_scale(), ours.get_growth_factor(), ours.get_backoff_factor()) == (
        ref.get_scale(),
        ref.get_growth_factor(),
        ref.get_backoff_factor(),
    )
    assert ours.get_growth_interval() == ref.get_growth_interval()
    assert pickle.loads(pickle.dumps(ours)).state_dict() == ref.state_dict()
    with pytest.raises(RuntimeError) as want:
        torch.amp.GradScaler("cpu").load_state_dict({})
    with pytest.raises(RuntimeError) as got:
        jm.amp.GradScaler("cpu").load_state_dict({})
    assert str(got.value) == str(want.value)


@pytest.mark.torch
def test_grad_scaler_disabled_is_a_pass_through():
    ref = torch.amp.GradScaler("cpu", enabled=False)
    ours = jm.amp.GradScaler("cpu", enabled=False)
    w = jm.nn.Parameter(jnp.array([1.0, 2.0]))
    opt = jm.optim.SGD([w], lr=0.5)
    loss = jm.backward(lambda: ours.scale((w * w).sum()))
    ours.unscale_(opt)
    ours.step(opt)
    ours.update()
    np.testing.assert_allclose(np.asarray(w.data), [0.0, 0.0])
    assert float(loss) == 5.0
    assert (ours.get_scale(), ours.state_dict(), ours.is_enabled()) == (
        ref.get_scale(),
        ref.state_dict(),
        ref.is_enabled(),
    )


def _misuse(framework, what):
    nn, optim = (torch.nn, torch.optim) if framework == "torch" else (jm.nn, jm.optim)
    w = nn.Parameter(torch.ones(2) if framework == "torch" else jnp.ones(2))
    opt = optim.SGD([w], lr=0.1)
    scaler = (torch.amp if framework == "torch" else jm.amp).GradScaler("cpu")
    if framework == "torch":
        scaler.scale((w * w).sum()).backward()
    else:
        jm.backward(lambda: scaler.scale((w * w).sum()))
    if what == "unscale_twice":
        scaler.unscale_(opt)
        scaler.unscale_(opt)
    elif what == "unscale_after_step":
        scaler.step(opt)
        scaler.unscale_(opt)
    elif what == "step_twice":
        scaler.step(opt)
        scaler.step(opt)
    elif what == "closure":
        scaler.step(opt, closure=lambda: None)
    elif what == "update_first":
        scaler.update()


@pytest.mark.torch
@pytest.mark.parametrize(
    "what", ["unscale_twice", "unscale_after_step", "step_twice", "closure", "update_first"]
)
def test_grad_scaler_misuse_raises_as_torch(what):
    with pytest.raises(Exception) as want:
        _misuse("torch", what)
    with pytest.raises(Exception) as got:
        _misuse("jm", what)
    assert (type(got.value), str(got.value)) == (type(want.value), str(want.value))


@pytest.mark.torch
def test_grad_scaler_refuses_float16_gradients_as_torch():
    def run(framework):
        if framework == "torch":
            w = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
            opt, scaler = torch.optim.SGD([w], lr=0.1), torch.amp.GradScaler("cpu")
            scaler.scale((w * w).sum()).backward()
        else:
            w = jm.nn.Parameter(jnp.ones(2, jnp.float16))
            opt, scaler = jm.optim.SGD([w], lr=0.1), jm.amp.GradScaler("cpu")
            jm.backward(lambda: scaler.scale((w * w).sum()))
        scaler.unscale_(opt)

    with pytest.raises(ValueError) as want:
        run("torch")
    with pytest.raises(ValueError) as got:
        run("jm")
    assert str(got.value) == str(want.value)


@pytest.mark.torch
def test_grad_scaler_scale_dtypes_match_torch():
    ref, ours = torch.amp.GradScaler("cpu"), jm.amp.GradScaler("cpu")
    for shape in [(), (3,)]:
        for dtype in ("bfloat16", "float32"):
            t = ref.scale(torch.ones(shape, dtype=getattr(torch, dtype)))
            j = ours.scale(jnp.ones(shape, dtype=dtype))
            assert (dtype_name(j), float(j.ravel()[0])) == (dtype_name(t), float(t.ravel()[0]))
    pair = ours.scale([jnp.ones(2), jnp.ones(()) * 2])
    assert isinstance(pair, list) and float(pair[1]) == 2.0**17
    with pytest.raises(ValueError, match="iterable of Tensors"):
        ours.scale(3.0)


def test_grad_scaler_in_compiled_step_must_be_passed_and_whole():
    w = jm.nn.Parameter(jnp.ones(2))
    holder = jm.nn.Module()
    holder.w = w
    opt = jm.optim.SGD([w], lr=0.1)
    scaler = jm.amp.GradScaler("cpu")

    @jm.compile
    def not_given(model, opt, x):
        return jm.backward(lambda: scaler.scale((model.w * x).sum()))

    with pytest.raises(RuntimeError, match="Pass the scaler as an argument"):
        not_given(holder, opt, jnp.ones(2))

    @jm.compile
    def half(model, opt, scaler, x):
        opt.zero_grad()
        jm.backward(lambda: scaler.scale((model.w * x).sum()))
        scaler.step(opt)

    half(holder, opt, scaler, jnp.ones(2))
    with pytest.raises(RuntimeError, match="same compiled function"):
        scaler.update()

    @jm.compile
    def reads_scale(model, opt, scaler, x):
        return scaler.get_scale()

    with pytest.raises(RuntimeError, match="outside the compiled step"):
        reads_scale(holder, opt, jm.amp.GradScaler("cpu"), jnp.ones(2))


@pytest.mark.torch
def test_a_layer_first_called_inside_autocast_is_exact_outside_it():
    """Eager programs traced inside a region are not served outside it.

    JAX caches traces by function: a program traced inside ``jm.autocast``
    (bfloat16 casts included) was served to the same layer's calls after the
    region, which then computed in bfloat16. A shape no other test uses makes
    the first trace happen inside the region here.
    """
    torch.manual_seed(0)
    ref, ours = torch.nn.MultiheadAttention(8, 2), jm.nn.MultiheadAttention(8, 2)
    ours.load_state_dict(ref.state_dict())
    x = np.random.default_rng(5).standard_normal((3, 7, 8)).astype(np.float32)
    with jm.autocast("cpu"):
        assert ours(jnp.asarray(x), jnp.asarray(x), jnp.asarray(x))[0].dtype == jnp.bfloat16
    got = ours(jnp.asarray(x), jnp.asarray(x), jnp.asarray(x))[0]
    with torch.no_grad():
        want = ref(*[torch.from_numpy(x)] * 3)[0].numpy()
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


# The jm torch functions on autocast's CPU "lower" list (torch computes them in bfloat16).
_LOWERED = {
    "matmul": lambda m, a, b, c: m.matmul(a, b.T),
    "matmul_vector": lambda m, a, b, c: m.matmul(a, b[0]),
    "mm": lambda m, a, b, c: m.mm(a, b.T),
    "bmm": lambda m, a, b, c: m.bmm(a[None], b.T[None]),
    "addmm": lambda m, a, b, c: m.addmm(c, a, b.T),
    "baddbmm": lambda m, a, b, c: m.baddbmm(c[None], a[None], b.T[None]),
    "addbmm": lambda m, a, b, c: m.addbmm(c, a[None], b.T[None]),
}


@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("name", list(_LOWERED))
def test_jm_matrix_products_follow_torch_cpu_autocast(name, dtype, compiled):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (5, 4), (3, 5))]
    call = _LOWERED[name]
    t_args = [torch.from_numpy(x).to(getattr(torch, dtype)) for x in arrays]
    with torch.autocast("cpu"):
        want = call(torch, *t_args)
    with jax.enable_x64(dtype == "float64"):
        j_args = [jnp.asarray(x, dtype=dtype) for x in arrays]
        run = jm.compile(lambda *xs: call(jm, *xs)) if compiled else (lambda *xs: call(jm, *xs))
        with jm.autocast("cpu"):
            got = run(*j_args)
        assert str(got.dtype) == str(want.dtype).split(".")[-1]
        assert str(run(*j_args).dtype) == dtype  # outside the region, the inputs' dtype
    np.testing.assert_allclose(
        np.asarray(got, np.float32), want.float().numpy(), rtol=2e-2, atol=2e-2
    )


# ----------------------------------------------------------------------------- jm.* functions

# (case, input dtype) pairs torch refuses under CPU autocast (with either autocast dtype):
# nothing to compare, and each must still be refused.
FUNCTION_TORCH_REFUSES = {
    ("norm:nuc", "bfloat16"): "linalg.matrix_norm: Low precision dtypes not supported",
    ("norm:nuc", "float16"): "linalg.matrix_norm: Low precision dtypes not supported",
    ("complex", "bfloat16"): "Expected both inputs to be Half, Float or Double tensors",
    ("norm:dtype", "float64"): "the dtype of the input (Double) should be convertible",
    ("quantile:tensor_q", "float64"): "q tensor must be same dtype as the input tensor",
    ("polar:mixed", "float64"): "Expected object of scalar type Double",
    ("index_copy:mixed", "float64"): "self and source expected to have the same dtype",
    ("index_copy:mixed_self", "float64"): "self and source expected to have the same dtype",
    ("cdist:mixed", "float64"): "expected scalar type Double but found Float",
}
# (case, input dtype) pairs where jmodule's dtype is not torch's with or without autocast,
# for reasons autocast has no part in: autocast must leave both sides as they are.
FUNCTION_DIFFERS_ANYWAY = {
    ("bincount", "bfloat16"): "torch's half-precision weights give float64",
    ("bincount", "float16"): "torch's half-precision weights give float64",
    ("complex", "float16"): "torch's complex32 has no JAX counterpart",
}
# (autocast dtype, input dtype): CPU autocast to bfloat16 and to float16 (both supported),
# on float32 inputs, on inputs already in the autocast dtype, and on float64 ones.
AUTOCAST_INPUTS = [
    ("bfloat16", "float32"),
    ("bfloat16", "bfloat16"),
    ("bfloat16", "float64"),
    ("float16", "float32"),
    ("float16", "float16"),
]


class _Recording(Arrays):
    """jmodule's arrays for a case, each recorded (to be given to a compiled call)."""

    def __init__(self, dtype, seen):
        super().__init__(False, dtype, jm.nn)
        self.seen = seen

    def _wrap(self, a, dtype):
        self.seen.append(super()._wrap(a, dtype))
        return self.seen[-1]

    def i(self, high, *shape):
        self.seen.append(super().i(high, *shape))
        return self.seen[-1]

    def const(self, value, dtype="int64"):
        self.seen.append(super().const(value, dtype))
        return self.seen[-1]


class _Replay(Arrays):
    """The recorded arrays again, in order: inside ``jm.compile``, the traced arguments."""

    def __init__(self, dtype, xs):
        super().__init__(False, dtype, jm.nn)
        self.xs = iter(xs)

    def _wrap(self, a, dtype):
        return next(self.xs)

    def i(self, high, *shape):
        return next(self.xs)

    def const(self, value, dtype="int64"):
        return next(self.xs)


def _leaves(out):
    if isinstance(out, (tuple, list)):
        return [y for x in out for y in _leaves(x)]
    return [out]


def _numpy(x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (x.float() if x.dtype in (torch.bfloat16, torch.float16) else x).numpy()
    if isinstance(x, jax.Array) and x.dtype in (jnp.bfloat16, jnp.float16):
        x = x.astype(jnp.float32)
    return np.asarray(x)


def _fn_dtypes(out):
    """The output dtypes (``bool`` for a Python bool: ``allclose``, ``equal``)."""
    return ["bool"] if isinstance(out, bool) else _dtypes(out)


def _outcome(fn):
    """``fn()``'s output dtypes, or its exception's type."""
    try:
        return _fn_dtypes(fn())
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        return type(e)


def _function_params():
    """Every case eagerly with each (autocast dtype, input dtype); inside ``jm.compile``
    with bfloat16 autocast on float32 and bfloat16 inputs (eager-only functions aside)."""
    for case in FUNCTION_CASES:
        for low, dtype in AUTOCAST_INPUTS:
            compiled = case.compiled and low == "bfloat16" and dtype != "float64"
            for mode in ("eager", "compiled") if compiled else ("eager",):
                yield pytest.param(case, low, dtype, mode, id=f"{case.id}-{low}-{dtype}-{mode}")


@pytest.mark.torch
def test_function_cases_cover_every_jm_torch_function():
    """Every ``jm.*`` torch function that computes arrays has a case; the rest return
    Python objects (facts, dtypes, generator states) that autocast has no part in."""
    no_arrays = {
        "can_cast", "finfo", "iinfo", "is_complex", "is_floating_point", "is_nonzero",
        "is_tensor", "numel", "promote_types", "result_type", "get_rng_state", "set_rng_state",
    }  # fmt: skip
    names = set(_torch_functions.__all__) | set(_torch_functions.BUILTIN_NAMED)
    assert {c.name for c in FUNCTION_CASES} == names - no_arrays
    assert all(hasattr(torch, name) for name in names)
    assert len({c.id for c in FUNCTION_CASES}) == len(FUNCTION_CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("case", "low", "dtype", "mode"), list(_function_params()))
def test_jm_functions_follow_torch_cpu_autocast(case, low, dtype, mode):
    """``jm.<f>`` under ``jm.autocast("cpu", dtype=low)`` gives ``torch.<f>``'s dtypes
    under ``torch.autocast`` (and values to the half type's rounding), eager and compiled.

    Torch decides each dtype, live: its CPU lists (fp32: prod, trace, quantile, cdist,
    polar, view_as_complex; promote: cat, stack, index_copy) and the listed ops its
    composites run (mm in tensordot and inner, bmm in einsum, matmul's family)."""
    t_low = getattr(torch, low)

    def torch_call():
        return case.call(torch, Arrays(True, dtype, torch.nn))

    refused = FUNCTION_TORCH_REFUSES.get((case.id, dtype))
    if refused is not None:
        with (
            torch.autocast("cpu", dtype=t_low),
            pytest.raises(RuntimeError, match=re.escape(refused)),
        ):
            torch_call()
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=t_low):
            want = torch_call()
        torch_outside = _outcome(torch_call)
    region = jm.autocast("cpu", dtype=getattr(jnp, low))
    with jax.enable_x64(dtype == "float64" or case.x64), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "eager":
            run = lambda: case.call(jm, Arrays(False, dtype, jm.nn))
            before = _outcome(run)  # first outside: no eager cache may serve the region
        else:  # the case's arrays become the compiled function's (traced) arguments
            seen = []
            with region:
                _outcome(lambda: case.call(jm, _Recording(dtype, seen)))
            compiled = jm.compile(lambda *xs: case.call(jm, _Replay(dtype, xs)))
            run = lambda: compiled(*seen)
        with region:
            got = _outcome(run)
            out = None if isinstance(got, type) else run()
        # Nothing of the region leaks out of it (compiled programs: the region is part of
        # their key, test_compiled_function_traced_outside_autocast_retraces_inside).
        if mode == "eager":
            assert _outcome(run) == before
    if (case.id, dtype) in FUNCTION_DIFFERS_ANYWAY:  # autocast changes neither side
        assert mode == "eager" and _fn_dtypes(want) == torch_outside and got == before
        return
    assert got == _fn_dtypes(want)
    if not case.values:
        return
    values = _leaves(out)
    half = any(d in ("bfloat16", "float16") for d in [dtype, *got])
    tol = 2e-2 if half else 1e-5
    for g, w in zip(values, _leaves(want), strict=True):
        if isinstance(w, torch.Tensor):
            assert tuple(g.shape) == tuple(w.shape)
            np.testing.assert_allclose(_numpy(g), _numpy(w), rtol=tol, atol=tol, equal_nan=True)
        else:
            assert g == w


@pytest.mark.torch
@pytest.mark.parametrize("order", ["half_first", "float32_first"])
@pytest.mark.parametrize("name", ["cat", "stack", "hstack", "vstack", "index_copy"])
def test_promote_list_refuses_mixed_half_types_as_torch(name, order):
    """CPU's promote list (cat, stack, index_copy; hstack and vstack run cat) widens from
    the autocast dtype operand by operand: float16 met before any float32 under bfloat16
    autocast is torch's RuntimeError; after a float32 one, everything is float32."""

    def call(m, xs):
        if name == "index_copy":  # self and source: the first two
            return m.index_copy(xs[0], 0, xs[-1], xs[1])
        return getattr(m, name)(xs[:-1])

    dtypes = ["bfloat16", "float16", "float32"]
    if order == "float32_first":
        dtypes = ["float32", "float16", "bfloat16"]
    t = [torch.ones(2, 3, dtype=getattr(torch, d)) for d in dtypes] + [torch.tensor([1, 0])]
    j = [jnp.ones((2, 3), d) for d in dtypes] + [jnp.array([1, 0])]
    with torch.autocast("cpu"):
        want = _outcome(lambda: call(torch, t))
        message = None
        if want is RuntimeError:
            with pytest.raises(RuntimeError) as info:
                call(torch, t)
            message = str(info.value)
    with jm.autocast("cpu"):
        got = _outcome(lambda: call(jm, j))
        if message is not None:
            with pytest.raises(RuntimeError, match=re.escape(message)):
                call(jm, j)
    assert got == want
    assert (want is RuntimeError) == (order == "half_first")


def test_composite_functions_follow_cuda_lists(monkeypatch):
    """On CUDA the composites' own policies apply, not those of the ops they run (read
    from torch's header): einsum is lowered whole, tensordot and inner promote, prod runs
    in float32 unless a dtype is asked for (fp32_set_opt_dtype), cdist in float32."""
    monkeypatch.setattr(_autocast, "_platform", lambda: "cuda")
    monkeypatch.setattr(_autocast, "_cuda_available", lambda: True)
    x16, x32 = jnp.ones((2, 3), jnp.float16), jnp.ones((2, 3), jnp.float32)
    with jm.autocast("cuda"):
        assert jm.einsum("ij,ij->ij", x32, x32).dtype == jnp.float16  # CPU: a mul, float32
        assert jm.tensordot(x32, x32.T, dims=1).dtype == jnp.float32  # CPU: mm, float16
        assert jm.tensordot(x16, x32.T, dims=1).dtype == jnp.float32
        assert jm.inner(x16, x16).dtype == jnp.float16
        assert jm.prod(x16).dtype == jnp.float32
        assert jm.prod(x16, dtype=jnp.float16).dtype == jnp.float16
        assert jm.cdist(x16, x16).dtype == jnp.float32
        assert jm.trace(x16[:, :2]).dtype == jnp.float16  # CPU's fp32 list only
    table = _autocast.CUDA
    assert (table["einsum"], table["tensordot"], table["prod"], table["cdist"]) == (
        "lower",
        "promote",
        "fp32_set_opt_dtype",
        "fp32",
    )
    assert "trace" not in table
