"""Flax NNX modules inside jmodule models, and jmodule models as NNX modules."""

import copy

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jmodule as jm
from jmodule import nn


def _block(seed=0):
    return nnx.Sequential(
        nnx.Linear(4, 3, rngs=nnx.Rngs(seed)),
        nnx.BatchNorm(3, rngs=nnx.Rngs(seed)),
        nnx.Dropout(0.5, rngs=nnx.Rngs(seed + 1)),
    )


class Net(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(self.block(x))


X = jnp.arange(20.0).reshape(5, 4) / 10


@pytest.mark.slow
def test_nnx_module_becomes_a_submodule_with_parameters_and_buffers():
    reference = _block()
    net = Net(nnx.clone(reference))
    assert isinstance(net.block, nn.FlaxModule)
    params = dict(net.named_parameters())
    assert set(params) >= {"block.layers.0.kernel", "block.layers.0.bias", "block.layers.1.scale"}
    assert "block.layers.1.mean" in dict(net.named_buffers())
    np.testing.assert_array_equal(
        np.asarray(params["block.layers.0.kernel"]), np.asarray(reference.layers[0].kernel[...])
    )
    want = net.head(reference(X))  # the same NNX computation, run by Flax itself
    np.testing.assert_allclose(np.asarray(net(X)), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(net.state_dict()["block.layers.1.mean"]),
        np.asarray(reference.layers[1].mean[...]),
        rtol=1e-6,
    )
    assert "FlaxModule(" in repr(net) and "Sequential" in repr(net)


def test_compiled_model_with_nnx_block_matches_eager_and_threads_its_rng():
    net = Net(_block())
    eager = copy.deepcopy(net)
    net.compile()
    outs = []
    for _ in range(3):
        got, want = net(X), eager(X)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
        outs.append(np.asarray(got))
    assert not np.allclose(outs[0], outs[1])  # NNX dropout draws fresh masks per call
    assert jm.compile_stats(net).num_traces == 1


@pytest.mark.slow
def test_gradients_reach_nnx_parameters_and_a_step_trains_them():
    net = Net(_block())
    loss_before = float(jm.backward(lambda: (net(X) ** 2).mean()))
    kernel = net.get_parameter("block.layers.0.kernel")
    assert kernel.grad is not None and kernel.grad.shape == (4, 3)

    opt = jm.optim.SGD(net.parameters(), lr=0.1)
    before = np.asarray(kernel.data).copy()

    @jm.compile
    def step(model, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: (model(x) ** 2).mean())
        opt.step()
        return loss

    losses = [float(step(net, opt, X)) for _ in range(30)]
    assert losses[-1] < loss_before / 2
    assert not np.allclose(np.asarray(kernel.data), before)  # jm.optim trained the NNX kernel


@pytest.mark.slow
def test_to_flax_runs_under_nnx_jit_and_grad():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))
    reference = copy.deepcopy(model)
    flax_model = nn.to_flax(model)
    out = nnx.jit(lambda m, x: m(x))(flax_model, X)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference(X)), rtol=1e-5, atol=1e-6)
    assert int(flax_model.buffers["1.num_batches_tracked"][...]) == 1
    grads = nnx.grad(lambda m, x: (m(x) ** 2).sum())(flax_model, X)
    want = jm.grad(lambda m, x: (m(x) ** 2).sum())(reference, X)
    for name, g in want.items():
        np.testing.assert_allclose(
            np.asarray(grads["params"][name][...]), np.asarray(g), rtol=1e-5, atol=1e-6
        )
    assert isinstance(grads["params"]["0.weight"], nnx.Param)


def test_to_flax_dropout_draws_fresh_masks_under_nnx_jit():
    flax_model = nn.to_flax(nn.Dropout(0.5))
    f = nnx.jit(lambda m, x: m(x))
    a, b = f(flax_model, jnp.ones(64)), f(flax_model, jnp.ones(64))
    assert not np.array_equal(np.asarray(a), np.asarray(b))
    assert set(np.unique(np.asarray(a)).tolist()) <= {0.0, 2.0}
