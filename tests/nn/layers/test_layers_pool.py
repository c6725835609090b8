"""Pooling, upsampling and shuffle layers through the shared PyTorch-parity checks.

Covers MaxPool1d/2d/3d and AvgPool1d/2d/3d (stride, padding, dilation,
ceil_mode, count_include_pad, divisor_override, return_indices, unbatched
input) and the adaptive poolings (non-divisible sizes, None entries).
"""

import numpy as np
import pytest
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm


def _x(*shape):
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


CASES = [
    LayerCase("MaxPool1d", (3, 2, 1), {"dilation": 2, "ceil_mode": True}, inputs=_x(2, 3, 9)),
    LayerCase("MaxPool1d", (3,), {"return_indices": True}, inputs=_x(3, 10)),
    LayerCase("MaxPool2d", (3, 2, 1), inputs=_x(2, 3, 7, 6)),
    LayerCase(
        "MaxPool2d", ((2, 3),), {"ceil_mode": True, "return_indices": True}, inputs=_x(1, 2, 7, 8)
    ),
    LayerCase("MaxPool3d", (2,), {"stride": (1, 2, 2), "padding": 1}, inputs=_x(1, 2, 3, 4, 5)),
    LayerCase(
        "AvgPool1d", (4, 3, 2), {"ceil_mode": True, "count_include_pad": False}, inputs=_x(2, 3, 10)
    ),
    LayerCase("AvgPool2d", (3, 2, 1), {"ceil_mode": True}, inputs=_x(1, 3, 6, 7)),
    LayerCase("AvgPool2d", ((3, 2), 2, (1, 0)), {"count_include_pad": False}, inputs=_x(3, 6, 7)),
    LayerCase("AvgPool2d", (2,), {"divisor_override": 3}, inputs=_x(1, 2, 4, 5)),
    LayerCase(
        "AvgPool3d",
        (2,),
        {"ceil_mode": True, "count_include_pad": False, "padding": 1},
        inputs=_x(1, 2, 3, 4, 5),
    ),
    LayerCase("AdaptiveAvgPool1d", (3,), inputs=_x(2, 3, 8)),
    LayerCase("AdaptiveAvgPool2d", ((1, 1),), inputs=_x(2, 3, 5, 5)),
    LayerCase("AdaptiveAvgPool2d", ((3, None),), inputs=_x(2, 3, 7, 4)),
    LayerCase("AdaptiveAvgPool3d", ((2, 3, 1),), inputs=_x(1, 2, 3, 5, 4)),
    LayerCase("AdaptiveMaxPool1d", (3,), inputs=_x(3, 8)),
    LayerCase("AdaptiveMaxPool2d", ((3, 4),), {"return_indices": True}, inputs=_x(2, 3, 7, 6)),
    LayerCase("AdaptiveMaxPool3d", (2,), inputs=_x(1, 2, 3, 5, 4)),
]

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_pool_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


def test_pool_errors_name_shapes():
    with pytest.raises(
        RuntimeError,
        match=r"max_pool2d: expected a 3D \(unbatched\) or 4D \(batched\) input, "
        r"got input of size \[2, 3\]",
    ):
        jm.nn.MaxPool2d(2)(np.zeros((2, 3), np.float32))
    with pytest.raises(
        RuntimeError,
        match="pad should be at most half of effective kernel size, but got pad=2, kernel_size=2",
    ):
        jm.nn.MaxPool2d(2, padding=2)(np.zeros((1, 4, 4), np.float32))
    with pytest.raises(
        RuntimeError, match=r"Calculated output size: \(0x0\). Output size is too small"
    ):
        jm.nn.AvgPool2d(3)(np.zeros((1, 2, 2), np.float32))
    with pytest.raises(
        RuntimeError, match=r"adaptive_avg_pool2d\(\): Expected 3D or 4D tensor .* but got \[2, 3\]"
    ):
        jm.nn.AdaptiveAvgPool2d(2)(np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        jm.nn.functional.avg_pool2d(np.zeros((1, 2, 2), np.float32), 2, divisor_override=0)
