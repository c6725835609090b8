"""Convolution layers through the shared PyTorch-parity checks (tests/layer_harness.py).

Each option of Conv1d/2d/3d and ConvTranspose1d/2d/3d (stride, padding as
int/tuple/'same'/'valid', dilation, groups, bias, padding_mode,
output_padding, output_size, unbatched input) appears in at least one case.
"""

import numpy as np
import pytest
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm


def _x(*shape):
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


CASES = [
    LayerCase("Conv1d", (3, 4, 3), inputs=_x(2, 3, 9)),
    LayerCase("Conv1d", (4, 6, 2), {"stride": 2, "padding": 1, "groups": 2}, inputs=_x(2, 4, 8)),
    LayerCase(
        "Conv1d",
        (3, 4, 4),
        {"padding": "same", "dilation": 2, "padding_mode": "reflect"},
        inputs=_x(2, 3, 9),
    ),
    LayerCase("Conv1d", (3, 4, 3), {"padding": 1, "padding_mode": "circular"}, inputs=_x(3, 7)),
    LayerCase("Conv2d", (3, 4, 3), {"stride": (2, 1), "padding": (1, 0)}, inputs=_x(2, 3, 7, 6)),
    LayerCase(
        "Conv2d", (4, 4, 3), {"groups": 4, "bias": False, "padding": "valid"}, inputs=_x(1, 4, 6, 6)
    ),
    LayerCase(
        "Conv2d",
        (3, 4, (2, 3)),
        {"padding": "same", "dilation": (2, 1), "padding_mode": "replicate"},
        inputs=_x(2, 3, 5, 6),
    ),
    LayerCase(
        "Conv2d", (3, 4, 3), {"padding": (1, 2), "padding_mode": "circular"}, inputs=_x(3, 5, 5)
    ),
    LayerCase("Conv3d", (2, 3, 3), {"stride": 2, "padding": 1}, inputs=_x(1, 2, 5, 4, 5)),
    LayerCase(
        "Conv3d",
        (4, 2, (1, 2, 2)),
        {"groups": 2, "padding_mode": "reflect", "padding": (0, 1, 1)},
        inputs=_x(1, 4, 3, 4, 4),
    ),
    LayerCase(
        "ConvTranspose1d",
        (4, 6, 3),
        {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2, "bias": False},
        inputs=_x(2, 4, 5),
    ),
    LayerCase("ConvTranspose1d", (3, 4, 3), {"dilation": 2, "padding": 3}, inputs=_x(3, 6)),
    LayerCase(
        "ConvTranspose2d",
        (4, 4, (3, 2)),
        {"stride": (2, 3), "output_padding": (1, 2), "groups": 2},
        inputs=_x(1, 4, 3, 3),
    ),
    LayerCase(
        "ConvTranspose2d",
        (3, 4, 3),
        {"stride": 2, "padding": 1},
        inputs=_x(1, 3, 4, 4),
        call_kwargs={"output_size": (8, 8)},
        id="ConvTranspose2d-output_size",
    ),
    LayerCase(
        "ConvTranspose3d",
        (2, 3, 2),
        {"stride": 2, "dilation": 2, "output_padding": 1},
        inputs=_x(1, 2, 2, 3, 2),
    ),
]

VALUES, IDS = parametrize(CASES)


@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_conv_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"groups": 2}, "in_channels must be divisible by groups"),
        ({"groups": 3, "out_channels": 4}, "out_channels must be divisible by groups"),
        ({"padding": "full"}, "Invalid padding string 'full'"),
        ({"padding": "same", "stride": 2}, "padding='same' is not supported for strided"),
        ({"padding_mode": "mirror"}, "padding_mode must be one of"),
    ],
)
def test_conv_constructor_errors(kwargs, match):
    args = {"in_channels": 3, "out_channels": 6, "kernel_size": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        jm.nn.Conv2d(**args)


def test_conv_transpose_constructor_errors():
    with pytest.raises(
        ValueError, match='Only "zeros" padding mode is supported for ConvTranspose2d'
    ):
        jm.nn.ConvTranspose2d(2, 2, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="padding must be an int or a tuple of ints"):
        jm.nn.ConvTranspose1d(2, 2, 3, padding="same")


def test_conv_input_errors_name_shapes():
    conv = jm.nn.Conv2d(3, 8, 3)
    with pytest.raises(
        RuntimeError,
        match=r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, "
        r"but got input of size: \[2, 3, 4, 5, 6\]",
    ):
        conv(np.zeros((2, 3, 4, 5, 6), np.float32))
    with pytest.raises(
        RuntimeError,
        match=r"weight of size \[8, 3, 3, 3\], expected input\[1, 4, 5, 5\] to have 3 channels, "
        r"but got 4",
    ):
        conv(np.zeros((1, 4, 5, 5), np.float32))
    with pytest.raises(RuntimeError, match=r"Kernel size can't be greater than actual input size"):
        conv(np.zeros((1, 3, 2, 2), np.float32))
    up = jm.nn.ConvTranspose2d(3, 2, 3, stride=2)
    with pytest.raises(
        ValueError,
        match=r"requested an output size of \(9, 9\), but valid sizes range from \(7, 7\) "
        r"to \(8, 8\)",
    ):
        up(np.zeros((1, 3, 3, 3), np.float32), output_size=(9, 9))
    with pytest.raises(
        RuntimeError, match="output padding must be smaller than either stride or dilation"
    ):
        jm.nn.functional.conv_transpose2d(
            np.zeros((1, 2, 3, 3), np.float32), np.zeros((2, 2, 3, 3), np.float32), output_padding=1
        )
