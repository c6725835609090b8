"""``jm.nn.utils`` against ``torch.nn.utils`` live: gradient clipping, parameter vectors,
BatchNorm fusion, ``skip_init`` and ``stateless.functional_call``.

Each case builds the same parameters and gradients in both frameworks and
compares returned norms, the clipped ``.grad`` and raised errors; the
training comparison runs 10 SGD steps with ``clip_grad_norm_`` in float64,
eagerly and in a ``jm.compile``d step.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_ref import normalize

import jmodule as jm

pytestmark = pytest.mark.torch

RNG = np.random.default_rng(0)
SHAPES = [(3, 4), (5,), (2, 3, 2)]


def _pairs(scale: float = 1.0, none_at: int | None = None, dtype: str = "float32"):
    """The same parameters with the same gradients, in torch and in jmodule."""
    rng = np.random.default_rng(7)
    tps, jps = [], []
    for i, shape in enumerate(SHAPES):
        value = rng.standard_normal(shape).astype(dtype)
        grad = (scale * rng.standard_normal(shape)).astype(dtype)
        tp = torch.nn.Parameter(torch.from_numpy(value.copy()))
        jp = jm.nn.Parameter(jnp.asarray(value))
        if i != none_at:
            tp.grad = torch.from_numpy(grad.copy())
            jp.grad = jnp.asarray(grad)
        tps.append(tp)
        jps.append(jp)
    return tps, jps


def _assert_grads(tps, jps, rtol=1e-6, atol=1e-7):
    for tp, jp in zip(tps, jps):
        if tp.grad is None:
            assert jp.grad is None
        else:
            np.testing.assert_allclose(np.asarray(jp.grad), tp.grad.numpy(), rtol=rtol, atol=atol)


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value).__name__, normalize(str(info.value))


NORMS = [2.0, 1.0, math.inf, -math.inf, 3.0, 0.5, 0.0]


@pytest.mark.parametrize("norm_type", NORMS)
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    tps, jps = _pairs(none_at=1)
    t_norm = torch.nn.utils.clip_grad_norm_(tps, max_norm, norm_type=norm_type)
    j_norm = jm.nn.utils.clip_grad_norm_(iter(jps), max_norm, norm_type=norm_type)
    assert isinstance(j_norm, jax.Array) and j_norm.shape == () and j_norm.dtype == jnp.float32
    np.testing.assert_allclose(float(j_norm), float(t_norm), rtol=1e-6)
    _assert_grads(tps, jps)


def test_clip_grad_norm_of_one_parameter_and_of_none():
    tps, jps = _pairs()
    t = torch.nn.utils.clip_grad_norm_(tps[0], 0.1)
    j = jm.nn.utils.clip_grad_norm_(jps[0], 0.1)
    np.testing.assert_allclose(float(j), float(t), rtol=1e-6)
    _assert_grads(tps, jps)
    empty_t = torch.nn.utils.clip_grad_norm_([], 1.0)
    empty_j = jm.nn.utils.clip_grad_norm_([], 1.0)
    assert float(empty_j) == float(empty_t) and str(empty_j.dtype) == "float32"
    no_grad_t, no_grad_j = _pairs(none_at=0)
    assert float(jm.nn.utils.clip_grad_norm_(no_grad_j[:1], 1.0)) == float(
        torch.nn.utils.clip_grad_norm_(no_grad_t[:1], 1.0)
    )


@pytest.mark.parametrize("foreach", [None, True, False])
def test_foreach_is_accepted_with_the_same_result(foreach):
    tps, jps = _pairs()
    t = torch.nn.utils.clip_grad_norm_(tps, 0.3, foreach=foreach)
    j = jm.nn.utils.clip_grad_norm_(jps, 0.3, foreach=foreach)
    np.testing.assert_allclose(float(j), float(t), rtol=1e-6)
    _assert_grads(tps, jps)
    torch.nn.utils.clip_grad_value_(tps, 0.01, foreach=foreach)
    jm.nn.utils.clip_grad_value_(jps, 0.01, foreach=foreach)
    _assert_grads(tps, jps)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_error_if_nonfinite_as_torch(bad, norm_type):
    tps, jps = _pairs()
    tps[0].grad[0, 0] = bad
    jps[0].grad = jps[0].grad.at[0, 0].set(bad)
    t_err = _error(
        lambda: torch.nn.utils.clip_grad_norm_(tps, 1.0, norm_type, error_if_nonfinite=True)
    )
    j_err = _error(
        lambda: jm.nn.utils.clip_grad_norm_(jps, 1.0, norm_type, error_if_nonfinite=True)
    )
    assert j_err == t_err
    _assert_grads(tps, jps)  # nothing was scaled
    # Without the check both scale by the non-finite norm.
    t = torch.nn.utils.clip_grad_norm_(tps, 1.0, norm_type)
    j = jm.nn.utils.clip_grad_norm_(jps, 1.0, norm_type)
    np.testing.assert_equal(float(j), float(t))
    for tp, jp in zip(tps, jps):
        np.testing.assert_allclose(np.asarray(jp.grad), tp.grad.numpy(), rtol=1e-6)
    t_err = _error(lambda: torch.nn.utils.get_total_norm([tps[0].grad], error_if_nonfinite=True))
    j_err = _error(lambda: jm.nn.utils.get_total_norm([jps[0].grad], error_if_nonfinite=True))
    assert j_err == t_err


def test_get_total_norm_then_clip_grads_with_norm_equals_clip_grad_norm_():
    tps, jps = _pairs(scale=3.0)
    for norm_type in (2.0, 1.0, math.inf, 4.0):
        t_total = torch.nn.utils.get_total_norm([p.grad for p in tps], norm_type)
        j_total = jm.nn.utils.get_total_norm([p.grad for p in jps], norm_type)
        np.testing.assert_allclose(float(j_total), float(t_total), rtol=1e-6)
    t_one = torch.nn.utils.get_total_norm(tps[0].grad)
    j_one = jm.nn.utils.get_total_norm(jps[0].grad)
    np.testing.assert_allclose(float(j_one), float(t_one), rtol=1e-6)
    assert float(jm.nn.utils.get_total_norm([])) == float(torch.nn.utils.get_total_norm([]))
    assert torch.nn.utils.clip_grads_with_norm_(tps, 2.0, t_total) is None
    assert jm.nn.utils.clip_grads_with_norm_(jps, 2.0, j_total) is None
    _assert_grads(tps, jps)
    assert jm.nn.utils.clip_grads_with_norm_([jm.nn.Parameter(jnp.ones(2))], 1.0, 3.0) is None


@pytest.mark.parametrize("clip_value", [0.1, 1, 10.0])
def test_clip_grad_value_matches_torch(clip_value):
    tps, jps = _pairs(scale=2.0, none_at=2)
    assert torch.nn.utils.clip_grad_value_(tps, clip_value) is None
    assert jm.nn.utils.clip_grad_value_(jps, clip_value) is None
    _assert_grads(tps, jps)
    torch.nn.utils.clip_grad_value_(tps[0], clip_value / 2)
    jm.nn.utils.clip_grad_value_(jps[0], clip_value / 2)
    _assert_grads(tps, jps)


def test_clipping_keeps_the_gradient_dtype():
    p = jm.nn.Parameter(jnp.ones(3, jnp.bfloat16))
    p.grad = jnp.full(3, 4.0, jnp.bfloat16)
    q = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    q.grad = torch.full((3,), 4.0, dtype=torch.bfloat16)
    jn = jm.nn.utils.clip_grad_norm_([p], 1.0)
    tn = torch.nn.utils.clip_grad_norm_([q], 1.0)
    assert str(jn.dtype) == str(tn.dtype).removeprefix("torch.")
    assert p.grad.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(p.grad, np.float32), q.grad.float().numpy(), rtol=1e-2)


def _models():
    torch.manual_seed(0)
    t = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    j = jm.nn.Sequential(jm.nn.Linear(3, 4), jm.nn.Tanh(), jm.nn.Linear(4, 2))
    j.load_state_dict(t.state_dict())
    return t, j


def test_clipping_inside_a_compiled_step_matches_torch():
    t, j = _models()
    x = RNG.standard_normal((6, 3)).astype(np.float32)
    tx = torch.from_numpy(x)
    jx = jnp.asarray(x)

    @jm.compile
    def grads(model, x, max_norm, clip_value):
        for p in model.parameters():
            p.grad = None
        jm.backward(lambda: (model(x) ** 2).sum())
        norm = jm.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=3.0)
        jm.nn.utils.clip_grad_value_(model.parameters(), clip_value)
        return norm

    norm = grads(j, jx, 0.5, 0.05)
    (t(tx) ** 2).sum().backward()
    t_norm = torch.nn.utils.clip_grad_norm_(t.parameters(), 0.5, norm_type=3.0)
    torch.nn.utils.clip_grad_value_(t.parameters(), 0.05)
    np.testing.assert_allclose(float(norm), float(t_norm), rtol=1e-5)
    _assert_grads(list(t.parameters()), list(j.parameters()), rtol=1e-5, atol=1e-7)


def test_error_if_nonfinite_in_a_compiled_step_says_it_cannot():
    _, j = _models()

    @jm.compile
    def step(model, x):
        jm.backward(lambda: model(x).sum())
        return jm.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)

    with pytest.raises(
        RuntimeError, match="error_if_nonfinite=True cannot raise inside a compiled"
    ):
        step(j, jnp.ones((2, 3)))
    with pytest.raises(
        RuntimeError, match="error_if_nonfinite=True cannot raise inside a compiled"
    ):
        jax.jit(lambda g: jm.nn.utils.get_total_norm([g], error_if_nonfinite=True))(jnp.ones(2))


@pytest.mark.parametrize("compiled", [False, True])
def test_ten_sgd_steps_with_clip_grad_norm_match_torch_float64(compiled):
    with jax.enable_x64(True):
        torch.manual_seed(1)
        t = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
        ).double()
        j = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.Tanh(), jm.nn.Linear(8, 3)).double()
        j.load_state_dict(t.state_dict())
        # lr and momentum exact in float32: jm.optim holds its hyper-parameters as
        # float32 even for float64 parameters (0.1 would differ from torch by 1.5e-8).
        t_opt = torch.optim.SGD(t.parameters(), lr=0.125, momentum=0.875)
        j_opt = jm.optim.SGD(j.parameters(), lr=0.125, momentum=0.875)
        rng = np.random.default_rng(3)
        data = [
            (rng.standard_normal((16, 4)) * 3, rng.standard_normal((16, 3)) * 3) for _ in range(10)
        ]

        def step(model, opt, x, y):
            opt.zero_grad()
            loss = jm.backward(lambda: ((model(x) - y) ** 2).mean())
            norm = jm.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            opt.step()
            return loss, norm

        run = jm.compile(step) if compiled else step
        clipped = 0
        for x, y in data:
            t_opt.zero_grad()
            t_loss = ((t(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
            t_loss.backward()
            t_norm = torch.nn.utils.clip_grad_norm_(t.parameters(), max_norm=0.5)
            t_opt.step()
            j_loss, j_norm = run(j, j_opt, jnp.asarray(x), jnp.asarray(y))
            assert j_norm.dtype == jnp.float64
            np.testing.assert_allclose(float(j_loss), t_loss.item(), rtol=1e-10)
            np.testing.assert_allclose(float(j_norm), t_norm.item(), rtol=1e-10)
            clipped += t_norm.item() > 0.5
        assert clipped >= 5  # the clipping did act
        for (name, tv), jv in zip(t.state_dict().items(), j.state_dict().values()):
            np.testing.assert_allclose(
                np.asarray(jv), tv.numpy(), rtol=1e-10, atol=1e-12, err_msg=name
            )


# ------------------------------------------------------------------ parameter vectors


def test_parameters_to_vector_and_back_match_torch():
    t, j = _models()
    tv = torch.nn.utils.parameters_to_vector(t.parameters())
    jv = jm.nn.utils.parameters_to_vector(j.parameters())
    np.testing.assert_array_equal(np.asarray(jv), tv.detach().numpy())
    new = np.arange(tv.numel(), dtype=np.float32) / 10
    torch.nn.utils.vector_to_parameters(torch.from_numpy(new), t.parameters())
    assert jm.nn.utils.vector_to_parameters(jnp.asarray(new), j.parameters()) is None
    for (name, a), b in zip(t.state_dict().items(), j.state_dict().values()):
        np.testing.assert_array_equal(np.asarray(b), a.numpy(), err_msg=name)
    # A longer vector is fine in both; its tail is unused.
    longer = np.arange(tv.numel() + 3, dtype=np.float32)
    torch.nn.utils.vector_to_parameters(torch.from_numpy(longer), t.parameters())
    jm.nn.utils.vector_to_parameters(jnp.asarray(longer), j.parameters())
    np.testing.assert_array_equal(
        np.asarray(jm.nn.utils.parameters_to_vector(j.parameters())),
        torch.nn.utils.parameters_to_vector(t.parameters()).detach().numpy(),
    )


def test_vector_to_parameters_errors_as_torch():
    t, j = _models()
    assert _error(lambda: jm.nn.utils.vector_to_parameters([1.0], j.parameters())) == _error(
        lambda: torch.nn.utils.vector_to_parameters([1.0], t.parameters())
    )
    assert _error(lambda: jm.nn.utils.vector_to_parameters(jnp.ones(5), j.parameters())) == _error(
        lambda: torch.nn.utils.vector_to_parameters(torch.ones(5), t.parameters())
    )


@pytest.mark.slow
def test_parameter_vectors_are_differentiable_and_work_compiled():
    t, j = _models()
    (torch.nn.utils.parameters_to_vector(t.parameters()) ** 3).sum().backward()
    jm.backward(lambda: (jm.nn.utils.parameters_to_vector(j.parameters()) ** 3).sum())
    _assert_grads(list(t.parameters()), list(j.parameters()))

    @jm.compile
    def scatter(model, vec):
        jm.nn.utils.vector_to_parameters(vec * 2, model.parameters())
        return jm.nn.utils.parameters_to_vector(model.parameters())

    n = sum(p.numel() for p in t.parameters())
    vec = np.linspace(-1, 1, n).astype(np.float32)
    out = scatter(j, jnp.asarray(vec))
    torch.nn.utils.vector_to_parameters(torch.from_numpy(vec * 2), t.parameters())
    expected = torch.nn.utils.parameters_to_vector(t.parameters()).detach().numpy()
    np.testing.assert_array_equal(np.asarray(out), expected)
    np.testing.assert_array_equal(
        np.asarray(jm.nn.utils.parameters_to_vector(j.parameters())), expected
    )


# ------------------------------------------------------------------ fusion


def _randomize_bn(tbn):
    with torch.no_grad():
        n = tbn.num_features
        tbn.running_mean.copy_(torch.randn(n))
        tbn.running_var.copy_(torch.rand(n) + 0.5)
        if tbn.weight is not None:
            tbn.weight.copy_(torch.randn(n))
            tbn.bias.copy_(torch.randn(n))


CONVS = [
    ("Conv1d", "BatchNorm1d", (2, 3, 9), {}),
    ("Conv2d", "BatchNorm2d", (2, 3, 7, 6), {"bias": False}),
    ("Conv2d", "BatchNorm2d", (2, 3, 7, 6), {"groups": 3, "stride": 2}),
    ("Conv3d", "BatchNorm3d", (1, 3, 5, 5, 4), {}),
    ("ConvTranspose2d", "BatchNorm2d", (2, 3, 5, 5), {"stride": 2}),
]


@pytest.mark.slow
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize(("conv", "bn", "shape", "kw"), CONVS)
def test_fuse_conv_bn_eval_matches_torch(conv, bn, shape, kw, affine):
    torch.manual_seed(2)
    transpose = conv.startswith("ConvTranspose")
    tc = getattr(torch.nn, conv)(3, 6, 3, **kw).eval()
    tb = getattr(torch.nn, bn)(6, affine=affine).eval()
    _randomize_bn(tb)
    jc = getattr(jm.nn, conv)(3, 6, 3, **kw).eval()
    jb = getattr(jm.nn, bn)(6, affine=affine).eval()
    jc.load_state_dict(tc.state_dict())
    jb.load_state_dict(tb.state_dict())
    t_fused = torch.nn.utils.fuse_conv_bn_eval(tc, tb, transpose=transpose)
    j_fused = jm.nn.utils.fuse_conv_bn_eval(jc, jb, transpose=transpose)
    assert type(j_fused) is type(jc) and j_fused is not jc
    for name, tv in t_fused.named_parameters():
        jv = dict(j_fused.named_parameters())[name]
        assert isinstance(jv, jm.nn.Parameter) and jv.requires_grad == tv.requires_grad, name
        np.testing.assert_allclose(np.asarray(jv), tv.detach().numpy(), rtol=1e-6, atol=1e-6)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        t_out = t_fused(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(j_fused(jnp.asarray(x))), t_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jb(jc(jnp.asarray(x)))), t_out, rtol=1e-4, atol=1e-4)
    # The originals are unchanged.
    np.testing.assert_array_equal(np.asarray(jc.weight), tc.weight.detach().numpy())


@pytest.mark.parametrize(("bias", "features"), [(True, 5), (False, 5), (True, 1)])
def test_fuse_linear_bn_eval_matches_torch(bias, features):
    torch.manual_seed(3)
    tl = torch.nn.Linear(4, 5, bias=bias).eval()
    tb = torch.nn.BatchNorm1d(features).eval()
    _randomize_bn(tb)
    jl = jm.nn.Linear(4, 5, bias=bias).eval()
    jb = jm.nn.BatchNorm1d(features).eval()
    jl.load_state_dict(tl.state_dict())
    jb.load_state_dict(tb.state_dict())
    t_fused = torch.nn.utils.fuse_linear_bn_eval(tl, tb)
    j_fused = jm.nn.utils.fuse_linear_bn_eval(jl, jb)
    for name, tv in t_fused.named_parameters():
        jv = dict(j_fused.named_parameters())[name]
        assert jv.requires_grad == tv.requires_grad, name
        np.testing.assert_allclose(np.asarray(jv), tv.detach().numpy(), rtol=1e-6, atol=1e-6)
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    with torch.no_grad():
        t_out = t_fused(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(j_fused(jnp.asarray(x))), t_out, rtol=1e-5, atol=1e-5)


def test_fusion_errors_as_torch():
    tc, tb = torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)
    jc, jb = jm.nn.Conv2d(3, 4, 1), jm.nn.BatchNorm2d(4)
    assert _error(lambda: jm.nn.utils.fuse_conv_bn_eval(jc, jb)) == _error(
        lambda: torch.nn.utils.fuse_conv_bn_eval(tc, tb)
    )
    tl, tb1 = torch.nn.Linear(3, 4).eval(), torch.nn.BatchNorm1d(3).eval()
    jl, jb1 = jm.nn.Linear(3, 4).eval(), jm.nn.BatchNorm1d(3).eval()
    assert _error(lambda: jm.nn.utils.fuse_linear_bn_eval(jl, jb1)) == _error(
        lambda: torch.nn.utils.fuse_linear_bn_eval(tl, tb1)
    )
    assert _error(lambda: jm.nn.utils.fuse_linear_bn_eval(jl, jb1.train())) == _error(
        lambda: torch.nn.utils.fuse_linear_bn_eval(tl, tb1.train())
    )


def test_fuse_weights_functions_match_torch():
    rng = np.random.default_rng(6)
    w, rm = rng.standard_normal((4, 2, 3)).astype(np.float32), rng.standard_normal(4)
    rv = rng.random(4) + 0.5
    t = [torch.from_numpy(np.asarray(a, np.float32)) for a in (w, rm, rv)]
    j = [jnp.asarray(a, jnp.float32) for a in (w, rm, rv)]
    tw, tb = torch.nn.utils.fuse_conv_bn_weights(t[0], None, t[1], t[2], 1e-3, None, None)
    jw, jb = jm.nn.utils.fuse_conv_bn_weights(j[0], None, j[1], j[2], 1e-3, None, None)
    for a, b in ((jw, tw), (jb, tb)):
        assert isinstance(a, jm.nn.Parameter) and a.requires_grad == b.requires_grad
        np.testing.assert_allclose(np.asarray(a), b.detach().numpy(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ skip_init, stateless


def test_skip_init_builds_without_initialising():
    t = torch.nn.utils.skip_init(torch.nn.Linear, 5, out_features=2, bias=False)
    j = jm.nn.utils.skip_init(jm.nn.Linear, 5, out_features=2, bias=False)
    assert [(k, tuple(v.shape)) for k, v in t.state_dict().items()] == [
        (k, tuple(v.shape)) for k, v in j.state_dict().items()
    ]
    np.testing.assert_array_equal(np.asarray(j.weight), np.zeros((2, 5), np.float32))
    j.reset_parameters()
    assert float(abs(j.weight).sum()) > 0
    cpu = jm.nn.utils.skip_init(jm.nn.Conv2d, 2, 3, 3, device="cpu")
    assert cpu.weight.shape == (3, 2, 3, 3) and cpu.weight.device.platform == "cpu"


def test_skip_init_errors_as_torch():
    class TNoDevice(torch.nn.Module):
        def __init__(self, n):
            super().__init__()

    class JNoDevice(jm.nn.Module):
        def __init__(self, n):
            super().__init__()

    t_err = _error(lambda: torch.nn.utils.skip_init(TNoDevice, 3))
    assert _error(lambda: jm.nn.utils.skip_init(JNoDevice, 3)) == t_err
    t_type, t_msg = _error(lambda: torch.nn.utils.skip_init(int, 3))
    j_type, j_msg = _error(lambda: jm.nn.utils.skip_init(int, 3))
    assert (j_type, j_msg) == (t_type, t_msg)


def test_stateless_functional_call_warns_and_matches_torch():
    t, j = _models()
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    new = {k: v * 2 for k, v in t.state_dict().items()}
    with pytest.warns(FutureWarning, match="deprecated"):
        t_out = torch.nn.utils.stateless.functional_call(t, new, (torch.from_numpy(x),))
    with pytest.warns(FutureWarning, match="jm.func.functional_call"):
        j_out = jm.nn.utils.stateless.functional_call(
            j, {k: jnp.asarray(v.numpy()) for k, v in new.items()}, jnp.asarray(x)
        )
    np.testing.assert_allclose(np.asarray(j_out), t_out.detach().numpy(), rtol=1e-6, atol=1e-6)
    with pytest.warns(FutureWarning):
        j_none = jm.nn.utils.stateless.functional_call(jm.nn.Identity(), {}, None, {"input": 1.0})
    with pytest.warns(FutureWarning):
        t_none = torch.nn.utils.stateless.functional_call(
            torch.nn.Identity(), {}, None, {"input": 1.0}
        )
    assert j_none == t_none
    with pytest.warns(FutureWarning), pytest.raises(ValueError):
        jm.nn.utils.stateless.functional_call(j, {}, jnp.asarray(x), strict=True)


def test_fusion_without_running_stats_errors_as_torch():
    tc, tb = torch.nn.Conv2d(3, 4, 1).eval(), torch.nn.BatchNorm2d(4, track_running_stats=False)
    jc, jb = jm.nn.Conv2d(3, 4, 1).eval(), jm.nn.BatchNorm2d(4, track_running_stats=False)
    tb.eval()
    jb.eval()
    assert _error(lambda: jm.nn.utils.fuse_conv_bn_eval(jc, jb)) == _error(
        lambda: torch.nn.utils.fuse_conv_bn_eval(tc, tb)
    )


def test_compiled_clipping_skips_frozen_parameters_as_torch():
    t, j = _models()
    t[0].weight.requires_grad_(False)
    j[0].weight.requires_grad_(False)
    x = RNG.standard_normal((4, 3)).astype(np.float32)

    @jm.compile
    def step(model, x):
        for p in model.parameters():
            p.grad = None
        jm.backward(lambda: (model(x) ** 2).sum())
        return jm.nn.utils.clip_grad_norm_(model.parameters(), 0.01, norm_type=math.inf)

    j_norm = step(j, jnp.asarray(x))
    (t(torch.from_numpy(x)) ** 2).sum().backward()
    t_norm = torch.nn.utils.clip_grad_norm_(t.parameters(), 0.01, norm_type=math.inf)
    np.testing.assert_allclose(float(j_norm), float(t_norm), rtol=1e-5)
    assert j[0].weight.grad is None and t[0].weight.grad is None
    _assert_grads(list(t.parameters()), list(j.parameters()), rtol=1e-5, atol=1e-8)
