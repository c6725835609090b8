"""The ``code`` view: a forward's program as Python that runs.

The inlined jaxpr is written as a function ``forward(self, <arguments>)``,
one statement per primitive (``v3 = prim.dot_general(x, w, ...)``), reading
parameters and buffers by ``state_dict`` key (``ops.get(self, "fc.weight")``)
and writing back the buffers the forward updates (``ops.set(...)``).
Constants too large to inline, and the rare parameter that has no Python
spelling, appear as ``CONSTANTS.c0``, ``c1``, ... and are kept in a
:class:`ConstMap`. Executing the code with ``CONSTANTS`` bound computes what
the forward computes (see :meth:`ScriptModule.code`).
"""

from __future__ import annotations

import dataclasses
import enum
import keyword
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from jmodule._tensor import Tensor
from jmodule.jit import ops
from jmodule.jit._graph import inline
from jmodule.jit._trace import Traced

#: Arrays with at most this many elements are written inline.
INLINE_LIMIT = 16

_RESERVED = {"self", "ops", "prim", "np", "lax", "CONSTANTS", "forward"}


class ConstMap:
    """The constants referenced as ``CONSTANTS.c<N>`` by rendered code.

    Attribute or item access gives a constant; ``const_mapping`` is the dict.

    >>> cm = ConstMap({"c0": 1.5})
    >>> cm.c0, cm["c0"], len(cm)
    (1.5, 1.5, 1)
    """

    def __init__(self, const_mapping: dict[str, Any]):
        self.const_mapping = dict(const_mapping)

    def __getattr__(self, name: str) -> Any:
        mapping = self.__dict__.get("const_mapping", {})
        if name in mapping:
            return mapping[name]
        raise AttributeError(f"ConstMap has no constant {name!r}")

    def __getitem__(self, name: str) -> Any:
        return self.const_mapping[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.const_mapping)

    def __len__(self) -> int:
        return len(self.const_mapping)

    def items(self) -> Any:
        """``(name, constant)`` pairs."""
        return self.const_mapping.items()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {_describe(v)}" for k, v in self.const_mapping.items())
        return f"ConstMap({{{inner}}})"


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{np.dtype(value.dtype).name}{list(value.shape)}"
    return type(value).__name__


def identifier(name: str, taken: set[str]) -> str:
    """A Python identifier for display name ``name``, not in ``taken`` (then added)."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name).strip("_") or "arg"
    if out[0].isdigit():
        out = "_" + out
    if keyword.iskeyword(out) or out in _RESERVED:
        out += "_"
    base, n = out, 1
    while out in taken:
        n += 1
        out = f"{base}_{n}"
    taken.add(out)
    return out


class _Writer:
    """Writes one program (and the programs nested in its equations) as Python."""

    def __init__(self) -> None:
        self.constants: dict[str, Any] = {}
        self.uses_lax = False
        self.taken: set[str] = set(_RESERVED)
        self.counter = 0

    # ----------------------------------------------------------------- names and atoms

    def fresh(self, prefix: str = "v") -> str:
        while True:
            name = f"{prefix}{self.counter}"
            self.counter += 1
            if name not in self.taken:
                self.taken.add(name)
                return name

    def constant(self, value: Any) -> str:
        name = f"c{len(self.constants)}"
        self.constants[name] = value
        return f"CONSTANTS.{name}"

    def array(self, value: Any) -> str:
        arr = np.asarray(value)
        if arr.ndim == 0:
            return self.scalar(arr.item(), arr.dtype)
        finite = arr.dtype.kind not in "fc" or bool(np.all(np.isfinite(arr)))
        if arr.size <= INLINE_LIMIT and finite and arr.dtype.kind in "biufc":
            return f"np.array({arr.tolist()!r}, dtype={self.dtype(arr.dtype)})"
        return self.constant(value)

    def scalar(self, value: Any, dtype: Any) -> str:
        dtype = np.dtype(dtype)
        if dtype.kind == "b":
            return f"np.bool_({bool(value)!r})"
        text = _number(value)
        if text is None:
            return self.constant(np.asarray(value, dtype))
        if hasattr(np, dtype.name) and np.dtype(getattr(np, dtype.name)) == dtype:
            return f"np.{dtype.name}({text})"
        return f"ops.scalar({dtype.name!r}, {text})"

    def dtype(self, dtype: Any) -> str:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            impl = getattr(dtype, "_impl", None)
            if impl is not None and getattr(impl, "name", None):
                return f"ops.key_dtype({impl.name!r})"
            return self.constant(dtype)
        return f"ops.{name}" if ops.is_dtype_name(name) else f"ops.dtype({name!r})"

    def atom(self, v: Any, names: dict[Any, str]) -> str:
        if isinstance(v, jex_core.Literal):
            try:
                return self.array(np.asarray(v.val, dtype=v.aval.dtype))
            except TypeError:  # an extended dtype (e.g. PRNG keys) numpy cannot hold
                return self.constant(v.val)
        return names[v]

    # ----------------------------------------------------------------- parameter values

    def value(self, v: Any, lines: list[str], indent: str) -> str:
        """Python spelling of equation parameter ``v`` (nested programs become defs)."""
        if isinstance(v, jex_core.ClosedJaxpr):
            fn = self.function(v, lines, indent)
            specs = ", ".join(self.spec(a) for a in v.in_avals)
            return f"ops.closed_jaxpr({fn}, [{specs}])"
        if v is None or isinstance(v, (bool, str)):
            return repr(v)
        if isinstance(v, int) and type(v) is int:
            return repr(v)
        if type(v) is float:
            return _number(v) or self.constant(v)
        if type(v) is tuple:
            items = [self.value(x, lines, indent) for x in v]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if type(v) is list:
            return f"[{', '.join(self.value(x, lines, indent) for x in v)}]"
        if type(v) is dict and all(isinstance(k, str) for k in v):
            inner = ", ".join(f"{k!r}: {self.value(x, lines, indent)}" for k, x in v.items())
            return f"{{{inner}}}"
        if isinstance(v, (np.ndarray, jax.Array)):
            return self.array(v)
        if isinstance(v, np.generic):
            return self.scalar(v.item(), v.dtype)
        return self.verified(v, self.spelling(v, lines, indent))

    def spelling(self, v: Any, lines: list[str], indent: str) -> str | None:
        if isinstance(v, np.dtype) or type(v).__module__ == "numpy.dtypes":
            return self.dtype(v)
        if type(v).__name__ == "KeyTy":
            return self.dtype(v)
        if type(v).__name__ == "PRNGImpl" and getattr(v, "name", None):
            return f"ops.prng_impl({v.name!r})"
        if isinstance(v, enum.Enum):
            return f"{self.cls(type(v))}.{v.name}"
        if isinstance(v, tuple) and hasattr(type(v), "_fields"):
            fields = ", ".join(
                f"{f}={self.value(getattr(v, f), lines, indent)}" for f in type(v)._fields
            )
            return f"{self.cls(type(v))}({fields})"
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            fields = [f for f in dataclasses.fields(v) if f.init]
            args = ", ".join(
                f"{f.name}={self.value(getattr(v, f.name), lines, indent)}" for f in fields
            )
            return f"{self.cls(type(v))}({args})"
        return None

    def cls(self, t: type) -> str:
        if getattr(jax.lax, t.__name__, None) is t:
            self.uses_lax = True
            return f"lax.{t.__name__}"
        return f"ops.load({f'{t.__module__}:{t.__qualname__}'!r})"

    def verified(self, v: Any, text: str | None) -> str:
        """``text`` if evaluating it gives ``v`` back; otherwise a constant."""
        if text is not None:
            namespace = {
                "np": np,
                "ops": ops,
                "lax": jax.lax,
                "CONSTANTS": ConstMap(self.constants),
            }
            try:
                again = eval(text, namespace)  # the spelling we just wrote, nothing else
                if type(again) is type(v) and bool(again == v):
                    return text
            except Exception:  # an unspellable value becomes a constant
                pass
        return self.constant(v)

    def spec(self, aval: Any) -> str:
        shape = tuple(aval.shape)
        weak = ", weak_type=True" if getattr(aval, "weak_type", False) else ""
        return f"ops.spec({shape!r}, {self.dtype(aval.dtype)}{weak})"

    # ----------------------------------------------------------------- programs

    def body(self, closed: Any, names: dict[Any, str], lines: list[str], indent: str) -> list[str]:
        """Statements for ``closed``'s equations; returns the output expressions."""
        jaxpr = closed.jaxpr
        for v, c in zip(jaxpr.constvars, closed.consts):
            name = self.fresh("k")
            names[v] = name
            lines.append(f"{indent}{name} = {self.array(c)}")
        for eqn in jaxpr.eqns:
            args = [self.atom(v, names) for v in eqn.invars]
            prims = ops.lookup_primitive(eqn.primitive.name)
            kwargs = [f"{k}={self.value(p, lines, indent)}" for k, p in eqn.params.items()]
            if prims is eqn.primitive:
                call = f"{ops.attribute_for(eqn.primitive.name)}({', '.join(args + kwargs)})"
            else:
                ref = self.constant(eqn.primitive)
                call = f"ops.bind({', '.join([ref, *args, *kwargs])})"
            outs = []
            for v in eqn.outvars:
                if isinstance(v, jex_core.DropVar):
                    outs.append("_")
                else:
                    names[v] = self.fresh()
                    outs.append(names[v])
            if eqn.primitive.multiple_results:
                target = ", ".join(outs) + ("," if len(outs) == 1 else "")
                target = target or "_"
            else:
                target = outs[0]
            lines.append(f"{indent}{target} = {call}")
        return [self.atom(v, names) for v in jaxpr.outvars]

    def function(self, closed: Any, lines: list[str], indent: str) -> str:
        """A nested ``def`` for a program held in an equation parameter; returns its name."""
        fn = self.fresh("program")
        names: dict[Any, str] = {}
        params = []
        for v in closed.jaxpr.invars:
            names[v] = self.fresh("a")
            params.append(names[v])
        inner: list[str] = [f"{indent}def {fn}({', '.join(params)}):"]
        outs = self.body(closed, names, inner, indent + "    ")
        inner.append(f"{indent}    return [{', '.join(outs)}]")
        lines.extend(inner)
        return fn


def _number(value: Any) -> str | None:
    if isinstance(value, complex):
        return f"complex({_number(value.real)}, {_number(value.imag)})"
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else '-float("inf")'
    return repr(value)


def _tree_expr(treedef: Any, leaves: Sequence[str]) -> str:
    """A Python expression rebuilding the forward's output tree from leaf expressions."""
    skeleton = jax.tree_util.tree_unflatten(treedef, [_Leaf(x) for x in leaves])
    return _expr(skeleton)


class _Leaf:
    def __init__(self, text: str):
        self.text = text


def _expr(node: Any) -> str:
    if isinstance(node, _Leaf):
        return node.text
    if type(node) is Tensor:  # a saved program returns arrays; called with Tensors (the
        return _expr(node.array)  # caller's choice), its module wraps them again
    if node is None:
        return "None"
    if type(node) is tuple:
        items = [_expr(x) for x in node]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if type(node) is list:
        return f"[{', '.join(_expr(x) for x in node)}]"
    if type(node) is dict:
        return "{" + ", ".join(f"{k!r}: {_expr(x)}" for k, x in node.items()) + "}"
    if isinstance(node, tuple) and hasattr(type(node), "_fields"):
        fields = ", ".join(f"{f}={_expr(getattr(node, f))}" for f in type(node)._fields)
        return f"ops.load({f'{type(node).__module__}:{type(node).__qualname__}'!r})({fields})"
    raise TypeError(f"cannot write an output of type {type(node).__name__} as Python")


def render(
    traced: Traced,
    in_names: Sequence[str],
    arg_names: Sequence[str] | None,
    header: Sequence[str],
) -> tuple[str, ConstMap]:
    """``(code, ConstMap)`` for one trace of a forward."""
    closed = inline(traced.jaxpr)
    w = _Writer()
    jaxpr = closed.jaxpr
    names: dict[Any, str] = {}
    num_state = len(traced.names)
    lines: list[str] = []
    used = _used_vars(jaxpr)
    for i, v in enumerate(jaxpr.invars[:num_state]):
        is_rng = traced.names[i] == ops.RNG_KEY
        names[v] = identifier("rng_key" if is_rng else traced.names[i], w.taken)
        if v in used:
            key = "ops.RNG_KEY" if traced.names[i] == ops.RNG_KEY else repr(traced.names[i])
            lines.append(f"    {names[v]} = ops.get(self, {key})")
    signature = _signature(traced, arg_names, jaxpr.invars[num_state:], names, w, lines)
    outs = w.body(closed, names, lines, "    ")
    num_out = traced.out_tree.num_leaves
    for i, value in zip(traced.changed, outs[num_out:]):
        key = "ops.RNG_KEY" if traced.names[i] == ops.RNG_KEY else repr(traced.names[i])
        lines.append(f"    ops.set(self, {key}, {value})")
    lines.append(f"    return {_tree_expr(traced.out_tree, outs[:num_out])}")
    head = [f"# {line}" for line in header]
    head += ["import numpy as np", ""]
    if w.uses_lax:
        head.insert(len(head) - 1, "from jax import lax")
    head += ["from jmodule.jit import ops", "from jmodule.jit.ops import prim", "", ""]
    code = "\n".join([*head, f"def forward({signature}):", *lines]) + "\n"
    return code, ConstMap(w.constants)


def _used_vars(jaxpr: Any) -> set[Any]:
    used = set()
    for eqn in jaxpr.eqns:
        used.update(v for v in eqn.invars if isinstance(v, jex_core.Var))
    used.update(v for v in jaxpr.outvars if isinstance(v, jex_core.Var))
    return used


def _signature(
    traced: Traced,
    arg_names: Sequence[str] | None,
    arg_vars: Sequence[Any],
    names: dict[Any, str],
    w: _Writer,
    lines: list[str],
) -> str:
    """``self, x, y, *, mask`` and the statements unpacking nested argument leaves."""
    args, kwargs = traced.signature.tree
    params = ["self"]
    top: dict[tuple[int, Any], str] = {}
    for i in range(len(args)):
        base = arg_names[i] if arg_names and i < len(arg_names) else f"arg{i}"
        top[(0, i)] = identifier(base, w.taken)
        params.append(top[(0, i)])
    if kwargs:
        params.append("*")
    for key in sorted(kwargs):
        top[(1, key)] = identifier(str(key), w.taken)
        params.append(top[(1, key)])
    unpack: list[str] = []
    flat, _ = jax.tree_util.tree_flatten_with_path(traced.signature.tree)
    for v, (path, _leaf) in zip(arg_vars, flat):
        group, first, *rest = path
        key = first.idx if group.idx == 0 else first.key
        expr = top[(group.idx, key)] + jax.tree_util.keystr(tuple(rest))
        if not rest:
            names[v] = expr
        else:
            names[v] = identifier(expr, w.taken)
            unpack.append(f"    {names[v]} = {expr}")
    lines[:0] = unpack
    return ", ".join(params)
