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

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jmodule import _tensor
from jmodule._lowering import recorder as _recorder
from jmodule._lowering import state
from jmodule._lowering import tape as _tape
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.binding import TracerLeakError
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = [
    "backward",
    "enable_grad",
    "grad",
    "inference_mode",
    "is_grad_enabled",
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


def tensor_backward(
    tensor: Any, gradient: Any, retain_graph: bool | None, create_graph: bool, inputs: Any
) -> None:
    """``Tensor.backward`` (see its docs): walk the graph back from ``tensor``."""
    if create_graph:
        raise RuntimeError(
            "backward(create_graph=True) is not supported: gradients are plain arrays. For "
            "higher-order derivatives compose jm.grad / jax.grad."
        )
    v = tensor._v
    if type(v) is not _tape.TapeTracer or not v._trace.graph:
        raise RuntimeError(NO_GRAPH_HELP)
    if gradient is None:
        if v.shape != ():
            raise RuntimeError(
                "grad can be implicitly created only for scalar outputs (this value has shape "
                f"{tuple(v.shape)}: pass backward(gradient=...))"
            )
        seed = _tape._seed(v.val)
    else:
        seed = _tape.concrete(state.value(_tensor._plain(gradient)))
        seed = jnp.asarray(seed, v.dtype)
        if seed.shape != v.shape:
            raise RuntimeError(
                f"Mismatch in shape: grad_output[0] has a shape of {tuple(seed.shape)} and "
                f"output[0] has a shape of {tuple(v.shape)}."
            )
    only = None if inputs is None else _targets(inputs)
    try:
        per_recorder = v._trace.backward_graph(v, seed, retain=bool(retain_graph))
        for rec, grads in per_recorder.items():
            if only is not None:
                keep = {t.index for t in rec.tapped.values() if id(t.cell) in only}
                grads = {i: g for i, g in grads.items() if i in keep}
            _accumulate(rec, grads, zeroed=frozenset())
    except Exception as e:
        _tracebacks.hide(e)
        raise


NO_GRAPH_HELP = (
    "element 0 of tensors does not require grad and does not have a grad_fn: this value was "
    "not computed from parameters in grad mode. loss.backward() walks the graph that eager "
    "calls record with grad mode on (outside jm.no_grad): a module called on a jm.Tensor "
    "(jmodule.torch's tensors are), and Tensor operations or jm functions on what it "
    "returns. A jax.Array has no graph, and inside jm.compile / jax.jit there is none: there, "
    "differentiate a closure with jm.backward(lambda: loss_fn(model(x), y))."
)


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
    for t in rec.tapped.values():
        p = t.cell
        g = (grads or {}).get(t.index)
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
    read = {id(t.cell) for t in rec.tapped.values()}
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
        index = {id(t.cell): t.index for t in rec.tapped.values()}
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
    """A grad-mode switch: a context manager that is also a decorator, used with or
    without parentheses (``@jm.no_grad`` and ``@jm.no_grad()``), as PyTorch's are.

    Grad mode belongs to the thread (as PyTorch's). It decides whether eager
    calls on jm.Tensors record the graph ``loss.backward()`` walks: under
    ``no_grad`` they compute values only (no residuals kept, as PyTorch). It does
    not reach into ``jm.backward``/``jm.grad``, which differentiate what their
    closure reads whatever the mode (cut gradients there with ``.detach()`` or
    ``jax.lax.stop_gradient``), nor compiled code, which records no graph.
    """

    #: The grad mode inside the block (None: this helper does not change it).
    _mode: bool | None = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], bool):
            return cls()(args[0])  # used as a bare decorator
        return super().__new__(cls)

    def __enter__(self) -> None:
        local = state.local
        self.__dict__.setdefault("_outer", []).append(local.grad_enabled)
        if self._mode is not None:
            local.grad_enabled = self._mode

    def __exit__(self, *exc: object) -> None:
        state.local.grad_enabled = self._outer.pop()

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self.clone():
                return fn(*args, **kwargs)

        return run

    def clone(self) -> _GradMode:
        """A fresh helper of the same kind (PyTorch's ``clone``)."""
        fresh = object.__new__(type(self))
        fresh.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_outer"})
        return fresh


class no_grad(_GradMode):
    """``with jm.no_grad():`` / ``@jm.no_grad`` / ``@jm.no_grad()``: grad mode off in
    the block (see ``_GradMode``): no graph is recorded for ``loss.backward()``.

    >>> import jmodule as jm
    >>> @jm.no_grad
    ... def evaluate(x):
    ...     return x * 2, jm.is_grad_enabled()
    >>> with jm.no_grad():
    ...     evaluate(3)
    (6, False)
    >>> jm.is_grad_enabled()
    True
    """


class enable_grad(_GradMode):
    """``with jm.enable_grad():`` / ``@jm.enable_grad``: grad mode on in the block."""

    _mode = True


class inference_mode(_GradMode):
    """``with jm.inference_mode():`` / ``@jm.inference_mode`` / ``@jm.inference_mode(False)``:
    as :class:`no_grad`; ``inference_mode(False)`` leaves the mode as it is (compile with
    ``model.compile()`` for fast inference)."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = bool(mode)
        self._mode = False if self.mode else None


class set_grad_enabled(_GradMode):
    """``jm.set_grad_enabled(mode)``: as a call, sets this thread's grad mode; as a
    context manager or a decorator, sets it for the block and restores it after (as
    PyTorch's)."""

    def __new__(cls, mode: bool) -> set_grad_enabled:
        return super().__new__(cls)

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
        self._mode = self.mode
        self._before = state.local.grad_enabled
        state.local.grad_enabled = self.mode  # a plain call sets it (torch's semantics)

    def __enter__(self) -> None:
        self.__dict__.setdefault("_outer", []).append(self._before)

    def __call__(self, fn: Callable) -> Callable:
        state.local.grad_enabled = self._before  # as a decorator it sets nothing until called
        return super().__call__(fn)

    def clone(self) -> _GradMode:
        fresh = object.__new__(type(self))
        fresh.mode = fresh._mode = self.mode
        fresh._before = state.local.grad_enabled
        state.local.grad_enabled = self.mode
        return fresh


def is_grad_enabled() -> bool:
    """Whether grad mode is on in this thread (see :class:`no_grad`).

    >>> import jmodule as jm
    >>> with jm.set_grad_enabled(False):
    ...     jm.is_grad_enabled()
    False
    """
    return state.local.grad_enabled


_tensor.install_autograd(_recorder.in_graph, tensor_backward)
