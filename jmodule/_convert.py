"""Small conversions shared across the package."""

from __future__ import annotations

from typing import Any

import numpy as np


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """A torch tensor as a numpy array, keeping bfloat16 (via ``ml_dtypes``).

    Imports nothing from torch itself: works on whatever tensor is passed.
    """
    t = tensor.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        import ml_dtypes

        return t.view(dtype=_torch_int16(t)).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _torch_int16(t: Any) -> Any:
    import torch  # only reached when a torch tensor was given

    return torch.int16
