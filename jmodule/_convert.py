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


#: PyTorch's scalar-type names (``torch.float32`` prints as ``Float`` in its errors).
_TORCH_SCALAR_NAMES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
}


def torch_scalar_name(dtype: Any) -> str:
    """The name PyTorch's error messages give ``dtype`` (``Float``, ``Long``, ...)."""
    name = np.dtype(dtype).name
    return _TORCH_SCALAR_NAMES.get(name, name)
