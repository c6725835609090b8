"""Float64 training (x64 on) against torch float64: optimizers and schedulers to 1e-10.

With ``jax_enable_x64`` on and a float64 model, hyper-parameters (lr, momentum,
betas, eps, weight decay) take the parameters' float64, as PyTorch's Python
floats do; in float32 they would move a weight by float32's 0.1
(0.10000000149011612) and end a few steps ~1e-7 away from torch.

Every optimizer case of ``test_optim.CASES`` and every scheduler case of
``test_lr_scheduler.CASES`` runs 10 steps of a small tanh network, eagerly and
compiled, next to torch in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import side_by_side
from _torch import torch
from test_lr_scheduler import CASES as SCHEDULES
from test_optim import CASES, IDS

import jmodule as jm
from jmodule import optim


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _nets(nn):
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _batches(steps: int = 10):
    rng = np.random.default_rng(11)
    return [(rng.standard_normal((6, 4)), rng.standard_normal((6, 3))) for _ in range(steps)]


def _groups(params: list) -> list[dict]:
    return [{"params": params[:2]}, {"params": params[2:], "lr": 0.02}]


def _run(name: str, kwargs: dict, schedule=None):
    tm, eager, compiled = side_by_side.models(_nets, seed=3)
    topt = getattr(torch.optim, name)(_groups(list(tm.parameters())), **kwargs)
    jopts = [
        getattr(optim, name)(_groups(list(m.parameters())), **kwargs) for m in (eager, compiled)
    ]
    scheds = []
    if schedule is not None:
        scheds = [schedule(topt, torch.optim.lr_scheduler)]
        scheds += [schedule(o, optim.lr_scheduler) for o in jopts]
    for x, y in _batches():
        side_by_side.step_all(tm, topt, eager, compiled, jopts, x, y)
        for s in scheds:
            s.step()
    side_by_side.assert_params_match(tm, [eager, compiled])
    side_by_side.assert_state_matches(topt, jopts)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_float64_training_matches_torch_float64(name, kwargs):
    _run(name, kwargs)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("case", list(SCHEDULES))
def test_float64_scheduled_training_matches_torch_float64(case):
    _run("SGD", {"lr": 0.1, "momentum": 0.9}, SCHEDULES[case])


@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_sgd_moves_a_float64_weight_by_float64_lr(compiled):
    tw = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    tw.grad = torch.ones(3, dtype=torch.float64)
    topt.step()
    model = jm.nn.Linear(3, 1, bias=False).to(jm.float64)
    model.weight.data = jnp.zeros((1, 3), jnp.float64)
    opt = optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x):
        opt.zero_grad()
        jm.backward(lambda: model(x).sum())
        opt.step()

    (jm.compile(step) if compiled else step)(model, opt, jnp.ones((1, 3), jnp.float64))
    moved = np.asarray(model.weight.data)[0]
    assert moved.dtype == np.float64
    assert moved.tolist() == tw.detach().numpy().tolist()  # float64's 0.1, not float32's


def test_float32_groups_keep_float32_hyperparameters():
    w = jm.nn.Parameter(jnp.zeros(2, jnp.float32))
    opt = optim.SGD([w], lr=0.1)
    w.grad = jnp.ones(2, jnp.float32)
    opt.step()
    assert w.data.dtype == jnp.float32
    assert opt._hp["0"].dtype == jnp.float32
