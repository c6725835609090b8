"""PyTorch as the live reference: one description of each tree, built in both frameworks.

A *side* bundles a framework's ``nn`` namespace and how to make an array in it.
A *tree builder* takes a side and returns a module, so the same code builds the
torch reference and the jmodule candidate (the spirit of PyTorch's
``common_modules.py``: describe each case once, run shared tests over all).

``canon`` turns results of either framework into comparable plain data and
``outcome`` captures a call's result or its exception type and message, with
the few framework names in messages mapped to jmodule's (``normalize``), so a
test can assert ``outcome(torch_call) == outcome(jm_call)``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _torch import torch

import jmodule as jm
from jmodule import nn as jnn

# ---------------------------------------------------------------------------- sides


@dataclass(frozen=True)
class Side:
    """One framework: its ``nn`` namespace and array constructors."""

    name: str
    nn: Any

    @property
    def is_torch(self) -> bool:
        return self.name == "torch"

    def arr(self, value: Any, dtype: str = "float32") -> Any:
        """``value`` (anything numpy accepts) as this framework's array."""
        a = np.asarray(value, dtype=dtype)
        return torch.from_numpy(a.copy()) if self.is_torch else jnp.asarray(a)

    def dtype(self, name: str) -> Any:
        """The framework's dtype object called ``name`` ("float32", "bfloat16", ...)."""
        return getattr(torch if self.is_torch else jnp, name)

    def cast(self, x: Any, name: str) -> Any:
        return x.to(self.dtype(name)) if self.is_torch else x.astype(self.dtype(name))

    def param(self, value: Any, requires_grad: bool = True) -> Any:
        return self.nn.Parameter(self.arr(value), requires_grad=requires_grad)

    def randn(self, *shape: int, seed: int = 0) -> Any:
        return self.arr(np.random.default_rng(seed).standard_normal(shape))


TORCH = Side("torch", torch.nn)
JM = Side("jm", jnn)
SIDES = (TORCH, JM)


def both(fn: Callable[[Side], Any]) -> tuple[Any, Any]:
    """``(fn(TORCH), fn(JM))``."""
    return fn(TORCH), fn(JM)


# ---------------------------------------------------------------------------- custom classes
#
# Classes are made per side (the base class differs) but keep the same
# ``__name__`` so reprs and messages match. Each is also published in this
# module's globals under ``<Name>_<side>`` (its ``__qualname__``) so pickle can
# find it.

_CLASSES: dict[tuple[str, str], type] = {}


def _publish(side: Side, cls: type) -> type:
    qualname = f"{cls.__name__}_{side.name}"
    cls.__qualname__ = qualname
    cls.__module__ = __name__
    globals()[qualname] = cls
    _CLASSES[(side.name, cls.__name__)] = cls
    return cls


def _define(side: Side) -> None:
    nn = side.nn

    class Net(nn.Module):
        """A bit of everything: containers, BN, dropout, a raw parameter,
        persistent / non-persistent / None buffers, a None parameter."""

        def __init__(self, p: float = 0.0) -> None:
            super().__init__()
            self.stem = nn.Linear(4, 6)
            self.blocks = nn.ModuleList(
                [nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.ReLU()) for _ in range(3)]
            )
            self.heads = nn.ModuleDict({"cls": nn.Linear(6, 2), "reg": nn.Identity()})
            self.drop = nn.Dropout(p)
            self.scale = side.param(np.linspace(0.5, 1.5, 2))
            self.register_buffer("offset", side.arr([0.25, -0.5]))
            self.register_buffer("cache", side.arr(np.zeros(2)), persistent=False)
            self.register_parameter("unused", None)
            self.register_buffer("empty", None)
            self.nothing = None

        def forward(self, x):
            h = self.stem(x)
            for block in self.blocks:
                h = block(h)
            out = self.heads["cls"](self.drop(h)) * self.scale + self.offset
            return out + self.heads["reg"](h).sum(-1)[..., None]

    class Tied(nn.Module):
        """Tied parameters and one submodule reachable under several names."""

        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Linear(3, 3)
            self.dec = nn.Linear(3, 3)
            self.dec.weight = self.enc.weight
            shared = nn.Linear(3, 3)
            self.a = shared
            self.seq = nn.Sequential(shared, nn.ReLU(), shared)
            self.b = shared
            self.register_buffer("mask", side.arr(np.ones(3)))
            self.seq.register_buffer("mask", self.mask)

        def forward(self, x):
            return self.dec(self.seq(self.enc(x))) * self.mask

    class Extra(nn.Module):
        """A module with extra state and a multi-line extra_repr."""

        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.register_buffer("count", side.arr(np.zeros(())))
            self.note = {"epoch": 3}

        def get_extra_state(self):
            return dict(self.note)

        def set_extra_state(self, state):
            self.note = dict(state)

        def extra_repr(self) -> str:
            return "first line\nsecond line"

        def forward(self, x):
            return self.fc(x)

    class OneLine(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = side.param(np.ones(2))

        def extra_repr(self) -> str:
            return "just=one"

    class Add(nn.Module):
        """``x + y`` on plain Python numbers: hook semantics without arrays."""

        def forward(self, x, y=0):
            return x + y

    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError(f"forward failed on {x}")

    for cls in (Net, Tied, Extra, OneLine, Add, Boom):
        _publish(side, cls)


for _side in SIDES:
    _define(_side)


def cls(side: Side, name: str) -> type:
    """The per-side custom class ``name`` (``Net``, ``Tied``, ``Extra``, ...)."""
    return _CLASSES[(side.name, name)]


# ---------------------------------------------------------------------------- tree registry

TREES: dict[str, Callable[[Side], Any]] = {}
#: Trees whose ``forward`` takes a ``(batch, in_features)`` array.
FORWARD_IN: dict[str, int] = {}


def tree(name: str, in_features: int | None = None):
    def register(builder: Callable[[Side], Any]) -> Callable[[Side], Any]:
        TREES[name] = builder
        if in_features is not None:
            FORWARD_IN[name] = in_features
        return builder

    return register


@tree("linear", 3)
def _linear(s: Side):
    return s.nn.Linear(3, 4)


@tree("linear_nobias", 3)
def _linear_nobias(s: Side):
    return s.nn.Linear(3, 2, bias=False)


@tree("mlp", 4)
def _mlp(s: Side):
    nn = s.nn
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 3))


@tree("mlp_named", 4)
def _mlp_named(s: Side):
    nn = s.nn
    return nn.Sequential(
        OrderedDict(fc1=nn.Linear(4, 5), act=nn.ReLU(inplace=True), fc2=nn.Linear(5, 2))
    )


@tree("bn", 3)
def _bn(s: Side):
    return s.nn.BatchNorm1d(3)


@tree("bn_cumulative", 3)
def _bn_cumulative(s: Side):
    return s.nn.BatchNorm1d(3, eps=1e-3, momentum=None, affine=False)


@tree("bn_untracked", 3)
def _bn_untracked(s: Side):
    return s.nn.BatchNorm1d(3, track_running_stats=False)


@tree("net", 4)
def _net(s: Side):
    return cls(s, "Net")()


@tree("tied", 3)
def _tied(s: Side):
    return cls(s, "Tied")()


@tree("extra", 2)
def _extra(s: Side):
    return cls(s, "Extra")()


@tree("one_line")
def _one_line(s: Side):
    return cls(s, "OneLine")()


@tree("repeats")
def _repeats(s: Side):
    nn = s.nn
    block = lambda: nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    return nn.ModuleList(
        [block(), block(), nn.Identity(), nn.Identity(), nn.Identity(), block(), nn.ReLU()]
    )


@tree("params")
def _params(s: Side):
    nn = s.nn
    m = nn.Module()
    m.plist = nn.ParameterList([s.param(np.ones((2, 3))), s.arr([1.0, 2.0]), "tag"])
    m.single = nn.ParameterList([s.arr(np.zeros(4))])
    m.pdict = nn.ParameterDict({"b": s.arr(np.ones(2)), "a": s.param(np.zeros((1, 2)))})
    m.ordered = nn.ParameterDict(OrderedDict(z=s.arr(np.ones(3)), y=None))
    m.empty_list = nn.ParameterList()
    m.empty_dict = nn.ModuleDict()
    m.none_child = None
    m.register_module("placeholder", None)
    return m


@tree("deep")
def _deep(s: Side):
    nn = s.nn
    inner = nn.Sequential(nn.BatchNorm1d(2, affine=False), nn.Dropout(p=0.5, inplace=True))
    return nn.Sequential(
        nn.ModuleDict(OrderedDict(z=nn.Sequential(inner, nn.Identity()), a=nn.Linear(2, 2))),
        nn.ModuleList([nn.ModuleList([nn.ReLU()]), nn.ModuleList()]),
    )


def build(name: str) -> tuple[Any, Any]:
    """``(torch_module, jm_module)`` for tree ``name``, jmodule's state loaded from torch's."""
    t, j = both(TREES[name])
    copy_state(t, j)
    return t, j


def copy_state(t: Any, j: Any) -> None:
    """Load torch module ``t``'s state_dict (torch tensors) into jmodule module ``j``."""
    j.load_state_dict(t.state_dict())


# ---------------------------------------------------------------------------- comparison


def to_numpy(x: Any) -> np.ndarray:
    """An array of either framework (or a Parameter / Buffer) as numpy."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    if isinstance(x, (jm.nn.Parameter, jm.nn.Buffer)):
        x = x.data
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype == jnp.bfloat16 else x


def dtype_name(x: Any) -> str:
    """Framework-neutral dtype name; integers are just "int" (JAX's x64 mode is
    off, so torch's int64 is jmodule's int32)."""
    name = str(x.dtype).replace("torch.", "")
    return "int" if re.fullmatch(r"u?int\d+", name) or name == "long" else name


def is_array(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, jax.Array, jm.nn.Parameter, np.ndarray)) or (
        type(x) is jm.Tensor
    )


def canon(x: Any) -> Any:
    """Plain, framework-neutral data for ``x`` (arrays, modules, containers)."""
    if isinstance(x, (torch.nn.Module, jm.nn.Module)):
        return ("module", type(x).__name__)
    if is_array(x):
        kind = "param" if isinstance(x, (torch.nn.Parameter, jm.nn.Parameter)) else "array"
        values = np.round(to_numpy(x).astype(np.float64), 5)
        return (kind, tuple(x.shape), dtype_name(x), values.tolist())
    if isinstance(x, Mapping):
        return {k: canon(v) for k, v in x.items()}
    if isinstance(x, list):
        return [canon(v) for v in x]
    if isinstance(x, tuple):  # named tuples (IncompatibleKeys) become plain tuples
        return tuple(canon(v) for v in x)
    if callable(x) and not isinstance(x, type):
        return ("callable",)
    return x


_RENAMES = (
    (r"torch\.Size\(\[([^\]]*)\]\)", lambda m: repr(tuple(int(v) for v in m[1].split(",") if v))),
    (r"torch\.nn\.Buffer, torch\.Tensor", "jmodule.nn.Buffer, jax.Array"),
    (r"torch Tensor", "jax.Array"),
    (r"torch\.\w*Tensor\b", "jax.Array"),
    (r"torch\.nn\.modules\.", "jmodule.nn.modules."),
    (r"torch\.nn\.parameter\.", "jmodule.nn.parameter."),
    (r"torch\.nn\.(Parameter|Module|Buffer)\b", r"jmodule.nn.\1"),
)


def normalize(message: str) -> str:
    """A torch message with framework names written as jmodule's."""
    for pattern, repl in _RENAMES:
        message = re.sub(pattern, repl, message)
    return message


def message_of(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and len(e.args) == 1 else str(e)


def outcome(fn: Callable[[], Any]) -> tuple:
    """``("ok", canon(result))`` or ``("raise", type name, normalized message)``."""
    try:
        return ("ok", canon(fn()))
    except Exception as e:  # the exception is the result being compared
        return ("raise", type(e).__name__, normalize(message_of(e)))


def outcomes(fn: Callable[[Side], Any]) -> tuple[tuple, tuple]:
    """``(outcome(fn(TORCH)), outcome(fn(JM)))``: assert they are equal."""
    return outcome(lambda: fn(TORCH)), outcome(lambda: fn(JM))


def state_of(m: Any) -> dict[str, Any]:
    """Every parameter and buffer of ``m`` (duplicates included) as numpy."""
    out = {k: to_numpy(v) for k, v in m.named_parameters(remove_duplicate=False)}
    out.update({k: to_numpy(v) for k, v in m.named_buffers(remove_duplicate=False)})
    return out


def assert_same_state(t: Any, j: Any, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Same names, shapes and values for every parameter and buffer."""
    ts, js = state_of(t), state_of(j)
    assert list(ts) == list(js)
    for k in ts:
        assert ts[k].shape == js[k].shape, k
        np.testing.assert_allclose(js[k], ts[k], rtol=rtol, atol=atol, err_msg=k)


def inputs(n: int, d: int, seed: int = 1) -> tuple[Any, Any]:
    """The same random ``(n, d)`` float32 input in torch and jax."""
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return torch.from_numpy(x.copy()), jnp.asarray(x)


def run_forward(name: str, t: Any, j: Any, n: int = 5, seed: int = 1) -> tuple:
    """Tree ``name``'s torch and jmodule modules called on the same input, as numpy."""
    xt, xj = inputs(n, FORWARD_IN[name], seed)
    with torch.no_grad():
        out_t = t(xt)
    return to_numpy(out_t), to_numpy(j(xj))
