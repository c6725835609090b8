"""The new optimizers where the registries of ``test_optim`` do not reach.

Adafactor's factored state for parameters of every rank (a group mixing
them), the shared-count layout of large parameters for the optimizers with
per-parameter scalars in their state (NAdam's ``mu_product``, ASGD's ``eta``
and ``mu``), and RAdam's rectification in float32, all against torch live.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from test_optim import _assert_state_dicts, _np

import jmodule as jm
from jmodule import optim

pytestmark = pytest.mark.torch

TOL = 1e-10


def _float64_pair(name: str, kwargs: dict, shapes: list[tuple], seed: int = 0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s) for s in shapes]
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    jp = [jm.nn.Parameter(jnp.asarray(a)) for a in init]
    return rng, tp, getattr(torch.optim, name)(tp, **kwargs), jp, getattr(optim, name)(jp, **kwargs)


def _grads(rng, shapes, k):
    return [None if (k + j) % 4 == 3 else rng.standard_normal(s) for j, s in enumerate(shapes)]


def _step_both(tp, topt, jp, jopt, grads, step=None):
    for t, j, g in zip(tp, jp, grads):
        t.grad = None if g is None else torch.tensor(g)
        j.grad = None if g is None else jnp.asarray(g)
    topt.step()
    if step is None:
        jopt.step()
    else:
        step(jopt, *jp)


def _assert_close(tp, jp, tol=TOL):
    for t, j in zip(tp, jp):
        np.testing.assert_allclose(np.asarray(j.data), _np(t), rtol=tol, atol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_adafactor_factors_every_rank_like_torch(compiled):
    """A group of a 3-D, a 2-D, a vector and a scalar parameter: row/col factors or variance."""
    shapes = [(2, 3, 4), (3, 5), (4,), ()]
    with jax.enable_x64(True):
        rng, tp, topt, jp, jopt = _float64_pair("Adafactor", {"weight_decay": 0.1}, shapes)

        @jm.compile
        def step(opt, *params):
            opt.step()

        for k in range(8):
            _step_both(tp, topt, jp, jopt, _grads(rng, shapes, k), step if compiled else None)
        _assert_close(tp, jp)
        for i, tstate in topt.state_dict()["state"].items():
            jstate = jopt.state_dict()["state"][i]
            assert list(jstate) == list(tstate)
            for key, tv in tstate.items():
                assert jstate[key].shape == tuple(tv.shape)
                np.testing.assert_allclose(np.asarray(jstate[key]), _np(tv), rtol=TOL, atol=TOL)
        # Torch's state dict loads into a fresh jm optimizer, which carries on identically.
        jp2 = [jm.nn.Parameter(jnp.asarray(_np(t))) for t in tp]
        jopt2 = optim.Adafactor(jp2, weight_decay=0.1)
        jopt2.load_state_dict(topt.state_dict())
        for k in range(8, 11):
            _step_both(tp, topt, jp2, jopt2, _grads(rng, shapes, k))
        _assert_close(tp, jp2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("NAdam", {"lr": 0.01, "momentum_decay": 0.1}),
        ("ASGD", {"lr": 0.05, "lambd": 0.1, "t0": 1}),
        ("Rprop", {"lr": 0.05}),
    ],
)
def test_large_parameters_share_counts_and_match_torch(name, kwargs):
    """Parameters too large to pack keep their own state; their scalars share one count."""
    shapes = [(260, 256), (256, 260), (3,)]  # two above PACK_MAX_ELEMENTS, one small
    with jax.enable_x64(True):
        rng, tp, topt, jp, jopt = _float64_pair(name, kwargs, shapes, seed=1)
        for k in range(5):
            grads = [rng.standard_normal(s) for s in shapes]
            if k == 3:
                grads[1] = None  # the counts part ways
            _step_both(tp, topt, jp, jopt, grads)
        _assert_close(tp, jp)
        for i, tstate in topt.state_dict()["state"].items():
            jstate = jopt.state_dict()["state"][i]
            assert list(jstate) == list(tstate)
            for key, tv in tstate.items():
                assert str(jstate[key].dtype) == str(tv.dtype).removeprefix("torch.")
                np.testing.assert_allclose(np.asarray(jstate[key]), _np(tv), rtol=TOL, atol=TOL)


def test_radam_rectification_is_exact_in_float32():
    """float32 RAdam with lr=1: the rectified steps (from step 6) match torch's float64 rho_t.

    optax's float32 rho_t is ~0.03 off for beta2=0.999 (a 0.6% larger or
    smaller step); PyTorch computes it in float64.
    """
    rng = np.random.default_rng(3)
    init = rng.standard_normal(6).astype(np.float32)
    tp, jp = torch.nn.Parameter(torch.tensor(init)), jm.nn.Parameter(jnp.asarray(init))
    topt, jopt = torch.optim.RAdam([tp], lr=1.0), optim.RAdam([jp], lr=1.0)
    for _ in range(12):
        g = rng.standard_normal(6).astype(np.float32)
        before_t, before_j = _np(tp).copy(), np.asarray(jp.data)
        _step_both([tp], topt, [jp], jopt, [g])
        np.testing.assert_allclose(
            np.asarray(jp.data) - before_j, _np(tp) - before_t, rtol=2e-5, atol=1e-6
        )
    _assert_state_dicts(jopt.state_dict(), topt.state_dict())


@pytest.mark.parametrize(
    "name", ["Adadelta", "Adamax", "NAdam", "RAdam", "Rprop", "ASGD", "Adafactor"]
)
def test_signatures_match_torch(name):
    """Argument names, order, kinds and defaults as torch's (``maximize``, ``foreach``, ...)."""
    import inspect

    def shape(cls):
        return [
            (p.name, p.kind, p.default)
            for p in inspect.signature(cls).parameters.values()
            if p.name != "params"
        ]

    assert shape(getattr(optim, name)) == shape(getattr(torch.optim, name))
