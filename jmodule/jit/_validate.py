"""Checking a program file's header against its program, at load time.

The digests of a program file catch damage, not a header rewritten on purpose
(digests recomputed). So that such a file fails in ``jm.jit.load`` with a
:class:`ProgramFileError` rather than at its first call (``KeyError``, or
XLA failing to read the program), :func:`check_meta` checks every field the
loader and the loaded program use (types, the input and output trees, the
module tree, the state arrays' shapes and dtypes), and :func:`check_program`
checks them against the deserialized ``jax.export`` program and parses its
StableHLO.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jmodule._lowering.state import RNG_NAME
from jmodule.jit import _spec
from jmodule.jit._errors import ProgramFileError
from jmodule.jit._restored import check_tree

_CONSTRAINT = re.compile(r"^\s*[A-Za-z_]\w*\s*>=\s*\d+\s*$")


def _strs(value: Any, what: str, unique: bool = True) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{what} is not a list of strings")
    if unique and len(set(value)) != len(value):
        raise ValueError(f"{what} names something twice")
    return value


def _array_info(info: Any, what: str) -> None:
    if not (
        isinstance(info, dict)
        and isinstance(info.get("name"), str)
        and isinstance(info.get("part"), str)
        and isinstance(info.get("dtype"), str)
        and isinstance(info.get("shape"), list)
        and all(type(d) is int and d >= 0 for d in info["shape"])
    ):
        raise ValueError(f"malformed {what} entry {str(info)[:100]}")
    try:
        jax.numpy.dtype(info["dtype"])
    except TypeError:
        raise ValueError(
            f"{what} '{info['name']}' has an unknown dtype {info['dtype']!r}"
        ) from None


def check_meta(meta: dict[str, Any], parts: Mapping[str, Any], where: str) -> None:
    """Check the fields of ``meta`` that loading and running use.

    Raises:
        ProgramFileError: naming the first field that is malformed.
    """
    try:
        state = _strs(meta.get("state"), "the state list")
        if not state or state[-1] != RNG_NAME:
            raise ValueError("the state list does not end with the random key")
        changed = _strs(meta.get("changed"), "the list of changed state")
        if not set(changed) <= set(state):
            raise ValueError("the list of changed state names state the program does not take")
        modes = meta.get("modes")
        if not isinstance(modes, dict) or not all(isinstance(v, bool) for v in modes.values()):
            raise ValueError("the modes are not a mapping of module paths to booleans")
        names = meta.get("arg_names")
        if names is not None:
            _strs(names, "the argument names", unique=False)
        inputs = meta.get("inputs")
        if not (
            isinstance(inputs, dict)
            and set(inputs) == {"tuple"}
            and isinstance(inputs["tuple"], list)
            and len(inputs["tuple"]) == 2
            and isinstance(inputs["tuple"][0], dict)
            and set(inputs["tuple"][0]) == {"tuple"}
            and isinstance(inputs["tuple"][1], dict)
            and set(inputs["tuple"][1]) == {"dict"}
        ):
            raise ValueError("the inputs are not a pair (positional arguments, keyword arguments)")
        _spec.check(inputs, inputs=True)
        if any(type(k) is not str for k, _ in inputs["tuple"][1]["dict"]):
            raise ValueError("a keyword argument is not named by a string")
        _spec.check(meta.get("output"), inputs=False)
        constraint = meta.get("batch_constraint", "")
        if not isinstance(constraint, str) or (constraint and not _CONSTRAINT.match(constraint)):
            raise ValueError(f"the batch constraint {str(constraint)[:40]!r} is malformed")
        arrays = meta.get("arrays")
        if not isinstance(arrays, list):
            raise ValueError("the state arrays are not a list")
        for info in arrays:
            _array_info(info, "state array")
        if [a["name"] for a in arrays] != [n for n in state if n != RNG_NAME]:
            raise ValueError("the state arrays are not the program's state, in order")
        views = meta.get("views")
        if not isinstance(views, dict) or not all(
            isinstance(views.get(k), str) for k in ("graph", "inlined_graph", "code")
        ):
            raise ValueError("the views are not the graph, inlined graph and code texts")
        constants = views.get("constants")
        if not isinstance(constants, list):
            raise ValueError("the code constants are not a list")
        for c in constants:
            if isinstance(c, dict) and "part" in c:
                _array_info(c, "code constant")
            elif not (isinstance(c, dict) and isinstance(c.get("name"), str)):
                raise ValueError(f"malformed code constant {str(c)[:100]}")
        extra = meta.get("extra")
        if not isinstance(extra, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str) and e.get("part") in parts
            for e in extra
        ):
            raise ValueError("the extra files are not a list of named parts")
        if any(a["part"] not in parts for a in (*arrays, *(c for c in constants if "part" in c))):
            raise ValueError("an array names a part the file does not have")
        if "program" not in parts:
            raise ValueError("there is no program part")
        check_tree(meta.get("tree"), set(state))
    except ValueError as e:
        raise ProgramFileError(
            f"{where} has an inconsistent header: {e}. It was rewritten or written by another "
            "program; save the program again with jm.jit.save."
        ) from None


def check_program(meta: dict[str, Any], exported: Any, where: str) -> None:
    """Check ``meta`` (already :func:`check_meta`-ed) against the deserialized ``exported``.

    The program's StableHLO is parsed here (it is otherwise parsed at the
    first call).

    Raises:
        ProgramFileError: the program takes or returns other trees, or other
            state shapes and dtypes, than the header says, or is unreadable.
    """
    state, changed = meta["state"], meta["changed"]
    n_in = _spec.check(meta["inputs"])
    n_out = _spec.check(meta["output"], inputs=False)
    tree = jax.tree_util.tree_structure
    problem = None
    if exported.in_tree != tree(((list(state), [0] * n_in), {})):
        problem = f"takes {exported.in_tree}, not {len(state)} state arrays and {n_in} inputs"
    elif exported.out_tree != tree(([0] * n_out, list(changed))):
        problem = (
            f"returns {exported.out_tree}, not {n_out} outputs and {len(changed)} state updates"
        )
    else:
        for info, aval in zip(meta["arrays"], exported.in_avals):
            shape, dtype = tuple(info["shape"]), np.dtype(jax.numpy.dtype(info["dtype"]))
            if tuple(aval.shape) != shape or np.dtype(aval.dtype) != dtype:
                problem = (
                    f"takes '{info['name']}' as {aval.dtype}{list(aval.shape)}, the file holds "
                    f"it as {dtype}{list(shape)}"
                )
                break
    if problem is None:
        try:
            _parse_stablehlo(exported)
        except Exception as e:  # XLA's error for unreadable bytecode
            problem = f"cannot be read ({type(e).__name__}: {str(e)[:200]})"
    if problem is not None:
        raise ProgramFileError(
            f"{where} does not match its header: the program {problem}. It was rewritten or "
            "damaged; save the program again with jm.jit.save."
        )


def _parse_stablehlo(exported: Any) -> None:
    from jax._src.interpreters import mlir

    with mlir.make_ir_context():
        exported.mlir_module(serialized=False)
