"""Containers: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from typing import Any

import jax

from jmodule._lowering import state
from jmodule.nn.modules.module import Module, _indent
from jmodule.nn.modules.scan import Scan
from jmodule.nn.parameter import Parameter

__all__ = ["ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential"]


def _index(idx: Any, size: int) -> int:
    idx = operator.index(idx)
    if not -size <= idx < size:
        raise IndexError(f"index {idx} is out of range")
    return idx % size


def _check_factor(seq: Any, other: Any) -> None:
    if not isinstance(other, int):
        raise TypeError(f"unsupported operand type(s) for *: {type(seq)} and {type(other)}")
    if other <= 0:
        raise ValueError(f"Non-positive multiplication factor {other} for {type(seq)}")


class Sequential(Module):
    """Modules applied one after another, as ``torch.nn.Sequential``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    >>> seq(jnp.ones((2, 3))).shape, len(seq), type(seq[:2]).__name__
    ((2, 1), 3, 'Sequential')
    """

    #: Its forward calls modules that may be user code: a jm.Tensor passes on to them.
    _jm_passes_tensors = True

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[_index(idx, len(self))]

    def __setitem__(self, idx: int, module: Module) -> None:
        key = list(self._modules)[_index(idx, len(self))]
        setattr(self, key, module)

    def __delitem__(self, idx: int | slice) -> None:
        keys = list(self._modules)
        for key in keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self))]]:
            delattr(self, key)
        items = list(self._modules.items())
        self._modules.clear()
        self._modules.update((str(i), m) for i, (_, m) in enumerate(items))
        state.touch(self)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __add__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(
                "add operator supports only objects of Sequential class, but "
                f"{type(other)} is given."
            )
        return Sequential(*self, *other)

    def __iadd__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(
                "add operator supports only objects of Sequential class, but "
                f"{type(other)} is given."
            )
        for module in list(other):
            self.append(module)
        return self

    def __mul__(self, other: int) -> Sequential:
        """A new Sequential repeating these modules (the same objects) ``other`` times."""
        _check_factor(self, other)
        combined = Sequential()
        for _ in range(other):
            for module in self:
                combined.append(module)
        return combined

    def __rmul__(self, other: int) -> Sequential:
        return self.__mul__(other)

    def __imul__(self, other: int) -> Sequential:
        _check_factor(self, other)
        for module in list(self) * (other - 1):
            self.append(module)
        return self

    def __dir__(self) -> list[str]:
        return [k for k in super().__dir__() if not k.isdigit()]

    def append(self, module: Module) -> Sequential:
        """Add ``module`` at the end."""
        self.add_module(str(len(self)), module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        """Insert ``module`` before position ``index``."""
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        n = len(self._modules)
        if not (-n <= index <= n):
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        self._modules.update((str(i), m) for i, m in enumerate(items))
        state.touch(self)
        return self

    def extend(self, sequential: Iterable[Module]) -> Sequential:
        """Append every module of ``sequential``."""
        for layer in sequential:
            self.append(layer)
        return self

    def pop(self, key: int | slice) -> Module:
        """Remove and return the module at ``key``."""
        v = self[key]
        del self[key]
        return v

    def forward(self, input: Any) -> Any:
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    """A list of modules, registered as children named ``"0"``, ``"1"``, ...

    >>> from jmodule import nn
    >>> layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    >>> len(layers), len(list(layers.parameters()))
    (3, 6)
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self += modules

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self)))]

    def __setitem__(self, idx: int, module: Module) -> None:
        setattr(self, str(_index(idx, len(self))), module)

    def __delitem__(self, idx: int | slice) -> None:
        if isinstance(idx, slice):
            for k in range(len(self._modules))[idx]:
                delattr(self, str(k))
        else:
            delattr(self, str(_index(idx, len(self))))
        values = list(self._modules.values())
        self._modules.clear()
        self._modules.update((str(i), m) for i, m in enumerate(values))
        state.touch(self)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(chain(self, other))

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index``."""
        for i in range(len(self._modules), index, -1):
            self._modules[str(i)] = self._modules[str(i - 1)]
        self._modules[str(index)] = module
        state.touch(self)

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Append every module of ``modules``."""
        if not isinstance(modules, Iterable):
            raise TypeError(
                "ModuleList.extend should be called with an iterable, but got "
                + type(modules).__name__
            )
        offset = len(self)
        for i, module in enumerate(modules):
            self.add_module(str(offset + i), module)
        return self

    def pop(self, key: int | slice) -> Module:
        """Remove and return the module at ``key``."""
        v = self[key]
        del self[key]
        return v

    def __repr__(self) -> str:
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        blocks: list[list[Any]] = []
        for i, r in enumerate(reprs):
            if blocks and blocks[-1][2] == r:
                blocks[-1][1] = i
            else:
                blocks.append([i, i, r])
        lines = []
        for start, end, r in blocks:
            text = (
                f"({start}): {r}" if start == end else f"({start}-{end}): {end - start + 1} x {r}"
            )
            lines.append(_indent(text, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def __dir__(self) -> list[str]:
        return [k for k in super().__dir__() if not k.isdigit()]

    def scan(self, *, unroll: int | bool = 1) -> Scan:
        """These blocks as one :class:`~jmodule.nn.Scan` module: ``jm.nn.scan(self)``.

        Not in PyTorch. The blocks (structurally identical) run as one
        ``jax.lax.scan`` in compiled code; see :func:`jmodule.nn.scan`.

        >>> from jmodule import nn
        >>> h = nn.ModuleList([nn.Linear(2, 2) for _ in range(4)]).scan()
        >>> type(h).__name__, len(h)
        ('Scan', 4)
        """
        return Scan(self, unroll=unroll)


class ModuleDict(Module):
    """An ordered dict of modules, registered as children under their keys.

    >>> from jmodule import nn
    >>> heads = nn.ModuleDict({"cls": nn.Linear(4, 2), "reg": nn.Linear(4, 1)})
    >>> list(heads.keys())
    ['cls', 'reg']
    """

    def __init__(self, modules: Mapping[str, Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]
        state.touch(self)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def clear(self) -> None:
        """Remove every module."""
        self._modules.clear()
        state.touch(self)

    def pop(self, key: str) -> Module:
        """Remove and return the module under ``key``."""
        v = self[key]
        del self[key]
        return v

    def keys(self) -> Iterable[str]:
        """The keys, in insertion order."""
        return self._modules.keys()

    def items(self) -> Iterable[tuple[str, Module]]:
        """(key, module) pairs."""
        return self._modules.items()

    def values(self) -> Iterable[Module]:
        """The modules."""
        return self._modules.values()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        """Add or replace entries from a mapping or an iterable of pairs."""
        if not isinstance(modules, Iterable):
            raise TypeError(
                "ModuleDict.update should be called with an iterable of key/value pairs, "
                "but got " + type(modules).__name__
            )
        if isinstance(modules, (OrderedDict, ModuleDict, Mapping)):
            for key, module in modules.items():
                self[key] = module
            return
        for j, m in enumerate(modules):
            if not isinstance(m, Iterable):
                raise TypeError(
                    f"ModuleDict update sequence element #{j} should be Iterable; is "
                    + type(m).__name__
                )
            if len(m) != 2:
                raise ValueError(
                    f"ModuleDict update sequence element #{j} has length {len(m)}; 2 is required"
                )
            self[m[0]] = m[1]


_TORCH_DTYPE = {
    "float32": ("torch.float32", "torch.FloatTensor"),
    "float64": ("torch.float64", "torch.DoubleTensor"),
    "float16": ("torch.float16", "torch.HalfTensor"),
    "bfloat16": ("torch.bfloat16", "torch.BFloat16Tensor"),
    "int64": ("torch.int64", "torch.LongTensor"),
    "int32": ("torch.int32", "torch.IntTensor"),
    "int16": ("torch.int16", "torch.ShortTensor"),
    "int8": ("torch.int8", "torch.CharTensor"),
    "uint8": ("torch.uint8", "torch.ByteTensor"),
    "bool": ("torch.bool", "torch.BoolTensor"),
    "complex64": ("torch.complex64", "torch.ComplexFloatTensor"),
    "complex128": ("torch.complex128", "torch.ComplexDoubleTensor"),
}


def _param_line(key: Any, p: Any, typename: bool) -> str:
    """PyTorch's one-line description of a parameter in a list/dict repr."""
    if isinstance(p, (Parameter, jax.Array)):
        value = p.data if isinstance(p, Parameter) else p
        size = "x".join(str(s) for s in value.shape)
        names = _TORCH_DTYPE.get(str(value.dtype), (str(value.dtype),) * 2)
        platform = next(iter(value.devices())).platform if hasattr(value, "devices") else "cpu"
        device = "" if platform == "cpu" else f" (cuda:{next(iter(value.devices())).id})"
        kind = "Parameter" if isinstance(p, Parameter) else "Tensor"
        text = f"{kind} containing: [{names[1] if typename else names[0]} of size {size}{device}]"
        return f"  ({key}): {text}"
    return f"  ({key}): Object of type: {type(p).__name__}"


class ParameterList(Module):
    """A list of parameters, registered as ``"0"``, ``"1"``, ...

    Arrays added to it become Parameters, as in PyTorch.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> plist = nn.ParameterList([jnp.ones(2), jnp.zeros(3)])
    >>> [p.shape for p in plist]
    [(2,), (3,)]
    """

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self.__dict__["_size"] = 0
        if values is not None:
            self += values

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)([self[i] for i in range(len(self))[idx]])
        return getattr(self, str(_index(idx, len(self))))

    def __setitem__(self, idx: int, param: Any) -> None:
        idx = _index(idx, len(self))
        if isinstance(param, jax.Array) and not isinstance(param, Parameter):
            param = Parameter(param)
        setattr(self, str(idx), param)

    def __len__(self) -> int:
        return self.__dict__["_size"]

    def __iter__(self) -> Iterator[Any]:
        return iter(self[i] for i in range(len(self)))

    def __iadd__(self, parameters: Iterable[Any]) -> ParameterList:
        return self.extend(parameters)

    def append(self, value: Any) -> ParameterList:
        """Add ``value`` at the end (arrays become Parameters)."""
        new_idx = len(self)
        self.__dict__["_size"] += 1
        if isinstance(value, jax.Array) and not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, str(new_idx), value)
        return self

    def extend(self, values: Iterable[Any]) -> ParameterList:
        """Append every value."""
        if not isinstance(values, Iterable) or isinstance(values, (jax.Array, Parameter)):
            name = "jax.Array" if isinstance(values, jax.Array) else type(values).__name__
            raise TypeError(
                "ParameterList.extend should be called with an iterable, but got " + name
            )
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        return "\n".join(_param_line(k, p, typename=False) for k, p in enumerate(self))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ParameterList should not be called.")


class ParameterDict(Module):
    """An ordered dict of parameters (arrays added become Parameters).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> pdict = nn.ParameterDict({"scale": jnp.ones(3)})
    >>> list(dict(pdict.named_parameters()))
    ['scale']
    """

    def __init__(self, parameters: Any = None) -> None:
        super().__init__()
        self.__dict__["_keys"] = {}
        if parameters is not None:
            self.update(parameters)

    def _key_to_attr(self, key: str) -> str:
        if not isinstance(key, str):
            raise TypeError(
                "Index given to ParameterDict cannot be used as a key as it is not a string "
                f"(type is '{type(key).__name__}'). Open an issue on github if you need "
                "non-string keys."
            )
        return key

    def __getitem__(self, key: str) -> Any:
        return getattr(self, self._key_to_attr(key))

    def __setitem__(self, key: str, value: Any) -> None:
        self._keys[key] = None
        attr = self._key_to_attr(key)
        if isinstance(value, jax.Array) and not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, attr, value)

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, self._key_to_attr(key))

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._keys))

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def copy(self) -> ParameterDict:
        """A shallow copy (same Parameter objects)."""
        return ParameterDict(OrderedDict((k, self[k]) for k in self._keys))

    def setdefault(self, key: str, default: Any = None) -> Any:
        """``self[key]``, setting it to ``default`` first if absent."""
        if key not in self:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        """Remove every entry."""
        for k in list(self._keys):
            del self[k]

    def pop(self, key: str) -> Any:
        """Remove and return ``self[key]``."""
        v = self[key]
        del self[key]
        return v

    def popitem(self) -> tuple[str, Any]:
        """Remove and return the last (key, value) pair."""
        k = list(self._keys)[-1]
        val = self[k]
        del self[k]
        return k, val

    def get(self, key: str, default: Any = None) -> Any:
        """``self[key]`` if present, else ``default``."""
        return self[key] if key in self else default

    def fromkeys(self, keys: Iterable[str], default: Any = None) -> ParameterDict:
        """A new ParameterDict with ``keys`` all set to ``default``."""
        return ParameterDict((k, default) for k in keys)

    def keys(self) -> Iterable[str]:
        """The keys, in insertion order."""
        return self._keys.keys()

    def items(self) -> Iterable[tuple[str, Any]]:
        """(key, parameter) pairs."""
        return ((k, self[k]) for k in self._keys)

    def values(self) -> Iterable[Any]:
        """The parameters."""
        return (self[k] for k in self._keys)

    def update(self, parameters: Any) -> None:
        """Add or replace entries from a mapping or an iterable of pairs."""
        if not isinstance(parameters, Iterable):
            raise TypeError(
                "ParametersDict.update should be called with an iterable of key/value pairs, "
                "but got " + type(parameters).__name__
            )
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            for key, parameter in parameters.items():
                self[key] = parameter
        elif isinstance(parameters, Mapping):
            for key, parameter in sorted(parameters.items()):
                self[key] = parameter
        else:
            for j, p in enumerate(parameters):
                if not isinstance(p, Iterable):
                    raise TypeError(
                        f"ParameterDict update sequence element #{j} should be Iterable; is "
                        + type(p).__name__
                    )
                if len(p) != 2:
                    raise ValueError(
                        f"ParameterDict update sequence element #{j} has length {len(p)}; "
                        "2 is required"
                    )
                self[p[0]] = p[1]

    def extra_repr(self) -> str:
        return "\n".join(_param_line(k, p, typename=True) for k, p in self.items())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ParameterDict should not be called.")

    def __or__(self, other: ParameterDict) -> ParameterDict:
        copy = self.copy()
        copy.update(other)
        return copy

    def __ror__(self, other: ParameterDict) -> ParameterDict:
        copy = other.copy()
        copy.update(self)
        return copy

    def __ior__(self, other: ParameterDict) -> ParameterDict:
        self.update(other)
        return self
