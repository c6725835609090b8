"""``import jmodule.torch as torch``: jmodule under PyTorch's names, computing with ``jm.Tensor``.

A port of PyTorch model and training code changes its imports only::

    import jmodule.torch as torch
    import jmodule.torch.nn as nn
    import jmodule.torch.nn.functional as F

This namespace is ``jmodule``'s own (``nn``, ``optim``, ``no_grad``, the
dtypes, ``device``, ``manual_seed``, ``save``/``load``, ``compile``, ...) with
one difference: every torch function returns :class:`jm.Tensor <jmodule.Tensor>`
s, the creation functions included (``torch.zeros(3)``, ``torch.arange(T)``,
``torch.from_numpy(a)``), so that activations have ``torch.Tensor``'s methods
(``x.size(0)``, ``x.view(B, T, -1)``, ``x.transpose(1, 2)``, in-place
``losses[k] = ...``) from the first array on. ``jmodule`` itself keeps
returning plain ``jax.Array`` s, for JAX users; a Tensor passed to any jmodule
layer or function comes back a Tensor either way (``jmodule/_tensor.py``).
``torch.nn`` and ``torch.nn.functional`` here are ``jmodule.nn`` and
``jmodule.nn.functional``; ``torch.cuda`` says what JAX sees and
``torch.backends`` takes the TF32 switches (``jmodule/torch/backends.py``).

>>> import jmodule.torch as torch
>>> x = torch.zeros(2, 3)
>>> x[0, 1] = 5
>>> x.size(), x.sum().item(), torch.nn is __import__("jmodule").nn
(Size([2, 3]), 5.0, True)
"""

from __future__ import annotations

import builtins
import inspect
import sys
from typing import Any

import jmodule as _jm
from jmodule import _tensor, _torch_functions
from jmodule.torch import backends as backends
from jmodule.torch import cuda as cuda

__all__ = ["backends", "cuda"]


#: The torch functions, returning Tensors.
_FUNCTIONS = {
    name: _tensor.preserving(getattr(_torch_functions, name).__wrapped__, name, always=True)
    for name in _torch_functions.__all__
    if inspect.isfunction(getattr(_torch_functions, name))
    and hasattr(getattr(_torch_functions, name), "__wrapped__")
}
_FUNCTIONS.update(
    {
        name: _tensor.preserving(fn.__wrapped__, name, always=True)
        for name, fn in _torch_functions.BUILTIN_NAMED.items()
    }
)
# Names that are Python builtins (``sum``, ``max``, ``abs``, ...) are served by
# ``__getattr__``, so that this module rebinds no builtin (as ``jmodule`` does).
_BUILTIN_NAMED = {k: v for k, v in _FUNCTIONS.items() if hasattr(builtins, k)}
globals().update({k: v for k, v in _FUNCTIONS.items() if k not in _BUILTIN_NAMED})

# ``import jmodule.torch.nn.functional as F`` (``import torch.nn.functional as F``).
for _sub in ("nn", "nn.functional", "nn.init", "nn.utils", "optim", "optim.lr_scheduler"):
    sys.modules[f"{__name__}.{_sub}"] = sys.modules[f"jmodule.{_sub}"]
nn = _jm.nn
optim = _jm.optim


def __getattr__(name: str) -> Any:
    if name in _BUILTIN_NAMED:  # torch.sum, torch.max, ...: builtins' names
        return _BUILTIN_NAMED[name]
    try:
        return getattr(_jm, name)
    except AttributeError:
        raise AttributeError(f"module 'jmodule.torch' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_BUILTIN_NAMED, *dir(_jm)})
