"""Activation layers through the shared PyTorch-parity checks (tests/layer_harness.py)."""

import warnings

import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm


def _x(*shape, scale=3.0):
    """Standard-normal input times ``scale`` (reaches both sides of every kink)."""
    return lambda rng: ((scale * rng.standard_normal(shape)).astype(np.float32),)


# One input shape for the element-wise layers: fewer distinct programs to compile.
X = _x(4, 6)
X3 = _x(3, 4, 5)
CASES = [
    LayerCase("ReLU6", inputs=_x(4, 6, scale=5.0)),
    LayerCase("LeakyReLU", (0.2, True), inputs=X),
    LayerCase("PReLU", inputs=X3),
    LayerCase("PReLU", (4, 0.1), inputs=X3),
    LayerCase("RReLU", (0.1, 0.3), inputs=X, random=True),
    LayerCase("ELU", (0.5, True), inputs=X),
    LayerCase("SELU", inputs=X),
    LayerCase("CELU", (0.7,), inputs=X),
    LayerCase("GELU", inputs=X),
    LayerCase("GELU", ("tanh",), inputs=X),
    LayerCase("SiLU", inputs=X),
    LayerCase("Mish", inputs=X),
    LayerCase("Sigmoid", inputs=X),
    LayerCase("Tanh", inputs=X),
    LayerCase("Hardtanh", (-2.0, 3.0, True), inputs=X),
    LayerCase("Hardswish", inputs=_x(4, 6, scale=4.0)),
    LayerCase("Hardsigmoid", inputs=_x(4, 6, scale=4.0)),
    # beta * x crosses the threshold for some elements: the linear branch.
    LayerCase("Softplus", (2.0, 5.0), inputs=X),
    LayerCase("Softsign", inputs=X),
    LayerCase("Softmax", (1,), inputs=X3),
    LayerCase("LogSoftmax", (-1,), inputs=X3),
    LayerCase("Softmin", (0,), inputs=X3),
    LayerCase("Softmax2d", inputs=X3),
    LayerCase("GLU", (1,), inputs=_x(3, 4, 5)),
    LayerCase("Threshold", (0.1, 20.0), inputs=X),
    LayerCase("LogSigmoid", inputs=X),
    LayerCase("Hardshrink", inputs=X),
    LayerCase("Softshrink", (1.0,), inputs=X),
    LayerCase("Tanhshrink", inputs=X),
]

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_activation_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


@pytest.mark.torch
def test_softmax_module_without_dim_warns_like_pytorch():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        got = jm.nn.Softmax()(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch.nn.Softmax()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


def test_activation_argument_errors():
    with pytest.raises(ValueError, match=r"max_val \(0.0\) must be greater than min_val \(1.0\)"):
        jm.nn.Hardtanh(1.0, 0.0)
    with pytest.raises(ValueError, match="alpha cannot be 0 for CELU"):
        jm.nn.CELU(0.0)(np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match="approximate argument must be either none or tanh"):
        jm.nn.GELU("erf")(np.ones(2, np.float32))
    with pytest.raises(ValueError, match="Softmax2d: expected input to be 3D or 4D, got 2D"):
        jm.nn.Softmax2d()(np.ones((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="Found parameter numbers = 4 and channel size = 3"):
        jm.nn.PReLU(4)(np.ones((2, 3), np.float32))
