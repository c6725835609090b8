"""jm.optim.LBFGS against torch.optim.LBFGS, live: the same iterates, closures and state.

A small tanh regression: 10 ``step`` calls (several closure evaluations
each) in float64 to 1e-10, with and without the strong-Wolfe line search,
and a float32 step. ``step`` runs eagerly; inside ``jm.compile`` it raises.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import optim
from jmodule.optim.lbfgs import COMPILE_HELP


def _net(nn):
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))


def _setup(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    tm = _net(torch.nn).to(dtype)
    jmod = _net(jm.nn).to(jm.float64 if dtype == torch.float64 else jm.float32)
    jmod.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 3))
    y = np.sin(x.sum(1, keepdims=True))
    npdtype = np.float64 if dtype == torch.float64 else np.float32
    return tm, jmod, x.astype(npdtype), y.astype(npdtype)


def _closures(tm, topt, jmod, jopt, x, y):
    tx, ty, jx, jy = torch.tensor(x), torch.tensor(y), jnp.asarray(x), jnp.asarray(y)

    def torch_closure():
        topt.zero_grad()
        loss = ((tm(tx) - ty) ** 2).mean()
        loss.backward()
        return loss

    def jm_closure():
        jopt.zero_grad()
        return jm.backward(lambda: ((jmod(jx) - jy) ** 2).mean())

    def loss_only():
        return ((jmod(jx) - jy) ** 2).mean()

    return torch_closure, jm_closure, loss_only


def _value(v):
    if isinstance(v, torch.Tensor):
        return v.detach().numpy()
    return None if v is None else np.asarray(v)


def _assert_state(jopt, topt, tol, rtol=1e-7):
    """The state's layout and values (curvature entries to ``rtol``, see below)."""
    jsd, tsd = jopt.state_dict(), topt.state_dict()
    assert jsd["param_groups"] == tsd["param_groups"]
    assert list(jsd["state"]) == list(tsd["state"]) == [0]
    jstate, tstate = jsd["state"][0], tsd["state"][0]
    assert list(jstate) == list(tstate)
    for k, tv in tstate.items():
        jv = jstate[k]
        if isinstance(tv, list):
            assert isinstance(jv, list) and len(jv) == len(tv), k
            pairs = list(zip(jv, tv))
        else:
            pairs = [(jv, tv)]
        for a, b in pairs:
            if b is None or (type(b) is int and k != "t"):
                assert a == b, k
            else:
                # al, ro and H_diag are ratios of differences of nearly equal gradients:
                # their relative error is the iterates' (1e-13) over the last step's size.
                loose = k in ("al", "ro", "H_diag")
                r = rtol if loose else tol
                np.testing.assert_allclose(_value(a), _value(b), rtol=r, atol=tol, err_msg=k)


OPTIONS = [
    {"lr": 0.5, "max_iter": 4, "history_size": 3},
    {"max_iter": 4, "history_size": 3, "line_search_fn": "strong_wolfe"},
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("kwargs", OPTIONS, ids=["fixed-step", "strong_wolfe"])
def test_float64_steps_match_torch(kwargs):
    with jax.enable_x64(True):
        tm, jmod, x, y = _setup()
        topt = torch.optim.LBFGS(tm.parameters(), **kwargs)
        jopt = optim.LBFGS(jmod.parameters(), **kwargs)
        torch_closure, jm_closure, _ = _closures(tm, topt, jmod, jopt, x, y)
        for _ in range(10):
            tl = topt.step(torch_closure)
            jl = jopt.step(jm_closure)
            assert jl.dtype == jnp.float64
            np.testing.assert_allclose(float(jl), tl.item(), rtol=1e-10, atol=1e-10)
            for (name, t), j in zip(tm.named_parameters(), jmod.parameters()):
                np.testing.assert_allclose(
                    np.asarray(j.data), _value(t), rtol=1e-10, atol=1e-10, err_msg=name
                )
        tstate = topt.state[next(tm.parameters())]
        assert tstate["func_evals"] > 10 * 3 and len(tstate["old_dirs"]) == 3  # history full
        _assert_state(jopt, topt, 1e-10)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_float32_step_and_loss_only_closure_match_torch(line_search_fn):
    tm, jmod, x, y = _setup(torch.float32, seed=1)
    jmod2 = _net(jm.nn)
    jmod2.load_state_dict(jmod.state_dict())
    kwargs = {"line_search_fn": line_search_fn, "max_iter": 6}
    topt = torch.optim.LBFGS(tm.parameters(), **kwargs)
    jopt = optim.LBFGS(jmod.parameters(), **kwargs)
    jopt2 = optim.LBFGS(jmod2.parameters(), **kwargs)
    torch_closure, jm_closure, _ = _closures(tm, topt, jmod, jopt, x, y)
    loss_only = _closures(tm, topt, jmod2, jopt2, x, y)[2]
    tl, jl, jl2 = topt.step(torch_closure), jopt.step(jm_closure), jopt2.step(loss_only)
    for loss in (jl, jl2):
        np.testing.assert_allclose(float(loss), tl.item(), rtol=1e-6)
    for (name, t), j, j2 in zip(tm.named_parameters(), jmod.parameters(), jmod2.parameters()):
        for p in (j, j2):
            np.testing.assert_allclose(
                np.asarray(p.data), _value(t), rtol=1e-3, atol=1e-4, err_msg=name
            )
    tstate, jstate = topt.state_dict()["state"][0], jopt.state_dict()["state"][0]
    assert list(jstate) == list(tstate)
    assert (jstate["func_evals"], jstate["n_iter"]) == (tstate["func_evals"], tstate["n_iter"])


@pytest.mark.torch
def test_state_dict_from_torch_resumes_the_iterates():
    kwargs = {"max_iter": 3, "history_size": 4, "line_search_fn": "strong_wolfe"}
    with jax.enable_x64(True):
        tm, jmod, x, y = _setup(seed=2)
        topt = torch.optim.LBFGS(tm.parameters(), **kwargs)
        torch_closure = _closures(tm, topt, jmod, None, x, y)[0]
        for _ in range(3):
            topt.step(torch_closure)
        jmod.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
        jopt = optim.LBFGS(jmod.parameters(), **kwargs)
        jopt.load_state_dict(topt.state_dict())
        jm_closure = _closures(tm, topt, jmod, jopt, x, y)[1]
        for _ in range(3):
            topt.step(torch_closure)
            jopt.step(jm_closure)
        for t, j in zip(tm.parameters(), jmod.parameters()):
            np.testing.assert_allclose(np.asarray(j.data), _value(t), rtol=1e-10, atol=1e-10)
        _assert_state(jopt, topt, 1e-10)


def test_step_inside_jm_compile_raises_with_the_reason():
    model = jm.nn.Linear(2, 1)
    opt = optim.LBFGS(model.parameters())
    x = jnp.ones((3, 2))

    @jm.compile
    def given(model, opt, x):
        return opt.step(lambda: model(x).sum())

    @jm.compile
    def not_given(model, x):
        return opt.step(lambda: model(x).sum())

    for fn, args in ((given, (model, opt, x)), (not_given, (model, x))):
        with pytest.raises(RuntimeError, match=re.escape(COMPILE_HELP[:80])):
            fn(*args)
    assert "cannot branch on values" in COMPILE_HELP


@pytest.mark.torch
@pytest.mark.parametrize(
    "build",
    [
        lambda ps: optim_of(ps)([ps[0]], lr=-1.0),
        lambda ps: optim_of(ps)([{"params": ps[:1]}, {"params": ps[1:]}]),
    ],
)
def test_constructor_errors_match_torch(build):
    tps = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
    jps = [jm.nn.Parameter(jnp.ones(2)) for _ in range(2)]
    with pytest.raises(Exception) as expected:
        build(tps)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        build(jps)


def optim_of(ps):
    return torch.optim.LBFGS if isinstance(ps[0], torch.Tensor) else optim.LBFGS


@pytest.mark.torch
def test_unknown_line_search_raises_like_torch():
    tp, jp = torch.nn.Parameter(torch.ones(2)), jm.nn.Parameter(jnp.ones(2))
    topt = torch.optim.LBFGS([tp], line_search_fn="armijo")
    jopt = optim.LBFGS([jp], line_search_fn="armijo")
    with pytest.raises(RuntimeError) as expected:
        topt.step(lambda: (tp**2).sum().backward() or (tp**2).sum())
    with pytest.raises(RuntimeError, match=re.escape(str(expected.value))):
        jopt.step(lambda: (jp**2).sum())
