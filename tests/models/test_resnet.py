"""A ResNet-18 (torchvision's architecture, at a quarter of the width) written once
against an ``nn`` namespace and built from both ``torch.nn`` and ``jm.nn``: the
PyTorch state_dict loads unchanged, and outputs, running statistics and
parameter gradients match, eagerly and compiled, in eval and train mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from shared_models import resnet18

import jmodule as jm

pytestmark = pytest.mark.torch

# Float32 through 20 layers with batch-norm over small batches: differences
# in summation order compound to about 1e-5 relative; gradients (which pass
# through every batch-norm backward) to a little more.
RTOL, ATOL = 1e-4, 1e-4


def build():
    """Fresh models, the jmodule one holding PyTorch's initial weights."""
    torch.manual_seed(0)
    ref = resnet18(torch.nn)
    ours = resnet18(jm.nn)
    result = ours.load_state_dict(ref.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    return ref, ours


def _input(seed=0):
    return np.random.default_rng(seed).standard_normal((4, 3, 32, 32)).astype(np.float32)


def test_state_dict_matches():
    ref, ours = build()
    want = [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == want
    assert repr(ours) == repr(ref)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_outputs_and_running_stats_match(compiled):
    ref, ours = build()
    if compiled:
        ours.compile()
    for training in (True, False):  # train first: the running statistics move
        ref.train(training)
        ours.train(training)
        for seed in range(2):
            x = _input(seed)
            with torch.no_grad():
                want = ref(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(np.asarray(ours(jnp.asarray(x))), want, rtol=RTOL, atol=ATOL)
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(
            np.asarray(ours.state_dict()[k], np.float64),
            v.double().numpy(),
            rtol=RTOL,
            atol=ATOL,
            err_msg=k,
        )


@pytest.mark.slow
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_parameter_gradients_match(training):
    ref, ours = build()
    ref.train(training)
    ours.train(training)
    x = _input(0)
    cot = np.random.default_rng(1).standard_normal((4, 10)).astype(np.float32)
    ref.zero_grad()
    (ref(torch.from_numpy(x)) * torch.from_numpy(cot)).sum().backward()
    params = {k: p.data for k, p in ours.named_parameters()}

    def loss(params):
        out = jm.func.functional_call(ours, params, (jnp.asarray(x),))
        return (out * jnp.asarray(cot)).sum()

    grads = jax.jit(jax.grad(loss))(params)
    for k, p in ref.named_parameters():
        scale = float(np.abs(p.grad.numpy()).max())
        np.testing.assert_allclose(
            np.asarray(grads[k]), p.grad.numpy(), rtol=RTOL, atol=ATOL * max(scale, 1.0), err_msg=k
        )


@pytest.mark.slow
def test_compiled_training_steps_match():
    """SGD steps of the PyTorch loop under ``jm.compile`` (jm.backward, momentum,
    batch-norm statistics) make PyTorch's updates.

    Before each step the jmodule model is reset to PyTorch's weights: with
    batch-norm over so few values, this training run is so ill-conditioned
    that PyTorch in float32 and PyTorch in float64 already differ by ~25% in
    conv1's gradient after three steps, so free-running trajectories cannot
    be compared; each single step can (the momentum buffers stay in step).
    """
    ref, ours = build()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)
    opt = jm.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)
    cot = np.random.default_rng(1).standard_normal((4, 10)).astype(np.float32)

    @jm.compile
    def step(model, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: (model(x) * jnp.asarray(cot)).sum())
        opt.step()
        return loss

    # BatchNorm over 4 values amplifies float32 rounding (different summation
    # orders in XLA and ATen): 1e-4 held in most runs but not all (5.6e-4 seen
    # on a clean clone), so this ill-conditioned comparison uses 2e-3.
    tol = 2e-3
    for seed in range(3):
        ours.load_state_dict(ref.state_dict())
        x = _input(seed)
        ref_opt.zero_grad()
        want = (ref(torch.from_numpy(x)) * torch.from_numpy(cot)).sum()
        want.backward()
        ref_opt.step()
        got = step(ours, opt, jnp.asarray(x))
        np.testing.assert_allclose(float(got), want.detach().item(), rtol=tol, atol=tol)
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(
                np.asarray(ours.state_dict()[k], np.float64),
                v.double().numpy(),
                rtol=tol,
                atol=tol,
                err_msg=f"{k} after step {seed + 1}",
            )


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_float64_sgd_steps_match_torch_float64(compiled):
    """Five free-running SGD steps in float64 (x64 on) end where PyTorch float64 ends.

    Hyper-parameters follow the parameters' dtype: with float32 constants
    (float32's 0.01 and 0.9) the weights ended 3e-7 (relative) from PyTorch
    here; now ~1e-13.
    """
    with jax.enable_x64(True):
        ref, ours = build()
        ref.double()
        ours.to(jm.float64)
        ours.load_state_dict(ref.state_dict())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        opt = jm.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        cot = np.random.default_rng(1).standard_normal((4, 10))

        def step(model, opt, x):
            opt.zero_grad()
            loss = jm.backward(lambda: (model(x) * jnp.asarray(cot)).sum())
            opt.step()
            return loss

        step = jm.compile(step) if compiled else step
        for seed in range(5):
            # 64x64 (the issue's shape): at 32x32 layer4's batch norm over 4 values
            # amplifies rounding ~10x per step, which would hide what is tested.
            x = np.random.default_rng(seed).standard_normal((4, 3, 64, 64))
            ref_opt.zero_grad()
            want = (ref(torch.from_numpy(x)) * torch.from_numpy(cot)).sum()
            want.backward()
            ref_opt.step()
            got = step(ours, opt, jnp.asarray(x))
            np.testing.assert_allclose(float(got), want.item(), rtol=1e-10)
        for k, v in ref.state_dict().items():
            mine = np.asarray(ours.state_dict()[k])
            assert mine.dtype == v.numpy().dtype, k
            scale = max(float(np.abs(v.numpy()).max()), 1.0)
            np.testing.assert_allclose(mine, v.numpy(), rtol=1e-10, atol=1e-10 * scale, err_msg=k)
