"""jm.optim against torch.optim, live: update arithmetic, state dicts, groups, closures, compile.

Each optimizer case is described once (class name and options, the same for
both frameworks) and run through the shared parity tests, as PyTorch's own
``common_optimizers.py`` does.
"""

from __future__ import annotations

import copy
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _torch import torch

import jmodule as jm
from jmodule import optim
from jmodule.optim.optimizer import CHANGED_INSIDE_HELP, NOT_GIVEN_HELP

# ---------------------------------------------------------------------------- the registry

CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3}),
    ("SGD", {"lr": 0.1, "momentum": 0.8, "nesterov": True}),
    ("SGD", {"lr": 0.1, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1, "maximize": True}),
    ("Adam", {}),
    ("Adam", {"lr": 0.01, "amsgrad": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-3}),
    ("Adam", {"lr": 0.01, "maximize": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1, "maximize": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.2}),
    ("AdamW", {"lr": 0.01, "maximize": True, "betas": (0.5, 0.9)}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.5}),
    ("RMSprop", {"lr": 0.01, "centered": True}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "eps": 1e-2, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.7, "maximize": True}),
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05}),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.3, "eps": 0.1}),
    ("Adagrad", {"lr": 0.1, "weight_decay": 0.1, "maximize": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-3, "weight_decay": 0.1, "maximize": True}),
    ("Adamax", {}),
    ("Adamax", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-3, "weight_decay": 0.1}),
    ("Adamax", {"lr": 0.01, "maximize": True}),
    ("NAdam", {}),
    ("NAdam", {"lr": 0.01, "momentum_decay": 0.1, "betas": (0.8, 0.99), "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}),
    ("RAdam", {}),
    ("RAdam", {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-3, "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}),
    ("Rprop", {}),
    ("Rprop", {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.1)}),
    ("Rprop", {"lr": 1e-4, "step_sizes": (1e-3, 1.0), "maximize": True}),
    ("ASGD", {}),
    ("ASGD", {"lr": 0.05, "lambd": 0.1, "alpha": 0.5, "t0": 3, "weight_decay": 0.1}),
    ("ASGD", {"lr": 0.05, "t0": 0, "maximize": True}),
    ("Adafactor", {}),
    ("Adafactor", {"lr": 0.1, "beta2_decay": -0.5, "eps": (1e-3, 1e-2), "d": 2.0}),
    ("Adafactor", {"lr": 0.05, "weight_decay": 0.1, "maximize": True}),
]
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}" for name, kw in CASES]

RTOL, ATOL = 1e-5, 1e-6


def _data(seed: int = 0, steps: int = 10):
    """Initial weights for three parameters, and per-step gradients (None = no grad)."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (4,), (2, 3)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = []
    for k in range(steps):
        step = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        step[1] = None if k % 3 == 1 else step[1]  # skipped now and then, as torch skips None
        grads.append(step)
    return init, grads


def _pair(name: str, kwargs: dict, init: list[np.ndarray], second_lr: float = 0.03):
    """The same optimizer in both frameworks, over two param groups."""
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    jp = [jm.nn.Parameter(jnp.asarray(a)) for a in init]
    groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": second_lr}]
    return (
        tp,
        getattr(torch.optim, name)(groups(tp), **kwargs),
        jp,
        getattr(optim, name)(groups(jp), **kwargs),
    )


def _set_grads(tp, jp, grads):
    for t, j, g in zip(tp, jp, grads):
        t.grad = None if g is None else torch.tensor(g)
        j.grad = None if g is None else jnp.asarray(g)


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _assert_params(tp, jp):
    for t, j in zip(tp, jp):
        np.testing.assert_allclose(_np(j), _np(t), rtol=RTOL, atol=ATOL)


def _assert_state_dicts(jsd: dict, tsd: dict):
    """Same layout (indices, key order, group options) and the same values."""
    assert jsd["param_groups"] == tsd["param_groups"]
    assert list(jsd["state"]) == list(tsd["state"])
    for i, tstate in tsd["state"].items():
        jstate = jsd["state"][i]
        assert list(jstate) == list(tstate)
        for k, tv in tstate.items():
            assert jstate[k].shape == tuple(tv.shape)
            assert str(jstate[k].dtype) == str(tv.dtype).removeprefix("torch.")
            np.testing.assert_allclose(_np(jstate[k]), _np(tv), rtol=RTOL, atol=ATOL)


def _to_torch(sd: dict) -> dict:
    return {
        "state": {
            i: {k: torch.tensor(np.asarray(v)) for k, v in s.items()}
            for i, s in sd["state"].items()
        },
        "param_groups": copy.deepcopy(sd["param_groups"]),
    }


# ---------------------------------------------------------------------------- arithmetic


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_ten_steps_match_torch(name, kwargs):
    init, grads = _data()
    tp, topt, jp, jopt = _pair(name, kwargs, init)
    for step in grads:
        _set_grads(tp, jp, step)
        topt.step()
        assert jopt.step() is None
        _assert_params(tp, jp)
    _assert_state_dicts(jopt.state_dict(), topt.state_dict())


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}),
        ("Adam", {"lr": 0.01, "amsgrad": True}),
        ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}),
        ("Adagrad", {"lr": 0.1, "lr_decay": 0.1}),
        ("Adadelta", {"lr": 0.5, "weight_decay": 0.1}),
        ("Adamax", {"lr": 0.01}),
        ("NAdam", {"lr": 0.01, "momentum_decay": 0.1}),
        ("RAdam", {"lr": 0.01, "betas": (0.8, 0.9)}),
        ("Rprop", {"lr": 0.05}),
        ("ASGD", {"lr": 0.05, "lambd": 0.1, "t0": 2}),
        ("Adafactor", {"lr": 0.05, "weight_decay": 0.1}),
    ],
)
def test_state_dict_interchanges_with_torch(name, kwargs):
    """Load torch's state into jm (and jm's into torch) mid-run; both carry on identically."""
    init, grads = _data(seed=1, steps=8)
    tp, topt, jp, jopt = _pair(name, kwargs, init)
    for step in grads[:4]:
        _set_grads(tp, jp, step)
        topt.step()
        jopt.step()
    # A fresh jm optimizer from torch's state dict, a fresh torch one from jm's.
    jp2 = [jm.nn.Parameter(jnp.asarray(_np(t))) for t in tp]
    jopt2 = getattr(optim, name)([{"params": jp2[:2]}, {"params": jp2[2:]}], **kwargs)
    jopt2.load_state_dict(topt.state_dict())
    tp2 = [torch.nn.Parameter(torch.tensor(np.asarray(j.data))) for j in jp]
    topt2 = getattr(torch.optim, name)([{"params": tp2[:2]}, {"params": tp2[2:]}], **kwargs)
    topt2.load_state_dict(_to_torch(jopt.state_dict()))
    for step in grads[4:]:
        _set_grads(tp, jp2, step)
        _set_grads(tp2, jp, step)
        for o in (topt, jopt2, topt2, jopt):
            o.step()
    _assert_params(tp, jp2)
    _assert_params(tp2, jp)
    _assert_state_dicts(jopt2.state_dict(), topt.state_dict())


@pytest.mark.torch
def test_options_changed_between_steps_follow_torch():
    """Momentum switched on after some steps: torch starts the buffer then, and so does jm."""
    init, grads = _data(seed=2)
    tp, topt, jp, jopt = _pair("SGD", {"lr": 0.1}, init)
    for k, step in enumerate(grads):
        if k == 4:
            for o in (topt, jopt):
                o.param_groups[0]["momentum"] = 0.9
                o.param_groups[0]["lr"] = 0.05
        _set_grads(tp, jp, step)
        topt.step()
        jopt.step()
    _assert_params(tp, jp)
    _assert_state_dicts(jopt.state_dict(), topt.state_dict())


@pytest.mark.torch
def test_parameters_without_grad_are_skipped_and_keep_no_state():
    init, grads = _data(seed=3, steps=3)
    tp, topt, jp, jopt = _pair("Adam", {"lr": 0.1}, init)
    for step in grads:
        _set_grads(tp, jp, [step[0], None, None])
        topt.step()
        jopt.step()
    np.testing.assert_array_equal(_np(jp[1]), init[1])
    assert jp[2] not in jopt.state and jp[0] in jopt.state
    _assert_state_dicts(jopt.state_dict(), topt.state_dict())


def test_step_updates_parameters_in_place_and_state_is_keyed_by_parameter():
    model = jm.nn.Linear(3, 2)
    weight = model.weight
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = np.asarray(weight.data)
    weight.grad = jnp.ones((2, 3))
    opt.step()
    assert model.weight is weight
    np.testing.assert_allclose(np.asarray(weight.data), before - 0.1, rtol=1e-6)
    assert list(opt.state) == [weight]  # bias had no grad
    assert list(opt.state[weight]) == ["momentum_buffer"]
    np.testing.assert_array_equal(opt.state[weight]["momentum_buffer"], np.ones((2, 3)))


@pytest.mark.torch
def test_low_precision_state_keeps_the_parameter_dtype():
    p = jm.nn.Parameter(jnp.ones(4, jnp.bfloat16))
    tp = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt, topt = optim.Adam([p], lr=0.1), torch.optim.Adam([tp], lr=0.1)
    for _ in range(2):
        p.grad, tp.grad = (
            jnp.full(4, 0.5, jnp.bfloat16),
            torch.full((4,), 0.5, dtype=torch.bfloat16),
        )
        opt.step()
        topt.step()
    assert p.dtype == jnp.bfloat16
    for k, v in topt.state_dict()["state"][0].items():
        assert str(opt.state_dict()["state"][0][k].dtype) == str(v.dtype).removeprefix("torch.")
    np.testing.assert_allclose(
        np.asarray(p.data, np.float32), tp.detach().float().numpy(), rtol=1e-2
    )


@pytest.mark.torch
def test_state_dict_round_trips_through_a_jm_checkpoint(tmp_path):
    from jmodule import serialization

    init, grads = _data(seed=10, steps=4)
    tp, topt, jp, jopt = _pair("Adam", {"lr": 0.01, "amsgrad": True}, init)
    for step in grads[:2]:
        _set_grads(tp, jp, step)
        topt.step()
        jopt.step()
    serialization.save({"optimizer": jopt.state_dict()}, tmp_path / "ckpt")
    jp2 = [jm.nn.Parameter(p.data) for p in jp]
    jopt2 = optim.Adam([{"params": jp2[:2]}, {"params": jp2[2:]}], lr=0.01, amsgrad=True)
    jopt2.load_state_dict(serialization.load(tmp_path / "ckpt")["optimizer"])
    for step in grads[2:]:
        _set_grads(tp, jp2, step)
        topt.step()
        jopt2.step()
    _assert_params(tp, jp2)
    _assert_state_dicts(jopt2.state_dict(), topt.state_dict())


# ---------------------------------------------------------------------------- the interface


BAD_ARGS = [
    ("SGD", {"lr": -1.0}),
    ("SGD", {"lr": 0.1, "momentum": -0.5}),
    ("SGD", {"lr": 0.1, "weight_decay": -1.0}),
    ("SGD", {"lr": 0.1, "nesterov": True}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": True}),
    ("Adam", {"lr": -1.0}),
    ("Adam", {"eps": -1.0}),
    ("Adam", {"betas": (1.0, 0.999)}),
    ("Adam", {"betas": (0.9, -0.1)}),
    ("AdamW", {"weight_decay": -0.1}),
    ("RMSprop", {"alpha": -0.1}),
    ("RMSprop", {"momentum": -0.1}),
    ("Adagrad", {"lr_decay": -0.1}),
    ("Adagrad", {"initial_accumulator_value": -0.1}),
    ("Adadelta", {"lr": -1.0}),
    ("Adadelta", {"rho": 1.5}),
    ("Adadelta", {"eps": -1.0}),
    ("Adadelta", {"weight_decay": -1.0}),
    ("Adamax", {"betas": (0.9, 1.0)}),
    ("Adamax", {"eps": -1.0}),
    ("NAdam", {"momentum_decay": -0.1}),
    ("NAdam", {"betas": (-0.1, 0.999)}),
    ("RAdam", {"weight_decay": -0.1}),
    ("RAdam", {"betas": (0.9, 1.0)}),
    ("Rprop", {"lr": -1.0}),
    ("Rprop", {"etas": (1.5, 1.2)}),
    ("Rprop", {"etas": (0.5, 0.9)}),
    ("ASGD", {"lr": -1.0}),
    ("ASGD", {"weight_decay": -1.0}),
    ("Adafactor", {"lr": -1.0}),
    ("Adafactor", {"beta2_decay": 0.5}),
    ("Adafactor", {"eps": (-1.0, 1e-3)}),
    ("Adafactor", {"eps": (None, -1.0)}),
    ("Adafactor", {"d": 0.5}),
    ("Adafactor", {"weight_decay": -1.0}),
]


@pytest.mark.torch
@pytest.mark.parametrize("name, kwargs", BAD_ARGS, ids=[f"{n}-{kw}" for n, kw in BAD_ARGS])
def test_constructor_errors_match_torch(name, kwargs):
    with pytest.raises(Exception) as expected:
        getattr(torch.optim, name)([torch.nn.Parameter(torch.ones(2))], **kwargs)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        getattr(optim, name)([jm.nn.Parameter(jnp.ones(2))], **kwargs)


@pytest.mark.torch
@pytest.mark.parametrize(
    "name",
    [
        *("SGD", "Adam", "AdamW", "RMSprop", "Adagrad"),
        *("Adadelta", "Adamax", "NAdam", "RAdam", "Rprop", "ASGD", "Adafactor"),
    ],
)
def test_param_groups_and_repr_match_torch(name):
    kwargs = {"lr": 0.1}
    t = [torch.nn.Parameter(torch.ones(2)) for _ in range(3)]
    j = [jm.nn.Parameter(jnp.ones(2)) for _ in range(3)]
    topt = getattr(torch.optim, name)([{"params": t[:1]}, {"params": t[1:2], "lr": 0.5}], **kwargs)
    jopt = getattr(optim, name)([{"params": j[:1]}, {"params": j[1:2], "lr": 0.5}], **kwargs)
    topt.add_param_group({"params": [t[2]], "weight_decay": 0.25})
    jopt.add_param_group({"params": [j[2]], "weight_decay": 0.25})
    assert jopt.defaults == topt.defaults
    strip = lambda groups: [{k: v for k, v in g.items() if k != "params"} for g in groups]
    assert strip(jopt.param_groups) == strip(topt.param_groups)
    assert repr(jopt) == repr(topt)
    if name == "Adagrad":  # state exists from construction for the first groups, as torch's
        _assert_state_dicts(jopt.state_dict(), topt.state_dict())
    else:
        assert jopt.state_dict() == topt.state_dict()


@pytest.mark.torch
def test_named_parameters_give_param_names_like_torch():
    tm, jmod = torch.nn.Linear(2, 2), jm.nn.Linear(2, 2)
    topt = torch.optim.SGD(tm.named_parameters(), lr=0.1)
    jopt = optim.SGD(jmod.named_parameters(), lr=0.1)
    assert jopt.state_dict()["param_groups"] == topt.state_dict()["param_groups"]
    with pytest.raises(ValueError, match="cannot add param group without names"):
        jopt.add_param_group({"params": [jm.nn.Parameter(jnp.ones(1))]})


@pytest.mark.torch
def test_add_param_group_errors_match_torch():
    t, j = torch.nn.Parameter(torch.ones(2)), jm.nn.Parameter(jnp.ones(2))
    topt, jopt = torch.optim.SGD([t], lr=0.1), optim.SGD([j], lr=0.1)
    for tgroup, jgroup in [({"params": [t]}, {"params": [j]}), ({"params": {t}}, {"params": {j}})]:
        with pytest.raises(Exception) as expected:
            topt.add_param_group(tgroup)
        with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
            jopt.add_param_group(jgroup)
    with pytest.raises(TypeError, match="optimizer can only optimize Parameters, but one of the"):
        jopt.add_param_group({"params": [jnp.ones(2)]})
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        optim.Adam([])
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        optim.Adam([j], differentiable=True)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    p, q = jm.nn.Parameter(jnp.ones(2)), jm.nn.Parameter(jnp.ones(3))
    opt = optim.SGD([p, q], lr=0.1)
    p.grad = jnp.full(2, 3.0)
    opt.zero_grad(set_to_none=set_to_none)
    assert q.grad is None
    if set_to_none:
        assert p.grad is None
    else:
        np.testing.assert_array_equal(p.grad, np.zeros(2))


@pytest.mark.torch
def test_load_state_dict_errors_match_torch_and_change_nothing():
    t, j = (
        [torch.nn.Parameter(torch.ones(2)) for _ in range(2)],
        [jm.nn.Parameter(jnp.ones(2)) for _ in range(2)],
    )
    topt, jopt = torch.optim.Adam(t), optim.Adam(j)
    for p in j:
        p.grad = jnp.ones(2)
    jopt.step()
    for bad in (
        {"state": {}, "param_groups": [{"params": [0]}, {"params": [1]}]},
        {"state": {}, "param_groups": [{"params": [0]}]},
    ):
        with pytest.raises(ValueError) as expected:
            topt.load_state_dict(bad)
        with pytest.raises(ValueError, match=re.escape(str(expected.value))):
            jopt.load_state_dict(bad)
    good = jopt.state_dict()
    bad = copy.deepcopy(good)
    bad["state"][0]["exp_avg"] = jnp.ones(5)
    del bad["state"][1]["exp_avg_sq"]
    bad["param_groups"][0]["lr"] = 123.0
    with pytest.raises(ValueError) as err:
        jopt.load_state_dict(bad)
    message = str(err.value)
    assert "state[0]['exp_avg']: shape (5,) in the state dict, (2,) expected" in message
    assert "state[1]: keys ['exp_avg', 'step'] in the state dict" in message
    assert "(missing ['exp_avg_sq'])" in message
    assert jopt.param_groups[0]["lr"] == 1e-3  # nothing changed
    assert set(jopt.state_dict()["state"]) == {0, 1}


# ---------------------------------------------------------------------------- any optax transform


@jax.jit(static_argnums=0)
def _optax_step(tx, grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state


def test_wrapped_optax_transformation_matches_plain_optax():
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.05))
    init, grads = _data(seed=4, steps=5)
    params = [jm.nn.Parameter(jnp.asarray(a)) for a in init[:2]]
    opt = optim.Optimizer(params, tx)
    ref = [jnp.asarray(a) for a in init[:2]]
    ref_state = tx.init(ref)
    for step in grads:
        g = [jnp.asarray(step[0]), jnp.asarray(step[1] if step[1] is not None else init[1] * 0)]
        for p, gi in zip(params, g):
            p.grad = gi
        opt.step()
        ref, ref_state = _optax_step(tx, g, ref_state, ref)
        for p, r in zip(params, ref):
            np.testing.assert_allclose(np.asarray(p.data), np.asarray(r), rtol=1e-6, atol=1e-7)
    assert jax.tree.structure(opt.optax_state[0]) == jax.tree.structure(ref_state)


def test_wrapped_optax_keeps_leaf_order_in_large_groups():
    """Twelve parameters: state paths like [10] and [2] must not be mixed up."""
    rng = np.random.default_rng(9)
    init = [rng.standard_normal(k + 1).astype(np.float32) for k in range(12)]
    params = [jm.nn.Parameter(jnp.asarray(a)) for a in init]
    tx = optax.adam(0.1)
    opt = optim.Optimizer(params, tx)
    ref, ref_state = [jnp.asarray(a) for a in init], tx.init([jnp.asarray(a) for a in init])
    for _ in range(3):
        grads = [jnp.asarray(rng.standard_normal(a.shape), jnp.float32) for a in init]
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        ref, ref_state = _optax_step(tx, grads, ref_state, ref)
    for p, r in zip(params, ref):
        np.testing.assert_allclose(np.asarray(p.data), np.asarray(r), rtol=1e-6, atol=1e-7)


def test_wrapped_optax_leaves_gradless_parameters_alone_and_round_trips():
    a, b = jm.nn.Parameter(jnp.ones(2)), jm.nn.Parameter(jnp.ones(3))
    opt = optim.Optimizer([a, b], optax.adamw(0.1, weight_decay=0.5))
    a.grad = jnp.ones(2)
    opt.step()
    np.testing.assert_array_equal(b.data, np.ones(3))  # no grad: unchanged, even by decay
    assert np.all(np.asarray(a.data) < 1)
    sd = opt.state_dict()
    assert sd["state"] == {} and sd["param_groups"] == [{"params": [0, 1]}]
    a2, b2 = jm.nn.Parameter(a.data), jm.nn.Parameter(b.data)
    opt2 = optim.Optimizer([a2, b2], optax.adamw(0.1, weight_decay=0.5))
    opt2.load_state_dict(sd)
    for p in (a, b, a2, b2):
        p.grad = jnp.full(p.shape, 0.5)
    opt.step()
    opt2.step()
    np.testing.assert_array_equal(a.data, a2.data)
    np.testing.assert_array_equal(b.data, b2.data)
    with pytest.raises(TypeError, match=r"takes an optax\.GradientTransformation"):
        optim.Optimizer([a], {"lr": 0.1})


# ---------------------------------------------------------------------------- closures


def _models(seed: int = 5):
    """A torch Linear and two jm Linears with the same weights."""
    torch.manual_seed(seed)
    tm = torch.nn.Linear(4, 2)
    out = []
    for _ in range(2):
        m = jm.nn.Linear(4, 2)
        m.load_state_dict(tm.state_dict())
        out.append(m)
    rng = np.random.default_rng(seed)
    x, y = (
        rng.standard_normal((6, 4)).astype(np.float32),
        rng.standard_normal((6, 2)).astype(np.float32),
    )
    return tm, out, x, y


@pytest.mark.torch
def test_step_with_pytorch_style_closure_matches_torch():
    tm, (jmod, _), x, y = _models()
    topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    jopt = optim.SGD(jmod.parameters(), lr=0.1, momentum=0.9)
    tx, ty, jx, jy = torch.tensor(x), torch.tensor(y), jnp.asarray(x), jnp.asarray(y)

    def torch_closure():
        topt.zero_grad()
        loss = torch.nn.functional.mse_loss(tm(tx), ty)
        loss.backward()
        return loss

    def jm_closure():
        jopt.zero_grad()
        return jm.backward(lambda: jnp.mean((jmod(jx) - jy) ** 2))

    for _ in range(3):
        tloss, jloss = topt.step(torch_closure), jopt.step(jm_closure)
        np.testing.assert_allclose(float(jloss), float(tloss.detach()), rtol=1e-5)
    for (name, t), j in zip(tm.named_parameters(), jmod.parameters()):
        np.testing.assert_allclose(np.asarray(j.data), _np(t), rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.torch
def test_step_with_loss_only_closure_differentiates_it():
    tm, (jmod, _), x, y = _models(seed=6)
    topt = torch.optim.Adam(tm.parameters(), lr=0.05)
    jopt = optim.Adam(jmod.parameters(), lr=0.05)
    tx, ty, jx, jy = torch.tensor(x), torch.tensor(y), jnp.asarray(x), jnp.asarray(y)
    calls = []

    def torch_closure():
        topt.zero_grad()
        loss = torch.nn.functional.mse_loss(tm(tx), ty)
        loss.backward()
        return loss

    def loss_only():
        calls.append(1)
        return jnp.mean((jmod(jx) - jy) ** 2)

    jmod.weight.grad = jnp.full((2, 4), 100.0)  # stale: zero_grad() first, as torch's closure does
    for _ in range(3):
        tloss, jloss = topt.step(torch_closure), jopt.step(loss_only)
        np.testing.assert_allclose(float(jloss), float(tloss.detach()), rtol=1e-5)
    assert len(calls) == 3  # once per step
    for t, j in zip(tm.parameters(), jmod.parameters()):
        np.testing.assert_allclose(np.asarray(j.data), _np(t), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.asarray(j.grad), _np(t.grad), rtol=RTOL, atol=ATOL)


@pytest.mark.torch
def test_closure_hiding_its_backward_in_a_helper_is_pytorch_style():
    _, (jmod, ref), x, _ = _models()
    opt = optim.SGD(jmod.parameters(), lr=0.1)

    def helper():
        return jm.backward(lambda: jmod(jnp.asarray(x)).sum())

    opt.step(lambda: helper())
    jm.backward(lambda: ref(jnp.asarray(x)).sum())
    for p, q in zip(jmod.parameters(), ref.parameters()):
        np.testing.assert_allclose(np.asarray(p.grad), np.asarray(q.grad), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(p.data), np.asarray(q.data - 0.1 * q.grad), rtol=1e-6)


# ---------------------------------------------------------------------------- jm.compile


def _grads_by_hand(model, x, y):
    """Set ``.grad`` of every parameter from ``jax.value_and_grad`` of a pure loss."""
    params = dict(model.named_parameters())

    def loss_fn(values):
        return jnp.mean((jm.func.functional_call(model, values, (x,)) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)({n: p.data for n, p in params.items()})
    for n, p in params.items():
        p.grad = grads[n]
    return loss


@jm.compile
def _train_step(model, opt, x, y):
    opt.zero_grad()
    loss = _grads_by_hand(model, x, y)
    opt.step()
    return loss


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, kwargs, schedule",
    [
        ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}, "onecycle"),
        ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.2}, "onecycle"),
        ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}, "step"),
        ("Adagrad", {"lr": 0.1, "lr_decay": 0.1}, "step"),
        ("Adadelta", {"lr": 0.5, "weight_decay": 0.1}, "step"),
        ("Adamax", {"lr": 0.01, "weight_decay": 0.1}, "onecycle"),
        ("NAdam", {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}, "onecycle"),
        ("RAdam", {"lr": 0.01, "betas": (0.8, 0.9), "weight_decay": 0.1}, "onecycle"),
        ("Rprop", {"lr": 0.05, "maximize": True}, "step"),
        ("ASGD", {"lr": 0.05, "lambd": 0.1, "t0": 2}, "step"),
        ("Adafactor", {"lr": 0.05, "weight_decay": 0.1}, "step"),
    ],
)
def test_compiled_step_matches_eager_and_schedules_never_retrace(name, kwargs, schedule):
    eager = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.ReLU(), jm.nn.Linear(8, 2))
    compiled = copy.deepcopy(eager)
    opts = [getattr(optim, name)(m.parameters(), **kwargs) for m in (eager, compiled)]
    if schedule == "onecycle":  # changes lr and momentum / betas[0] every step
        scheds = [optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=8) for o in opts]
    else:
        scheds = [optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts]
    rng = np.random.default_rng(7)
    x, y = jnp.asarray(rng.standard_normal((5, 4)), jnp.float32), jnp.zeros((5, 2))
    traces = []
    for _ in range(6):
        opts[0].zero_grad()
        loss_eager = _grads_by_hand(eager, x, y)
        opts[0].step()
        loss_compiled = _train_step(compiled, opts[1], x, y)
        np.testing.assert_allclose(float(loss_compiled), float(loss_eager), rtol=1e-5)
        for s in scheds:
            s.step()
        traces.append(jm.compile_stats(_train_step).num_traces)
    # The second call retraces once (.grad goes from None to arrays); lr changes never do.
    assert traces[2:] == [traces[1]] * 4
    for a, b in zip(eager.parameters(), compiled.parameters()):
        np.testing.assert_allclose(np.asarray(b.data), np.asarray(a.data), rtol=1e-5, atol=1e-6)
    for (i, a), b in zip(opts[0].state.items(), opts[1].state.values()):
        assert list(a) == list(b)
        for k in a:
            np.testing.assert_allclose(np.asarray(b[k]), np.asarray(a[k]), rtol=1e-5, atol=1e-6)
    assert opts[1].param_groups[0]["lr"] == opts[0].param_groups[0]["lr"]


@pytest.mark.parametrize("make", [lambda: optax.sgd(0.1), lambda: optax.adam(0.05)])
def test_compiled_step_with_wrapped_optax_matches_eager(make):
    eager = jm.nn.Linear(4, 3)
    compiled = copy.deepcopy(eager)
    opts = [optim.Optimizer(m.parameters(), make()) for m in (eager, compiled)]
    x, y = jnp.ones((2, 4)), jnp.zeros((2, 3))
    for _ in range(3):
        opts[0].zero_grad()
        _grads_by_hand(eager, x, y)
        opts[0].step()
        _train_step(compiled, opts[1], x, y)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        np.testing.assert_allclose(np.asarray(b.data), np.asarray(a.data), rtol=1e-6, atol=1e-7)
    for a, b in zip(jax.tree.leaves(opts[0].optax_state), jax.tree.leaves(opts[1].optax_state)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)


@pytest.mark.torch
def test_compiled_step_with_loss_only_closure():
    _, (eager, compiled), x, y = _models(seed=8)
    opts = [optim.Adam(m.parameters(), lr=0.05) for m in (eager, compiled)]
    jx, jy = jnp.asarray(x), jnp.asarray(y)

    @jm.compile
    def step(model, opt, x, y):
        return opt.step(lambda: jnp.mean((model(x) - y) ** 2))

    for _ in range(3):
        a = opts[0].step(lambda: jnp.mean((eager(jx) - jy) ** 2))
        b = step(compiled, opts[1], jx, jy)
        np.testing.assert_allclose(float(b), float(a), rtol=1e-5)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        np.testing.assert_allclose(np.asarray(b.data), np.asarray(a.data), rtol=1e-5, atol=1e-6)


def test_compiled_function_must_be_given_the_optimizer():
    model = jm.nn.Linear(3, 1)
    opt = optim.Adam(model.parameters())

    @jm.compile
    def step(model, x):
        model.weight.grad = jnp.ones((1, 3)) * x.sum()
        opt.step()

    with pytest.raises(RuntimeError, match=re.escape(NOT_GIVEN_HELP.format(cls="Adam"))):
        step(model, jnp.ones(3))


def test_hyperparameters_changed_inside_a_compiled_step_raise():
    model = jm.nn.Linear(3, 1)
    opt = optim.SGD(model.parameters(), lr=0.1)

    @jm.compile
    def step(model, opt, x):
        opt.param_groups[0]["lr"] = 0.5
        model.weight.grad = jnp.ones((1, 3)) * x.sum()
        opt.step()

    what = "param_groups[0]['lr'] was"
    with pytest.raises(RuntimeError, match=re.escape(CHANGED_INSIDE_HELP.format(what=what))):
        step(model, opt, jnp.ones(3))
    opt.param_groups[0]["lr"] = 0.1

    @jm.compile
    def step2(model, opt, x):
        opt.param_groups[0]["maximize"] = True  # changes the program, not an input
        model.weight.grad = jnp.ones((1, 3)) * x.sum()
        opt.step()

    what = "A param group's options were"
    with pytest.raises(RuntimeError, match=re.escape(CHANGED_INSIDE_HELP.format(what=what))):
        step2(model, opt, jnp.ones(3))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", ["SGD", "AdamW", "Adafactor"])
def test_an_empty_param_group_is_allowed_as_in_torch(name, compiled):
    # torch accepts a group without parameters (one that add_param_group fills later,
    # or a frozen part of a model); a compiled step used to fail with IndexError.
    torch.manual_seed(0)
    tmodel = torch.nn.Linear(3, 2)
    jm.manual_seed(0)
    jmodel = jm.nn.Linear(3, 2)
    jmodel.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    topt = getattr(torch.optim, name)(
        [{"params": list(tmodel.parameters())}, {"params": [], "lr": 0.5}], lr=0.1
    )
    jopt = getattr(optim, name)(
        [{"params": list(jmodel.parameters())}, {"params": [], "lr": 0.5}], lr=0.1
    )
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)

    def jm_step(model, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: (model(x) ** 2).sum())
        opt.step()
        return loss

    step = jm.compile(jm_step) if compiled else jm_step
    for _ in range(3):
        topt.zero_grad()
        tloss = (tmodel(torch.from_numpy(x)) ** 2).sum()
        tloss.backward()
        topt.step()
        jloss = step(jmodel, jopt, jnp.asarray(x))
        np.testing.assert_allclose(float(jloss), tloss.item(), rtol=1e-4)
    for (k, t), j in zip(tmodel.state_dict().items(), jmodel.state_dict().values()):
        np.testing.assert_allclose(np.asarray(j), t.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
    assert jopt.state_dict()["param_groups"] == topt.state_dict()["param_groups"]
