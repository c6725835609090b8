"""Nested containers of arrays and plain values <-> (JSON skeleton, flat arrays).

The skeleton keeps everything that is not array data: container types
(``dict``, ``OrderedDict`` and its ``_metadata`` attribute, ``list``,
``tuple``), key order and key types, and plain values (``int``, ``float``
bit-exact, ``str``, ``bool``, ``None``, ``bytes``, ``complex``). Arrays are
replaced by an index into the flat list; an array object that appears twice
(tied weights) is stored once and comes back as one object.
"""

from __future__ import annotations

import base64
import collections
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

Leaf = tuple[str, Any]  # (dotted key path, array)

#: The deepest nesting of containers ``jm.save`` stores (``jm.load`` refuses a
#: ``jmodule.json`` nested deeper than its skeleton can be).
MAX_DEPTH = 100

SUPPORTED = (
    "dict, OrderedDict, list, tuple, jax.Array, numpy arrays and scalars, int, float, str, "
    "bool, None, bytes, complex"
)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or hasattr(x, "__jax_array__")


def _as_array(x: Any) -> Any:
    if isinstance(x, (jax.Array, np.ndarray)):
        return x
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x.__jax_array__()


def _join(prefix: str, key: Any) -> str:
    return str(key) if not prefix else f"{prefix}.{key}"


def flatten(obj: Any) -> tuple[dict, list[Leaf]]:
    """Split ``obj`` into a JSON-able skeleton and its arrays, in order.

    Raises:
        TypeError: ``obj`` holds a value of another type (named by its key),
            contains itself, or nests more than :data:`MAX_DEPTH` containers.
    """
    leaves: list[Leaf] = []
    index_of: dict[int, int] = {}
    active: set[int] = set()

    def array(x: Any, path: str) -> dict:
        x = _as_array(x)
        i = index_of.get(id(x))
        if i is None:
            i = index_of[id(x)] = len(leaves)
            leaves.append((path, x))
        return {"t": "array", "i": i}

    def key(k: Any, path: str) -> dict:
        if isinstance(k, (dict, list, np.ndarray, jax.Array)):
            raise TypeError(f"cannot save the key {k!r} at '{path}': keys must be plain values")
        return node(k, path)

    def node(x: Any, path: str) -> dict:
        if x is None:
            return {"t": "none"}
        if isinstance(x, bool):
            return {"t": "bool", "v": x}
        if type(x) is int:
            return {"t": "int", "v": x}
        if type(x) is float:
            return {"t": "float", "v": x.hex()}
        if type(x) is str:
            return {"t": "str", "v": x}
        if type(x) is bytes:
            return {"t": "bytes", "v": base64.b64encode(x).decode("ascii")}
        if type(x) is complex:
            return {"t": "complex", "v": [x.real.hex(), x.imag.hex()]}
        if _is_array(x):
            return array(x, path)
        if type(x) in (dict, collections.OrderedDict, list, tuple):
            if id(x) in active:
                raise TypeError(f"cannot save '{path or '<root>'}': the container contains itself")
            if len(active) >= MAX_DEPTH:  # active: the containers around x
                raise TypeError(
                    f"cannot save '{path}': it is nested more than {MAX_DEPTH} containers deep, "
                    "more than a checkpoint stores; flatten the structure (e.g. dotted keys)."
                )
            active.add(id(x))
            try:
                return container(x, path)
            finally:
                active.discard(id(x))
        if isinstance(x, jax.ShapeDtypeStruct):
            raise TypeError(
                f"cannot save '{path or '<root>'}': it is a meta array (shape and dtype, no "
                "data). Allocate it first, e.g. model.to_empty(device='cpu') and "
                "reset_parameters()."
            )
        if callable(getattr(type(x), "state_dict", None)):  # a module or an optimizer
            raise TypeError(
                f"cannot save '{path or '<root>'}' of type {type(x).__name__}: jm.save "
                "stores arrays and containers, not objects with code (torch.save pickles "
                "the class; jm does not). Save its state_dict instead: "
                "jm.save(model.state_dict(), path), and restore it with "
                "model.load_state_dict(jm.load(path))."
            )
        raise TypeError(
            f"cannot save '{path or '<root>'}' of type {type(x).__name__}: jm.save stores "
            f"{SUPPORTED}. Convert it to one of these first (for example a dataclass with "
            f"dataclasses.asdict, a torch tensor with .numpy())."
        )

    def container(x: Any, path: str) -> dict:
        if isinstance(x, dict):
            out: dict = {
                "t": "odict" if type(x) is collections.OrderedDict else "dict",
                "k": [key(k, path) for k in x],
                "v": [node(v, _join(path, k)) for k, v in x.items()],
            }
            meta = getattr(x, "_metadata", None)
            if meta is not None:
                out["m"] = node(meta, _join(path, "_metadata"))
            return out
        return {
            "t": type(x).__name__,
            "v": [node(v, _join(path, i)) for i, v in enumerate(x)],
        }

    return node(obj, ""), leaves


def unflatten(skeleton: dict, arrays: list[Any]) -> Any:
    """Rebuild the object :func:`flatten` split, with ``arrays`` in its slots.

    Raises:
        ValueError: the skeleton is malformed.
    """

    def node(n: dict) -> Any:
        t = n["t"]
        make = _DECODERS.get(t)
        if make is not None:
            return make(n)
        if t == "array":
            return arrays[n["i"]]
        if t in ("list", "tuple"):
            values = [node(v) for v in n["v"]]
            return values if t == "list" else tuple(values)
        if t in ("dict", "odict"):
            if len(n["k"]) != len(n["v"]):
                raise ValueError("dict node with unequal key and value counts")
            out = (collections.OrderedDict if t == "odict" else dict)(
                (node(k), node(v)) for k, v in zip(n["k"], n["v"])
            )
            if "m" in n:
                out._metadata = node(n["m"])  # type: ignore[attr-defined]
            return out
        raise ValueError(f"unknown node type {t!r}")

    try:
        return node(skeleton)
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"malformed tree ({type(e).__name__}: {e})") from None


def _check(kind: type, value: Any) -> Any:
    if type(value) is not kind:
        raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


_DECODERS: dict[str, Callable[[dict], Any]] = {
    "none": lambda n: None,
    "bool": lambda n: _check(bool, n["v"]),
    "int": lambda n: _check(int, n["v"]),
    "float": lambda n: float.fromhex(n["v"]),
    "str": lambda n: _check(str, n["v"]),
    "bytes": lambda n: base64.b64decode(n["v"], validate=True),
    "complex": lambda n: complex(float.fromhex(n["v"][0]), float.fromhex(n["v"][1])),
}
