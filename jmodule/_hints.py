"""Errors that teach, on ``jax.Array`` itself, for what PyTorch users try first.

jmodule's activations are plain ``jax.Array``\\ s (and tracers inside compiled
code), so ``loss.backward()`` and ``h.view(3, -1)`` reach JAX, whose answers
(``AttributeError ... 'ArrayImpl' object has no attribute 'backward'``,
``Cannot interpret '-1' as a data type``) do not say what to do. Importing
jmodule adds, on JAX's array and tracer classes:

* ``backward``: a property that raises ``AttributeError`` naming
  ``jm.backward`` (``hasattr(x, "backward")`` stays False);
* ``view``: JAX's own ``view(dtype)`` unchanged; called PyTorch's way, with
  a shape (``view(3, -1)``, ``view((3, 4))``), which JAX rejects anyway, it
  raises a ``TypeError`` naming ``reshape``.

Nothing valid in JAX behaves differently.
"""

from __future__ import annotations

from typing import Any

BACKWARD_HELP = (
    "jax arrays carry no autograd graph, so there is no loss.backward(). Compute the loss "
    "inside jm.backward, which runs it once and accumulates .grad like PyTorch: "
    "loss = jm.backward(lambda: loss_fn(model(x), y)). (jm.grad(fn) returns gradients "
    "without touching .grad.)"
)
VIEW_HELP = (
    "jax arrays' .view() reinterprets the dtype, as NumPy's does, and takes no shape. For "
    "PyTorch's x.view({shape}) use x.reshape({shape}): arrays are immutable, so a reshape "
    "is what view does (no copy is made when the layout allows)."
)


def _is_shape_like(args: tuple) -> bool:
    def dim(a: Any) -> bool:
        return isinstance(a, int) and not isinstance(a, bool)

    if args and all(dim(a) for a in args):
        return True
    return len(args) == 1 and isinstance(args[0], (tuple, list)) and all(dim(a) for a in args[0])


def _backward(self: Any) -> Any:
    raise AttributeError(BACKWARD_HELP)


def _install() -> None:
    from jax._src.array import ArrayImpl
    from jax.core import Tracer

    for cls in (ArrayImpl, Tracer):
        if getattr(cls, "_jm_hints", False):
            continue
        original = cls.view

        def view(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if not kwargs and _is_shape_like(args):
                shown = ", ".join(
                    map(str, args[0] if len(args) == 1 and not isinstance(args[0], int) else args)
                )
                raise TypeError(VIEW_HELP.format(shape=shown))
            return _original(self, *args, **kwargs)

        view.__doc__ = original.__doc__
        cls.view = view
        cls.backward = property(_backward, doc="Not in JAX: use jm.backward (see its docs).")
        cls._jm_hints = True


_install()
