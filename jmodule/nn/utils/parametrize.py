"""Parametrizations, as ``torch.nn.utils.parametrize``: a tensor computed from others.

``register_parametrization(module, "weight", P())`` moves ``module.weight``
(a parameter or a buffer) to ``module.parametrizations.weight.original`` and
makes ``module.weight`` a property of the module's new class
(``Parametrized<Class>``) that returns ``P()(original)`` on every read, as in
PyTorch. State-dict keys are PyTorch's (``parametrizations.weight.original``,
or ``original0``, ``original1``, ... when ``right_inverse`` returns several
tensors), so PyTorch checkpoints load unchanged.

Reading the property computes the tensor from whatever ``original`` holds
then: eagerly, the current value; inside ``jm.compile``, the program's traced
value, so a compiled step recomputes it every call (nothing stale is baked in);
inside ``jm.backward``, a differentiated read, so gradients reach
``original`` and an optimizer given ``model.parameters()`` trains it.

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> from jmodule.nn.utils import parametrize as P
>>> class Symmetric(jm.nn.Module):
...     def forward(self, X):
...         return jnp.triu(X) + jnp.triu(X, 1).T
>>> m = P.register_parametrization(jm.nn.Linear(3, 3), "weight", Symmetric())
>>> type(m).__name__, list(m.state_dict())
('ParametrizedLinear', ['bias', 'parametrizations.weight.original'])
>>> bool((m.weight == m.weight.T).all())
True
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from jmodule import _jax_internals as _jx
from jmodule._lowering import state as _state
from jmodule.nn.modules.container import ModuleDict, ModuleList
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter

__all__ = [
    "ParametrizationList",
    "cached",
    "is_parametrized",
    "register_parametrization",
    "remove_parametrizations",
    "transfer_parametrizations_and_params",
    "type_before_parametrizations",
]


def _is_tensor(x: Any) -> bool:
    """What PyTorch's ``isinstance(x, Tensor)`` means here: an array or a Parameter."""
    return isinstance(x, (jax.Array, _state.Cell))


def _no_grad(x: Any) -> Any:
    """``x`` cut from gradients (PyTorch computes these under ``torch.no_grad()``)."""
    if isinstance(x, _state.Cell):
        x = _state.read(x)
    return jax.lax.stop_gradient(x) if isinstance(x, jax.Array) else x


class _Cache:
    """The values of one thread's active ``cached()`` block (``state.local.parametrize_cache``)."""

    __slots__ = ("entries", "trace")

    def __init__(self, trace: Any) -> None:
        #: The JAX trace the outermost block was opened at.
        self.trace = trace
        #: ``(id(module), name) -> [(where computed, value), ...]``.
        self.entries: dict[tuple[int, str], list[tuple[tuple, Any]]] = {}


CACHED_AROUND_PROGRAM = (
    "parametrize.cached() is active around a compiled call (or another traced region: "
    "jax.jit, lax.scan, jm.utils.checkpoint) that reads a parametrized tensor. A compiled "
    "program cannot reuse a value from one call to the next, and it would keep the cache's "
    "effect when called outside the block. Put `with parametrize.cached():` inside the "
    "jm.compile'd function (or the module's forward), or leave it out."
)


@contextlib.contextmanager
def cached() -> Iterator[None]:
    """Compute each parametrized tensor once inside the block, as PyTorch's ``cached()``.

    The first read of ``module.weight`` in the block computes it; later reads
    return that value; leaving the outermost block drops the values. Works
    eagerly and inside a ``jm.compile``d function (put the block inside it:
    the program then computes the tensor once per call).

    Differences forced by JAX, each explicit:

    * a value is reused only where it was computed (the same JAX trace,
      binding and ``jm.backward``): read inside a ``jm.backward`` closure, a
      value cached outside it is computed again (once for the closure), so
      that gradients reach the originals;
    * a block *around* a compiled call raises ``RuntimeError`` when the
      program is traced and reads a parametrized tensor: a program cannot
      carry a value between calls. A program traced before, outside any
      block, runs as it was traced (computing the tensor at each read) even
      when called inside a block: ``cached()`` does not reach into programs;
    * the cache belongs to this thread (``threading.local``), as every
      context of jmodule does; PyTorch's is process-wide.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> from jmodule.nn.utils import parametrize as P
    >>> m = jm.nn.utils.parametrizations.weight_norm(jm.nn.Linear(2, 2))
    >>> with P.cached():
    ...     same = m.weight is m.weight
    >>> same, m.weight is m.weight
    (True, False)
    """
    local = _state.local
    outer = local.parametrize_cache
    if outer is None:
        local.parametrize_cache = _Cache(_jx.current_trace())
    try:
        yield
    finally:
        if outer is None:
            local.parametrize_cache = None


def _context() -> tuple[Any, Any, Any]:
    """Where a value was computed: the JAX trace, the innermost binding, the recorder."""
    local = _state.local
    return (
        _jx.current_trace(),
        local.bound[-1] if local.bound else None,
        local.recorder,
    )


def _traced_since(trace: Any, since: Any) -> bool:
    """Whether a jaxpr trace (jit, scan, checkpoint) began between ``since`` and ``trace``."""
    while trace is not None and trace is not since:
        if isinstance(trace, _jx.DynamicJaxprTrace):
            return True
        trace = _jx.parent_trace(trace)
    return False


def _cached_value(cache: _Cache, module: Module, tensor_name: str, compute: Any) -> Any:
    where = _context()
    if _traced_since(where[0], cache.trace):
        raise RuntimeError(CACHED_AROUND_PROGRAM)
    entries = cache.entries.setdefault((id(module), tensor_name), [])
    for computed_at, tensor in entries:
        if all(a is b for a, b in zip(computed_at, where)):
            return tensor
    tensor = compute()
    entries.append((where, tensor))
    return tensor


def _register_parameter_or_buffer(module: Module, name: str, X: Any) -> None:
    if isinstance(X, Parameter):
        module.register_parameter(name, X)
    else:
        module.register_buffer(name, X)


def _maybe_set(owner: Module, name: str, src: Any) -> None:
    """Put ``src`` into ``owner.<name>``, keeping the Parameter object (optimizers hold it),
    as PyTorch's ``dest.set_(src)``."""
    dest = owner._parameters.get(name)
    if dest is not None:
        _state.assign(dest, _state.as_array(src))
    else:
        setattr(owner, name, _state.as_array(src))


class ParametrizationList(ModuleList):
    """The parametrizations of one tensor and the original tensor(s) they start from.

    It is ``module.parametrizations[tensor_name]``, made by
    :func:`register_parametrization` (not by users). It holds the original
    under ``original``, or under ``original0``, ``original1``, ... when the
    first parametrization's ``right_inverse`` returns several tensors.

    Args:
        modules: the parametrizations, applied first to last.
        original: the parameter or buffer being parametrized.
        unsafe: allow the parametrization to change the dtype and shape.

    Raises:
        ValueError: a ``right_inverse`` or the parametrization returns
            something else than tensors, or changes the dtype or shape (unless
            ``unsafe``), as PyTorch's checks.
    """

    original: Any
    unsafe: bool

    def __init__(self, modules: Sequence[Module], original: Any, unsafe: bool = False) -> None:
        if len(modules) == 0:
            raise ValueError("ParametrizationList requires one or more modules.")
        super().__init__(modules)
        self.unsafe = unsafe
        original_shape = original.shape
        original_dtype = original.dtype
        new = _no_grad(original)
        for module in reversed(self):
            if hasattr(module, "right_inverse"):
                try:
                    new = module.right_inverse(new)
                except NotImplementedError:
                    pass
        if not _is_tensor(new) and not isinstance(new, Sequence):
            raise ValueError(
                "'right_inverse' must return a Tensor or a Sequence of tensors (list, tuple...). "
                f"Got {type(new).__name__}"
            )
        self.is_tensor = _is_tensor(new)
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            if original.dtype != new.dtype:
                raise ValueError(
                    "When `right_inverse` outputs one tensor, it may not change the dtype.\n"
                    f"original.dtype: {original.dtype}\n"
                    f"right_inverse(original).dtype: {new.dtype}"
                )
            if _devices(original) != _devices(new):
                raise ValueError(
                    "When `right_inverse` outputs one tensor, it may not change the device.\n"
                    f"original.device: {_devices(original)}\n"
                    f"right_inverse(original).device: {_devices(new)}"
                )
            if isinstance(original, Parameter):
                # The same Parameter object: an optimizer made before keeps training it.
                _state.assign(original, _state.as_array(new))
                self.register_parameter("original", original)
            else:
                self.register_buffer("original", _state.as_array(new))
        else:
            for i, originali in enumerate(new):
                if not _is_tensor(originali):
                    raise ValueError(
                        "'right_inverse' must return a Tensor or a Sequence of tensors "
                        "(list, tuple...). "
                        f"Got element {i} of the sequence with type {type(originali).__name__}."
                    )
                value = _state.as_array(originali)
                if isinstance(original, Parameter):
                    self.register_parameter(
                        f"original{i}", Parameter(value, requires_grad=original.requires_grad)
                    )
                else:
                    self.register_buffer(f"original{i}", value)
        if not self.unsafe:
            Z = self()
            if not _is_tensor(Z):
                raise ValueError(f"A parametrization must return a tensor. Got {type(Z).__name__}.")
            if Z.dtype != original_dtype:
                raise ValueError(
                    "Registering a parametrization may not change the dtype of the tensor, "
                    "unless `unsafe` flag is enabled.\n"
                    f"unparametrized dtype: {original_dtype}\n"
                    f"parametrized dtype: {Z.dtype}"
                )
            if tuple(Z.shape) != tuple(original_shape):
                raise ValueError(
                    "Registering a parametrization may not change the shape of the tensor, "
                    "unless `unsafe` flag is enabled.\n"
                    f"unparametrized shape: {_size(original_shape)}\n"
                    f"parametrized shape: {_size(Z.shape)}"
                )

    def right_inverse(self, value: Any) -> None:
        """Store ``value`` as the tensor's new value: the parametrizations' ``right_inverse``
        in reverse order, into ``original`` (or ``original0``, ``original1``, ...).

        This is what ``module.weight = value`` runs; eagerly and inside
        ``jm.compile`` (where it becomes an update of the program's state).

        Args:
            value: the value ``module.<tensor_name>`` should have.

        Raises:
            RuntimeError: a parametrization has no ``right_inverse``.
            ValueError: a ``right_inverse`` returns the wrong kind, number or
                dtype of tensors.
        """
        value = _no_grad(value)
        for module in reversed(self):
            if hasattr(module, "right_inverse"):
                value = module.right_inverse(value)
            else:
                raise RuntimeError(
                    f"parametrization {type(module).__name__} does not implement right_inverse."
                )
        if self.is_tensor:
            if not _is_tensor(value):
                raise ValueError(
                    f"`right_inverse` should return a tensor. Got {type(value).__name__}"
                )
            if value.dtype != self.original.dtype:
                raise ValueError(
                    f"The tensor returned by `right_inverse` has dtype {value.dtype} "
                    f"while `original` has dtype {self.original.dtype}"
                )
            _maybe_set(self, "original", value)
        else:
            if not isinstance(value, collections.abc.Sequence):
                raise ValueError(
                    "'right_inverse' must return a sequence of tensors. "
                    f"Got {type(value).__name__}."
                )
            if len(value) != self.ntensors:
                raise ValueError(
                    "'right_inverse' must return a sequence of tensors of length "
                    f"{self.ntensors}. Got a sequence of length {len(value)}."
                )
            for i, tensor in enumerate(value):
                original_i = getattr(self, f"original{i}")
                if not _is_tensor(tensor):
                    raise ValueError(
                        "'right_inverse' must return a sequence of tensors "
                        "or reference-type opaques. Got element "
                        f"{i} of type {type(tensor).__name__}."
                    )
                if original_i.dtype != tensor.dtype:
                    raise ValueError(
                        f"Tensor {i} returned by `right_inverse` has dtype {tensor.dtype} "
                        f"while `original{i}` has dtype {original_i.dtype}"
                    )
                _maybe_set(self, f"original{i}", tensor)

    def forward(self) -> Any:
        """The parametrized tensor: the parametrizations applied to the original(s)."""
        if self.is_tensor:
            x = self[0](self.original)
        else:
            x = self[0](*(getattr(self, f"original{i}") for i in range(self.ntensors)))
        for i in range(1, len(self)):
            x = self[i](x)
        return x


def _devices(x: Any) -> Any:
    """The devices of a concrete array (None for a traced one: nothing to compare)."""
    v = _state.peek(x) if isinstance(x, _state.Cell) else x
    if isinstance(v, jax.core.Tracer) or not isinstance(v, jax.Array):
        return None
    return v.devices()


def _size(shape: Any) -> str:
    """A shape as PyTorch prints a ``torch.Size``."""
    return f"torch.Size({list(shape)})"


def _default_deepcopy(self: Module, memo: dict) -> Module:
    # A parametrized module cannot be pickled (as PyTorch) but can be deep-copied.
    obj = memo.get(id(self))
    if obj is not None:
        return obj
    replica = self.__new__(type(self))
    memo[id(self)] = replica
    saved = super(type(self), self).__getstate__()
    replica.__setstate__(copy.deepcopy(saved, memo))
    return replica


def _getstate(self: Module) -> dict:
    raise RuntimeError(
        "Serialization of parametrized modules is only "
        "supported through state_dict(). See:\n"
        "https://pytorch.org/tutorials/beginner/saving_loading_models.html"
        "#saving-loading-a-general-checkpoint-for-inference-and-or-resuming-training"
    )


def _inject_new_class(module: Module) -> None:
    """Give ``module`` a class of its own, ``Parametrized<Class>``, to hold the properties."""
    cls = module.__class__
    dct: dict[str, Any] = {"__getstate__": _getstate}
    if not hasattr(cls, "__deepcopy__"):
        dct["__deepcopy__"] = _default_deepcopy
    module.__class__ = type(f"Parametrized{cls.__name__}", (cls,), dct)


def _inject_property(module: Module, tensor_name: str) -> None:
    """Make ``module.<tensor_name>`` a property computing the parametrized tensor."""
    if hasattr(module, tensor_name):
        raise AssertionError(f"Module already has an attribute named '{tensor_name}'")

    def get_parametrized(self: Module) -> Any:
        parametrization = self.parametrizations[tensor_name]
        cache = _state.local.parametrize_cache
        if cache is None:
            return parametrization()
        return _cached_value(cache, self, tensor_name, parametrization)

    def set_original(self: Module, value: Any) -> None:
        self.parametrizations[tensor_name].right_inverse(value)

    # It writes only the originals (state): ``Module.__setattr__`` lets a traced value
    # through and renews no attribute stamp (which would retrace a program every call).
    set_original._assigns_state = True  # type: ignore[attr-defined]
    setattr(module.__class__, tensor_name, property(get_parametrized, set_original))


def register_parametrization(
    module: Module, tensor_name: str, parametrization: Module, *, unsafe: bool = False
) -> Module:
    """Make ``module.<tensor_name>`` the output of ``parametrization``, as PyTorch's.

    The first parametrization of a tensor moves the parameter (or buffer) to
    ``module.parametrizations[tensor_name].original``; when
    ``parametrization`` has a ``right_inverse``, the original holds
    ``right_inverse(value)`` (several tensors, ``original0``, ``original1``,
    ..., when it returns a sequence). Later ones stack: the tensor is
    ``p_n(...p_1(original))``. The module's class becomes
    ``Parametrized<Class>``; reading ``module.<tensor_name>`` computes the
    tensor; assigning it runs ``right_inverse``. The same Parameter object
    stays ``original`` (when ``right_inverse`` returns one tensor), so an
    optimizer made before keeps training it.

    Args:
        module: the module holding the tensor.
        tensor_name: name of the parameter or buffer (or of an already
            parametrized tensor, to stack another parametrization).
        parametrization: a module whose ``forward`` maps the original(s) to
            the tensor; it may define ``right_inverse``.
        unsafe: skip the checks that the dtype and shape are kept.

    Returns:
        ``module``.

    Raises:
        ValueError: ``tensor_name`` is neither a parameter, a buffer nor a
            parametrized tensor of ``module``, or the parametrization breaks
            PyTorch's consistency checks (dtype, shape, kind of outputs).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> from jmodule.nn.utils import parametrize as P
    >>> class Double(jm.nn.Module):
    ...     def forward(self, X):
    ...         return 2 * X
    ...
    ...     def right_inverse(self, X):
    ...         return X / 2
    >>> m = jm.nn.Linear(2, 2)
    >>> w = m.weight.data
    >>> m = P.register_parametrization(m, "weight", Double())
    >>> original = m.parametrizations.weight.original
    >>> bool(jnp.allclose(m.weight, w)), bool(jnp.allclose(original, w / 2))
    (True, True)
    """
    parametrization.train(module.training)
    if is_parametrized(module, tensor_name):
        if not unsafe:
            Y = getattr(module, tensor_name)
            X = parametrization(Y)
            if not _is_tensor(X):
                raise ValueError(f"A parametrization must return a tensor. Got {type(X).__name__}.")
            if X.dtype != Y.dtype:
                raise ValueError(
                    "Registering a parametrization may not change the dtype of the tensor, "
                    "unless the `unsafe` flag is enabled.\n"
                    f"module.{tensor_name}.dtype: {Y.dtype}\n"
                    f"parametrization(module.{tensor_name}).dtype: {X.dtype}"
                )
            if tuple(X.shape) != tuple(Y.shape):
                raise ValueError(
                    "Registering a parametrization may not change the shape of the tensor, "
                    "unless the `unsafe` flag is enabled.\n"
                    f"module.{tensor_name}.shape: {_size(Y.shape)}\n"
                    f"parametrization(module.{tensor_name}).shape: {_size(X.shape)}"
                )
            if hasattr(parametrization, "right_inverse"):
                try:
                    Z = parametrization.right_inverse(X)
                except NotImplementedError:
                    pass
                else:
                    if not _is_tensor(Z):
                        raise ValueError(
                            "parametrization.right_inverse must return a tensor. "
                            f"Got: {type(Z).__name__}"
                        )
                    if Z.dtype != Y.dtype:
                        raise ValueError(
                            "The tensor returned by parametrization.right_inverse must have the "
                            f"same dtype as module.{tensor_name}, unless the `unsafe` flag is "
                            f"enabled.\nmodule.{tensor_name}.dtype: {Y.dtype}\n"
                            f"returned dtype: {Z.dtype}"
                        )
                    if tuple(Z.shape) != tuple(Y.shape):
                        raise ValueError(
                            "The tensor returned by parametrization.right_inverse must have the "
                            f"same shape as module.{tensor_name}, unless the `unsafe` flag is "
                            f"enabled.\nmodule.{tensor_name}.shape: {_size(Y.shape)}\n"
                            f"returned shape: {_size(Z.shape)}"
                        )
        plist = module.parametrizations[tensor_name]
        plist.append(parametrization)
        plist.unsafe |= unsafe
    elif tensor_name in module._buffers or tensor_name in module._parameters:
        original = getattr(module, tensor_name)
        parametrizations = ParametrizationList([parametrization], original, unsafe=unsafe)
        delattr(module, tensor_name)
        if not is_parametrized(module):
            _inject_new_class(module)
            module.parametrizations = ModuleDict()
        _inject_property(module, tensor_name)
        module.parametrizations[tensor_name] = parametrizations
    else:
        raise ValueError(
            f"Module '{module}' does not have a parameter, a buffer, or a "
            f"parametrized element with name '{tensor_name}'"
        )
    return module


def is_parametrized(module: Module, tensor_name: str | None = None) -> bool:
    """Whether ``module`` has a parametrization (on ``tensor_name``, when given).

    >>> import jmodule as jm
    >>> from jmodule.nn.utils import parametrize as P
    >>> m = jm.nn.utils.parametrizations.weight_norm(jm.nn.Linear(2, 2))
    >>> P.is_parametrized(m), P.is_parametrized(m, "weight"), P.is_parametrized(m, "bias")
    (True, True, False)
    """
    parametrizations = getattr(module, "parametrizations", None)
    if parametrizations is None or not isinstance(parametrizations, ModuleDict):
        return False
    if tensor_name is None:
        return len(parametrizations) > 0
    return tensor_name in parametrizations


def remove_parametrizations(
    module: Module, tensor_name: str, leave_parametrized: bool = True
) -> Module:
    """Remove the parametrizations of ``module.<tensor_name>``, as PyTorch's.

    With ``leave_parametrized=True`` the tensor keeps its current
    (parametrized) value; otherwise it gets the original back (only possible
    when there is one original). When ``original`` is one Parameter, that
    same object becomes ``module.<tensor_name>`` again (optimizers holding it
    carry on). The module gets its class back when nothing else is
    parametrized.

    Args:
        module: the parametrized module.
        tensor_name: the parametrized tensor.
        leave_parametrized: keep the parametrized value (else the original).

    Returns:
        ``module``.

    Raises:
        ValueError: ``module.<tensor_name>`` is not parametrized, or
            ``leave_parametrized=False`` with several originals.

    >>> import jmodule as jm
    >>> from jmodule.nn.utils import parametrize as P
    >>> m = jm.nn.utils.parametrizations.weight_norm(jm.nn.Linear(2, 2))
    >>> m = P.remove_parametrizations(m, "weight")
    >>> type(m).__name__, list(m.state_dict())
    ('Linear', ['bias', 'weight'])
    """
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
    parametrizations = module.parametrizations[tensor_name]
    if parametrizations.is_tensor:
        original = parametrizations.original
        if leave_parametrized:
            t = _no_grad(getattr(module, tensor_name))
            if isinstance(original, Parameter):
                _state.assign(original, _state.as_array(t))
            else:
                original = _state.as_array(t)
    else:
        if not leave_parametrized:
            raise ValueError(
                "Cannot leave unparametrized (`leave_parametrized=False`) a tensor "
                "that is parametrized in terms of a sequence of tensors."
            )
        t = _state.as_array(_no_grad(getattr(module, tensor_name)))
        originals = [
            getattr(parametrizations, f"original{i}") for i in range(parametrizations.ntensors)
        ]
        requires_grad = any(isinstance(o, Parameter) and o.requires_grad for o in originals)
        original = Parameter(t) if requires_grad else t
    delattr(module.__class__, tensor_name)
    del module.parametrizations[tensor_name]
    _register_parameter_or_buffer(module, tensor_name, original)
    if not is_parametrized(module):
        delattr(module, "parametrizations")
        module.__class__ = module.__class__.__bases__[0]
    return module


def type_before_parametrizations(module: Module) -> type:
    """The module's class before parametrizations were registered (else its class).

    >>> import jmodule as jm
    >>> from jmodule.nn.utils import parametrize as P
    >>> m = jm.nn.utils.parametrizations.weight_norm(jm.nn.Linear(2, 2))
    >>> P.type_before_parametrizations(m).__name__
    'Linear'
    """
    if is_parametrized(module):
        return module.__class__.__bases__[0]
    return type(module)


def transfer_parametrizations_and_params(
    from_module: Module, to_module: Module, tensor_name: str | None = None
) -> Module:
    """Register ``from_module``'s parametrizations (of ``tensor_name``, or all) on
    ``to_module`` too, with the same original parameters, as PyTorch's.

    Args:
        from_module: the parametrized module.
        to_module: the module to parametrize (missing tensors are created).
        tensor_name: the one tensor to transfer (default: every one).

    Returns:
        ``to_module``.
    """
    if is_parametrized(from_module):
        names = list(from_module.parametrizations) if tensor_name is None else [tensor_name]
        for parameter_name in names:
            if not hasattr(to_module, parameter_name):
                setattr(
                    to_module,
                    parameter_name,
                    Parameter(_state.as_array(getattr(from_module, parameter_name))),
                )
            for param_func in from_module.parametrizations[parameter_name]:
                register_parametrization(to_module, parameter_name, param_func)
            source = from_module.parametrizations[parameter_name]
            target = to_module.parametrizations[parameter_name]
            if hasattr(source, "original"):
                target.original = source.original
            else:
                num = 0
                while hasattr(source, f"original{num}"):
                    setattr(target, f"original{num}", getattr(source, f"original{num}"))
                    num += 1
    return to_module
