"""jm.optim.lr_scheduler against torch.optim.lr_scheduler, live: the same float sequences.

Each scheduler case is one function building it from a namespace (torch's or
jmodule's ``optim``), so both frameworks run exactly the same construction.
"""

from __future__ import annotations

import copy
import math
import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _torch import torch

import jmodule as jm
from jmodule import optim


def _pair(name: str = "SGD", **kwargs):
    """The same optimizer, two param groups with different lrs, in both frameworks."""
    t = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
    j = [jm.nn.Parameter(jnp.ones(2)) for _ in range(2)]
    groups = lambda ps: [{"params": ps[:1]}, {"params": ps[1:], "lr": 0.3}]
    return getattr(torch.optim, name)(groups(t), lr=0.1, **kwargs), getattr(optim, name)(
        groups(j), lr=0.1, **kwargs
    )


def _half(epoch):
    return 0.5**epoch


class _Warmup:
    """A callable object: its ``__dict__`` goes into LambdaLR's state dict."""

    def __init__(self, n):
        self.n = n

    def __call__(self, epoch):
        return min(1.0, (epoch + 1) / self.n)


CASES = {
    "StepLR": lambda o, ns: ns.StepLR(o, step_size=3, gamma=0.5),
    "MultiStepLR": lambda o, ns: ns.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.3),
    "ExponentialLR": lambda o, ns: ns.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda o, ns: ns.CosineAnnealingLR(o, T_max=6, eta_min=0.01),
    "LinearLR": lambda o, ns: ns.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=7),
    "ConstantLR": lambda o, ns: ns.ConstantLR(o, factor=0.5, total_iters=4),
    "PolynomialLR": lambda o, ns: ns.PolynomialLR(o, total_iters=8, power=2.0),
    "LambdaLR": lambda o, ns: ns.LambdaLR(o, lr_lambda=[_half, _Warmup(4)]),
    "MultiplicativeLR": lambda o, ns: ns.MultiplicativeLR(o, lr_lambda=lambda e: 0.95),
    "OneCycleLR-cos": lambda o, ns: ns.OneCycleLR(o, max_lr=[1.0, 2.0], total_steps=20),
    "OneCycleLR-linear-3phase": lambda o, ns: ns.OneCycleLR(
        o, max_lr=1.0, epochs=4, steps_per_epoch=5, anneal_strategy="linear", three_phase=True
    ),
    "SequentialLR": lambda o, ns: ns.SequentialLR(
        o,
        schedulers=[ns.LinearLR(o, start_factor=0.1, total_iters=3), ns.ExponentialLR(o, 0.8)],
        milestones=[4],
    ),
    "SequentialLR-3": lambda o, ns: ns.SequentialLR(
        o,
        schedulers=[
            ns.ConstantLR(o, factor=0.2, total_iters=2),
            ns.CosineAnnealingLR(o, T_max=5),
            ns.StepLR(o, step_size=2),
        ],
        milestones=[3, 9],
    ),
    "ChainedScheduler": lambda o, ns: ns.ChainedScheduler(
        [ns.ConstantLR(o, factor=0.5, total_iters=3), ns.ExponentialLR(o, gamma=0.9)]
    ),
    "CosineAnnealingWarmRestarts": lambda o, ns: ns.CosineAnnealingWarmRestarts(
        o, T_0=3, eta_min=0.01
    ),
    "CosineAnnealingWarmRestarts-T_mult": lambda o, ns: ns.CosineAnnealingWarmRestarts(
        o, T_0=2, T_mult=2
    ),
    "CyclicLR-triangular": lambda o, ns: ns.CyclicLR(
        o, base_lr=[0.01, 0.02], max_lr=0.1, step_size_up=3, step_size_down=5
    ),
    "CyclicLR-triangular2": lambda o, ns: ns.CyclicLR(
        o, base_lr=0.01, max_lr=[0.1, 0.2], step_size_up=2, mode="triangular2"
    ),
    "CyclicLR-exp_range": lambda o, ns: ns.CyclicLR(
        o,
        base_lr=0.01,
        max_lr=0.1,
        step_size_up=4,
        mode="exp_range",
        gamma=0.9,
        base_momentum=0.7,
        max_momentum=[0.95, 0.9],
    ),
    "CyclicLR-scale_fn": lambda o, ns: ns.CyclicLR(
        o,
        base_lr=0.01,
        max_lr=0.1,
        step_size_up=3,
        scale_fn=_Warmup(3),
        scale_mode="iterations",
        cycle_momentum=False,
    ),
}


def _momenta(opt):
    return [(g.get("momentum"), g.get("betas")) for g in opt.param_groups]


@pytest.mark.torch
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
@pytest.mark.parametrize("case", list(CASES))
def test_sequence_matches_torch(case, optimizer):
    kwargs = {"momentum": 0.9} if optimizer == "SGD" else {}
    topt, jopt = _pair(optimizer, **kwargs)
    tsched = CASES[case](topt, torch.optim.lr_scheduler)
    jsched = CASES[case](jopt, optim.lr_scheduler)
    assert jsched.get_last_lr() == tsched.get_last_lr()
    for _ in range(19):
        topt.step()
        jopt.step()
        tsched.step()
        jsched.step()
        assert jsched.get_last_lr() == tsched.get_last_lr()
        assert [g["lr"] for g in jopt.param_groups] == [g["lr"] for g in topt.param_groups]
        assert _momenta(jopt) == _momenta(topt)
    assert sorted(jsched.state_dict()) == sorted(tsched.state_dict())


@pytest.mark.torch
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mode": "max", "factor": 0.5, "patience": 1},
        {"threshold_mode": "abs", "threshold": 0.05, "patience": 0, "cooldown": 2},
        {"patience": 0, "min_lr": [0.02, 0.05], "factor": 0.5},
    ],
)
def test_reduce_on_plateau_matches_torch(kwargs):
    topt, jopt = _pair()
    tsched = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kwargs)
    jsched = optim.lr_scheduler.ReduceLROnPlateau(jopt, **kwargs)
    metrics = [1.0, 0.9, 0.95, 0.95, 0.96, 0.89, 0.89, 0.9, 0.7, 0.71, 0.72, 0.73] * 3
    for m in metrics:
        tsched.step(m)
        jsched.step(jnp.asarray(m))  # any float-convertible metric, an array included
        assert jsched.get_last_lr() == tsched.get_last_lr()
    assert sorted(jsched.state_dict()) == sorted(tsched.state_dict())


@pytest.mark.torch
@pytest.mark.parametrize(
    "case", ["CosineAnnealingLR", "LambdaLR", "SequentialLR", "OneCycleLR-cos"]
)
def test_state_dict_resumes_the_sequence(case):
    jopt, jopt2 = _pair()[1], _pair()[1]
    sched = CASES[case](jopt, optim.lr_scheduler)
    for _ in range(5):
        jopt.step()
        sched.step()
    sched2 = CASES[case](jopt2, optim.lr_scheduler)
    sched2.load_state_dict(copy.deepcopy(sched.state_dict()))
    jopt2.load_state_dict(jopt.state_dict())
    for _ in range(5):
        for o, s in ((jopt, sched), (jopt2, sched2)):
            o.step()
            s.step()
        assert sched2.get_last_lr() == sched.get_last_lr()


@pytest.mark.torch
def test_warnings_match_torch():
    topt, jopt = _pair()
    tsched = torch.optim.lr_scheduler.StepLR(topt, 2)
    jsched = optim.lr_scheduler.StepLR(jopt, 2)
    for sched in (tsched, jsched):  # scheduler stepped before the optimizer
        with pytest.warns(UserWarning, match=re.escape("Detected call of `lr_scheduler.step()`")):
            sched.step()
    for sched in (tsched, jsched):
        with pytest.warns(UserWarning, match="please use `get_last_lr\\(\\)`"):
            sched.get_lr()
    for sched in (tsched, jsched):  # the deprecated epoch argument: the closed form
        with pytest.warns(UserWarning, match="The epoch parameter in `scheduler.step\\(\\)`"):
            sched.step(5)
    assert jsched.get_last_lr() == tsched.get_last_lr()


@pytest.mark.torch
@pytest.mark.parametrize(
    "build",
    [
        lambda o, ns: ns.LinearLR(o, start_factor=0.0),
        lambda o, ns: ns.LinearLR(o, end_factor=1.5),
        lambda o, ns: ns.ConstantLR(o, factor=2.0),
        lambda o, ns: ns.OneCycleLR(o, max_lr=1.0),
        lambda o, ns: ns.OneCycleLR(o, max_lr=1.0, total_steps=10, pct_start=2),
        lambda o, ns: ns.OneCycleLR(o, max_lr=[1.0], total_steps=10),
        lambda o, ns: ns.ReduceLROnPlateau(o, factor=1.0),
        lambda o, ns: ns.ReduceLROnPlateau(o, mode="sideways"),
        lambda o, ns: ns.StepLR(o, 2, last_epoch=3),
        lambda o, ns: ns.SequentialLR(o, [ns.StepLR(o, 2)], milestones=[1]),
    ],
)
def test_errors_match_torch(build):
    topt, jopt = _pair()
    with pytest.raises(Exception) as expected:
        build(topt, torch.optim.lr_scheduler)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value)[:60])):
        build(jopt, optim.lr_scheduler)


@pytest.mark.torch
def test_one_cycle_past_the_end_raises_like_torch():
    topt, jopt = _pair()
    scheds = [
        ns.OneCycleLR(o, max_lr=1.0, total_steps=2)
        for o, ns in ((topt, torch.optim.lr_scheduler), (jopt, optim.lr_scheduler))
    ]
    for o, s in zip((topt, jopt), scheds):
        o.step()
        s.step()
        s.step()
    with pytest.raises(ValueError) as expected:
        scheds[0].step()
    with pytest.raises(ValueError, match=re.escape(str(expected.value))):
        scheds[1].step()


def test_wrapped_optax_optimizer_has_no_lr_to_schedule():
    opt = optim.Optimizer([jm.nn.Parameter(jnp.ones(1))], optax.sgd(0.1))
    with pytest.raises(KeyError, match="schedule there instead"):
        optim.lr_scheduler.StepLR(opt, 2)
    with pytest.raises(TypeError, match="is not an Optimizer"):
        optim.lr_scheduler.StepLR(object(), 2)


def test_lr_changes_reach_a_compiled_step_without_retracing():
    """Cosine-annealed SGD on f(w) = w**2 / 2 (grad w): w_k+1 = (1 - lr_k) w_k, compiled."""
    w = jm.nn.Parameter(jnp.ones(()))
    opt = optim.SGD([w], lr=0.5)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)

    @jm.compile
    def step(opt):
        w.grad = w.data  # w is carried in and out as the optimizer's parameter
        opt.step()

    expected, traces = 1.0, []
    for _ in range(6):
        expected *= 1 - opt.param_groups[0]["lr"]
        step(opt)
        sched.step()
        np.testing.assert_allclose(float(w.data), expected, rtol=1e-6)
        traces.append(jm.compile_stats(step).num_traces)
    assert traces[2:] == [traces[1]] * 4  # (the 2nd call retraces once: .grad None -> array)
    assert math.isclose(sched.get_last_lr()[0], opt.param_groups[0]["lr"])


@pytest.mark.torch
@pytest.mark.parametrize("T_mult", [1, 2])
def test_warm_restarts_with_fractional_epochs_match_torch(T_mult):
    topt, jopt = _pair()
    tsched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(topt, T_0=2, T_mult=T_mult)
    jsched = optim.lr_scheduler.CosineAnnealingWarmRestarts(jopt, T_0=2, T_mult=T_mult)
    for epoch in range(7):
        for i in range(4):  # per batch, as torch's docs show
            for o, s in ((topt, tsched), (jopt, jsched)):
                o.step()
                s.step(epoch + i / 4)
            assert jsched.get_last_lr() == tsched.get_last_lr()
            assert (jsched.T_cur, jsched.T_i, jsched.last_epoch) == (
                tsched.T_cur,
                tsched.T_i,
                tsched.last_epoch,
            )
    for s in (tsched, jsched):  # back to an earlier epoch, then plain steps
        s.step(1.5)
        s.step()
    assert jsched.get_last_lr() == tsched.get_last_lr()
    assert sorted(jsched.state_dict()) == sorted(tsched.state_dict())


@pytest.mark.torch
@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_cyclic_state_dict_resumes_and_keeps_a_callable_scale_object(name):
    kwargs = {"momentum": 0.9} if name == "SGD" else {}
    build = lambda o: optim.lr_scheduler.CyclicLR(
        o, base_lr=0.01, max_lr=0.1, step_size_up=3, scale_fn=_Warmup(5)
    )
    (_, jopt), (topt, jopt2) = _pair(name, **kwargs), _pair(name, **kwargs)
    sched = build(jopt)
    for _ in range(4):
        jopt.step()
        sched.step()
    saved = sched.state_dict()
    assert saved["_scale_fn_custom"] == {"n": 5}
    tsched = torch.optim.lr_scheduler.CyclicLR(
        topt, base_lr=0.01, max_lr=0.1, step_size_up=3, scale_fn=_Warmup(5)
    )
    assert sorted(saved) == sorted(tsched.state_dict())
    sched2 = build(jopt2)
    sched2._scale_fn_custom.n = 1
    sched2.load_state_dict(copy.deepcopy(saved))
    assert sched2._scale_fn_custom.n == 5
    jopt2.load_state_dict(jopt.state_dict())
    for _ in range(5):
        for o, s in ((jopt, sched), (jopt2, sched2)):
            o.step()
            s.step()
        assert sched2.get_last_lr() == sched.get_last_lr()
        assert _momenta(jopt2) == _momenta(jopt)


@pytest.mark.torch
@pytest.mark.parametrize(
    "build",
    [
        lambda o, ns: ns.CosineAnnealingWarmRestarts(o, T_0=0),
        lambda o, ns: ns.CosineAnnealingWarmRestarts(o, T_0=2.0),
        lambda o, ns: ns.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=0),
        lambda o, ns: ns.CosineAnnealingWarmRestarts(o, T_0=2, eta_min="0"),
        lambda o, ns: ns.CosineAnnealingWarmRestarts(o, T_0=2).step(-1),
        lambda o, ns: ns.CyclicLR(o, base_lr=0.1, max_lr=1.0, mode="square"),
        lambda o, ns: ns.CyclicLR(o, base_lr=[0.1], max_lr=1.0),
        lambda o, ns: ns.CyclicLR(o, base_lr=0.1, max_lr=1.0),  # SGD without momentum: fine
        lambda o, ns: ns.CyclicLR(o, base_lr=0.1, max_lr=1.0, cycle_momentum=True, last_epoch=3),
    ],
)
def test_new_scheduler_errors_match_torch(build):
    topt, jopt = _pair()
    try:
        build(topt, torch.optim.lr_scheduler)
    except Exception as expected:
        with pytest.raises(type(expected), match=re.escape(str(expected)[:60])):
            build(jopt, optim.lr_scheduler)
    else:
        build(jopt, optim.lr_scheduler)
