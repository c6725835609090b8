"""Packed optimizer state (small parameters share flat arrays) against torch.optim, live.

Every PyTorch optimizer packs the state of a group's small parameters, and the
large ones on the same devices share their step counts (see
``jmodule/optim/_packed.py``). These tests check that packing changes nothing a
user can see: the same updates as PyTorch when parameters skip steps (their
counts part ways), eagerly and compiled; ``opt.state[p]`` reads and writes
like PyTorch's live dict; state dicts interchange with PyTorch's.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jmodule as jm
from jmodule import optim
from jmodule.optim import PackedState
from jmodule.optim._packed import PACK_MAX_ELEMENTS

pytestmark = pytest.mark.torch

CASES = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    ("AdamW", {"lr": 0.01, "maximize": True}),
    ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05}),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw in CASES]
#: Four small parameters (packed together) and two too large to pack (they share
#: their step counts when the optimizer keeps one).
SHAPES = [(3, 4), (4,), (2, 3), (5,), (PACK_MAX_ELEMENTS // 64 + 1, 64), (PACK_MAX_ELEMENTS + 3,)]
RTOL, ATOL = 2e-5, 1e-5  # the large parameter sees rare float32 cancellations


def _setup(name: str, kwargs: dict, seed: int = 0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    jp = [jm.nn.Parameter(jnp.asarray(a)) for a in init]
    return tp, getattr(torch.optim, name)(tp, **kwargs), jp, getattr(optim, name)(jp, **kwargs)


def _grads(rng: np.random.Generator, skip: set[int]) -> list[np.ndarray | None]:
    return [
        None if i in skip else rng.standard_normal(s).astype(np.float32)
        for i, s in enumerate(SHAPES)
    ]


def _assert_same(tp, topt, jp, jopt):
    for t, j in zip(tp, jp):
        np.testing.assert_allclose(np.asarray(j.data), t.detach().numpy(), rtol=RTOL, atol=ATOL)
    tsd, jsd = topt.state_dict(), jopt.state_dict()
    assert list(jsd["state"]) == list(tsd["state"])
    for i, tstate in tsd["state"].items():
        assert list(jsd["state"][i]) == list(tstate)
        for k, v in tstate.items():
            np.testing.assert_allclose(
                np.asarray(jsd["state"][i][k]), v.numpy(), rtol=RTOL, atol=ATOL
            )


def _step_both(tp, topt, jp, jopt, grads):
    """Give both frameworks the same gradients (None = no gradient) and step."""
    for t, j, g in zip(tp, jp, grads):
        t.grad = None if g is None else torch.tensor(g)
        j.grad = None if g is None else jnp.asarray(g)
    topt.step()
    jopt.step()


#: Which parameters have no gradient at each step: all step together first (one
#: count for the bucket), then they part ways, then all step again.
SKIPS = [set(), set(), {1}, {0, 4}, set(), {3}, set()]


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_packed_steps_match_torch_when_parameters_skip_steps(name, kwargs):
    tp, topt, jp, jopt = _setup(name, kwargs)
    rng = np.random.default_rng(1)
    for skip in SKIPS:
        grads = _grads(rng, skip)
        _step_both(tp, topt, jp, jopt, grads)
        _assert_same(tp, topt, jp, jopt)
    # The four small parameters share packed state; the large ones keep their own
    # arrays and share their per-parameter scalars (step counts, SGD's first-step flag).
    assert all(isinstance(jopt.state[p], PackedState) for p in jp)


@jm.compile
def _compiled_step(opt, grads):
    for p, g in zip(opt.param_groups[0]["params"], grads):
        p.grad = g
    opt.step()


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_packed_compiled_steps_match_torch(name, kwargs):
    tp, topt, jp, jopt = _setup(name, kwargs, seed=2)
    rng = np.random.default_rng(3)
    for skip in SKIPS:
        grads = _grads(rng, skip)
        for t, g in zip(tp, grads):
            t.grad = None if g is None else torch.tensor(g)
        topt.step()
        _compiled_step(jopt, [None if g is None else jnp.asarray(g) for g in grads])
        _assert_same(tp, topt, jp, jopt)
    assert all(isinstance(jopt.state[p], PackedState) for p in jp[:4])


@pytest.mark.slow
def test_packed_state_is_a_live_view_like_torchs_dict():
    tp, topt, jp, jopt = _setup("Adam", {"lr": 0.05})
    rng = np.random.default_rng(4)
    for _ in range(2):
        _step_both(tp, topt, jp, jopt, _grads(rng, set()))
    view = jopt.state[jp[1]]
    assert isinstance(view, PackedState)
    assert list(view) == list(topt.state[tp[1]])
    np.testing.assert_allclose(
        np.asarray(view["exp_avg"]), topt.state[tp[1]]["exp_avg"].numpy(), rtol=RTOL, atol=ATOL
    )
    # Writing an entry changes the next step, in both frameworks.
    new = rng.standard_normal(SHAPES[1]).astype(np.float32)
    topt.state[tp[1]]["exp_avg"] = torch.tensor(new)
    view["exp_avg"] = jnp.asarray(new)
    topt.state[tp[2]]["step"] = torch.tensor(7.0)
    jopt.state[jp[2]]["step"] = 7
    np.testing.assert_array_equal(np.asarray(jopt.state[jp[1]]["exp_avg"]), new)
    _step_both(tp, topt, jp, jopt, _grads(rng, set()))
    _assert_same(tp, topt, jp, jopt)
    # The same for the large parameters, whose entries are their own arrays.
    big = rng.standard_normal(SHAPES[5]).astype(np.float32)
    topt.state[tp[5]]["exp_avg_sq"] = torch.tensor(np.abs(big))
    jopt.state[jp[5]]["exp_avg_sq"] = jnp.abs(jnp.asarray(big))
    topt.state[tp[4]]["step"] = torch.tensor(11.0)
    jopt.state[jp[4]]["step"] = 11
    assert isinstance(jopt.state[jp[5]], PackedState)
    _step_both(tp, topt, jp, jopt, _grads(rng, set()))
    _assert_same(tp, topt, jp, jopt)
    with pytest.raises(ValueError, match="parameter's shape"):
        view["exp_avg"] = jnp.zeros(3)
    with pytest.raises(ValueError, match="parameter's shape"):
        jopt.state[jp[5]]["exp_avg"] = jnp.zeros(3)
    with pytest.raises(KeyError, match="exp_avg_sq"):
        view["momentum_buffer"] = jnp.zeros(4)
    with pytest.raises(TypeError, match="cannot be deleted"):
        del view["exp_avg"]


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_packed_state_dicts_interchange_with_torch(name, kwargs):
    tp, topt, jp, jopt = _setup(name, kwargs, seed=5)
    rng = np.random.default_rng(6)
    for skip in SKIPS[:4]:  # torch's state, counts already parted
        grads = _grads(rng, skip)
        for t, g in zip(tp, grads):
            t.grad = None if g is None else torch.tensor(g)
        topt.step()
    for j, t in zip(jp, tp):
        j.data = jnp.asarray(t.detach().numpy())
    tsd = topt.state_dict()
    jopt.load_state_dict(
        {
            "state": {
                i: {k: jnp.asarray(v.numpy()) for k, v in s.items()}
                for i, s in tsd["state"].items()
            },
            "param_groups": tsd["param_groups"],
        }
    )
    for skip in SKIPS[4:]:
        grads = _grads(rng, skip)
        _step_both(tp, topt, jp, jopt, grads)
        _assert_same(tp, topt, jp, jopt)
    # And back: jm's state dict loads into a fresh torch optimizer that then agrees.
    tp2 = [torch.nn.Parameter(torch.tensor(np.asarray(j.data))) for j in jp]
    topt2 = getattr(torch.optim, name)(tp2, **kwargs)
    jsd = jopt.state_dict()
    topt2.load_state_dict(
        {
            "state": {
                i: {k: torch.tensor(np.asarray(v)) for k, v in s.items()}
                for i, s in jsd["state"].items()
            },
            "param_groups": jsd["param_groups"],
        }
    )
    grads = _grads(rng, {2})
    _step_both(tp2, topt2, jp, jopt, grads)
    _assert_same(tp2, topt2, jp, jopt)


def test_options_changed_between_steps_repack_and_follow_torch():
    """Momentum switched on mid-run: plain SGD keeps no state, then each parameter gets a buffer."""
    tp, topt, jp, jopt = _setup("SGD", {"lr": 0.1})
    rng = np.random.default_rng(8)
    for k, skip in enumerate(SKIPS):
        if k == 2:
            for g in (*topt.param_groups, *jopt.param_groups):
                g["momentum"] = 0.9
        grads = _grads(rng, skip)
        _step_both(tp, topt, jp, jopt, grads)
        _assert_same(tp, topt, jp, jopt)
    assert all(isinstance(jopt.state[p], PackedState) for p in jp[:4])


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs", CASES, ids=IDS)
def test_a_scalar_parameter_packs_with_vectors(name, kwargs):
    """A 0-d parameter first in its group: its elementwise state is still elementwise."""
    init = [np.float32(0.5), np.arange(3, dtype=np.float32), np.ones((2, 2), np.float32)]
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    jp = [jm.nn.Parameter(jnp.asarray(a)) for a in init]
    topt, jopt = getattr(torch.optim, name)(tp, **kwargs), getattr(optim, name)(jp, **kwargs)
    rng = np.random.default_rng(9)
    for skip in [set(), {2}, set()]:
        grads = [
            None if i in skip else rng.standard_normal(np.shape(a)).astype(np.float32)
            for i, a in enumerate(init)
        ]
        _step_both(tp, topt, jp, jopt, grads)
        _assert_same(tp, topt, jp, jopt)


@pytest.mark.parametrize("limit", ["above", "below"])
def test_an_optimizer_over_many_elements_packs_nothing_and_steps_the_same(monkeypatch, limit):
    # Packing pays in a small step; in a large one its gathers cost more than the
    # arrays it saves (nanoGPT: 1.05x plain JAX with AdamW's state packed, 1.01x not).
    from jmodule._lowering import flat
    from jmodule.optim._packed import Bucket

    total = sum(int(np.prod(s)) for s in SHAPES)
    monkeypatch.setattr(flat, "PACK_MAX_TOTAL", total if limit == "above" else total - 1)
    tp, topt, jp, jopt = _setup("Adam", {"lr": 0.01})
    rng = np.random.default_rng(1)
    for skip in SKIPS[:3]:
        _step_both(tp, topt, jp, jopt, _grads(rng, skip))
    packed = [p in jopt._packed and type(jopt._packed[p][0]) is Bucket for p in jp]
    assert packed == ([True] * 4 + [False] * 2 if limit == "above" else [False] * 6)
    _assert_same(tp, topt, jp, jopt)
