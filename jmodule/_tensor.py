"""``jm.Tensor``: an opt-in array with ``torch.Tensor``'s methods, for ported model code.

jmodule's activations are plain ``jax.Array`` s, and the three ``torch.Tensor``
methods ported code calls most clash with NumPy's meaning on them:
``x.size`` is an int, ``x.view(...)`` reinterprets a dtype and
``x.transpose(1, 2)`` permutes. Patching ``jax.Array`` is therefore not an
option (a JAX user's arrays must keep NumPy's meaning). Instead, a
:class:`Tensor` is a one-leaf pytree wrapping one array (a tracer inside
``jax.jit`` / ``jm.compile``, so it is free there: no copy, no extra
dispatch), with PyTorch's methods and in-place operations. It is opt-in by
the value: what you pass in decides what comes back.

* **Tensor in, Tensor out.** jmodule's layers (a module whose ``forward``
  is jmodule's own) and the ``jm.*`` / ``jm.nn.functional`` torch functions
  return Tensors when any argument is one (:func:`preserving`), and take
  plain arrays out of them first, so library code never sees a Tensor.
  A user module's ``forward`` gets the Tensors it is given. Operators with a
  Tensor (``t + x``, ``x * t``, ``t @ w``, with a Parameter or an array on
  either side) give Tensors; ``jnp`` functions accept Tensors
  (``__jax_array__``) and return plain arrays, as ``jnp`` always does.
  Where an array is on the left of an operator (``jnp.ones(3) + t``), JAX
  answers first and the result is a plain array.
* **In place.** A Tensor is a Python object holding its value, so
  ``t.add_(1)``, ``t += 1``, ``t[0] = 5``, ``t.masked_fill_(m, 0)``,
  ``t.copy_(src)`` replace the value and every name for the same Tensor
  sees it, eagerly and while tracing. Tensors share no memory, so a view
  (``t[0]``, ``t.view(...)``, ``t.transpose(0, 1)``) is a new value: an
  in-place change of a view would not reach its base, and raises instead
  while the base is alive (PyTorch would change both); a view remembers its
  base weakly, so ``x = zeros(6).view(2, 3); x += 1`` works. Inside
  ``jax.jit``/``jm.compile`` an argument Tensor is rebuilt from its traced
  leaf, so changing it in place could not reach the caller's object either:
  that raises too, saying to return the new value.
* **Type checks.** ``isinstance(x, jm.Tensor)`` is True for Tensors,
  ``jax.Array`` s (tracers included) and Parameters/Buffers, as
  ``isinstance(x, torch.Tensor)`` is for every tensor and parameter.

``import jmodule.torch as torch`` (``jmodule/torch``) is the namespace whose
creation functions return Tensors too, for a port that changes its imports only.

>>> import jmodule as jm
>>> x = jm.Tensor(jm.ones(2, 3, 4))
>>> x.size(), x.size(-1), x.transpose(1, 2).shape
(Size([2, 3, 4]), 4, Size([2, 4, 3]))
>>> y = x.view(2, -1) * 2
>>> y += 1
>>> float(y.sum()), y.dtype == jm.float32, type(jm.softmax(y, dim=-1)).__name__
(72.0, True, 'Tensor')
"""

from __future__ import annotations

import functools
import math
import operator
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _jax_internals as _jx
from jmodule._convert import torch_scalar_name
from jmodule._lowering import state
from jmodule._lowering.tape import TapeTracer as _TapeTracer
from jmodule._placement import device as _device

__all__ = [
    "Size",
    "SizeAttribute",
    "Tensor",
    "adopt",
    "has",
    "in_graph",
    "install",
    "install_autograd",
    "preserving",
    "unwrap_call",
    "wrap",
    "wrap_dim",
    "wrap_view",
]

_Tracer = jax.core.Tracer


class _TensorMeta(type):
    """``isinstance(x, Tensor)``: Tensors, ``jax.Array`` s and Parameters/Buffers (torch's
    ``isinstance(x, torch.Tensor)`` is True for tensors and parameters alike)."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return type.__instancecheck__(cls, obj) or isinstance(obj, jax.Array) or state.is_cell(obj)


def _make(v: Any, base: Any = None) -> Tensor:
    t = object.__new__(Tensor)
    t._v = v
    t._flags = 0
    t._base = base
    return t


def _view(v: Any, src: Any) -> Tensor:
    """A Tensor of ``v``, a view of ``src`` in PyTorch (the same memory): it remembers
    ``src``'s root Tensor, weakly, so that an in-place change raises while that is alive."""
    if type(src) is not Tensor:
        return _make(v)
    base = src._base
    if base is None or base() is None:
        base = weakref.ref(src)
    return _make(v, base)


_ARG = 2  # rebuilt from a traced leaf (an argument inside jax.jit / jm.compile)


def _leaf(x: Any) -> bool:
    return type(x) is Tensor or state.is_cell(x)


def wrap(out: Any) -> Any:
    """``out`` with every array in it (through tuples, lists, dicts, named tuples) a Tensor."""
    if isinstance(out, jax.Array):
        return _make(out)
    if type(out) is Tensor or out is None or isinstance(out, (bool, int, float, str)):
        return out
    return jax.tree_util.tree_map(
        lambda v: _make(v) if isinstance(v, jax.Array) else v, out, is_leaf=_leaf
    )


def _plain(x: Any) -> Any:
    return x._v if type(x) is Tensor else x


def has(args: tuple, kwargs: dict) -> bool:
    """Whether a Tensor is among ``args``/``kwargs`` (one level into tuples and lists)."""
    for a in args:
        t = type(a)
        if t is Tensor:
            return True
        if (t is tuple or t is list) and any(type(e) is Tensor for e in a):
            return True
    if kwargs:
        return has(tuple(kwargs.values()), {})
    return False


def unwrap_call(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    args = tuple(
        a._v
        if type(a) is Tensor
        else type(a)(_plain(e) for e in a)
        if type(a) in (tuple, list)
        else a
        for a in args
    )
    if kwargs:
        kwargs = dict(zip(kwargs, unwrap_call(tuple(kwargs.values()), {})[0]))
    return args, kwargs


#: Torch functions (and methods) whose result is a view of the input in PyTorch: changing
#: it in place would change the input there, so here it raises (see ``_VIEW_HELP``).
VIEWS = frozenset(
    "T as_strided broadcast_to chunk detach diagonal dsplit expand expand_as flatten hsplit "
    "movedim moveaxis mT narrow permute reshape reshape_as select split squeeze swapaxes "
    "swapdims t tensor_split transpose unbind unflatten unsqueeze view view_as view_as_complex "
    "view_as_real vsplit".split()
)


def _first(args: tuple) -> Any:
    for a in args:
        if type(a) is Tensor:
            return a
        if type(a) in (tuple, list):
            for e in a:
                if type(e) is Tensor:
                    return e
    return None


def wrap_view(out: Any, src: Any) -> Any:
    """:func:`wrap`, the Tensors views of ``src`` (what PyTorch's result would share)."""
    if isinstance(out, jax.Array):
        return _view(out, src)
    return jax.tree_util.tree_map(
        lambda v: _view(v, src) if isinstance(v, jax.Array) else v, out, is_leaf=_leaf
    )


# ------------------------------------------------------------------------- the graph
#
# ``loss.backward()``: eagerly, with grad mode on, a module called on jm.Tensors and
# every Tensor operation on a value of the graph (or on a parameter) run on this
# thread's graph tape (``recorder.in_graph``). Their Tensors hold the tape's values
# (``TapeTracer`` s: concrete for printing, ``float()`` and control flow); jnp and
# numpy get the arrays. Inside traced code there is no graph (``jm.backward`` there).


def _graph_arg(a: Any) -> bool:
    if type(a) is Tensor:
        v = a._v
        return type(v) is _TapeTracer and v._trace.graph
    return state.is_cell(a) and state.requires_grad(a)


def _graph_args(args: tuple, kwargs: dict) -> bool:
    """Whether a value of a graph, or a parameter that requires grad, is among the
    arguments (one level into tuples and lists)."""
    for a in args:
        t = type(a)
        if t is tuple or t is list:
            if any(_graph_arg(e) for e in a):
                return True
        elif _graph_arg(a):
            return True
    if kwargs:
        return _graph_args(tuple(kwargs.values()), {})
    return False


def recording() -> bool:
    """Whether calls made now record the graph: grad mode on, no gradient being taken,
    no trace (not even a tape's)."""
    local = state.local
    return (
        local.grad_enabled
        and local.recorder is None
        and not local.bound
        and type(_jx.current_trace()) is _jx.EvalTrace
    )


#: What recording and walking the graph take from the layers above this module
#: (``recorder.in_graph``, ``autograd.tensor_backward``): given once, at import, by
#: ``jmodule/autograd.py`` (:func:`install_autograd`).
_AUTOGRAD: dict[str, Callable] = {}


def install_autograd(in_graph: Callable, backward: Callable) -> None:
    """Give Tensors the graph's recorder and its backward walk (called once)."""
    _AUTOGRAD["in_graph"] = in_graph
    _AUTOGRAD["backward"] = backward


def in_graph(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` recorded on the graph (``recorder.in_graph``)."""
    return _AUTOGRAD["in_graph"](fn, args, kwargs)


def _aware(fn: Callable) -> Callable:
    """``fn`` (a Tensor method) recorded on the graph when given a value of it."""

    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        if _graph_args(args, kwargs) and recording():
            return in_graph(fn, args, kwargs)
        return fn(*args, **kwargs)

    return method


def wrap_graph(out: Any) -> Any:
    """``out`` with each value of a graph in it a Tensor (other arrays stay arrays)."""
    if type(out) is _TapeTracer:
        return _make(out)
    if isinstance(out, (tuple, list)):
        items = [wrap_graph(o) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    return out


def _value(v: Any) -> Any:
    """``v``, or for a value of a graph outside its tape's trace, its array (what jnp,
    numpy and jax.jit see: they do not differentiate)."""
    if type(v) is _TapeTracer and v.live():
        return v.val
    return v


def preserving(fn: Callable, name: str | None = None, *, always: bool = False) -> Callable:
    """``fn`` (a torch function taking and returning arrays) for Tensors too: with a Tensor
    among its arguments it computes with the arrays and returns Tensors; without one it is
    ``fn`` (one type check per argument). ``always``: it returns Tensors whatever it was
    given (``jmodule.torch``'s functions, creation included)."""
    views = (name or fn.__name__) in VIEWS

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not has(args, kwargs):
            if not always:
                return fn(*args, **kwargs)
            out = fn(*args, **kwargs)
            return wrap_view(out, None) if views else wrap(out)
        if _graph_args(args, kwargs) and recording():
            return in_graph(call, args, kwargs)
        src = _first(args) if views else None
        args, kwargs = unwrap_call(args, kwargs)
        out = fn(*args, **kwargs)
        return wrap_view(out, src) if views else wrap(out)

    call._jm_preserving = True
    return call


class Size(tuple):
    """``torch.Size``: the tuple of ints ``size()`` and ``shape`` are (equal to the tuple).

    >>> import jmodule as jm
    >>> jm.Size((2, 3)), jm.Size((2, 3)).numel(), jm.Size((2, 3)) == (2, 3)
    (Size([2, 3]), 6, True)
    """

    def numel(self) -> int:
        """The number of elements of an array of this shape."""
        return math.prod(self)

    def __repr__(self) -> str:
        return f"Size({list(self)})"

    def __getitem__(self, idx: Any) -> Any:
        out = super().__getitem__(idx)
        return Size(out) if isinstance(idx, slice) else out


class SizeAttribute(int):
    """``t.size`` (and ``p.size``): the element count, as ``jax.Array.size`` is (so
    jnp-style code keeps working), which called is ``torch.Tensor.size(dim=None)``."""

    def __new__(cls, shape: tuple[int, ...]) -> SizeAttribute:
        out = super().__new__(cls, math.prod(shape))
        out._shape = tuple(shape)
        return out

    def __call__(self, dim: int | None = None) -> Any:
        if dim is None:
            return Size(self._shape)
        return self._shape[wrap_dim(dim, len(self._shape), "size", empty_ok=False)]


def wrap_dim(dim: Any, ndim: int, what: str, empty_ok: bool = True) -> int:
    """``dim`` wrapped into ``range(ndim)`` as PyTorch does, with its errors."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{what}(): argument 'dim' must be int, not {type(dim).__name__}")
    dim = int(dim)
    if ndim == 0 and not empty_ok:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    n = max(ndim, 1)  # a 0-d tensor's dims are [-1, 0], as PyTorch's
    if not -n <= dim < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )
    return dim % n if ndim else 0


_VIEW_HELP = (
    "an in-place operation on a view of another jm.Tensor that is still in use (a slice, "
    "view, transpose, split or detach of it). jm.Tensors share no memory (JAX arrays are "
    "immutable), so the change could not reach the tensor it was taken from, as it would "
    "in PyTorch. Write the result out of place (y = y + 1), change the base tensor itself "
    "(x[idx] = value, x.masked_fill_(mask, value)), or take a copy first (.clone(), "
    ".contiguous())."
)
_ARG_HELP = (
    "an in-place operation on a jm.Tensor that is an argument of a traced function "
    "(jm.compile, model.compile(), jax.jit): the traced function sees a copy of the "
    "caller's Tensor, so the change could not reach it. Return the new value instead "
    "(x = x + 1 ... return x)."
)


def _index(idx: Any) -> Any:
    """An index as JAX takes it: Tensors and Parameters as arrays, a list of ints as an
    array (``x[[0, 2]]``, which JAX refuses as a bare list)."""
    if type(idx) is tuple:
        return tuple(_plain(state.value(i)) for i in idx)
    if type(idx) is list:
        return jnp.asarray([_plain(state.value(i)) for i in idx])
    return _plain(state.value(idx))


class Tensor(metaclass=_TensorMeta):
    """An array with ``torch.Tensor``'s methods and in-place operations (opt-in; see the
    module docs: ``jmodule/_tensor.py``).

    ``jm.Tensor(x)`` wraps an array, a Parameter's value or array-like data
    (keeping its dtype); ``jm.Tensor(2, 3)`` is a zero-filled float tensor of
    that shape, as ``torch.Tensor(2, 3)`` (uninitialised there) is; a Python
    list becomes a default-float tensor, as in PyTorch.

    Args:
        *data: an array-like, or sizes.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> t = jm.Tensor(jnp.arange(6.0)).view(2, 3)
    >>> t.size(0), t.float().mean(dim=1).tolist()
    (2, [1.0, 4.0])
    """

    __slots__ = ("__weakref__", "_base", "_flags", "_v")
    __array_priority__ = 200  # numpy defers to us
    __array_ufunc__ = None  # numpy's operators return NotImplemented: ours run
    _jm_tensor = True

    def __init__(self, *data: Any) -> None:
        # torch.Tensor(2, 3) is a shape; torch.Tensor([2, 3]) the data [2., 3.]
        if data and all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in data):
            v = jnp.zeros(tuple(int(n) for n in data), _device.get_default_dtype())
        elif len(data) == 1:
            x = data[0]
            if type(x) is Tensor:
                v = x._v
            elif state.is_cell(x):
                v = state.as_array(x)
            elif isinstance(x, (jax.Array, np.ndarray, np.generic)):
                v = jnp.asarray(x)
            else:
                v = jnp.asarray(x, dtype=_device.get_default_dtype())
        elif not data:
            v = jnp.zeros((0,), _device.get_default_dtype())
        else:
            raise TypeError(f"Tensor() takes sizes or one array-like; got {data!r}")
        self._v = v
        self._flags = 0
        self._base = None

    # ---------------------------------------------------------------- the value

    @property
    def data(self) -> Tensor:
        """The tensor itself (PyTorch's ``.data``: the same values, no gradient history;
        for a value of the graph, a Tensor of its array); assigning it replaces the
        value."""
        v = self._v
        if type(v) is _TapeTracer and v._trace.graph:
            return _make(v.val)
        return self

    @data.setter
    def data(self, new: Any) -> None:
        self._v = state.as_array(_plain(new))

    @property
    def array(self) -> jax.Array:
        """The plain ``jax.Array`` (a tracer inside traced code)."""
        return _value(self._v)

    def __jax_array__(self) -> jax.Array:
        return _value(self._v)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        v = self._v
        out = np.asarray(v.val if type(v) is _TapeTracer else v)
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        text = repr(self._v)
        return "Tensor" + text[5:] if text.startswith("Array") else f"Tensor({text})"

    def _read(self) -> Any:
        return self._v

    def _meta_or_value(self) -> Any:
        return self._v

    def _peek(self) -> Any:
        return self._v

    # ``_update`` and ``_placed`` (compute a new value, check its shape and dtype, place
    # it) are Parameter's, adopted with its methods: one implementation of in place.

    def _store(self, new: Any) -> Tensor:
        """Replace the value in place (the checks every in-place method shares)."""
        if self._flags & _ARG and isinstance(self._v, _Tracer):
            raise RuntimeError(_ARG_HELP)
        if self._base is not None and self._base() is not None:
            raise RuntimeError(_VIEW_HELP)
        self._v = new
        return self

    # ---------------------------------------------------------------- shape, type, place

    @property
    def shape(self) -> Size:
        """The shape, a :class:`Size` (a tuple)."""
        return Size(self._v.shape)

    @property
    def size(self) -> Any:
        """The element count (an int, as ``jax.Array.size``); called, PyTorch's
        ``size(dim=None)``."""
        return SizeAttribute(self._v.shape)

    @property
    def dtype(self) -> Any:
        """The dtype (``t.dtype == jm.float32``)."""
        return self._v.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self._v.ndim

    @property
    def device(self) -> _device.device:
        """Where the value is, as a ``jm.device``. Inside traced code, the device the
        program runs on by default (what ``device=`` arguments need there: creation
        functions place nothing while tracing)."""
        v = _value(self._v)
        if isinstance(v, _Tracer) or not isinstance(v, jax.Array):
            return _device.device(state.traced_device())
        return _device.device(next(iter(v.devices())))

    @property
    def is_cuda(self) -> bool:
        """Whether the value is on a GPU."""
        return self.device.type == "cuda"

    @property
    def T(self) -> Tensor:
        """The dimensions reversed."""
        return _view(self._v.T, self)

    @property
    def mT(self) -> Tensor:
        """The last two dimensions swapped."""
        return _view(jnp.swapaxes(self._v, -1, -2), self)

    @property
    def requires_grad(self) -> bool:
        """Whether this is a value of the graph ``backward()`` walks (computed eagerly
        from parameters, with grad mode on)."""
        v = self._v
        return type(v) is _TapeTracer and v._trace.graph

    def backward(
        self,
        gradient: Any = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Any = None,
    ) -> None:
        """Accumulate the gradient of this value into every parameter's ``.grad``, as
        PyTorch's ``loss.backward()``.

        Eagerly, with grad mode on (outside ``jm.no_grad``), a module called on a
        jm.Tensor and the Tensor operations on what it returns record the graph
        this walks back; gradients add to ``.grad`` (``zero_grad()`` between steps).
        The graph is freed by the walk unless ``retain_graph``. Inside
        ``jm.compile`` there is no graph: use ``jm.backward(closure)`` there.

        Args:
            gradient: d(something)/d(this value), for a non-scalar value.
            retain_graph: keep the graph for another ``backward``.
            create_graph: not supported (use ``jm.grad`` for higher derivatives).
            inputs: modules and/or Parameters: accumulate only into these.

        Raises:
            RuntimeError: the value is not part of a graph, is not a scalar and no
                ``gradient`` was given, or its graph was freed by an earlier backward.

        >>> import jmodule.torch as torch
        >>> model = torch.nn.Linear(3, 1)
        >>> loss = model(torch.ones(4, 3)).sum()
        >>> loss.backward()
        >>> model.weight.grad.tolist()
        [[4.0, 4.0, 4.0]]
        """
        _AUTOGRAD["backward"](self, gradient, retain_graph, create_graph, inputs)

    def contiguous(self, memory_format: Any = None) -> Tensor:
        """The tensor itself, or for a view a new Tensor of the same values (a copy in
        PyTorch, so changing it in place is allowed)."""
        return _make(self._v) if self._base is not None else self

    def is_contiguous(self, memory_format: Any = None) -> bool:
        """True: XLA chooses layouts; every value is contiguous as far as code can tell."""
        return True

    def pin_memory(self, device: Any = None) -> Tensor:
        """The tensor itself: JAX stages host-to-device copies itself (``x.pin_memory()
        .to(device, non_blocking=True)`` ports unchanged)."""
        return self

    def cpu(self) -> Tensor:
        """On the CPU (a no-op there)."""
        return self.to("cpu")

    def cuda(self, device: Any = None, non_blocking: bool = False) -> Tensor:
        """On a GPU (``jm.device("cuda")``, or ``device``)."""
        return self.to(device if device is not None else "cuda")

    def type(self, dtype: Any = None) -> Any:
        """With no argument, PyTorch's type name (``"torch.FloatTensor"``); with a dtype,
        the tensor cast to it."""
        if dtype is None:
            return f"torch.{torch_scalar_name(self._v.dtype)}Tensor"
        return self.to(dtype)

    def type_as(self, other: Any) -> Tensor:
        """Cast to ``other``'s dtype."""
        return _make(self._v.astype(jnp.asarray(_plain(state.value(other))).dtype))

    def numpy(self, force: bool = False) -> np.ndarray:
        """The values as a numpy array."""
        return self.__array__()

    def item(self) -> Any:
        """The one value, as a Python number."""
        return self._v.item()

    def tolist(self) -> Any:
        """The values as (nested) Python lists."""
        return self._v.tolist()

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Accepted and ignored: gradients are of the parameters ``jm.backward`` finds
        (raises for ``True``, which would ask for a gradient of this value)."""
        if requires_grad:
            raise RuntimeError(
                "jm.Tensor.requires_grad_(True): jmodule differentiates parameters, not "
                "activations. Make it a nn.Parameter, or differentiate a function of it with "
                "jm.grad / jax.grad."
            )
        return self

    # ---------------------------------------------------------------- views and shapes

    def view_as(self, other: Any) -> Tensor:
        """``view(other.size())``."""
        return self.view(*jnp.shape(_plain(state.value(other))))

    def reshape(self, *shape: Any) -> Tensor:
        """PyTorch's ``reshape`` (sizes or one tuple; one ``-1`` inferred)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self.view(*shape)

    def reshape_as(self, other: Any) -> Tensor:
        """``reshape(other.size())``."""
        return self.view_as(other)

    def expand_as(self, other: Any) -> Tensor:
        """``expand(other.size())``."""
        return self.expand(*jnp.shape(_plain(state.value(other))))

    # ---------------------------------------------------------------- indexing

    def __getitem__(self, idx: Any) -> Tensor:
        return _view(self._v[_index(idx)], self)

    def __setitem__(self, idx: Any, value: Any) -> None:
        idx, value = _index(idx), _plain(state.value(value))
        v = self._v
        if (
            isinstance(idx, jax.Array)
            and idx.dtype == jnp.bool_
            and idx.shape == v.shape
            and jnp.ndim(value) == 0
        ):
            new = jnp.where(idx, jnp.asarray(value, v.dtype), v)  # traceable x[mask] = c
        else:
            new = v.at[idx].set(jnp.asarray(value).astype(v.dtype))
        self._store(new)

    def __len__(self) -> int:
        if not self._v.ndim:
            raise TypeError("len() of a 0-d tensor")
        return self._v.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __bool__(self) -> bool:
        return bool(self._v)

    def __float__(self) -> float:
        return float(self._v)

    def __int__(self) -> int:
        return int(self._v)

    def __index__(self) -> int:
        return operator.index(self._v)

    def __complex__(self) -> complex:
        return complex(self._v)

    def __format__(self, spec: str) -> str:
        if spec and not self._v.ndim:
            return format(self._v.item(), spec)
        return format(repr(self), spec)

    __hash__ = object.__hash__

    def __getstate__(self) -> dict:
        return {"v": np.asarray(self._v)}

    def __setstate__(self, d: dict) -> None:
        self._v = jnp.asarray(d["v"])
        self._flags = 0
        self._base = None

    def __deepcopy__(self, memo: dict) -> Tensor:
        return _make(jnp.array(self._v, copy=True))

    def __copy__(self) -> Tensor:
        return _make(self._v)

    # ---------------------------------------------------------------- in place

    def masked_fill_(self, mask: Any, value: Any) -> Tensor:
        """Set the elements where ``mask`` is True to ``value``, in place."""
        m, val = _index(mask), _plain(state.value(value))
        return self._update(lambda v: jnp.where(m, jnp.asarray(val, v.dtype), v))


def _flatten(t: Tensor) -> tuple[tuple[Any], None]:
    v = t._v
    if type(v) is _TapeTracer and v.live():
        return (v.val,), None
    return (v,), None


def _unflatten(_: None, children: Any) -> Tensor:
    (v,) = children
    t = object.__new__(Tensor)
    t._v = v
    t._flags = _ARG
    t._base = None
    return t


jax.tree_util.register_pytree_node(Tensor, _flatten, _unflatten)


# ------------------------------------------------------------------------- operators


def _binary(op: Callable) -> tuple[Callable, Callable]:
    def forward(self: Tensor, other: Any) -> Any:
        return _make(op(self._v, _plain(state.value(other))))

    def reflected(self: Tensor, other: Any) -> Any:
        return _make(op(_plain(state.value(other)), self._v))

    return forward, reflected


def _inplace(op: Callable) -> Callable:
    def method(self: Tensor, other: Any) -> Tensor:
        o = _plain(state.value(other))
        return self._update(lambda v: op(v, o))

    return method


for _name, _op in {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "matmul": operator.matmul,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
    "lshift": operator.lshift,
    "rshift": operator.rshift,
}.items():
    _fwd, _ref = _binary(_op)
    setattr(Tensor, f"__{_name}__", _fwd)
    setattr(Tensor, f"__r{_name}__", _ref)
    setattr(Tensor, f"__i{_name}__", _inplace(_op))
for _name, _op in {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}.items():
    setattr(Tensor, f"__{_name}__", _binary(_op)[0])
for _name, _op in {
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": operator.abs,
    "invert": operator.invert,
}.items():
    setattr(Tensor, f"__{_name}__", (lambda op: lambda self: _make(op(self._v)))(_op))


# ------------------------------------------------------------------------- torch methods


def _complex_cast(dtype: str) -> Callable:
    def method(self: Tensor, memory_format: Any = None) -> Tensor:
        return self.to(jnp.dtype(dtype))

    method.__doc__ = f"The tensor as {dtype}."
    return method


Tensor.cfloat = _complex_cast("complex64")
Tensor.cdouble = _complex_cast("complex128")


def _borrowed(fn: Callable, name: str) -> Callable:
    views = name in VIEWS

    @functools.wraps(fn)
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        result = fn(self, *args, **kwargs)
        if result is self:
            return self
        return wrap_view(result, self) if views else wrap(result)

    return method


def adopt(methods: type) -> None:
    """Give :class:`Tensor` the ``torch.Tensor`` methods ``methods`` defines (Parameter's
    ``_TensorMethods``, the one implementation of each), returning Tensors; Tensor's own
    definitions win. Called once, by ``jmodule/nn/parameter.py`` at import."""
    for name, fn in vars(methods).items():
        if name in Tensor.__dict__ or isinstance(fn, property) or not callable(fn):
            continue
        if name.startswith("__") and not name.startswith("__i"):
            continue  # Tensor has its own operators
        if name.startswith("_") and not name.startswith("__"):
            setattr(Tensor, name, fn)  # a helper the methods share (``_new``): as it is
        else:
            setattr(Tensor, name, _borrowed(fn, name))


#: ``jm`` torch functions that are not ``torch.Tensor`` methods (creation, the generator).
_NOT_METHODS = frozenset(
    "arange as_tensor empty eye from_numpy full linspace logspace meshgrid ones rand "
    "randint randn randperm scalar_tensor tensor tril_indices triu_indices zeros get_rng_state "
    "set_rng_state is_tensor finfo iinfo can_cast promote_types result_type".split()
)


def install(functions: dict[str, Callable]) -> None:
    """Give :class:`Tensor` the methods that are ``jm`` torch functions (``x.softmax(-1)``
    is ``jm.softmax(x, -1)``; ``x.exp_()`` its in-place form) and those built on them.

    Called once, by ``jmodule/_torch_functions/__init__.py`` (which sits above this module) with its
    functions by name.
    """
    methods = {k: v for k, v in functions.items() if k not in _NOT_METHODS}
    flip, tile, where = functions["flip"], functions["tile"], functions["where"]
    rand, randn = functions["rand"], functions["randn"]

    def _getattr(self: Tensor, name: str) -> Any:
        """A ``jm`` torch function as a method, its in-place form, or the array's attribute."""
        if name.startswith("_"):
            raise AttributeError(name)
        fn = methods.get(name)
        if fn is not None:
            views = name in VIEWS

            def method(*args: Any, **kwargs: Any) -> Any:
                if _graph_args((self, *args), kwargs) and recording():
                    return in_graph(method, args, kwargs)
                for alias, torch_name in (("axis", "dim"), ("keepdims", "keepdim")):
                    if alias in kwargs:  # the NumPy spellings torch accepts too
                        kwargs[torch_name] = kwargs.pop(alias)
                a, k = unwrap_call(args, kwargs)
                out = fn(self._v, *a, **k)
                return wrap_view(out, self) if views else wrap(out)

            method.__name__ = name
            return method
        base = methods.get(name[:-1]) if name.endswith("_") else None
        if base is not None:

            def inplace(*args: Any, **kwargs: Any) -> Tensor:
                if _graph_args((self, *args), kwargs) and recording():
                    return in_graph(inplace, args, kwargs)
                a, k = unwrap_call(args, kwargs)
                return self._update(lambda v: base(v, *a, **k))

            inplace.__name__ = name
            return inplace
        try:
            attr = getattr(_value(self._v), name)
        except AttributeError:
            raise AttributeError(
                f"'Tensor' object has no attribute '{name}' (jm.Tensor has torch.Tensor's "
                "methods that jmodule implements and jax.Array's attributes)"
            ) from None
        if callable(attr):

            def forwarded(*args: Any, **kwargs: Any) -> Any:
                a, k = unwrap_call(args, kwargs)
                return wrap(attr(*a, **k))

            return forwarded
        return wrap(attr)

    def _dims(dims: tuple) -> tuple:
        return tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims

    def flip_(self: Tensor, *dims: Any) -> Tensor:
        """The values reversed along ``dims`` (ints or one sequence)."""
        return _make(flip(self._v, _dims(dims)))

    def tile_(self: Tensor, *dims: Any) -> Tensor:
        """PyTorch's ``tile`` (sizes or one tuple)."""
        return _make(tile(self._v, _dims(dims)))

    def where_(self: Tensor, condition: Any, other: Any) -> Tensor:
        """``jm.where(condition, self, other)`` (PyTorch's argument order for the method)."""
        return _make(where(_index(condition), self._v, _index(other)))

    def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None):
        """Fill with N(mean, std²) draws from the jm generator (or ``generator``)."""
        d = randn(*self._v.shape, dtype=self._v.dtype, generator=generator)
        return self._store(mean + std * jnp.asarray(d))

    def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0, *, generator: Any = None):
        """Fill with U(a, b) draws from the jm generator (or ``generator``)."""
        d = rand(*self._v.shape, dtype=self._v.dtype, generator=generator)
        return self._store(a + (b - a) * jnp.asarray(d))

    def bernoulli_(self: Tensor, p: float = 0.5, *, generator: Any = None) -> Tensor:
        """Fill with Bernoulli(p) draws (0 or 1) from the jm generator."""
        d = rand(*self._v.shape, generator=generator)
        return self._store((jnp.asarray(d) < _plain(state.value(p))).astype(self._v.dtype))

    for name, method in {
        "flip": flip_,
        "tile": tile_,
        "where": where_,
        "normal_": normal_,
        "uniform_": uniform_,
        "bernoulli_": bernoulli_,
    }.items():
        method.__name__ = method.__qualname__ = name
        setattr(Tensor, name, method)
    Tensor.__getattr__ = _getattr
    _record_methods()


#: Tensor's own functions that do not compute (or see the array themselves).
_UNRECORDED = frozenset(
    "__init__ __jax_array__ __array__ __repr__ __getattr__ __getstate__ __setstate__ "
    "__deepcopy__ __copy__ __len__ __iter__ backward numpy _read _meta_or_value _peek _store "
    "_update _placed _new".split()
)
_UNRECORDED_PROPERTIES = frozenset("data array shape size dtype ndim device requires_grad".split())


def _record_methods() -> None:
    """Make every Tensor method and property that computes record the graph when given
    a value of it (``_aware``); called once, when the methods are all in place."""
    for name, attr in list(vars(Tensor).items()):
        if name in _UNRECORDED:
            continue
        if isinstance(attr, property):
            if name not in _UNRECORDED_PROPERTIES and attr.fget is not None:
                setattr(
                    Tensor, name, property(_aware(attr.fget), attr.fset, attr.fdel, attr.__doc__)
                )
        elif callable(attr) and not isinstance(attr, type) and hasattr(attr, "__code__"):
            setattr(Tensor, name, _aware(attr))
