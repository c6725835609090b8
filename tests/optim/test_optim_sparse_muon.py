"""SparseAdam and Muon against torch.optim, live: 10 steps, eager and compiled.

SparseAdam runs next to torch's ``Embedding(sparse=True)``: torch's gradient
holds only the rows looked up, jmodule's is dense with the other rows zero.
Muon orthogonalises in bfloat16 as torch does; jmodule rounds where torch's
kernels round, so float64 training follows torch's to 1e-10.
"""

from __future__ import annotations

import copy
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jmodule as jm
from jmodule import optim

pytestmark = pytest.mark.torch

# ---------------------------------------------------------------------------- harness


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _close(a, b, tol):
    np.testing.assert_allclose(_np(a), _np(b), rtol=tol, atol=tol)


def _assert_state(jopt, topt, tol):
    jsd, tsd = jopt.state_dict(), topt.state_dict()
    assert jsd["param_groups"] == tsd["param_groups"]
    assert list(jsd["state"]) == list(tsd["state"])
    for i, tstate in tsd["state"].items():
        assert list(jsd["state"][i]) == list(tstate)
        for k, tv in tstate.items():
            jv = jsd["state"][i][k]
            if isinstance(tv, int):
                assert type(jv) is int and jv == tv, k
            else:
                assert str(jv.dtype) == str(tv.dtype).removeprefix("torch."), k
                _close(jv, tv, tol)


def _step(model, opt, loss_fn, *args):
    opt.zero_grad()
    loss = jm.backward(lambda: loss_fn(model, *args))
    opt.step()
    return loss


@jm.compile
def _compiled_embedding_step(model, opt, idx, w):
    return _step(model, opt, _embedding_loss, idx, w)


@jm.compile
def _compiled_mlp_step(model, opt, x, y):
    return _step(model, opt, _mlp_loss, x, y)


def _torch_step(model, opt, loss_fn, *args):
    opt.zero_grad()
    loss = loss_fn(model, *args)
    loss.backward()
    opt.step()
    return loss


# ---------------------------------------------------------------------------- SparseAdam


def _embedding_loss(model, idx, w):
    return (model(idx) * w).sum() + (model(idx) ** 2).mean()


SPARSE_CASES = [
    {},
    {"lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-4},
    {"lr": 0.05, "maximize": True},
]


def _embeddings(dtype):
    torch.manual_seed(0)
    tm = torch.nn.Embedding(12, 3, sparse=True).to(dtype)
    jms = []
    for _ in range(2):
        m = jm.nn.Embedding(12, 3, sparse=True).to(
            jm.float64 if dtype == torch.float64 else jm.float32
        )
        m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        jms.append(m)
    return tm, jms


def _lookups(dtype, steps=10):
    rng = np.random.default_rng(4)
    out = []
    for k in range(steps):
        high = 6 if k < 5 else 12  # rows 6.. untouched for five steps, then looked up
        idx = rng.integers(0, high, size=(2, 3))
        out.append((idx, rng.standard_normal((2, 3, 3)).astype(dtype)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", SPARSE_CASES, ids=lambda kw: str(kw) or "defaults")
@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
def test_sparse_adam_follows_torch_sparse_embedding(kwargs, x64):
    tdtype, ndtype, tol = (
        (torch.float64, np.float64, 1e-10) if x64 else (torch.float32, np.float32, 2e-6)
    )
    with jax.enable_x64(x64):
        tm, (eager, compiled) = _embeddings(tdtype)
        topt = torch.optim.SparseAdam(tm.parameters(), **kwargs)
        jopts = [optim.SparseAdam(m.parameters(), **kwargs) for m in (eager, compiled)]
        for k, (idx, w) in enumerate(_lookups(ndtype)):
            tl = _torch_step(tm, topt, _embedding_loss, torch.tensor(idx), torch.tensor(w))
            assert tm.weight.grad.is_sparse
            el = _step(eager, jopts[0], _embedding_loss, jnp.asarray(idx), jnp.asarray(w))
            cl = _compiled_embedding_step(compiled, jopts[1], jnp.asarray(idx), jnp.asarray(w))
            for loss, m in ((el, eager), (cl, compiled)):
                _close(loss, tl, tol)
                _close(m.weight.data, tm.weight, tol)
            if k == 4:  # rows 6.. never looked up: their moments are still zero in both
                for name in ("exp_avg", "exp_avg_sq"):
                    assert not np.any(_np(topt.state[tm.weight][name])[6:])
                    for m, o in zip((eager, compiled), jopts):
                        assert not np.any(np.asarray(o.state[m.weight][name])[6:])
                        _close(o.state[m.weight][name], topt.state[tm.weight][name], tol)
        for o in jopts:
            _assert_state(o, topt, tol)
            assert o.state_dict()["state"][0]["step"] == 10


def test_sparse_adam_state_dict_interchanges_with_torch():
    tm, (jmod, jmod2) = _embeddings(torch.float32)
    topt = torch.optim.SparseAdam(tm.parameters(), lr=0.05)
    jopt = optim.SparseAdam(jmod.parameters(), lr=0.05)
    lookups = _lookups(np.float32, 8)
    for idx, w in lookups[:4]:
        _torch_step(tm, topt, _embedding_loss, torch.tensor(idx), torch.tensor(w))
        _step(jmod, jopt, _embedding_loss, jnp.asarray(idx), jnp.asarray(w))
    jmod2.load_state_dict({"weight": tm.weight.detach().numpy()})
    jopt2 = optim.SparseAdam(jmod2.parameters(), lr=0.05)
    jopt2.load_state_dict(topt.state_dict())  # torch's int step loads
    for idx, w in lookups[4:]:
        _torch_step(tm, topt, _embedding_loss, torch.tensor(idx), torch.tensor(w))
        _step(jmod2, jopt2, _embedding_loss, jnp.asarray(idx), jnp.asarray(w))
    _close(jmod2.weight.data, tm.weight, 2e-6)
    _assert_state(jopt2, topt, 2e-6)


@pytest.mark.parametrize(
    "kwargs", [{"lr": 0.0}, {"eps": 0.0}, {"betas": (1.0, 0.9)}, {"betas": (0.9, 1.0)}]
)
def test_sparse_adam_constructor_errors_match_torch(kwargs):
    with pytest.raises(Exception) as expected:
        torch.optim.SparseAdam([torch.nn.Parameter(torch.ones(2))], **kwargs)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        optim.SparseAdam([jm.nn.Parameter(jnp.ones(2))], **kwargs)


# ---------------------------------------------------------------------------- Muon

MUON_CASES = [
    {},
    {"lr": 0.02, "nesterov": False, "adjust_lr_fn": "match_rms_adamw"},
    {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.0, "adjust_lr_fn": "original"},
    {"lr": 0.01, "ns_steps": 3, "ns_coefficients": (3.0, -3.2, 1.2), "eps": 1e-3},
]


@pytest.mark.parametrize("kwargs", MUON_CASES, ids=lambda kw: str(kw) or "defaults")
def test_muon_ten_steps_match_torch(kwargs):
    rng = np.random.default_rng(1)
    shapes = [(6, 4), (3, 5), (4, 4)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    jp = [jm.nn.Parameter(jnp.asarray(a)) for a in init]
    groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.03}]
    topt, jopt = torch.optim.Muon(groups(tp), **kwargs), optim.Muon(groups(jp), **kwargs)
    for k in range(10):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for i, (t, j, g) in enumerate(zip(tp, jp, grads)):
            skip = i == 1 and k % 3 == 1  # skipped now and then, as torch skips None
            t.grad = None if skip else torch.tensor(g)
            j.grad = None if skip else jnp.asarray(g)
        topt.step()
        assert jopt.step() is None
        for t, j in zip(tp, jp):
            _close(j.data, t, 1e-6)
    _assert_state(jopt, topt, 1e-6)


def _mlp(nn):
    return nn.Sequential(nn.Linear(4, 8, bias=False), nn.Tanh(), nn.Linear(8, 3, bias=False))


def _mlp_loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


@pytest.mark.slow
def test_muon_float64_training_matches_torch_eager_and_compiled():
    """With CyclicLR cycling lr and momentum (and so ``1 - momentum``) every step."""
    with jax.enable_x64(True):
        torch.manual_seed(2)
        tm = _mlp(torch.nn).double()
        eager = _mlp(jm.nn).to(jm.float64)
        eager.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
        compiled = copy.deepcopy(eager)
        kwargs = {"lr": 0.05, "weight_decay": 0.05}
        topt = torch.optim.Muon(tm.parameters(), **kwargs)
        jopts = [optim.Muon(m.parameters(), **kwargs) for m in (eager, compiled)]
        cyclic = {"base_lr": 0.01, "max_lr": 0.05, "step_size_up": 3, "base_momentum": 0.8}
        scheds = [torch.optim.lr_scheduler.CyclicLR(topt, **cyclic)]
        scheds += [optim.lr_scheduler.CyclicLR(o, **cyclic) for o in jopts]
        rng = np.random.default_rng(3)
        traces = []
        for _ in range(10):
            x, y = rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
            tl = _torch_step(tm, topt, _mlp_loss, torch.tensor(x), torch.tensor(y))
            el = _step(eager, jopts[0], _mlp_loss, jnp.asarray(x), jnp.asarray(y))
            cl = _compiled_mlp_step(compiled, jopts[1], jnp.asarray(x), jnp.asarray(y))
            for loss in (el, cl):
                assert loss.dtype == jnp.float64
                _close(loss, tl, 1e-10)
            for s in scheds:
                s.step()
            traces.append(jm.compile_stats(_compiled_mlp_step).num_traces)
        assert traces[2:] == [traces[1]] * 8  # lr and momentum changes never retrace
        for m, o in zip((eager, compiled), jopts):
            for (name, t), j in zip(tm.named_parameters(), m.parameters()):
                _close(j.data, t, 1e-10)
            _assert_state(o, topt, 1e-10)


def test_muon_newton_schulz_matches_torch_bfloat16():
    from torch.optim._muon import _zeropower_via_newtonschulz

    from jmodule.optim.muon import zeropower_via_newtonschulz

    rng = np.random.default_rng(5)
    coefficients = (3.4445, -4.7750, 2.0315)
    ours = jax.jit(lambda g: zeropower_via_newtonschulz(g, coefficients, 5, 1e-7))
    for shape in [(6, 4), (3, 5), (8, 8), (16, 5)]:
        for _ in range(5):
            g = rng.standard_normal(shape).astype(np.float32)
            ref = _zeropower_via_newtonschulz(torch.tensor(g), coefficients, 5, 1e-7)
            out = ours(jnp.asarray(g))
            assert out.dtype == jnp.bfloat16
            _close(out.astype(jnp.float32), ref.float(), 1e-2)  # one bfloat16 step at most


@pytest.mark.parametrize(
    "kwargs",
    [{"lr": -1.0}, {"momentum": -0.1}, {"weight_decay": -1.0}, {"adjust_lr_fn": "other"}],
)
def test_muon_constructor_errors_match_torch(kwargs):
    with pytest.raises(Exception) as expected:
        torch.optim.Muon([torch.nn.Parameter(torch.ones(2, 2))], **kwargs)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        optim.Muon([jm.nn.Parameter(jnp.ones((2, 2)))], **kwargs)


def test_muon_rejects_non_matrix_parameters_like_torch():
    with pytest.raises(ValueError) as expected:
        torch.optim.Muon([torch.nn.Parameter(torch.ones(3))])
    with pytest.raises(ValueError, match=re.escape(str(expected.value))):
        optim.Muon([jm.nn.Parameter(jnp.ones(3))])
