"""Functional forms of the layers, as ``torch.nn.functional``.

Functions take and return ``jax.Array``s (Parameters are accepted anywhere);
given a ``jm.Tensor`` they return Tensors (``jmodule/_tensor.py``).
Where PyTorch mutates an argument in place, JAX arrays are immutable: each
such function documents what it returns instead. One file per family of
layers; each defines ``__all__`` and is re-exported here.
"""

import inspect as _inspect

from jmodule._tensor import preserving as _preserving
from jmodule.nn.functional._activation import *  # noqa: F403
from jmodule.nn.functional._attention import *  # noqa: F403
from jmodule.nn.functional._basic import *  # noqa: F403
from jmodule.nn.functional._conv import *  # noqa: F403
from jmodule.nn.functional._fold import *  # noqa: F403
from jmodule.nn.functional._grid import *  # noqa: F403
from jmodule.nn.functional._loss import *  # noqa: F403
from jmodule.nn.functional._misc import *  # noqa: F403
from jmodule.nn.functional._normalization import *  # noqa: F403
from jmodule.nn.functional._pooling import *  # noqa: F403
from jmodule.nn.functional._rnn import *  # noqa: F403
from jmodule.nn.functional._sparse import *  # noqa: F403

_here = globals()  # (this module's names: none of them a builtin's)
for _name, _fn in list(_here.items()):
    if not _name.startswith("_") and _inspect.isfunction(_fn):
        _here[_name] = _preserving(_fn, _name)
del _name, _fn, _here
