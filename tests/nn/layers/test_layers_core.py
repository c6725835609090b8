"""The core layers through the shared PyTorch-parity checks (tests/layer_harness.py)."""

import numpy as np
import pytest
from layer_harness import ALL_CHECKS, LayerCase, parametrize

pytestmark = pytest.mark.torch


def _x(*shape):
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


CASES = [
    LayerCase("Linear", (5, 7), inputs=_x(3, 5)),
    LayerCase("Linear", (5, 7), {"bias": False}, inputs=_x(2, 4, 5)),
    LayerCase("Linear", (300, 200), inputs=_x(2, 300), rtol=1e-4, atol=1e-4),
    LayerCase("Identity", (3,), {"unused": 1}, inputs=_x(2, 3)),
    LayerCase("ReLU", inputs=_x(4, 6)),
    LayerCase("ReLU", (True,), inputs=_x(4, 6), id="ReLU(inplace=True)"),
    LayerCase("Dropout", (0.3,), inputs=_x(8, 6), random=True),
    LayerCase("BatchNorm1d", (6,), inputs=_x(8, 6)),
    LayerCase("BatchNorm1d", (6,), inputs=_x(8, 6, 5), id="BatchNorm1d(6)-3d"),
    LayerCase("BatchNorm1d", (6,), {"momentum": None}, inputs=_x(8, 6)),
    LayerCase("BatchNorm1d", (6,), {"affine": False}, inputs=_x(8, 6)),
    LayerCase("BatchNorm1d", (6,), {"track_running_stats": False}, inputs=_x(8, 6)),
    LayerCase("BatchNorm1d", (6,), {"bias": False}, inputs=_x(8, 6)),
]

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_layer_matches_pytorch(check, case):
    ALL_CHECKS[check](case)
