"""Normalisation layers through the shared PyTorch-parity checks (tests/layer_harness.py).

BatchNorm2d/3d (momentum incl. None, affine, track_running_stats), LayerNorm,
GroupNorm, RMSNorm, InstanceNorm1d/2d/3d (affine, running statistics,
unbatched input) and LocalResponseNorm.
"""

import warnings

import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm


def _x(*shape, shift=0.0):
    # A shift away from zero makes the running statistics move visibly.
    return lambda rng: ((rng.standard_normal(shape) + shift).astype(np.float32),)


CASES = [
    LayerCase("BatchNorm2d", (3,), inputs=_x(4, 3, 3, 3, shift=1.0)),
    LayerCase("BatchNorm2d", (3,), {"momentum": None, "affine": False}, inputs=_x(2, 3, 4, 4)),
    LayerCase("BatchNorm3d", (2,), {"eps": 1e-3, "momentum": 0.3}, inputs=_x(2, 2, 3, 3, 3)),
    LayerCase("LayerNorm", (5,), inputs=_x(3, 4, 5, shift=2.0)),
    LayerCase("LayerNorm", ((4, 5),), {"bias": False, "eps": 1e-3}, inputs=_x(3, 4, 5)),
    LayerCase("LayerNorm", (5,), {"elementwise_affine": False}, inputs=_x(3, 5)),
    LayerCase("GroupNorm", (2, 4), inputs=_x(3, 4, 5)),
    LayerCase("GroupNorm", (3, 6), {"affine": False}, inputs=_x(2, 6, 2, 3)),
    LayerCase("GroupNorm", (1, 4), {"bias": False, "eps": 1e-3}, inputs=_x(2, 4)),
    LayerCase("RMSNorm", (5,), inputs=_x(3, 4, 5)),
    LayerCase("RMSNorm", ((4, 5),), {"eps": 1e-4, "elementwise_affine": False}, inputs=_x(3, 4, 5)),
    LayerCase("InstanceNorm1d", (3,), inputs=_x(2, 3, 6)),
    LayerCase(
        "InstanceNorm1d", (3,), {"affine": True}, inputs=_x(3, 6), id="InstanceNorm1d-unbatched"
    ),
    LayerCase(
        "InstanceNorm2d",
        (3,),
        {"affine": True, "track_running_stats": True},
        inputs=_x(2, 3, 4, 4, shift=1.0),
    ),
    LayerCase(
        "InstanceNorm2d",
        (3,),
        {"track_running_stats": True, "momentum": None},
        inputs=_x(2, 3, 3, 4),
    ),
    LayerCase("InstanceNorm3d", (2,), {"affine": True, "bias": False}, inputs=_x(1, 2, 3, 2, 3)),
    LayerCase("LocalResponseNorm", (2,), inputs=_x(2, 5, 3)),
    LayerCase("LocalResponseNorm", (3, 0.1, 0.6, 2.0), inputs=_x(2, 4, 3, 3)),
]

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_norm_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


@pytest.mark.torch
def test_instance_norm_channel_mismatch():
    x = np.random.default_rng(0).standard_normal((2, 4, 5)).astype(np.float32)
    with pytest.raises(
        ValueError, match=r"expected input's size at dim=1 to match num_features \(3\), but got: 4"
    ):
        jm.nn.InstanceNorm1d(3, affine=True)(x)
    # Without affine parameters PyTorch only warns, and normalises anyway.
    with pytest.warns(UserWarning, match="input's size at dim=1 does not match num_features"):
        got = jm.nn.InstanceNorm1d(3)(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch.nn.InstanceNorm1d(3)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_norm_errors_name_shapes():
    with pytest.raises(
        ValueError,
        match=r"Expected more than 1 spatial element when training, got input size \(2, 3, 1\)",
    ):
        jm.nn.InstanceNorm1d(3)(np.zeros((2, 3, 1), np.float32))
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input"):
        jm.nn.InstanceNorm1d(3)(np.zeros((2, 3, 4, 5), np.float32))
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):
        jm.nn.BatchNorm2d(3)(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(
        RuntimeError,
        match=r"Given normalized_shape=\[4\], expected input with shape \[\*, 4\], "
        r"but got input of size\[2, 3\]",
    ):
        jm.nn.LayerNorm(4)(np.zeros((2, 3), np.float32))
    with pytest.raises(
        RuntimeError,
        match=r"divisible by num_groups, but got input of shape \[2, 3, 5\] and num_groups=2",
    ):
        jm.nn.functional.group_norm(np.zeros((2, 3, 5), np.float32), 2)
    with pytest.raises(
        ValueError, match=r"num_channels \(4\) must be divisible by num_groups \(3\)"
    ):
        jm.nn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="Expected 3D or higher dimensionality input"):
        jm.nn.LocalResponseNorm(2)(np.zeros((4, 2), np.float32))
