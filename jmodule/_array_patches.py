"""Teaching errors installed on JAX's array and tracer classes: the one module that patches JAX.

Errors that teach, on ``jax.Array`` itself, for what PyTorch users try first.

jmodule's activations are plain ``jax.Array``\\ s (and tracers inside compiled
code), so ``loss.backward()`` and ``h.view(3, -1)`` reach JAX, whose answers
(``AttributeError ... 'ArrayImpl' object has no attribute 'backward'``,
``Cannot interpret '-1' as a data type``) do not say what to do. Importing
jmodule adds, on JAX's array and tracer classes:

* ``backward``: a property that raises ``AttributeError`` naming
  ``jm.backward`` (``hasattr(x, "backward")`` stays False);
* ``view``: JAX's own ``view(dtype)`` unchanged; called PyTorch's way, with
  a shape (``view(3, -1)``, ``view((3, 4))``), which JAX rejects anyway, it
  raises a ``TypeError`` naming ``reshape``;
* ``torch.Tensor``'s common in-place methods (``copy_``, ``zero_``, ``add_``,
  ``masked_fill_``, ... :data:`INPLACE`): properties that raise
  ``AttributeError`` (``hasattr`` stays False) saying that jax arrays are
  immutable, what computes the new array, and how to change a module's state
  instead (``model.state_dict()[k].copy_(w)``, Hugging Face's
  ``from_pretrained``, holds arrays: ``load_state_dict``, or
  ``state_dict(keep_vars=True)``, whose values are the Parameters).

A tracer looks up what its class lacks through ``Tracer.__getattr__``, which
Python also calls when a property raises ``AttributeError``; for the hinted
names it raises the hint (every other name goes to JAX's own, unchanged).
Nothing valid in JAX behaves differently (``tests/project/test_array_patches.py``
checks JAX's own ``view(dtype)`` on arrays and tracers). No other module of
jmodule assigns attributes to JAX's classes.
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


#: ``torch.Tensor``'s in-place methods that get a hint on jax arrays, and (where no
#: ``jm.<name without _>`` function computes it) what computes the new array instead.
INPLACE = {
    "copy_": "jnp.broadcast_to(src, x.shape).astype(x.dtype)",
    "zero_": "jnp.zeros_like(x)",
    "fill_": "jnp.full_like(x, value)",
    "normal_": "mean + std * jm.randn_like(x)",
    "uniform_": "a + (b - a) * jm.rand_like(x)",
    "random_": "jm.randint(low, high, x.shape)",
    "detach_": "jax.lax.stop_gradient(x)",
    "fill_diagonal_": "x.at[jnp.diag_indices(min(x.shape))].set(value)",
    **{
        f"{name}_": ""
        for name in (
            "add sub mul div clamp clip pow neg abs exp log sqrt sigmoid tanh relu floor ceil "
            "round sign reciprocal lerp addcmul addcdiv masked_fill index_copy index_fill "
            "index_add scatter scatter_add bernoulli"
        ).split()
    },
}

INPLACE_HELP = (
    "jax arrays are immutable, so x.{name}(...) cannot change x in place (a model.state_dict() "
    "value, an activation and a traced value are all jax arrays). Compute the new array: "
    "x = {functional}. {state}"
)
_STATE_WITH_METHOD = (
    "To change a module's parameters or buffers: model.load_state_dict(state_dict) (strict, "
    "shapes checked, as in PyTorch), or update the Parameters themselves, as Hugging "
    "Face-style loading does: model.state_dict(keep_vars=True)[k].{name}(...) (its parameter "
    "values are the Parameters, whose {name} changes the module), or "
    "module.weight.{name}(...). Buffers are arrays there too: load_state_dict sets them, or "
    "assign the new array (module.running_mean = new)."
)
_STATE_WITHOUT_METHOD = (
    "To change a module's parameters or buffers: model.load_state_dict(state_dict), or assign "
    "the new array: module.weight.data = new for a parameter, module.name = new for a buffer."
)


def inplace_help(name: str) -> str:
    """The message for ``x.<name>`` on a jax array, ``name`` one of :data:`INPLACE`."""
    from jmodule.nn.parameter import Parameter

    functional = INPLACE[name] or f"jm.{name[:-1]}(x, ...)"
    how = (
        _STATE_WITH_METHOD.format(name=name) if hasattr(Parameter, name) else _STATE_WITHOUT_METHOD
    )
    return INPLACE_HELP.format(name=name, functional=functional, state=how)


def _inplace(name: str) -> property:
    def fget(self: Any) -> Any:
        raise AttributeError(inplace_help(name))

    return property(fget, doc=f"Not in JAX (arrays are immutable): {name} explains what to do.")


def _hint(name: str) -> str | None:
    if name == "backward":
        return BACKWARD_HELP
    if name in INPLACE:
        return inplace_help(name)
    return None


def _install() -> None:
    from jax.core import Tracer

    from jmodule._jax_internals import ArrayImpl

    if not getattr(Tracer, "_jm_hints", False):
        original_getattr = Tracer.__getattr__

        def __getattr__(self: Any, name: str, _original: Any = original_getattr) -> Any:
            hint = _hint(name)
            if hint is not None:  # a hint property raised: say it, not "has no attribute"
                raise AttributeError(hint)
            return _original(self, name)

        Tracer.__getattr__ = __getattr__

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
        for name in INPLACE:
            if not hasattr(cls, name):  # never shadow a JAX attribute
                setattr(cls, name, _inplace(name))
        cls._jm_hints = True


_install()
