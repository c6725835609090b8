"""``opt.step(closure)`` whose closure calls a ``jm.compile``'d function (issue 16).

PyTorch is the reference, live: ``def closure(): opt.zero_grad(); loss =
loss_fn(model(x), y); loss.backward(); return loss`` trains, and so must the
jmodule closure whose forward and backward are one compiled program
(``jm.backward`` inside ``jm.compile``), whether ``opt.zero_grad()`` runs
outside it or inside it, and the loss-only closure whose loss comes from a
compiled function without ``jm.backward`` (jmodule differentiates it). Ten
steps in float64 to 1e-10 for SGD and for LBFGS (many closure calls per
step, with and without the strong-Wolfe line search), eagerly and with the
whole step inside ``jm.compile``. The compiled function is traced once.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import optim


def _net(nn):
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))


def _setup(seed=0, dtype=torch.float64, net=_net):
    torch.manual_seed(seed)
    tm = net(torch.nn).to(dtype)
    jmod = net(jm.nn).to(jm.float64 if dtype == torch.float64 else jm.float32)
    jmod.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 3))
    y = np.sin(x.sum(1, keepdims=True))
    npdtype = np.float64 if dtype == torch.float64 else np.float32
    return tm, jmod, x.astype(npdtype), y.astype(npdtype)


def _torch_closure(tm, topt, x, y):
    tx, ty = torch.tensor(x), torch.tensor(y)

    def closure():
        topt.zero_grad()
        loss = ((tm(tx) - ty) ** 2).mean()
        loss.backward()
        return loss

    return closure


def _mse(model, x, y):
    return ((model(x) - y) ** 2).mean()


KINDS = ["backward-inside", "zero-grad-and-backward-inside", "loss-only"]


def _jm_closure(kind, jmod, jopt, x, y):
    """``(closure, the compiled function it calls)``, each compiled function new."""
    jx, jy = jnp.asarray(x), jnp.asarray(y)
    if kind == "backward-inside":

        @jm.compile
        def fwd_bwd(model, x, y):
            return jm.backward(lambda: _mse(model, x, y))

        def closure():
            jopt.zero_grad()
            return fwd_bwd(jmod, jx, jy)

        return closure, fwd_bwd
    if kind == "zero-grad-and-backward-inside":
        if isinstance(jopt, optim.LBFGS):  # not an argument of a compiled function (tested)

            @jm.compile
            def zero_fwd_bwd(model, x, y):
                model.zero_grad()
                return jm.backward(lambda: _mse(model, x, y))

            return (lambda: zero_fwd_bwd(jmod, jx, jy)), zero_fwd_bwd

        @jm.compile
        def zero_fwd_bwd(model, opt, x, y):
            opt.zero_grad()
            return jm.backward(lambda: _mse(model, x, y))

        return (lambda: zero_fwd_bwd(jmod, jopt, jx, jy)), zero_fwd_bwd

    @jm.compile
    def loss_fn(model, x, y):  # no jm.backward: step(closure) differentiates it
        return _mse(model, x, y)

    return (lambda: loss_fn(jmod, jx, jy)), loss_fn


def _assert_same(tm, jmod, tl, jl, tol):
    np.testing.assert_allclose(float(jl), tl.item(), rtol=tol, atol=tol)
    for (name, t), j in zip(tm.named_parameters(), jmod.parameters()):
        np.testing.assert_allclose(
            np.asarray(j.data), t.detach().numpy(), rtol=tol, atol=tol, err_msg=name
        )


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("warm", [False, True], ids=["first-traced-in-step", "traced-before"])
@pytest.mark.parametrize("kind", KINDS)
def test_sgd_step_with_a_compiled_closure_trains_like_torch(kind, warm):
    with jax.enable_x64(True):
        tm, jmod, x, y = _setup()
        topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
        jopt = optim.SGD(jmod.parameters(), lr=0.1, momentum=0.9)
        torch_closure = _torch_closure(tm, topt, x, y)
        closure, compiled = _jm_closure(kind, jmod, jopt, x, y)
        if warm:  # traced outside any step first: its later calls must still say so
            closure()
            jopt.zero_grad()
        for i in range(10):
            if i == 2:
                traces = jm.compile_stats(compiled).num_traces
            tl = topt.step(torch_closure)
            jl = jopt.step(closure)
            assert isinstance(jl, jax.Array) and not isinstance(jl, jax.core.Tracer)
            assert jl.dtype == jnp.float64
            _assert_same(tm, jmod, tl, jl, 1e-10)
            for (name, t), j in zip(tm.named_parameters(), jmod.parameters()):
                np.testing.assert_allclose(
                    np.asarray(j.grad), t.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=name
                )
        # Traced at most twice (a first call inside the step is traced as differentiated
        # before it is seen to run jm.backward; the later calls are plain donating ones),
        # and never again after the first steps.
        assert jm.compile_stats(compiled).num_traces == traces <= 2


@pytest.mark.slow
@pytest.mark.torch
def test_the_issue_repro_moves_the_weights_every_call_in_float32():
    tm, jmod, x, y = _setup(seed=3, dtype=torch.float32, net=lambda nn: nn.Linear(3, 1))
    topt = torch.optim.SGD(tm.parameters(), lr=0.1)
    jopt = optim.SGD(jmod.parameters(), lr=0.1)
    torch_closure = _torch_closure(tm, topt, x, y)
    closure, _ = _jm_closure("backward-inside", jmod, jopt, x, y)
    losses, weights = [], [np.asarray(jmod.weight.data)]
    for _ in range(4):
        tl, jl = topt.step(torch_closure), jopt.step(closure)
        _assert_same(tm, jmod, tl, jl, 1e-5)
        losses.append(float(jl))
        weights.append(np.asarray(jmod.weight.data))
    assert all(b < a for a, b in itertools.pairwise(losses))
    assert all(not np.array_equal(a, b) for a, b in itertools.pairwise(weights))


LBFGS_OPTIONS = [
    {"lr": 0.5, "max_iter": 4, "history_size": 3, "line_search_fn": None},
    {"max_iter": 4, "history_size": 3, "line_search_fn": "strong_wolfe"},
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kwargs", LBFGS_OPTIONS, ids=["fixed-step", "strong_wolfe"])
def test_lbfgs_step_with_a_compiled_closure_trains_like_torch(kwargs, kind):
    with jax.enable_x64(True):
        tm, jmod, x, y = _setup(seed=0)
        topt = torch.optim.LBFGS(tm.parameters(), **kwargs)
        jopt = optim.LBFGS(jmod.parameters(), **kwargs)
        torch_closure = _torch_closure(tm, topt, x, y)
        closure, compiled = _jm_closure(kind, jmod, jopt, x, y)
        for i in range(10):
            if i == 2:
                traces = jm.compile_stats(compiled).num_traces
            tl = topt.step(torch_closure)
            jl = jopt.step(closure)
            _assert_same(tm, jmod, tl, jl, 1e-10)
        tstate = topt.state_dict()["state"][0]
        jstate = jopt.state_dict()["state"][0]
        assert tstate["func_evals"] > 10 * 3  # the closure ran many times per step
        assert (jstate["func_evals"], jstate["n_iter"]) == (tstate["func_evals"], tstate["n_iter"])
        assert jm.compile_stats(compiled).num_traces == traces <= 2


@pytest.mark.torch
@pytest.mark.parametrize("kind", KINDS)
def test_a_compiled_step_whose_closure_calls_a_compiled_function(kind):
    with jax.enable_x64(True):
        tm, jmod, x, y = _setup(seed=2)
        topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
        jopt = optim.SGD(jmod.parameters(), lr=0.1, momentum=0.9)
        torch_closure = _torch_closure(tm, topt, x, y)
        closure, _ = _jm_closure(kind, jmod, jopt, x, y)

        @jm.compile
        def train(model, opt, x, y):  # the closure's model and opt are these, bound here
            return opt.step(closure)

        jx, jy = jnp.asarray(x), jnp.asarray(y)
        for _ in range(10):
            tl = topt.step(torch_closure)
            jl = train(jmod, jopt, jx, jy)
            _assert_same(tm, jmod, tl, jl, 1e-10)


def test_compiled_values_of_parameters_made_before_the_compiled_backward_raise():
    jmod = jm.nn.Linear(3, 1)
    jopt = optim.SGD(jmod.parameters(), lr=0.1)
    x = jnp.ones((4, 3))

    @jm.compile
    def weighted(model, x, h):  # h is a constant here; in PyTorch it would be differentiated
        return jm.backward(lambda: (model(x) * h).sum())

    def closure():
        jopt.zero_grad()
        return weighted(jmod, x, jmod(x))

    before = [np.asarray(p.data) for p in jmod.parameters()]
    for _ in range(2):  # the call that traces it, and a later one
        with pytest.raises(RuntimeError, match=r"computed with parameters before it called"):
            jopt.step(closure)
        assert all(p.grad is None for p in jmod.parameters())
        for b, p in zip(before, jmod.parameters()):
            np.testing.assert_array_equal(np.asarray(p.data), b)
    detached = lambda: weighted(jmod, x, jax.lax.stop_gradient(jmod(x)))
    jopt.zero_grad()
    jopt.step(detached)  # a constant in PyTorch too: fine
    assert all(p.grad is not None for p in jmod.parameters())


class _Tracked:
    """A module that keeps a statistic of its parameters' output in a buffer."""

    @staticmethod
    def build(nn, torch_side):
        class Tracked(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 2)
                self.register_buffer("stat", torch.zeros(()) if torch_side else jnp.zeros(()))

            def forward(self, x):
                out = self.lin(x)
                self.stat = out.mean().detach() if torch_side else out.mean()
                return out

        return Tracked()


@pytest.mark.torch
@pytest.mark.parametrize("how", ["eager", "compiled-loss-only-closure"])
def test_buffer_written_from_the_parameters_under_a_gradient_keeps_its_value(how):
    torch.manual_seed(0)
    tm = _Tracked.build(torch.nn, True)
    jmod = _Tracked.build(jm.nn, False)
    jmod.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    tm(torch.tensor(x)).pow(2).sum().backward()
    if how == "eager":
        jm.backward(lambda: (jmod(jnp.asarray(x)) ** 2).sum())
    else:
        loss_fn = jm.compile(lambda m, x: (m(x) ** 2).sum())
        optim.SGD(jmod.parameters(), lr=0.0).step(lambda: loss_fn(jmod, jnp.asarray(x)))
    assert not isinstance(jmod.stat, jax.core.Tracer)
    np.testing.assert_allclose(np.asarray(jmod.stat), tm.stat.item(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        np.asarray(jmod.lin.weight.grad), tm.lin.weight.grad.numpy(), rtol=1e-5, atol=1e-6
    )


def test_lbfgs_as_an_argument_of_a_compiled_closure_says_what_to_do():
    model = jm.nn.Linear(2, 1)
    opt = optim.LBFGS(model.parameters())
    x = jnp.ones((3, 2))

    @jm.compile
    def zero_fwd_bwd(model, opt, x):
        opt.zero_grad()
        return jm.backward(lambda: model(x).sum())

    with pytest.raises(RuntimeError, match=r"call model\.zero_grad\(\) there"):
        opt.step(lambda: zero_fwd_bwd(model, opt, x))
    assert all(p.grad is None for p in model.parameters())
