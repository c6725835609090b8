"""Gradients the PyTorch way, computed by JAX: ``jm.backward``, ``jm.grad``.

``jm.backward(closure)`` is ``loss.backward()`` for a world without a tape:
it runs ``closure()`` once under ``jax.vjp`` and accumulates the gradients
into ``param.grad`` exactly as PyTorch does. What it differentiates is what
the closure *read*: every parameter that requires grad whose value the
closure used, however it reached it (a module in a container, a global, an
attribute chain, a bare Parameter). Parameters the loss does not depend on
keep ``grad=None``. Buffer writes and random draws made by the closure
persist, as they would eagerly. The same code runs inside ``jm.compile``,
where it becomes part of one XLA program. ``_lowering/recorder.py`` has the
machinery.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import recorder as _recorder
from jmodule._lowering import state
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.binding import TracerLeakError
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = [
    "backward",
    "enable_grad",
    "grad",
    "inference_mode",
    "no_grad",
    "set_grad_enabled",
    "value_and_grad",
]


def _targets(inputs: Any) -> set[int]:
    """Ids of the parameters named by ``inputs`` (modules, Parameters, or sequences of them)."""
    if isinstance(inputs, (Module, Parameter)):
        inputs = [inputs]
    out: set[int] = set()
    for x in inputs:
        if isinstance(x, Module):
            out.update(id(p) for p in x.parameters())
        elif isinstance(x, Parameter):
            out.add(id(x))
        elif isinstance(x, (list, tuple)):
            out |= _targets(x)
        else:
            raise TypeError(
                "backward(inputs=...) takes modules and Parameters (or sequences of them); "
                f"got {type(x).__name__}"
            )
    return out


def backward(
    closure: Callable[[], Any],
    inputs: Any = None,
    *,
    has_aux: bool = False,
    retain_graph: bool | None = None,
    create_graph: bool = False,
) -> Any:
    """Run ``closure()`` once and accumulate d(loss)/d(param) into every ``param.grad``.

    The jmodule spelling of ``loss = closure(); loss.backward()``: gradients
    add to existing ``.grad`` values (call ``zero_grad()`` between steps, as
    in PyTorch). The parameters differentiated are those the closure read
    that require grad; parameters with ``requires_grad=False`` or that the
    loss does not depend on get none. Buffer updates (BatchNorm statistics)
    and random draws made by the closure persist.

    Args:
        closure: a function of no arguments returning a scalar loss.
        inputs: modules and/or Parameters: accumulate only into these (as
            ``loss.backward(inputs=...)``).
        has_aux: the closure returns ``(loss, aux)``: values computed with the
            loss that the caller needs (an RNN's ``hidden``, the logits), as
            ``jax.value_and_grad(has_aux=True)``. ``aux`` comes back as the
            values (concrete eagerly; inside ``jm.compile``, values of the
            program), not differentiated. A value the closure assigns to a
            variable outside it is usable after an eager ``jm.backward``; inside
            ``jm.compile`` it belongs to the finished gradient and cannot be used
            (the error says to return it as ``aux``).
        retain_graph: accepted for PyTorch compatibility (JAX keeps no graph).
        create_graph: not supported; use ``jm.grad`` for higher derivatives.

    Returns:
        The loss; with ``has_aux``, ``(loss, aux)``.

    Raises:
        RuntimeError: the loss is not a scalar.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Linear(3, 1)
    >>> loss = jm.backward(lambda: model(jnp.ones((4, 3))).sum())
    >>> model.weight.grad
    Array([[4., 4., 4.]], dtype=float32)
    >>> def closure():
    ...     out = model(jnp.ones((2, 3)))
    ...     return out.sum(), out  # the loss, and what the caller keeps
    >>> loss, out = jm.backward(closure, has_aux=True)
    >>> out.shape
    (2, 1)
    """
    del retain_graph
    if create_graph:
        raise RuntimeError(
            "jm.backward(create_graph=True) is not supported: gradients are plain arrays. "
            "For higher-order derivatives compose jm.grad / jax.grad."
        )
    _recorder.note_backward()
    only = None if inputs is None else _targets(inputs)
    try:
        loss, aux, rec, grads = _recorder.differentiate(
            lambda _: _checked(closure(), has_aux), only=only, has_aux=has_aux, caller="backward"
        )
        _accumulate(rec, grads, zeroed=frozenset())
    except Exception as e:  # the closure's line and the message first, not jmodule's frames
        _tracebacks.hide(e)
        raise
    return (loss, aux) if has_aux else loss


def _checked(out: Any, has_aux: bool) -> Any:
    """The closure's result, checked for the shape ``has_aux`` says it has."""
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(
                "jm.backward(fn, has_aux=True): fn must return a pair (loss, aux); it returned "
                f"{type(out).__name__}"
            )
        return tuple(out)
    if isinstance(out, (tuple, list)):
        raise RuntimeError(
            f"jm.backward: the closure returned a {type(out).__name__} of {len(out)}, not a "
            "scalar loss. To hand values back with the loss (an RNN's hidden state, the "
            "logits), return (loss, aux) and call jm.backward(fn, has_aux=True), which "
            "returns (loss, aux)."
        )
    return out


def _accumulate(rec: _recorder.Recorder, grads: dict[int, Any] | None, zeroed: Any) -> None:
    """Add each tapped parameter's gradient into its ``.grad`` (set it, for ids in ``zeroed``)."""
    for p, _, index in rec.tapped.values():
        g = (grads or {}).get(index)
        fresh = id(p) in zeroed
        if g is None:
            if fresh:
                p.grad = None
            continue
        if (
            isinstance(g, jax.core.Tracer)
            and state.local.recorder is None  # not inside another gradient's trial (step)
            and not state.is_bound(p.__dict__)
        ):
            raise TracerLeakError(UNBOUND_GRAD_HELP.format(shape=tuple(p.shape)))
        g = g.astype(p.dtype) if g.dtype != p.dtype else g
        p.grad = g if fresh or p.grad is None else p.grad + g


def step_closure(closure: Callable[[], Any], params: Sequence[Parameter]) -> Any:
    """``Optimizer.step(closure)``: the closure's loss, with ``.grad`` set for ``params``.

    A PyTorch-style closure (it calls ``zero_grad()`` and ``jm.backward``
    itself) runs as it is. A closure that only returns the loss is
    differentiated, as ``zero_grad()`` then ``jm.backward(closure)`` would.
    Which kind it is shows while it runs, once: a ``jm.backward`` inside it.
    """
    loss, _, rec, grads = _recorder.differentiate(
        lambda _: closure(), caller="step", step_closure=True
    )
    if grads is None:  # it called jm.backward itself
        for p in params:
            if rec.owns(p.grad):
                raise RuntimeError(STEP_READ_BEFORE_HELP)
        return loss
    mine = {id(p) for p in params}
    read = {id(p) for p, _, _ in rec.tapped.values()}
    for p in params:
        if id(p) not in read:
            p.grad = None  # what zero_grad() would have left
    _accumulate(rec, grads, zeroed=mine)
    return loss


UNBOUND_GRAD_HELP = (
    "jm.backward inside a traced function (jm.compile, jax.jit) differentiated a Parameter "
    "of shape {shape} that the function reaches outside its arguments (a global or closure "
    "variable): its .grad would hold a traced value after the function returns. Pass the "
    "module (or the Parameter) holding it as an argument of the compiled function."
)
STEP_READ_BEFORE_HELP = (
    "The closure given to Optimizer.step() computed with parameters before it called "
    "jm.backward, and the gradients jm.backward found depend on those values. Compute the "
    "loss inside the function given to jm.backward: "
    "`def closure(): opt.zero_grad(); return jm.backward(lambda: loss_fn(model(x), y))`."
)


def value_and_grad(
    fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``jax.value_and_grad`` for functions of modules.

    For a module argument the gradient is a dict keyed like its
    ``state_dict()`` (parameters with ``requires_grad`` only); for an array
    argument it is an array. ``.grad`` attributes are not touched; buffer
    updates and random draws made by ``fn`` persist.

    Args:
        fn: the function; it returns a scalar (and an auxiliary value with
            ``has_aux``).
        argnums: which positional argument(s) to differentiate.
        has_aux: ``fn`` returns ``(loss, aux)``.

    Returns:
        A function returning ``(value, grads)`` (``((value, aux), grads)``
        with ``has_aux``); ``grads`` is a tuple when ``argnums`` is.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Linear(2, 1)
    >>> loss, grads = jm.value_and_grad(lambda m, x: m(x).sum())(model, jnp.ones((3, 2)))
    >>> sorted(grads), grads["bias"]
    (['bias', 'weight'], Array([3.], dtype=float32))
    """
    multiple = not isinstance(argnums, int)
    nums = tuple(argnums) if multiple else (argnums,)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        layout: list[tuple[str, Any]] = []  # ("module", [(name, param)]) or ("array", array)
        only: set[int] = set()
        for i in nums:
            t = args[i]
            if isinstance(t, Module):
                entries = [(n, p) for n, p in t.named_parameters() if p.requires_grad]
                only.update(id(p) for _, p in entries)
                layout.append(("module", entries))
            else:
                layout.append(("array", jnp.asarray(state.value(t))))
        arrays: list[int] = []

        def call(rec: _recorder.Recorder) -> Any:
            call_args = list(args)
            for pos, (kind, x) in zip(nums, layout):
                if kind == "array":
                    call_args[pos], index = rec.tap_array(x)
                    arrays.append(index)
            return fn(*call_args, **kwargs)

        value, aux, rec, grads = _recorder.differentiate(
            call, only=only, has_aux=has_aux, caller="value_and_grad"
        )
        index = {id(p): i for p, _, i in rec.tapped.values()}
        out, j = [], 0
        for kind, x in layout:
            if kind == "module":
                out.append({n: _grad_or_zeros(grads, index.get(id(p)), p) for n, p in x})
            else:
                out.append(_grad_or_zeros(grads, arrays[j], x))
                j += 1
        result = tuple(out) if multiple else out[0]
        return ((value, aux), result) if has_aux else (value, result)

    return wrapped


def _grad_or_zeros(grads: dict[int, Any] | None, index: int | None, like: Any) -> Any:
    g = None if index is None or grads is None else grads.get(index)
    ref = state.peek(like) if state.is_cell(like) else like
    if g is None:
        return jnp.zeros_like(ref)
    return g.astype(ref.dtype) if g.dtype != ref.dtype else g


def grad(
    fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``jax.grad`` for functions of modules; see :func:`value_and_grad`.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Linear(2, 1)
    >>> grads = jm.grad(lambda m, x: m(x).sum())(model, jnp.ones((3, 2)))
    >>> grads["weight"].shape
    (1, 2)
    """
    vg = value_and_grad(fn, argnums, has_aux)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped


class _GradMode:
    """A grad-mode helper: a no-op context manager that is also a decorator, used with or
    without parentheses (``@jm.no_grad`` and ``@jm.no_grad()``), as PyTorch's are.

    jmodule records no graph outside ``jm.backward``/``jm.grad``, so there is
    nothing to switch: these exist so that ported code runs unchanged. Inside
    a differentiated closure they do not cut gradients; do that explicitly
    with ``param.detach()`` or ``jax.lax.stop_gradient``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], bool):
            return args[0]  # used as a bare decorator: the function, unchanged
        return super().__new__(cls)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: Callable) -> Callable:
        return fn

    def clone(self) -> _GradMode:
        """A fresh helper of the same kind (PyTorch's ``clone``)."""
        return self


class no_grad(_GradMode):
    """``with jm.no_grad():`` / ``@jm.no_grad`` / ``@jm.no_grad()``: accepted for porting,
    and a no-op (see ``_GradMode``).

    >>> import jmodule as jm
    >>> @jm.no_grad
    ... def evaluate(x):
    ...     return x * 2
    >>> with jm.no_grad():
    ...     evaluate(3)
    6
    """


class enable_grad(_GradMode):
    """``with jm.enable_grad():`` / ``@jm.enable_grad``: a no-op, as :class:`no_grad`."""


class inference_mode(_GradMode):
    """``with jm.inference_mode():`` / ``@jm.inference_mode`` / ``@jm.inference_mode(False)``:
    a no-op, as :class:`no_grad` (compile with ``model.compile()`` for fast inference)."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = bool(mode)


class set_grad_enabled(_GradMode):
    """``jm.set_grad_enabled(mode)``, as a call, a context manager or a decorator: a no-op
    (see :class:`no_grad`)."""

    def __new__(cls, mode: bool) -> set_grad_enabled:
        return super().__new__(cls)

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
