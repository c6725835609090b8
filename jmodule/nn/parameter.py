"""``Parameter`` and ``Buffer``: PyTorch's markers, holding ``jax.Array`` values.

A :class:`Parameter` is what ``module.weight`` returns. It is usable wherever a
``jax.Array`` is (``jnp``/``jax.nn`` functions, arithmetic, indexing, as a
``jax.jit`` argument) because it is a state cell (``jmodule._lowering.state.Cell``):
a pytree node with one leaf that defines the array operators; ``jax.lax``
primitives need the raw array (``param.data``). It also has the ``torch.Tensor``
methods model code calls on parameters (``numel``, ``size``, ``view``,
``transpose``, ``copy_``, ``normal_``, ...), with PyTorch's meaning, and einops
accepts it (``jmodule/_einops.py`` registers a backend through einops' own
extension point).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _tensor
from jmodule._convert import torch_scalar_name
from jmodule._lowering import state
from jmodule._lowering.state import META_HELP as META_HELP
from jmodule._lowering.state import Cell, as_array
from jmodule._tensor import Size, SizeAttribute, wrap_dim
from jmodule.nn import init

__all__ = ["Buffer", "Parameter", "Size", "as_array"]

# ``as_array`` is the state module's; it is re-exported here, where PyTorch-facing
# code has always found it.


# ``Size``, the callable ``p.size`` and PyTorch's dim wrapping are ``jm.Tensor``'s
# (``jmodule/_tensor.py``, below the package): one owner for both kinds of tensor.
_SizeAttribute = SizeAttribute
_dim = wrap_dim


def _view_shape(shape: tuple, numel: int) -> tuple[int, ...]:
    """PyTorch's ``view`` shape check and ``-1`` inference (its error messages)."""
    shown = "[" + ", ".join(map(str, shape)) + "]"
    free = [i for i, n in enumerate(shape) if n == -1]
    for i, n in enumerate(shape):
        if n < -1:
            raise RuntimeError(f"invalid shape dimension {n} at index {i} of shape {shown}")
    if len(free) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = math.prod(n for n in shape if n != -1)
    if free:
        if known == 0:
            if numel == 0:
                raise RuntimeError(
                    f"cannot reshape tensor of 0 elements into shape {shown} because the "
                    "unspecified dimension size -1 can be any value and is ambiguous"
                )
            raise RuntimeError(f"shape '{shown}' is invalid for input of size {numel}")
        if numel % known:
            raise RuntimeError(f"shape '{shown}' is invalid for input of size {numel}")
        return tuple(numel // known if n == -1 else n for n in shape)
    if known != numel:
        raise RuntimeError(f"shape '{shown}' is invalid for input of size {numel}")
    return tuple(shape)


_INPLACE_HELP = (
    "a leaf Variable that requires grad is being used in an in-place operation. (Inside "
    "jm.backward, as in PyTorch's grad mode; in-place changes of a parameter belong outside "
    "the closure, e.g. after the optimizer step, or on p.data.)"
)


def _arg(x: Any) -> Any:
    return state.value(x)


class _TensorMethods(Cell):
    """The ``torch.Tensor`` methods model code calls on parameters, with torch's meanings.

    Reading methods compute through ``state.read`` (a ``jm.backward`` sees
    them: gradients flow); in-place ones replace the value as ``p.data = ...``
    does and return the parameter. ``transpose``, ``view`` and ``size`` have
    PyTorch's meaning, not NumPy's (``jax.Array.transpose(*axes)`` permutes,
    ``.view(dtype)`` only reinterprets, ``.size`` is an int): ``p.size`` is
    still the element count for jnp-style code, and calling it is torch's.
    """

    # ------------------------------------------------------------------ shape and type

    def _meta_or_value(self) -> Any:
        # shape and dtype only: a block of a stacked value needs no slicing for them
        return state.raw(self)

    def _peek(self) -> Any:
        # the value to change in place, unseen by a gradient recorder
        return state.peek(self)

    @property
    def size(self) -> Any:
        """The element count (an ``int``, as ``jax.Array.size``); called, PyTorch's
        ``size(dim=None)``: a :class:`Size`, or one dimension's length.

        Raises:
            IndexError: ``dim`` out of range (PyTorch's message).
        """
        return _SizeAttribute(tuple(self._meta_or_value().shape))

    def numel(self) -> int:
        """The number of elements."""
        return math.prod(self._meta_or_value().shape)

    def nelement(self) -> int:
        """Alias for :meth:`numel`."""
        return self.numel()

    def dim(self) -> int:
        """The number of dimensions."""
        return len(self._meta_or_value().shape)

    def ndimension(self) -> int:
        """Alias for :meth:`dim`."""
        return self.dim()

    def element_size(self) -> int:
        """Bytes per element."""
        return jnp.dtype(self._meta_or_value().dtype).itemsize

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating type (bfloat16 and float16 included; not complex)."""
        return bool(jnp.issubdtype(self._meta_or_value().dtype, jnp.floating))

    def is_complex(self) -> bool:
        """Whether the dtype is complex."""
        return bool(jnp.issubdtype(self._meta_or_value().dtype, jnp.complexfloating))

    # ------------------------------------------------------------------ reading

    def _read(self) -> Any:
        v = state.read(self)
        if isinstance(v, jax.ShapeDtypeStruct):
            raise RuntimeError(META_HELP)
        return v

    def detach(self) -> jax.Array:
        """The value without gradient tracking: a plain ``jax.Array``."""
        return jax.lax.stop_gradient(self._read())

    def clone(self) -> jax.Array:
        """A copy of the value (a ``jax.Array``; gradients flow through it, as in PyTorch)."""
        return jnp.array(self._read(), copy=True)

    def view(self, *shape: Any) -> jax.Array:
        """PyTorch's ``view``: the value reshaped to ``shape`` (one ``-1`` is inferred).

        ``view(dtype)`` reinterprets the bytes, as in PyTorch. Arrays are
        immutable, so the result is a reshaped array, not an alias of the
        parameter (writing to it cannot change the parameter).

        Raises:
            RuntimeError: a shape that does not fit the element count (PyTorch's message).
        """
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        v = self._read()
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            return v.view(shape[0])  # a dtype
        if not shape:
            raise TypeError("view() takes a shape (ints or one tuple of ints) or a dtype")
        if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape):
            raise TypeError(f"view(): size must be a tuple of ints, got {shape!r}")
        return jnp.reshape(v, _view_shape(tuple(int(n) for n in shape), math.prod(v.shape)))

    def transpose(self, dim0: int, dim1: int) -> jax.Array:
        """PyTorch's ``transpose``: dimensions ``dim0`` and ``dim1`` swapped.

        Not NumPy's ``transpose(*axes)`` (a permutation): for that use
        ``p.permute(*dims)`` or ``jnp.transpose(p, axes)``; ``p.T`` reverses.

        Raises:
            IndexError: a dimension out of range (PyTorch's message).
        """
        v = self._read()
        a = _dim(dim0, v.ndim, "transpose")
        b = _dim(dim1, v.ndim, "transpose")
        return jnp.swapaxes(v, a, b) if v.ndim else v

    def permute(self, *dims: Any) -> jax.Array:
        """PyTorch's ``permute``: the dimensions in the order ``dims``."""
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        v = self._read()
        return jnp.transpose(v, [_dim(d, v.ndim, "permute") for d in dims])

    def t(self) -> jax.Array:
        """PyTorch's ``t()``: a 2-D value transposed (0-D and 1-D unchanged)."""
        v = self._read()
        if v.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {v.ndim}D")
        return v.T

    # Arithmetic named as torch.Tensor's (jax.Array has operators, not these names).
    def add(self, other: Any, *, alpha: Any = 1) -> jax.Array:
        """``self + alpha * other``."""
        return self._read() + (_arg(other) if alpha == 1 else alpha * _arg(other))

    def sub(self, other: Any, *, alpha: Any = 1) -> jax.Array:
        """``self - alpha * other``."""
        return self._read() - (_arg(other) if alpha == 1 else alpha * _arg(other))

    def mul(self, other: Any) -> jax.Array:
        """``self * other``."""
        return self._read() * _arg(other)

    def div(self, other: Any, *, rounding_mode: str | None = None) -> jax.Array:
        """``self / other`` (``rounding_mode`` ``"trunc"``/``"floor"`` as in PyTorch)."""
        v, o = self._read(), _arg(other)
        if rounding_mode is None:
            return v / o
        if rounding_mode == "floor":
            return jnp.floor_divide(v, o)
        if rounding_mode == "trunc":
            return jnp.trunc(v / o).astype(jnp.result_type(v, o))
        raise RuntimeError(
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
            f"'{rounding_mode}'"
        )

    def pow(self, exponent: Any) -> jax.Array:
        """``self ** exponent``."""
        return self._read() ** _arg(exponent)

    def matmul(self, other: Any) -> jax.Array:
        """``self @ other``."""
        return self._read() @ _arg(other)

    def neg(self) -> jax.Array:
        """``-self``."""
        return -self._read()

    def abs(self) -> jax.Array:
        """``abs(self)``."""
        return jnp.abs(self._read())

    def exp(self) -> jax.Array:
        """Elementwise ``e ** self``."""
        return jnp.exp(self._read())

    def log(self) -> jax.Array:
        """Elementwise natural logarithm."""
        return jnp.log(self._read())

    def sqrt(self) -> jax.Array:
        """Elementwise square root."""
        return jnp.sqrt(self._read())

    def square(self) -> jax.Array:
        """Elementwise square."""
        return jnp.square(self._read())

    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False) -> jax.Array:
        """PyTorch's ``norm``: the 2-norm of all elements by default (``p`` a number:
        the vector p-norm, over ``dim`` when given)."""
        v = self._read()
        if p == "fro" or p is None:
            p = 2
        axis = None if dim is None else tuple(np.atleast_1d(dim).tolist())
        flat = v.reshape(-1) if axis is None else v
        return jnp.linalg.vector_norm(flat, ord=p, axis=axis, keepdims=keepdim)

    # ------------------------------------------------------------------ new arrays, casts

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """PyTorch's ``Tensor.to``: ``to(dtype)``, ``to(device)``, ``to(device, dtype)``,
        ``to(other)`` (its dtype and device), with ``non_blocking``, ``copy`` and
        ``memory_format`` (accepted; XLA chooses layouts).

        As in PyTorch, when nothing changes (and not ``copy=True``) it returns the
        parameter itself; otherwise a new ``jax.Array`` (not a Parameter; gradients
        flow through it). Every dtype is accepted (``to(jm.long)`` too), with section
        2's x64 rule. Inside traced code a device is not applied: the program's
        placement is.

        Raises:
            DeviceError: JAX cannot see the device.
            DtypeError: a 64-bit float while JAX's x64 mode is off.

        >>> import jax.numpy as jnp
        >>> import jmodule as jm
        >>> w = jm.nn.Parameter(jnp.ones((2, 3)))
        >>> w.to(jm.bfloat16).dtype, w.to(jm.float32) is w, type(w.to(jm.int)).__name__
        (dtype(bfloat16), True, 'ArrayImpl')
        """
        from jmodule import _placement
        from jmodule._placement import device as _device
        from jmodule._torch_functions._common import out_dtype

        dtype = kwargs.pop("dtype", None)
        where = kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        copy = bool(kwargs.pop("copy", False))
        _device.check_memory_format(kwargs.pop("memory_format", None))
        if kwargs:
            raise TypeError(f"to() got unexpected keyword argument(s) {sorted(kwargs)}")
        flags = [a for a in args if isinstance(a, bool)]  # (non_blocking, copy), positional
        if len(flags) > 1:
            copy = copy or flags[1]
        for a in args:
            if isinstance(a, bool) or a is None:
                continue
            spec = state.value(a) if state.is_cell(a) else a
            if not isinstance(spec, jax.Array) and hasattr(spec, "__jax_array__"):
                spec = spec.__jax_array__()  # a jm.Tensor
            if isinstance(spec, jax.core.Tracer):
                dtype = spec.dtype  # a traced array: no device to read
                continue
            device_like, dtype_like = _placement.one(spec)
            where = device_like if device_like is not None else where
            dtype = dtype_like if dtype_like is not None else dtype
        raw = self._meta_or_value()
        want = None if dtype is None else out_dtype(dtype, what="the parameter")
        # int64 asked of an int32 parameter while x64 is off: the same dtype here, but a
        # conversion (a new tensor) in PyTorch
        if want is not None and type(dtype).__module__.startswith("torch"):
            dtype = str(dtype).removeprefix("torch.")
        converts = want is not None and jnp.dtype(dtype) != raw.dtype
        place = None if where is None else _device.resolve(where)
        if isinstance(raw, jax.ShapeDtypeStruct):  # meta: a new shape and dtype, no data
            return jax.ShapeDtypeStruct(raw.shape, want) if converts else self
        v = self._read()
        out = v
        if want is not None and want != v.dtype:
            out = _placement.cast(out, want)
        if place is not None and not isinstance(out, jax.core.Tracer) and not _at(v, place):
            out = _placement.move(out, place)
        if out is v:
            return jnp.array(v, copy=True) if copy or converts else self
        return out

    def new_tensor(
        self, data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False
    ) -> Any:
        """PyTorch's ``Tensor.new_tensor``: ``data`` copied into a new array of this
        parameter's dtype (or ``dtype``) on its device (or ``device``).

        >>> import jax.numpy as jnp
        >>> import jmodule as jm
        >>> w = jm.nn.Parameter(jnp.ones((2, 3)))
        >>> w.new_tensor([1, 2])
        Tensor([1., 2.], dtype=float32)
        """
        from jmodule._torch_functions import creation

        creation.check_torch_only("new_tensor", requires_grad=requires_grad)
        dt = dtype if dtype is not None else self._meta_or_value().dtype
        return _tensor.wrap(
            self._new_placed(creation.tensor(data, dtype=dt, device=device), device)
        )

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        """PyTorch's ``Tensor.new_zeros``: zeros of ``size`` (ints or one tuple) in this
        parameter's dtype (or ``dtype``) on its device (or ``device``): a ``jm.Tensor``
        (a new tensor, as in PyTorch: ``init_hidden``'s state has torch's methods).

        >>> import jax.numpy as jnp
        >>> import jmodule as jm
        >>> w = jm.nn.Parameter(jnp.ones((2, 3)))
        >>> w.new_zeros(2, 4).shape, w.new_zeros((1, 2), dtype=jm.int).dtype
        (Size([2, 4]), dtype('int32'))
        """
        return self._new("new_zeros", size, 0, dtype, device, kwargs)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        """PyTorch's ``Tensor.new_ones``: as :meth:`new_zeros`, filled with ones."""
        return self._new("new_ones", size, 1, dtype, device, kwargs)

    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        """PyTorch's ``Tensor.new_empty``: as :meth:`new_zeros` (JAX has no uninitialised
        memory: the values are zeros)."""
        return self._new("new_empty", size, 0, dtype, device, kwargs)

    def new_full(
        self, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None, **kwargs: Any
    ) -> Any:
        """PyTorch's ``Tensor.new_full``: ``fill_value`` everywhere, of ``size``, in this
        parameter's dtype (or ``dtype``) on its device (or ``device``)."""
        return self._new("new_full", (size,), state.value(fill_value), dtype, device, kwargs)

    def _new(self, what: str, size: tuple, fill: Any, dtype: Any, device: Any, kw: dict) -> Any:
        from jmodule._torch_functions import _common, creation

        if "size" in kw and not size:  # new_zeros(size=(2, 3)), as torch accepts
            size = (kw.pop("size"),)
        creation.check_torch_only(what, requires_grad=kw.pop("requires_grad", False))
        for ignored in ("layout", "pin_memory"):
            kw.pop(ignored, None)
        if kw:
            raise TypeError(f"{what}() got unexpected keyword argument(s) {sorted(kw)}")
        shape = _common.shape_arg(size)
        raw = self._meta_or_value()
        dt = _common.out_dtype(dtype) if dtype is not None else raw.dtype
        if isinstance(raw, jax.ShapeDtypeStruct) and device is None:
            return jax.ShapeDtypeStruct(shape, dt)  # meta in, meta out
        out = jnp.full(shape, fill, dt)
        out = _common.place(out, device) if device is not None else self._new_placed(out, None)
        return _tensor.wrap(out)  # a new tensor, as torch's: a jm.Tensor

    def _new_placed(self, out: Any, device: Any) -> Any:
        """``out`` on this parameter's device when no ``device`` was given (PyTorch's
        ``new_*`` put new tensors there; the ``jm.device`` context does not apply)."""
        v = self._meta_or_value()
        if (
            device is None
            and _concrete(v)
            and v.committed
            and len(v.devices()) == 1
            and _concrete(out)
            and out.devices() != v.devices()
        ):
            return jax.device_put(out, next(iter(v.devices())))
        return out

    # ------------------------------------------------------------------ in place

    def _store(self, new: Any) -> _TensorMethods:
        """Replace the value as ``p.data = new`` does; the parameter, for chaining."""
        recorder = state.local.recorder
        if recorder is not None and state.requires_grad(self):
            raise RuntimeError(_INPLACE_HELP)
        state.assign(self, new)
        return self

    def _placed(self, new: Any, old: Any) -> Any:
        """``new`` with ``old``'s dtype, shape and (for concrete arrays) sharding."""
        new = jnp.asarray(new, dtype=old.dtype)
        if isinstance(old, jax.Array) and not isinstance(old, jax.core.Tracer):
            if not isinstance(new, jax.core.Tracer) and new.sharding != old.sharding:
                new = jax.device_put(new, old.sharding)
            else:
                new = state.committed(new, like=old)  # as the value it replaces: no new compile
        return new

    def copy_(self, src: Any, non_blocking: bool = False) -> _TensorMethods:
        """Copy ``src`` (broadcast to this shape, cast to this dtype) into the parameter.

        Raises:
            RuntimeError: ``src`` does not broadcast to this shape (PyTorch's
                message), or inside ``jm.backward`` for a parameter that
                requires grad.
        """
        old = self._peek()
        if isinstance(old, jax.ShapeDtypeStruct):
            return self  # meta: no data to copy into
        v = as_array(src)
        shape = tuple(old.shape)
        src_shape = tuple(v.shape)
        for i in range(1, min(len(shape), len(src_shape)) + 1):
            a, b = shape[-i], src_shape[-i]
            if b not in (1, a) and a != 1:
                raise RuntimeError(
                    f"The size of tensor a ({a}) must match the size of tensor b ({b}) at "
                    f"non-singleton dimension {len(shape) - i}"
                )
        wide = np.broadcast_shapes(shape, src_shape)
        if tuple(wide) != shape:
            raise RuntimeError(
                f"output with shape {list(shape)} doesn't match the broadcast shape {list(wide)}"
            )
        return self._store(self._placed(jnp.broadcast_to(v.astype(old.dtype), shape), old))

    def fill_(self, value: Any) -> _TensorMethods:
        """Set every element to ``value`` (a number or a 0-d array).

        Raises:
            RuntimeError: ``value`` has dimensions (PyTorch's message).
        """
        old = self._peek()
        if isinstance(old, jax.ShapeDtypeStruct):
            return self
        v = state.value(value)
        ndim = getattr(v, "ndim", 0)
        if ndim:
            raise RuntimeError(
                f"fill_ only supports 0-dimension value tensor but got tensor with {ndim} "
                "dimensions."
            )
        return self._store(self._placed(jnp.full(old.shape, v, old.dtype), old))

    def zero_(self) -> _TensorMethods:
        """Set every element to zero."""
        return self.fill_(0)

    def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Any:
        """Fill with values drawn from N(mean, std²), from the jm generator (or ``generator``):
        the same values as ``jm.nn.init.normal_``; in compiled code the key is threaded
        through like dropout's."""
        self._store(state.peek(self))  # the same checks as every in-place method
        return init.normal_(self, mean, std, generator=generator)

    def uniform_(
        self, a: float = 0.0, b: float = 1.0, *, generator: Any = None, **bounds: Any
    ) -> Any:
        """Fill with values drawn from U(a, b) (PyTorch's names ``from``/``to`` work as
        keywords too), from the jm generator (or ``generator``), as ``jm.nn.init.uniform_``."""
        unknown = set(bounds) - {"from", "to"}
        if unknown:
            raise TypeError(f"uniform_() got unexpected keyword argument(s) {sorted(unknown)}")
        a = bounds.get("from", a)
        b = bounds.get("to", b)
        self._store(state.peek(self))
        return init.uniform_(self, a, b, generator=generator)

    # In-place arithmetic (``p -= lr * p.grad`` in a manual SGD loop, ``p.add_(...)``):
    # the parameter's value is replaced, eagerly and inside compiled code, as PyTorch
    # changes the tensor in place; the result keeps the parameter's shape and dtype.

    def _update(self, compute: Callable[[Any], Any]) -> _TensorMethods:
        old = self._peek()
        if isinstance(old, jax.ShapeDtypeStruct):
            return self  # meta: no data to change
        new = jnp.asarray(compute(old))
        shape = tuple(old.shape)
        if tuple(new.shape) != shape:
            raise RuntimeError(
                f"output with shape {list(shape)} doesn't match the broadcast shape "
                f"{list(new.shape)}"
            )
        if not _differentiable(old.dtype) and _differentiable(new.dtype):
            raise RuntimeError(
                f"result type {torch_scalar_name(new.dtype)} can't be cast to the desired output "
                f"type {torch_scalar_name(old.dtype)}"
            )
        return self._store(self._placed(new.astype(old.dtype), old))

    def add_(self, other: Any, *, alpha: Any = 1) -> _TensorMethods:
        """``self += alpha * other`` in place (PyTorch's ``Tensor.add_``)."""
        o = _arg(other)
        return self._update(lambda v: v + (o if alpha == 1 else alpha * o))

    def sub_(self, other: Any, *, alpha: Any = 1) -> _TensorMethods:
        """``self -= alpha * other`` in place (PyTorch's ``Tensor.sub_``)."""
        o = _arg(other)
        return self._update(lambda v: v - (o if alpha == 1 else alpha * o))

    def mul_(self, other: Any) -> _TensorMethods:
        """``self *= other`` in place."""
        o = _arg(other)
        return self._update(lambda v: v * o)

    def div_(self, other: Any, *, rounding_mode: str | None = None) -> _TensorMethods:
        """``self /= other`` in place; ``rounding_mode`` ``"trunc"`` or ``"floor"`` as torch."""
        o = _arg(other)
        if rounding_mode is None:
            return self._update(lambda v: v / o)
        if rounding_mode == "trunc":
            return self._update(lambda v: jnp.trunc(v / o))
        if rounding_mode == "floor":
            return self._update(lambda v: jnp.floor_divide(v, o))
        raise RuntimeError(
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
            f"'{rounding_mode}'"
        )

    def clamp_(self, min: Any = None, max: Any = None) -> _TensorMethods:
        """Clamp every element into ``[min, max]`` in place."""
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        lo, hi = _arg(min), _arg(max)
        return self._update(lambda v: jnp.clip(v, lo, hi))

    clip_ = clamp_

    def __iadd__(self, other: Any) -> _TensorMethods:
        return self.add_(other)

    def __isub__(self, other: Any) -> _TensorMethods:
        return self.sub_(other)

    def __imul__(self, other: Any) -> _TensorMethods:
        return self.mul_(other)

    def __itruediv__(self, other: Any) -> _TensorMethods:
        return self.div_(other)


#: ``torch.Tensor`` methods whose NumPy namesake on ``jax.Array`` means something
#: else (``std`` biased, ``max(1)`` values only, ``split`` by count, ``repeat`` as
#: ``repeat_interleave``, ``keepdims``/``axis`` names, ...): on a Parameter they are
#: the ``jm`` torch function of the same name, with the parameter as ``input``.
TORCH_MEANING = (
    "all any amax amin argmax argmin argsort chunk clamp clip cumprod cumsum flatten flip "
    "gather index_select log_softmax logsumexp masked_fill max mean min movedim narrow prod "
    "roll round softmax sort split squeeze std sum topk unbind unsqueeze var"
).split()


def _torch_method(name: str) -> Any:
    def method(self: _TensorMethods, *args: Any, **kwargs: Any) -> Any:
        from jmodule import _torch_functions

        fn = getattr(_torch_functions, name, None) or _torch_functions.BUILTIN_NAMED[name]
        for alias, torch_name in (("axis", "dim"), ("keepdims", "keepdim")):
            if alias in kwargs:  # the NumPy spellings torch accepts too
                kwargs[torch_name] = kwargs.pop(alias)
        return fn(self._read(), *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``torch.Tensor.{name}``: ``jm.{name}(self, ...)``, PyTorch's meaning."
    return method


for _name in TORCH_MEANING:
    setattr(_TensorMethods, _name, _torch_method(_name))


def _concrete(v: Any) -> bool:
    return isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer)


def _at(v: jax.Array, place: Any) -> bool:
    """Whether the concrete array ``v`` already is where the parsed ``place`` says."""
    if isinstance(place, jax.Device):
        return v.devices() == {place}
    if isinstance(place, jax.sharding.Sharding):
        return v.sharding.is_equivalent_to(place, v.ndim)
    return False  # meta


#: ``torch.Tensor``'s dtype conversions: ``p.float()`` is ``p.to(jm.float32)`` (the
#: parameter itself when it already is float32, as in PyTorch; else a ``jax.Array``).
#: Set here, not in the class body, so that no class namespace rebinds a builtin.
CASTS = {
    "float": jnp.float32,
    "double": jnp.float64,
    "half": jnp.float16,
    "bfloat16": jnp.bfloat16,
    "long": jnp.int64,
    "int": jnp.int32,
    "short": jnp.int16,
    "char": jnp.int8,
    "byte": jnp.uint8,
    "bool": jnp.bool_,
}


def _cast_method(name: str, dtype: Any) -> Any:
    def method(self: _TensorMethods, memory_format: Any = None) -> Any:
        return self.to(dtype, memory_format=memory_format)

    shown = jnp.dtype(dtype).name
    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"``torch.Tensor.{name}()``: ``self.to({shown})`` (the parameter itself when it "
        "already is; else a new ``jax.Array``)."
    )
    return method


for _name, _dtype in CASTS.items():
    setattr(_TensorMethods, _name, _cast_method(_name, _dtype))


def _sizes(sizes: tuple) -> tuple[int, ...]:
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    return tuple(int(n) for n in sizes)


def _repeat(self: _TensorMethods, *sizes: Any) -> jax.Array:
    """``torch.Tensor.repeat``: tile the value ``sizes`` times (NumPy's ``repeat`` differs)."""
    sizes = _sizes(sizes)
    x = self._read()
    if len(sizes) < x.ndim:
        raise RuntimeError(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions "
            "of tensor"
        )
    return jnp.tile(x.reshape((1,) * (len(sizes) - x.ndim) + x.shape), sizes)


def _expand(self: _TensorMethods, *sizes: Any) -> jax.Array:
    """``torch.Tensor.expand``: broadcast to ``sizes`` (``-1`` keeps a dimension)."""
    sizes = _sizes(sizes)
    x = self._read()
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to "
            f"the number of dimensions in the tensor ({x.ndim})"
        )
    shape = tuple(x.shape[i - lead] if n == -1 and i >= lead else n for i, n in enumerate(sizes))
    return jnp.broadcast_to(x, shape)


_TensorMethods.repeat = _repeat
_TensorMethods.expand = _expand


def _differentiable(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class Parameter(_TensorMethods):
    """A module parameter: a ``jax.Array`` value plus ``requires_grad`` and ``grad``.

    Args:
        data: the initial value (jax/numpy array, torch tensor, or a
            ``jax.ShapeDtypeStruct`` for an abstract "meta" parameter).
            Defaults to an empty float32 array, as in PyTorch.
        requires_grad: whether gradients are computed for it (only floating
            and complex parameters can; integer ones need ``requires_grad=False``).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> w = nn.Parameter(jnp.ones((2, 3)))
    >>> (w * 2).sum(), w.shape, w.requires_grad
    (Array(12., dtype=float32), (2, 3), True)
    """

    def __init__(self, data: Any = None, requires_grad: bool = True):
        if data is None:
            data = jnp.empty((0,), jnp.float32)
        value = as_array(data)
        if requires_grad and not _differentiable(value.dtype):
            raise RuntimeError(
                "Only Tensors of floating point and complex dtype can require gradients"
            )
        state.assign(self, value)
        self.__dict__["_requires_grad"] = bool(requires_grad)
        self.__dict__["grad"] = None

    @property
    def grad(self) -> Any:
        """The accumulated gradient (a ``jax.Array``), or None."""
        d = self.__dict__
        watch = state.local.watch
        if watch is not None and id(d) in watch.watched and id(d) not in watch.written:
            watch.reads.add(id(d))
        return state.grad_value(d)

    @grad.setter
    def grad(self, value: Any) -> None:
        d = self.__dict__
        watch = state.local.watch
        if watch is not None and id(d) in watch.watched:
            watch.written.add(id(d))
        d["grad"] = value

    @property
    def requires_grad(self) -> bool:
        """Whether gradients are computed for this parameter."""
        return self.__dict__["_requires_grad"]

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        value = bool(value)
        if value and not _differentiable(state.peek(self).dtype):
            raise RuntimeError(
                "only Tensors of floating point and complex dtype can require gradients"
            )
        if value != self.__dict__["_requires_grad"]:
            self.__dict__["_requires_grad"] = value
            state.touch(self)  # the modules holding it describe themselves again

    def requires_grad_(self, requires_grad: bool = True) -> Parameter:
        """Set ``requires_grad`` in place and return the parameter.

        Raises:
            RuntimeError: ``requires_grad`` for an integer or boolean parameter.
        """
        if requires_grad and not _differentiable(state.peek(self).dtype):
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Parameter containing:\n{state.peek(self)!r}"

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        from jmodule._display import parameter_repr

        return parameter_repr(self, path, subtree_renderer)

    def __deepcopy__(self, memo: dict) -> Parameter:
        # As PyTorch, a copy starts without ``.grad``; other attributes are kept.
        out = Parameter.__new__(type(self))
        memo[id(self)] = out
        # A real copy, as PyTorch's clone(): compiled steps donate (free)
        # the buffers they rewrite, so two modules must never share one.
        state.assign(out, _copy_array(state.peek(self)))
        out.__dict__.update(_requires_grad=self.__dict__["_requires_grad"], grad=None)
        for k, v in self.__dict__.items():
            if k not in out.__dict__ and k not in state.PRIVATE:
                out.__dict__[k] = copy.deepcopy(v, memo)
        return out

    def __reduce_ex__(self, protocol: int):
        # As PyTorch, ``.grad`` is not pickled.
        kept = {k: v for k, v in self.__dict__.items() if k not in state.PRIVATE}
        return (_rebuild_parameter, (type(self), {**kept, "grad": None}))


def _copy_array(value: Any) -> Any:
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return value.copy()
    return value


def _rebuild_parameter(cls: type, state: dict) -> Parameter:
    out = cls.__new__(cls)
    out.__dict__.update(state)
    return out


class Buffer(_TensorMethods):
    """Marks an array as a buffer when assigned to a module attribute (PyTorch 2.x).

    ``module.x = nn.Buffer(array, persistent=False)`` registers ``x`` as a
    buffer; reading ``module.x`` afterwards returns the plain ``jax.Array``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> m = nn.Module()
    >>> m.steps = nn.Buffer(jnp.zeros(()), persistent=False)
    >>> list(m.state_dict())
    []
    """

    def __init__(self, data: Any = None, *, persistent: bool = True):
        if data is None:
            data = jnp.empty((0,), jnp.float32)
        state.assign(self, as_array(data))
        self.__dict__["persistent"] = persistent

    def __repr__(self) -> str:
        return f"Buffer containing:\n{state.peek(self)!r}"


jax.tree_util.register_pytree_node(Parameter, state.flatten_cell, lambda _, c: c[0])
jax.tree_util.register_pytree_node(Buffer, state.flatten_cell, lambda _, c: c[0])


_tensor.adopt(_TensorMethods)  # jm.Tensor's torch methods are these, returning Tensors

#: Parameter methods that compute nothing a gradient flows through.
_NOT_RECORDED = frozenset(
    "argmax argmin argsort all any detach dim element_size is_complex is_floating_point "
    "ndimension nelement new_empty new_full new_ones new_tensor new_zeros numel".split()
)


def _recorded(fn: Any) -> Any:
    """``fn`` (a parameter's torch method that computes), recorded on the graph
    ``loss.backward()`` walks when ``state.recording``: a differentiable result is then a
    jm.Tensor of the graph, as torch's result has a ``grad_fn``; others stay arrays."""

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if state.recording(self):
            return _tensor.wrap_graph(_tensor.in_graph(fn, (self, *args), kwargs))
        return fn(self, *args, **kwargs)

    return method


for _name, _fn in list(vars(_TensorMethods).items()):
    # Eagerly in grad mode a parameter's torch methods (``p.t()``, ``p.pow(2)``,
    # ``p.sum()``) give a jm.Tensor of the graph; its operators (``p * 2``) and
    # jax.Array's methods give arrays, as for JAX code.
    if (
        callable(_fn)
        and not isinstance(_fn, (type, property))
        and not _name.startswith("_")
        and not _name.endswith("_")
        and _name not in _NOT_RECORDED
    ):
        setattr(_TensorMethods, _name, _recorded(_fn))
