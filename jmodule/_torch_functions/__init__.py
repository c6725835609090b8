"""The ``torch.*`` functions model and training code calls, as ``jm.*`` (``__all__``).

One file per family: ``creation`` (``tensor``, ``zeros``, ``arange``, ...),
``random_fns`` (``rand``, ``randn``, ``multinomial``, ... from the jm
generator), ``shape`` (``cat``, ``split``, ``gather``, ...), ``pointwise``
(elementwise functions and comparisons), ``reduction`` (``sum``, ``std``,
``max``, ``topk``, ``sort``, ...), ``linalg`` (``matmul``, ``einsum``,
``cdist``, ...) and ``info`` (``is_tensor``, ``numel``, ...). Every function
takes jax/numpy arrays, Python numbers and Parameters (read so that
``jm.backward`` sees them) and returns ``jax.Array`` s, eagerly and inside
``jm.compile`` / ``jax.jit``; given a ``jm.Tensor`` it returns Tensors.
Names that are Python builtins (``sum``, ``max``, ``abs``, ...) are in
:data:`BUILTIN_NAMED`, which ``jmodule`` serves through its ``__getattr__``.

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> x = jm.tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 3.0]])
>>> jm.max(x, dim=1)
max(values=Array([5., 4.], dtype=float32), indices=Array([1, 0], dtype=int32))
>>> [p.shape for p in jm.split(jm.arange(10), [3, 7])]
[(3,), (7,)]
>>> float(jm.std(x).round(3)), jm.transpose(jm.zeros(2, 3, 4), 0, 2).shape
(1.871, (4, 3, 2))
>>> jm.topk(jm.tensor([3, 1, 4, 1, 5]), 2).indices
Array([4, 2], dtype=int32)
>>> jm.allclose(x, x + 1e-9), jm.numel(x)
(True, 6)
"""

import inspect as _inspect

from jmodule._tensor import install as _install
from jmodule._tensor import preserving as _preserving
from jmodule._torch_functions import creation, info, linalg, pointwise, random_fns, reduction, shape
from jmodule._torch_functions.creation import *  # noqa: F403
from jmodule._torch_functions.info import *  # noqa: F403
from jmodule._torch_functions.linalg import *  # noqa: F403
from jmodule._torch_functions.pointwise import *  # noqa: F403
from jmodule._torch_functions.random_fns import *  # noqa: F403
from jmodule._torch_functions.reduction import *  # noqa: F403
from jmodule._torch_functions.shape import *  # noqa: F403

__all__ = [
    *creation.__all__,
    *info.__all__,
    *linalg.__all__,
    *pointwise.__all__,
    *random_fns.__all__,
    *reduction.__all__,
    *shape.__all__,
]

# Given a jm.Tensor, each function returns Tensors (``jmodule/_tensor.py``).
_here = globals()  # (this module's names: none of them a builtin's, see BUILTIN_NAMED)
for _name in __all__:
    if _inspect.isfunction(_here[_name]):
        _here[_name] = _preserving(_here[_name], _name)

#: ``jm.sum``, ``jm.max``, ``jm.abs``, ...: public names that are Python builtins.
BUILTIN_NAMED = {
    name: _preserving(fn, name)
    for name, fn in {**pointwise.BUILTIN_NAMED, **reduction.BUILTIN_NAMED}.items()
}
_install({**{n: globals()[n] for n in __all__}, **BUILTIN_NAMED})  # jm.Tensor's methods
#: ``jm.return_types.max`` etc.: the named tuples, by PyTorch's names.
RETURN_TYPES = dict(reduction.RETURN_TYPES)
