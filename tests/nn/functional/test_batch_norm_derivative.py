"""Training-mode batch norm's written-out derivative against torch and against itself.

``F.batch_norm_update`` in training mode carries a custom JVP (the gradient
is its transpose). Checked here: gradients and second derivatives equal
torch's (float64, x64 on), forward mode agrees with reverse mode, the
affine-free form, and the running statistics, eagerly and compiled.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jmodule as jm
from jmodule.nn import functional as F

pytestmark = pytest.mark.torch


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _data(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = rng.standard_normal(shape).astype(dtype) * 3 + 1
    w = (rng.random(c) + 0.5).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    cot = rng.standard_normal(shape).astype(dtype)
    return x, w, b, cot


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 4), (2, 3, 4, 3, 2)])
@pytest.mark.parametrize("affine", [True, False])
def test_gradients_and_second_derivatives_equal_torch_in_float64(x64, shape, affine):
    x, w, b, cot = _data(shape)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True) if affine else None
    tb = torch.tensor(b, requires_grad=True) if affine else None
    out = torch.nn.functional.batch_norm(tx, None, None, tw, tb, training=True)
    loss = (out * torch.tensor(cot)).sum() + (out**3).sum() * 0.01
    wrt = [tx, tw, tb] if affine else [tx]
    grads = torch.autograd.grad(loss, wrt, create_graph=True)
    # second derivative: the gradient of (grad_x . v) with respect to x
    v = np.random.default_rng(1).standard_normal(shape)
    (hv,) = torch.autograd.grad((grads[0] * torch.tensor(v)).sum(), tx)

    def f(x, w, b):
        out = F.batch_norm(x, None, None, w if affine else None, b if affine else None, True)
        return (out * cot).sum() + (out**3).sum() * 0.01

    args = (jnp.asarray(x), jnp.asarray(w), jnp.asarray(b))
    got = jax.grad(f, argnums=(0, 1, 2) if affine else (0,))(*args)
    for g, t in zip(got, grads):
        np.testing.assert_allclose(np.asarray(g), t.detach().numpy(), rtol=1e-10, atol=1e-12)
    got_hv = jax.grad(lambda x: (jax.grad(f)(x, *args[1:]) * v).sum())(args[0])
    np.testing.assert_allclose(np.asarray(got_hv), hv.numpy(), rtol=1e-9, atol=1e-11)
    fwd_rev = jax.jvp(lambda x: jax.grad(f)(x, *args[1:]), (args[0],), (jnp.asarray(v),))[1]
    np.testing.assert_allclose(np.asarray(fwd_rev), hv.numpy(), rtol=1e-9, atol=1e-11)


def test_forward_mode_of_the_output(x64):
    x, w, b, _ = _data((3, 4, 5))
    t = np.random.default_rng(2).standard_normal(x.shape)

    def f(x):
        return F.batch_norm_update(x, jnp.zeros(4), jnp.ones(4), w, b, training=True)

    primal, tangent = jax.jvp(f, (jnp.asarray(x),), (jnp.asarray(t),))
    eps = 1e-6  # central differences, exact to ~eps**2 for this smooth map
    plus, minus = f(jnp.asarray(x + eps * t)), f(jnp.asarray(x - eps * t))
    # the output; the running statistics are updated outside the gradient (as in torch)
    want = (np.asarray(plus[0]) - np.asarray(minus[0])) / (2 * eps)
    np.testing.assert_allclose(np.asarray(tangent[0]), want, rtol=1e-6, atol=1e-8)
    torch_out = torch.nn.functional.batch_norm(
        torch.tensor(x), None, None, torch.tensor(w), torch.tensor(b), training=True
    )
    np.testing.assert_allclose(np.asarray(primal[0]), torch_out.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_batchnorm_module_training_steps_match_torch(x64, compiled):
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU())
    tnet = tnet.double()
    net = jm.nn.Sequential(jm.nn.Conv2d(2, 3, 3), jm.nn.BatchNorm2d(3), jm.nn.ReLU())
    net = net.double()
    net.load_state_dict(tnet.state_dict())
    topt = torch.optim.SGD(tnet.parameters(), lr=0.1, momentum=0.9)
    opt = jm.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    xs = np.random.default_rng(0).standard_normal((5, 4, 2, 6, 6))

    def step(net, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: (net(x) ** 2).mean())
        opt.step()
        return loss

    step = jm.compile(step) if compiled else step
    for x in xs:
        topt.zero_grad()
        tloss = (tnet(torch.from_numpy(x)) ** 2).mean()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(float(step(net, opt, jnp.asarray(x))), tloss.item(), rtol=1e-10)
    for k, v in tnet.state_dict().items():
        np.testing.assert_allclose(
            np.asarray(net.state_dict()[k]), v.numpy(), rtol=1e-10, atol=1e-12
        )
