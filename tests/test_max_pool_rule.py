"""Max pooling follows PyTorch's rule for which element of a window wins.

PyTorch's CPU kernel walks each window in order, starting from ``-inf`` on
the first element inside the input, and moves on a strictly greater value
or on a NaN. So ties go to the first maximum, a NaN beats everything before
it (the last NaN wins), and an all ``-inf`` window picks its first element
inside the input. Values, ``return_indices`` and gradients (reverse and
forward mode, eager and compiled) are checked against torch live on inputs
built to hit each case, for 1-3-D, stride, padding, dilation and ceil_mode.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule.nn import functional as F

TF = torch.nn.functional

CONFIGS = [
    (1, {"kernel_size": 3, "stride": 1}),
    (1, {"kernel_size": 4, "stride": 3, "padding": 2, "ceil_mode": True}),
    (1, {"kernel_size": 3, "stride": 2, "dilation": 2, "padding": 1}),
    (2, {"kernel_size": 3, "stride": 2, "padding": 1}),  # ResNet's stem pool
    (2, {"kernel_size": (2, 3), "stride": (1, 2), "ceil_mode": True}),
    (2, {"kernel_size": 3, "stride": 1, "padding": 1, "dilation": (2, 1)}),
    (3, {"kernel_size": 2, "stride": (1, 2, 2), "padding": 1}),
]


def _hostile(nd: int, seed: int) -> np.ndarray:
    """Small integers (many ties), zeros as after a ReLU, NaNs and -infs."""
    rng = np.random.default_rng(seed)
    shape = (2, 3, *(9, 8, 7)[:nd])
    x = rng.integers(-2, 3, shape).astype(np.float32)
    x[rng.random(shape) < 0.3] = 0.0
    x[rng.random(shape) < 0.08] = np.nan
    x[rng.random(shape) < 0.15] = -np.inf
    return x


def _torch(nd, x, kwargs):
    xt = torch.from_numpy(x).requires_grad_(True)
    out, idx = getattr(TF, f"max_pool{nd}d")(xt, return_indices=True, **kwargs)
    cot = np.random.default_rng(7).standard_normal(out.shape).astype(np.float32)
    (out * torch.from_numpy(cot)).sum().backward()
    return out.detach().numpy(), idx.numpy(), xt.grad.numpy(), cot


@pytest.mark.torch
@pytest.mark.parametrize(("nd", "kwargs"), CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_values_indices_and_gradients_match_torch(nd, kwargs, seed):
    x = _hostile(nd, seed)
    want, want_idx, want_grad, cot = _torch(nd, x, kwargs)
    pool = getattr(F, f"max_pool{nd}d")
    out, idx = pool(jnp.asarray(x), return_indices=True, **kwargs)
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(idx), want_idx)

    grad = jax.grad(lambda v: (pool(v, **kwargs) * cot).sum())
    # An input that wins several overlapping windows sums their cotangents, in an
    # order that may differ from torch's: equal to rounding, not to the last bit.
    close = {"rtol": 1e-6, "atol": 1e-6}
    np.testing.assert_allclose(np.asarray(grad(jnp.asarray(x))), want_grad, **close)
    np.testing.assert_allclose(np.asarray(jax.jit(grad)(jnp.asarray(x))), want_grad, **close)


@pytest.mark.parametrize(("nd", "kwargs"), CONFIGS)
def test_forward_mode_agrees_with_reverse_mode(nd, kwargs):
    # The pool is a gather of the winners; jax.jvp,
    # jax.jacfwd and second derivatives work through it as through any op.
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((1, 2, *(6, 5, 4)[:nd])).astype(np.float32))
    t = jnp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    pool = getattr(F, f"max_pool{nd}d")
    out, tout = jax.jvp(lambda v: pool(v, **kwargs), (x,), (t,))
    cot = jnp.asarray(rng.standard_normal(out.shape).astype(np.float32))
    (back,) = jax.vjp(lambda v: pool(v, **kwargs), x)[1](cot)
    np.testing.assert_allclose(float((tout * cot).sum()), float((back * t).sum()), rtol=1e-5)

    # second derivatives: forward-over-reverse equals reverse-over-reverse
    def g(v):
        return jax.grad(lambda u: (pool(u, **kwargs) ** 3).sum())(v)

    fwd_rev = jax.jvp(g, (x,), (t,))[1]
    rev_rev = jax.grad(lambda v: (g(v) * t).sum())(x)
    np.testing.assert_allclose(np.asarray(fwd_rev), np.asarray(rev_rev), rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(fwd_rev).sum()) > 0


@pytest.mark.torch
def test_module_in_a_compiled_training_step_matches_torch():
    # MaxPool2d as ResNet uses it (after a ReLU: ties at zero in every window).
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)
    )
    net = jm.nn.Sequential(jm.nn.Conv2d(2, 4, 3, padding=1), jm.nn.ReLU(), jm.nn.MaxPool2d(3, 2, 1))
    net.load_state_dict(tnet.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 2, 8, 8)).astype(np.float32)
    (tnet(torch.from_numpy(x)) ** 2).sum().backward()

    @jm.compile
    def step(net, x):
        return jm.backward(lambda: (net(x) ** 2).sum())

    step(net, jnp.asarray(x))
    for (name, p), tp in zip(net.named_parameters(), tnet.parameters()):
        np.testing.assert_allclose(np.asarray(p.grad), tp.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.torch
def test_integer_inputs_pool_by_the_same_rule():
    x = np.random.default_rng(0).integers(-3, 3, (2, 3, 7, 7)).astype(np.int32)
    out, idx = F.max_pool2d(jnp.asarray(x), 3, 2, 1, return_indices=True)
    t_out, t_idx = TF.max_pool2d(torch.from_numpy(x).float(), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(np.asarray(out), t_out.numpy().astype(np.int32))
    np.testing.assert_array_equal(np.asarray(idx), t_idx.numpy())


@pytest.mark.torch
def test_windows_past_the_slice_limit_pick_torch_indices_too():
    # More than TAP_LIMIT elements per window: reduce_window, with the same rule for
    # the values and indices (its gradient goes to the first maximum).
    from jmodule.nn.functional import _pooling

    kernel = 9
    assert kernel * kernel > _pooling.TAP_LIMIT
    x = _hostile(2, 3)
    x = np.tile(x, (1, 1, 2, 2))  # 18 x 16 maps, room for 9 x 9 windows
    want, want_idx = TF.max_pool2d(torch.from_numpy(x), kernel, 3, 2, return_indices=True)
    out, idx = F.max_pool2d(jnp.asarray(x), kernel, 3, 2, return_indices=True)
    np.testing.assert_array_equal(np.asarray(out), want.numpy())
    np.testing.assert_array_equal(np.asarray(idx), want_idx.numpy())
