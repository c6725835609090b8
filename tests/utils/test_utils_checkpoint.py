"""jm.utils.checkpoint: activation checkpointing on jax.checkpoint.

Every checkpointed run is compared with the same run without checkpointing
(values, gradients, buffers, the random stream), and a small MLP block with
torch.utils.checkpoint live.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule.utils.checkpoint import checkpoint, checkpoint_sequential

tcp = torch.utils.checkpoint

F = jm.nn.functional


def _close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _block(seed: int = 0) -> jm.nn.Module:
    jm.manual_seed(seed)
    return jm.nn.Sequential(
        jm.nn.Linear(4, 8),
        jm.nn.BatchNorm1d(8),
        jm.nn.GELU(),
        jm.nn.Dropout(0.5),
        jm.nn.Linear(8, 3),
    )


X = jnp.arange(24.0).reshape(6, 4) / 10


def _eager_run(wrap, dtype=jnp.float32):
    """One jm.backward through ``wrap(block, x)``: loss, grads, buffers, the generator key."""
    block = _block().to(dtype)
    jm.manual_seed(7)
    x = X.astype(dtype)
    loss = jm.backward(lambda: (wrap(block, x) ** 2).sum())
    grads = {n: p.grad for n, p in block.named_parameters()}
    bufs = {n: jnp.asarray(b) for n, b in block.named_buffers()}
    return loss, grads, bufs, jm.random.default_generator.get_state()


def _assert_same_run(a, b):
    _close(a[0], b[0])
    for n in a[1]:
        _close(a[1][n], b[1][n])
    for n in a[2]:
        _close(a[2][n], b[2][n])
    np.testing.assert_array_equal(np.asarray(a[3]), np.asarray(b[3]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "wrap",
    [
        lambda b, x: checkpoint(b, x, use_reentrant=False),
        lambda b, x: checkpoint(lambda y: b(y), x, use_reentrant=False),
        lambda b, x: checkpoint(b.forward, x, use_reentrant=False),
        lambda b, x: checkpoint(functools.partial(lambda m, y: m(y), b), x, use_reentrant=False),
        lambda b, x: checkpoint(lambda m, y: m(y), b, x, use_reentrant=False),
    ],
    ids=["module", "closure", "bound_method", "partial", "module_argument"],
)
def test_eager_same_as_without(wrap):
    """Loss, .grad, BatchNorm statistics and the dropout stream equal the direct call's.

    In float64: the gradient of the weight before the BatchNorm is a difference of
    near-equal terms, whose float32 rounding depends on how each run groups them.
    """
    with jax.enable_x64(True):
        _assert_same_run(_eager_run(wrap, jnp.float64), _eager_run(lambda b, x: b(x), jnp.float64))


@pytest.mark.slow
def test_dropout_recompute_sees_forward_draws():
    """The backward recomputation replays the forward's dropout mask (grads match the mask)."""
    jm.manual_seed(3)
    w = jm.nn.Parameter(jnp.ones((5, 5)))
    drop = jm.nn.Dropout(0.5)
    x = jnp.ones((5,))

    def f(v):
        return drop(v @ w)

    jm.backward(lambda: checkpoint(f, x, use_reentrant=False).sum())
    kept = np.asarray(w.grad[0]) != 0  # d(sum)/dW[i, j] = x_i * mask_j * 2
    _close(w.grad, np.tile(np.where(kept, 2.0, 0.0), (5, 1)))
    assert 0 < kept.sum() < 5


def _compiled_run(ck: bool, policy=None, steps: int = 3, dtype=jnp.float32):
    block = _block().to(dtype)
    x = X.astype(dtype)
    opt = jm.optim.Adam(block.parameters(), lr=1e-2)
    jm.manual_seed(11)

    @jm.compile
    def step(m, opt, x):
        opt.zero_grad()
        out = checkpoint(m, x, use_reentrant=False, policy=policy) if ck else m(x)
        del out
        loss = jm.backward(
            lambda: (
                (checkpoint(m, x, use_reentrant=False, policy=policy) if ck else m(x)) ** 2
            ).mean()
        )
        opt.step()
        return loss

    losses = [step(block, opt, x) for _ in range(steps)]
    return (
        losses,
        {n: p.data for n, p in block.named_parameters()},
        {n: jnp.asarray(b) for n, b in block.named_buffers()},
        jm.random.default_generator.get_state(),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy", [None, "dots_saveable", jax.checkpoint_policies.nothing_saveable]
)
def test_compiled_training_step_same_as_without(policy):
    """A jm.compile'd Adam step (a forward outside and one inside jm.backward, each
    checkpointed): per-step losses, weights, BatchNorm buffers and the key as without.

    In float64: in float32 the recomputed forward may round differently (XLA fuses it
    otherwise), and three Adam steps, which normalise small gradients, grow that to 1e-5
    on some CPUs (1e-10 in float64)."""
    with jax.enable_x64(True):
        a = _compiled_run(True, policy, dtype=jnp.float64)
        b = _compiled_run(False, dtype=jnp.float64)
        for la, lb in zip(a[0], b[0]):
            _close(la, lb, rtol=1e-8, atol=1e-10)
        for part in (1, 2):
            for n in a[part]:
                assert a[part][n].dtype == jnp.float64 or "num_batches" in n
                _close(a[part][n], b[part][n], rtol=1e-8, atol=1e-10)
        np.testing.assert_array_equal(np.asarray(a[3]), np.asarray(b[3]))


def test_functional_call_under_jax_grad():
    """Through jm.func.functional_call under jax.grad the gradient is the direct one."""
    lin = jm.nn.Linear(4, 3)
    params = dict(lin.named_parameters())
    params = {k: jnp.asarray(v) for k, v in params.items()}

    def loss(p, ck):
        call = lambda x: jm.func.functional_call(lin, p, (x,))
        y = checkpoint(call, X, use_reentrant=False) if ck else call(X)
        return jnp.tanh(y).sum()

    ga = jax.grad(loss)(params, True)
    gb = jax.grad(loss)(params, False)
    for k in ga:
        _close(ga[k], gb[k])


def _torch_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 5)
    )


def _jm_mlp(t):
    m = jm.nn.Sequential(
        jm.nn.Linear(5, 16), jm.nn.GELU(), jm.nn.LayerNorm(16), jm.nn.Linear(16, 5)
    )
    m.load_state_dict(t.state_dict())
    return m


@pytest.mark.slow
@pytest.mark.torch
def test_against_torch_checkpoint():
    """Outputs and parameter/input gradients equal torch.utils.checkpoint's (non-reentrant)."""
    t = _torch_mlp()
    j = _jm_mlp(t)
    xn = np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)
    xt = torch.tensor(xn, requires_grad=True)
    out_t = tcp.checkpoint(t, xt, use_reentrant=False)
    (out_t.sin().sum()).backward()

    xj = jm.nn.Parameter(jnp.asarray(xn))
    jm.backward(lambda: jnp.sin(checkpoint(j, xj, use_reentrant=False)).sum())
    _close(checkpoint(j, xj, use_reentrant=False), out_t.detach().numpy())
    _close(xj.grad, xt.grad.numpy())
    for (n, pt), (_, pj) in zip(t.named_parameters(), j.named_parameters()):
        _close(pj.grad, pt.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.torch
def test_checkpoint_sequential_against_torch():
    """checkpoint_sequential chunks as torch does (the last chunk unchecked): same values/grads."""
    torch.manual_seed(1)
    layers_t = [torch.nn.Linear(4, 4) for _ in range(5)]
    seq_t = torch.nn.Sequential(*[m for lin in layers_t for m in (lin, torch.nn.Tanh())])
    seq_j = jm.nn.Sequential(*[m for _ in layers_t for m in (jm.nn.Linear(4, 4), jm.nn.Tanh())])
    seq_j.load_state_dict(seq_t.state_dict())
    xn = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    out_t = tcp.checkpoint_sequential(seq_t, 3, torch.tensor(xn), use_reentrant=False)
    out_t.sum().backward()
    run = lambda: checkpoint_sequential(seq_j, 3, jnp.asarray(xn), use_reentrant=False)
    jm.backward(lambda: run().sum())
    _close(run(), out_t.detach().numpy())
    for (_, pt), (_, pj) in zip(seq_t.named_parameters(), seq_j.named_parameters()):
        _close(pj.grad, pt.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_policy_by_name_equals_policy_object():
    a = _eager_run(lambda b, x: checkpoint(b, x, use_reentrant=False, policy="dots_saveable"))
    b = _eager_run(
        lambda b, x: checkpoint(
            b, x, use_reentrant=False, policy=jax.checkpoint_policies.dots_saveable
        )
    )
    _assert_same_run(a, b)


def test_unknown_policy_name_raises():
    with pytest.raises(ValueError, match=r"unknown policy 'dots_saved'.*dots_saveable"):
        checkpoint(jm.nn.Linear(2, 2), jnp.ones(2), use_reentrant=False, policy="dots_saved")


def test_use_reentrant_true_raises_saying_why():
    with pytest.raises(ValueError, match=r"non-reentrant.*no autograd tape"):
        checkpoint(jm.nn.Linear(2, 2), jnp.ones(2), use_reentrant=True)
    with pytest.raises(ValueError, match="non-reentrant"):
        checkpoint_sequential([jm.nn.Linear(2, 2)], 1, jnp.ones(2), use_reentrant=True)


@pytest.mark.torch
def test_use_reentrant_not_passed_warns_like_torch():
    """Torch warns when use_reentrant is not passed; so do we (and run non-reentrant)."""
    with warnings.catch_warnings(record=True) as seen_t:
        warnings.simplefilter("always")
        tcp.checkpoint(torch.nn.Linear(2, 2), torch.ones(2))
    assert any("use_reentrant" in str(w.message) for w in seen_t)
    lin = jm.nn.Linear(2, 2)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        out = checkpoint(lin, jnp.ones(2))
    _close(out, lin(jnp.ones(2)))
    with pytest.warns(UserWarning, match="checkpoint_sequential: the use_reentrant"):
        checkpoint_sequential([lin], 1, jnp.ones(2))


def test_unsupported_torch_options_raise():
    lin = jm.nn.Linear(2, 2)
    x = jnp.ones(2)
    with pytest.raises(ValueError, match="preserve_rng_state=False"):
        checkpoint(lin, x, use_reentrant=False, preserve_rng_state=False)
    with pytest.raises(ValueError, match="context_fn"):
        checkpoint(lin, x, use_reentrant=False, context_fn=lambda: (None, None))
    with pytest.raises(ValueError, match="debug"):
        checkpoint(lin, x, use_reentrant=False, debug=True)
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint(lin, x, use_reentrant=False, determinism_check="always")


def test_kwargs_and_static_arguments_pass_through():
    def f(x, scale, *, shift, mode):
        return x * scale + shift if mode == "affine" else x

    out = checkpoint(f, X, 2.0, shift=jnp.ones(4), mode="affine", use_reentrant=False)
    _close(out, X * 2.0 + 1)


_GLOBAL_BN = jm.nn.BatchNorm1d(4)


def _uses_global(x):
    return _GLOBAL_BN(x)


def test_buffer_of_a_module_not_held_raises():
    """A buffer write to a module fn reaches only through a global cannot leave the region."""
    with pytest.raises(jm.TracerLeakError, match="does not hold"):
        checkpoint(_uses_global, X, use_reentrant=False)
    _close(_GLOBAL_BN.running_mean, jnp.zeros(4))


def test_buffer_of_a_module_not_held_raises_compiled():
    """Inside jm.compile too (the program binds the module, the region does not hold it)."""

    class Outer(jm.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = _GLOBAL_BN

        def forward(self, x):
            return checkpoint(_uses_global, x, use_reentrant=False)

    model = Outer()
    step = jm.compile(lambda m, x: m(x))
    with pytest.raises(jm.TracerLeakError, match="does not hold"):
        step(model, X)
    _close(_GLOBAL_BN.running_mean, jnp.zeros(4))


@pytest.mark.slow
def test_nested_checkpoint_and_outputs_pytree():
    lin = jm.nn.Linear(4, 4)

    def inner(x):
        return {"y": lin(x), "n": 3}

    def outer(x):
        d = checkpoint(inner, x, use_reentrant=False)
        return d["y"] * d["n"]

    jm.backward(lambda: checkpoint(outer, X, use_reentrant=False).sum())
    g = lin.weight.grad
    lin.zero_grad()
    jm.backward(lambda: (lin(X) * 3).sum())
    _close(g, lin.weight.grad)


class _Stack(jm.nn.Module):
    def __init__(self, n: int, ck: bool):
        super().__init__()
        self.blocks = jm.nn.ModuleList(
            [
                jm.nn.Sequential(
                    jm.nn.LayerNorm(16), jm.nn.Linear(16, 64), jm.nn.GELU(), jm.nn.Linear(64, 16)
                )
                for _ in range(n)
            ]
        )
        self.ck = ck

    def forward(self, x):
        for b in self.blocks:
            x = x + (checkpoint(b, x, use_reentrant=False) if self.ck else b(x))
        return (x**2).mean()


def _lowered_step(ck: bool):
    jm.manual_seed(0)
    model = _Stack(6, ck)
    opt = jm.optim.Adam(model.parameters(), lr=1e-3)

    @jm.compile
    def step(m, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: m(x))
        opt.step()
        return loss

    return step.lower(model, opt, jnp.ones((8, 32, 16)))


@pytest.mark.slow
def test_compiled_step_recomputes_each_block():
    """The program handed to XLA recomputes every checkpointed block in the backward pass.

    XLA:GPU/TPU keep JAX's optimization barriers until after scheduling, so
    the recomputation runs in the backward pass; XLA:CPU removes them before
    scheduling, so there the recomputation also depends on the cotangent (the
    temporary memory it saves: tests/utils/test_utils_checkpoint_cpu_memory.py).
    """
    plain = _lowered_step(False).as_text()
    remat = _lowered_step(True).as_text()
    # (the plain step has barriers too: the chunks of its packed concatenations, flat.py)
    assert remat.count("optimization_barrier") >= plain.count("optimization_barrier") + 6
    # the first Linear of each block is recomputed (the backward pass needs its output;
    # the last Linear's output it does not, so JAX leaves that one out)
    assert remat.count("dot_general") == plain.count("dot_general") + 6
