"""Float64 training next to torch: one torch step, one eager jm step and one compiled jm step.

Shared by the optimizer tests that follow torch live over several steps
(``test_optim_float64.py``, ``test_optim_composition.py``): the same loss, the
same three step functions, and the same comparison of parameters and optimizer
state, so a fix to the loop is made once. x64 must be on (the callers' fixture).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from _torch import torch

import jmodule as jm

TOL = 1e-10


def mse(model: Any, x: Any, y: Any) -> Any:
    return ((model(x) - y) ** 2).mean()


def eager_step(model: Any, opt: Any, x: Any, y: Any) -> Any:
    opt.zero_grad()
    loss = jm.backward(lambda: mse(model, x, y))
    opt.step()
    return loss


compiled_step = jm.compile(eager_step)


def torch_step(model: Any, opt: Any, x: Any, y: Any) -> Any:
    opt.zero_grad()
    loss = mse(model, x, y)
    loss.backward()
    opt.step()
    return loss


def models(net: Callable[[Any], Any], seed: int) -> tuple[Any, Any, Any]:
    """``net(torch.nn)`` in float64 and two jm copies of it (eager, compiled) with its weights."""
    torch.manual_seed(seed)
    tm = net(torch.nn).double()
    eager = net(jm.nn).to(jm.float64)
    eager.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    assert all(p.dtype == jnp.float64 for p in eager.parameters())
    return tm, eager, copy.deepcopy(eager)


def step_all(tm, topt, eager, compiled, jopts: Sequence[Any], x, y) -> None:
    """One step of each side on the batch ``(x, y)`` (numpy); the three losses agree."""
    tl = torch_step(tm, topt, torch.tensor(x), torch.tensor(y))
    el = eager_step(eager, jopts[0], jnp.asarray(x), jnp.asarray(y))
    cl = compiled_step(compiled, jopts[1], jnp.asarray(x), jnp.asarray(y))
    for loss in (el, cl):
        assert loss.dtype == jnp.float64
        np.testing.assert_allclose(float(loss), tl.item(), rtol=TOL, atol=TOL)


def assert_params_match(tm, jm_models: Sequence[Any]) -> None:
    ref = {k: v.detach().numpy() for k, v in tm.state_dict().items()}
    for m in jm_models:
        for k, v in m.state_dict().items():
            assert np.asarray(v).dtype == np.float64, k
            np.testing.assert_allclose(np.asarray(v), ref[k], rtol=TOL, atol=TOL, err_msg=k)


def assert_state_matches(topt, jopts: Sequence[Any], *, layout: bool = False) -> None:
    """Each jm optimizer's state equals torch's; with ``layout`` also its groups and key order."""
    tsd = topt.state_dict()
    for jopt in jopts:
        jsd = jopt.state_dict()
        if layout:
            assert jsd["param_groups"] == tsd["param_groups"]
            assert list(jsd["state"]) == list(tsd["state"])
        for i, tstate in tsd["state"].items():
            if layout:
                assert list(jsd["state"][i]) == list(tstate)
            for k, tv in tstate.items():
                jv = np.asarray(jsd["state"][i][k])
                np.testing.assert_allclose(jv, tv.numpy(), rtol=TOL, atol=TOL, err_msg=k)
