"""JSON descriptions of a program's input and output trees, for program files.

Inputs are ``(args, kwargs)`` whose leaves are arrays or compile-time
constants (``Static``); outputs are trees of arrays. Containers are tuples,
lists, dicts (string or integer keys), named tuples and None. A saved file
stores these descriptions as JSON (never pickle), so loading runs no code
from the file.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jmodule._lowering.arguments import Static
from jmodule.jit._errors import JitError
from jmodule.nn.parameter import as_array

_SCALARS = {bool: "bool", int: "int", float: "float", str: "str", complex: "complex"}


def _encode_static(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {"static": "none"}
    kind = _SCALARS.get(type(value))
    if kind is None:
        raise JitError(
            f"Cannot save the program: argument {where} is the Python value {value!r} "
            f"({type(value).__name__}), a compile-time constant of the program, and only "
            "bool, int, float, complex, str and None constants can be stored."
        )
    if kind == "complex":
        return {"static": kind, "value": [value.real, value.imag]}
    if kind == "float" and not math.isfinite(value):
        return {"static": kind, "value": repr(value)}
    return {"static": kind, "value": value}


def _decode_static(spec: dict[str, Any]) -> Any:
    kind = spec["static"]
    if kind == "none":
        return None
    value = spec["value"]
    if kind == "complex":
        return complex(*value)
    if kind == "float":
        return float(value)
    return {"bool": bool, "int": int, "str": str}[kind](value)


def encode(tree: Any, where: str = "") -> dict[str, Any]:
    """The JSON description of ``tree`` (array leaves become ``{"leaf": ...}``)."""
    if type(tree) is Static:
        return _encode_static(tree.value, where)
    if tree is None:
        return {"none": True}
    if isinstance(tree, tuple) and hasattr(type(tree), "_fields"):
        return {
            "namedtuple": type(tree).__name__,
            "fields": list(type(tree)._fields),
            "items": [encode(x, f"{where}.{f}") for f, x in zip(type(tree)._fields, tree)],
        }
    if type(tree) in (tuple, list):
        kind = "tuple" if type(tree) is tuple else "list"
        return {kind: [encode(x, f"{where}[{i}]") for i, x in enumerate(tree)]}
    if type(tree) in (dict, collections.OrderedDict):
        items = []
        for key, x in tree.items():
            if type(key) not in (str, int):
                raise JitError(
                    f"Cannot save the program: {where or 'a dict'} has a key of type "
                    f"{type(key).__name__}; saved programs take dicts with str or int keys."
                )
            items.append([key, encode(x, f"{where}[{key!r}]")])
        return {"dict": items}
    if hasattr(tree, "shape") and hasattr(tree, "dtype"):
        return {"leaf": True}
    raise JitError(
        f"Cannot save the program: {where or 'the value'} is a {type(tree).__name__}; "
        "saved programs take and return arrays in tuples, lists, dicts and named tuples."
    )


def _check_static(spec: dict[str, Any]) -> None:
    kind = spec["static"]
    if kind == "none":
        if set(spec) != {"static"}:
            raise ValueError("a None constant with a value")
        return
    if set(spec) != {"static", "value"}:
        raise ValueError(f"a constant of kind {kind!r} without a value")
    value = spec["value"]
    number = (int, float)
    ok = {
        "bool": lambda: type(value) is bool,
        "int": lambda: type(value) is int,
        "str": lambda: type(value) is str,
        "float": lambda: type(value) in number or type(value) is str,
        "complex": lambda: (
            isinstance(value, list) and len(value) == 2 and all(type(v) in number for v in value)
        ),
    }.get(kind)
    if ok is None or not ok():
        raise ValueError(f"a malformed compile-time constant {str(spec)[:80]}")
    _decode_static(spec)  # float("...") may still refuse


def check(spec: Any, inputs: bool = True) -> int:
    """The number of array leaves of the tree description ``spec``, checking its structure.

    Args:
        spec: a description from a file (untrusted).
        inputs: whether compile-time constants may appear (input trees only).

    Raises:
        ValueError: ``spec`` is not what :func:`encode` writes.
    """
    if not isinstance(spec, dict):
        raise ValueError(f"a tree node is a {type(spec).__name__}, not an object")
    keys = set(spec)
    if keys == {"leaf"} and spec["leaf"] is True:
        return 1
    if keys == {"none"} and spec["none"] is True:
        return 0
    if "static" in keys and inputs:
        _check_static(spec)
        return 0
    if keys in ({"tuple"}, {"list"}):
        items = spec["tuple" if "tuple" in keys else "list"]
        if not isinstance(items, list):
            raise ValueError("a tuple or list node without a list of items")
        return sum(check(s, inputs) for s in items)
    if keys == {"dict"}:
        items = spec["dict"]
        if not isinstance(items, list) or not all(
            isinstance(kv, list) and len(kv) == 2 for kv in items
        ):
            raise ValueError("a dict node without a list of [key, value] pairs")
        key_types = {type(k) for k, _ in items}
        if not (key_types <= {str} or key_types <= {int}) or len({k for k, _ in items}) != len(
            items
        ):
            raise ValueError("a dict node whose keys are not distinct strs or distinct ints")
        return sum(check(s, inputs) for _, s in items)
    if keys == {"namedtuple", "fields", "items"}:
        name, fields, items = spec["namedtuple"], spec["fields"], spec["items"]
        if not (
            isinstance(name, str)
            and isinstance(fields, list)
            and all(isinstance(f, str) for f in fields)
            and isinstance(items, list)
            and len(items) == len(fields)
        ):
            raise ValueError("a malformed named tuple node")
        collections.namedtuple(name, fields)  # ValueError for names it cannot take
        return sum(check(s, inputs) for s in items)
    raise ValueError(f"an unknown tree node with keys {sorted(keys)[:5]}")


def build(spec: dict[str, Any], leaves: Iterator[Any]) -> Any:
    """Rebuild an output tree from its description and its leaves, in order."""
    if "leaf" in spec:
        return next(leaves)
    if "none" in spec:
        return None
    if "tuple" in spec:
        return tuple(build(s, leaves) for s in spec["tuple"])
    if "list" in spec:
        return [build(s, leaves) for s in spec["list"]]
    if "dict" in spec:
        return {key: build(s, leaves) for key, s in spec["dict"]}
    if "namedtuple" in spec:
        cls = collections.namedtuple(spec["namedtuple"], spec["fields"])
        return cls(*(build(s, leaves) for s in spec["items"]))
    raise JitError(f"unknown tree description {sorted(spec)}")


def match(spec: dict[str, Any], value: Any, where: str, out: list[Any]) -> None:
    """Check call argument ``value`` against ``spec``; append its array leaves to ``out``.

    Raises:
        TypeError: the structure differs, or a compile-time constant has another value.
    """
    if "static" in spec:
        saved = _decode_static(spec)
        if type(value) is not type(saved) or value != saved:
            raise TypeError(
                f"{where} is a compile-time constant of this loaded program: it was "
                f"{saved!r} when the program was saved and must be {saved!r} (got {value!r}). "
                "Save the program again with the value you need."
            )
        return
    if "leaf" in spec:
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            raise TypeError(
                f"{where} must be an array (the program was saved with an array there), "
                f"got {type(value).__name__}"
            )
        out.append(as_array(value))
        return
    if "none" in spec:
        if value is not None:
            raise TypeError(f"{where} must be None, as when the program was saved")
        return
    for kind in ("tuple", "list"):
        if kind in spec:
            items = spec[kind]
            if not isinstance(value, (tuple, list)) or len(value) != len(items):
                raise TypeError(
                    f"{where} must be a {kind} of {len(items)} items, as when the program was "
                    f"saved (got {type(value).__name__}"
                    f"{f' of {len(value)}' if isinstance(value, (tuple, list)) else ''})"
                )
            for i, (s, v) in enumerate(zip(items, value)):
                match(s, v, f"{where}[{i}]", out)
            return
    if "namedtuple" in spec:
        match({"tuple": spec["items"]}, tuple(value), where, out)
        return
    if "dict" in spec:
        keys = [key for key, _ in spec["dict"]]
        if not isinstance(value, dict) or sorted(map(str, value)) != sorted(map(str, keys)):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise TypeError(f"{where} must be a dict with keys {sorted(keys)}, got {got}")
        # Leaves in jax's order (sorted keys), which is the order the program takes them.
        for key, s in sorted(spec["dict"], key=lambda kv: kv[0]):
            match(s, value[key], f"{where}[{key!r}]", out)
        return
    raise JitError(f"unknown tree description {sorted(spec)}")


def out_skeleton(treedef: Any) -> Any:
    """The output tree with placeholder leaves (for :func:`encode`)."""
    return jax.tree_util.tree_unflatten(treedef, [_Placeholder()] * treedef.num_leaves)


class _Placeholder:
    shape = ()
    dtype = np.dtype("float32")
