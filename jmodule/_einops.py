"""einops accepts jmodule's Parameters and Buffers, through a backend of its own.

einops picks a backend per tensor type (``einops._backends.get_backend``): it
asks each backend class it knows whether the tensor is its type; the classes
are the subclasses of ``einops._backends.AbstractBackend`` whose
``framework_name`` is an imported module. Its jax backend asks
``isinstance(x, jax.numpy.ndarray)``, which a Parameter is not (it is a state
cell holding a ``jax.Array``: making it an instance of ``jax.Array`` would
send it down JAX's own fast paths as if it were an array).

So jmodule, when einops is installed, defines one more backend class,
:class:`CellBackend` (``framework_name = "jmodule"``), through einops' own
extension point: it claims only state cells and computes with their values
read as every operator reads them (``state.read``: a ``jm.backward`` sees the
read, so gradients flow; inside ``jm.compile`` the value is the traced one).
Nothing of einops is patched and no other type changes backend. Under
``jax.jit``, a Parameter passed as an argument is already a plain tracer
(it is a pytree of one leaf), which einops' jax backend handles itself.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from jmodule._lowering import state

__all__ = ["CellBackend"]


def _v(x: Any) -> Any:
    return state.value(x)


def _define() -> Any:
    from einops import _backends

    class CellBackend(_backends.JaxBackend):
        """einops' jax backend for jmodule's Parameter and Buffer (their values)."""

        framework_name = "jmodule"

        def is_appropriate_type(self, tensor: Any) -> bool:
            return state.is_cell(tensor)

        def shape(self, x: Any) -> Any:
            return _v(x).shape

        def reshape(self, x: Any, shape: Any) -> Any:
            return self.np.reshape(_v(x), shape)

        def transpose(self, x: Any, axes: Any) -> Any:
            # numpy's transpose (a permutation): a Parameter's own is PyTorch's.
            return self.np.transpose(_v(x), axes)

        def reduce(self, x: Any, operation: str, axes: Any) -> Any:
            return getattr(self.np, operation)(_v(x), axis=axes)

        def add_axis(self, x: Any, new_position: int) -> Any:
            return self.np.expand_dims(_v(x), new_position)

        def tile(self, x: Any, repeats: Any) -> Any:
            return self.np.tile(_v(x), repeats)

        def concat(self, tensors: list, axis: int) -> Any:
            return self.np.concatenate([_v(t) for t in tensors], axis=axis)

        def stack_on_zeroth_dimension(self, tensors: list) -> Any:
            return self.np.stack([_v(t) for t in tensors])

        def is_float_type(self, x: Any) -> bool:
            return super().is_float_type(_v(x))

        def einsum(self, pattern: str, *x: Any) -> Any:
            return self.np.einsum(pattern, *map(_v, x))

        def to_numpy(self, x: Any) -> Any:
            return self.onp.asarray(_v(x))

    return CellBackend


def _try_define() -> Any:
    if importlib.util.find_spec("einops") is None:
        return None
    try:
        return _define()
    except (ImportError, AttributeError):  # an einops without this extension point
        return None


#: The backend class einops finds for state cells (None without a usable einops).
CellBackend = _try_define()
