"""jm.optim.swa_utils against torch.optim.swa_utils, live (float64, 1e-10).

SWA and EMA averages over a 10-step training loop (eagerly, and with
``update_parameters`` inside the compiled step), ``update_bn`` recomputing
BatchNorm statistics, and ``SWALR``'s sequences.
"""

from __future__ import annotations

import copy
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import optim
from jmodule.optim import swa_utils as jswa

tswa = torch.optim.swa_utils

TOL = 1e-10


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _net(nn):
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


def _models():
    torch.manual_seed(7)
    tm = _net(torch.nn).double()
    jmod = _net(jm.nn).to(jm.float64)
    jmod.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    return tm, jmod


def _batches(n=10, seed=8):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((5, 4)), rng.standard_normal((5, 2))) for _ in range(n)]


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


AVERAGERS = {
    "swa": lambda ns: {},
    "swa-multi": lambda ns: {"multi_avg_fn": ns.get_swa_multi_avg_fn()},
    "ema-multi": lambda ns: {"multi_avg_fn": ns.get_ema_multi_avg_fn(0.8)},
    "ema-multi-buffers": lambda ns: {
        "multi_avg_fn": ns.get_ema_multi_avg_fn(0.7),
        "use_buffers": True,
    },
    "ema": lambda ns: {"avg_fn": ns.get_ema_avg_fn(0.9)},
    "swa-buffers": lambda ns: {"use_buffers": True},
}


@jm.compile
def _compiled_step(model, opt, averaged, x, y):
    opt.zero_grad()
    loss = jm.backward(lambda: _loss(model, x, y))
    opt.step()
    averaged.update_parameters(model)
    return loss


def _eager_step(model, opt, averaged, x, y):
    opt.zero_grad()
    loss = jm.backward(lambda: _loss(model, x, y))
    opt.step()
    averaged.update_parameters(model)
    return loss


def _assert_state_dicts(jsd, tsd):
    assert list(jsd) == list(tsd)
    for k, tv in tsd.items():
        jv = np.asarray(jsd[k])
        assert str(jv.dtype) == str(tv.dtype).removeprefix("torch."), k
        np.testing.assert_allclose(jv, tv.numpy(), rtol=TOL, atol=TOL, err_msg=k)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", list(AVERAGERS))
def test_averaged_model_follows_torch_through_training(case, compiled):
    tm, jmod = _models()
    tavg = tswa.AveragedModel(tm, **AVERAGERS[case](tswa))
    javg = jswa.AveragedModel(jmod, **AVERAGERS[case](jswa))
    topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    jopt = optim.SGD(jmod.parameters(), lr=0.1, momentum=0.9)
    step = _compiled_step if compiled else _eager_step
    for x, y in _batches():
        topt.zero_grad()
        tl = _loss(tm, torch.tensor(x), torch.tensor(y))
        tl.backward()
        topt.step()
        tavg.update_parameters(tm)
        jl = step(jmod, jopt, javg, jnp.asarray(x), jnp.asarray(y))
        np.testing.assert_allclose(float(jl), tl.item(), rtol=TOL, atol=TOL)
        _assert_state_dicts(javg.state_dict(), tavg.state_dict())
    assert int(javg.n_averaged) == 10
    x = _batches(1, seed=9)[0][0]
    for m in (tavg, javg):
        m.eval()
    np.testing.assert_allclose(
        np.asarray(javg(jnp.asarray(x))), tavg(torch.tensor(x)).detach().numpy(), rtol=TOL, atol=TOL
    )


@pytest.mark.torch
def test_update_bn_recomputes_batchnorm_statistics_like_torch():
    tm, jmod = _models()
    tavg, javg = tswa.AveragedModel(tm), jswa.AveragedModel(jmod)
    for k, (x, _) in enumerate(_batches(4)):  # move the weights, then average them
        with torch.no_grad():
            for p in tm.parameters():
                p.mul_(1.0 + 0.1 * k)
        for p in jmod.parameters():
            p.data = p.data * (1.0 + 0.1 * k)
        tm(torch.tensor(x))
        jmod(jnp.asarray(x))
        tavg.update_parameters(tm)
        javg.update_parameters(jmod)
    loader = [(x, y) for x, y in _batches(5, seed=10)]
    for m in (tavg, javg):
        m.eval()
    tswa.update_bn([(torch.tensor(x), torch.tensor(y)) for x, y in loader], tavg)
    jswa.update_bn([(jnp.asarray(x), jnp.asarray(y)) for x, y in loader], javg)
    _assert_state_dicts(javg.state_dict(), tavg.state_dict())
    bn = javg.module[1]
    assert bn.momentum == 0.1 and not javg.training  # both restored
    jswa.update_bn([jnp.asarray(x) for x, _ in loader], javg.module)  # plain batches too
    tswa.update_bn([torch.tensor(x) for x, _ in loader], tavg.module)
    _assert_state_dicts(javg.state_dict(), tavg.state_dict())


@pytest.mark.torch
@pytest.mark.parametrize(
    "kwargs",
    [
        {"swa_lr": 0.05},
        {"swa_lr": [0.05, 0.5], "anneal_epochs": 3, "anneal_strategy": "linear"},
        {"swa_lr": 0.2, "anneal_epochs": 0},
        {"swa_lr": 0.01, "anneal_epochs": 1, "anneal_strategy": "cos"},
    ],
)
def test_swalr_sequence_matches_torch(kwargs):
    t = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
    j = [jm.nn.Parameter(jnp.ones(2)) for _ in range(2)]
    groups = lambda ps: [{"params": ps[:1]}, {"params": ps[1:], "lr": 0.3}]
    topt, jopt = torch.optim.SGD(groups(t), lr=0.1), optim.SGD(groups(j), lr=0.1)
    tsched, jsched = tswa.SWALR(topt, **kwargs), jswa.SWALR(jopt, **kwargs)
    assert jsched.get_last_lr() == tsched.get_last_lr()
    for _ in range(14):
        for o, s in ((topt, tsched), (jopt, jsched)):
            o.step()
            s.step()
        assert jsched.get_last_lr() == tsched.get_last_lr()
    assert sorted(jsched.state_dict()) == sorted(tsched.state_dict())
    resumed = jswa.SWALR(optim.SGD(groups(j), lr=0.1), **kwargs)
    resumed.load_state_dict(copy.deepcopy(jsched.state_dict()))
    assert resumed.anneal_func is not None and resumed.get_last_lr() == jsched.get_last_lr()


@pytest.mark.torch
@pytest.mark.parametrize(
    "build",
    [
        lambda o, ns: ns.SWALR(o, swa_lr=0.1, anneal_strategy="square"),
        lambda o, ns: ns.SWALR(o, swa_lr=0.1, anneal_epochs=-1),
        lambda o, ns: ns.SWALR(o, swa_lr=[0.1, 0.2]),
        lambda o, ns: ns.get_ema_multi_avg_fn(1.5),
        lambda o, ns: ns.get_ema_avg_fn(-0.1),
    ],
)
def test_errors_match_torch(build):
    topt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    jopt = optim.SGD([jm.nn.Parameter(jnp.ones(2))], lr=0.1)
    with pytest.raises(Exception) as expected:
        build(topt, tswa)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        build(jopt, jswa)


def test_both_average_functions_and_an_in_place_multi_avg_fn_raise():
    model = jm.nn.Linear(2, 2)
    with pytest.raises(AssertionError, match="Only one of avg_fn and multi_avg_fn"):
        jswa.AveragedModel(
            model, avg_fn=jswa.get_swa_avg_fn(), multi_avg_fn=jswa.get_swa_multi_avg_fn()
        )

    def in_place(averaged, current, n):  # torch style: changes its arguments, returns None
        for a, c in zip(averaged, current):
            a += c

    avg = jswa.AveragedModel(model, multi_avg_fn=in_place)
    avg.update_parameters(model)  # the first update copies, as torch's
    with pytest.raises(TypeError, match="returns the new averages"):
        avg.update_parameters(model)
