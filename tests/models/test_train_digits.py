"""A 200-step training run of a small CNN on scikit-learn's digits, against PyTorch.

Same initial weights (PyTorch's, loaded), same batches, same optimizer: the
loss curve of jmodule eager, jmodule compiled and PyTorch agree step by step.
"""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import jmodule as jm
import jmodule.nn.functional as F
import jmodule.optim
from jmodule import nn

pytestmark = pytest.mark.torch

STEPS, BATCH = 200, 32


def _data():
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8), NCHW
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).integers(0, len(x), size=(STEPS, BATCH))
    return x, y, order


def _build(lib):
    return lib.Sequential(
        lib.Conv2d(1, 8, 3, padding=1),
        lib.BatchNorm2d(8),
        lib.ReLU(),
        lib.MaxPool2d(2),
        lib.Flatten(),
        lib.Linear(8 * 4 * 4, 10),
    )


def _torch_curve(x, y, order):
    torch.manual_seed(0)
    model = _build(torch.nn)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for idx in order:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx])
        )
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return initial, np.array(losses)


def _jm_model(initial):
    model = _build(nn)
    model.load_state_dict(initial)
    return model, jm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@pytest.fixture(scope="module")
def reference():
    x, y, order = _data()
    initial, losses = _torch_curve(x, y, order)
    return x, y, order, initial, losses


def _step(model, opt, xb, yb):
    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(model(xb), yb))
    opt.step()
    return loss


def _check(curve, want):
    np.testing.assert_allclose(curve[:20], want[:20], rtol=1e-4, atol=1e-5)
    # Float32 rounding differences grow over 200 steps of momentum SGD; the
    # curves stay within 2% and end at the same level.
    np.testing.assert_allclose(curve, want, rtol=0.02, atol=0.02)
    assert want[-20:].mean() < want[:20].mean() / 4


@pytest.mark.slow
def test_eager_training_follows_pytorch(reference):
    x, y, order, initial, want = reference
    model, opt = _jm_model(initial)
    curve = [float(_step(model, opt, jnp.asarray(x[i]), jnp.asarray(y[i]))) for i in order]
    _check(np.array(curve), want)


def test_compiled_training_follows_pytorch(reference):
    x, y, order, initial, want = reference
    model, opt = _jm_model(initial)
    step = jm.compile(_step)
    curve = [float(step(model, opt, jnp.asarray(x[i]), jnp.asarray(y[i]))) for i in order]
    _check(np.array(curve), want)
    assert jm.compile_stats(step).num_traces <= 2
