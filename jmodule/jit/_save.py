"""Writing a ScriptModule's program and state to one file (``jm.jit.save``'s work).

The program is the forward as ``jax.export`` serializes it (StableHLO, for
CPU and CUDA, with a symbolic batch dimension when asked), taking the state
as inputs; the state is stored beside it as raw arrays, with the module
tree's description, the views and any extra files. Every part is
checksummed (``_format``). Reading is ``_io.load``.

This module sits beneath ``_script`` (whose ``ScriptModule.save`` calls
:func:`write`) and ``_io``; it imports neither.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, BinaryIO

import jax
import numpy as np

from jmodule import _jax_internals as _jx
from jmodule._lowering import state as _state
from jmodule._lowering.state import RNG_NAME as _RNG_NAME
from jmodule._version import __version__
from jmodule.jit import _format, _spec
from jmodule.jit._errors import NOT_TRACED, NotTracedError
from jmodule.jit._restored import describe_tree
from jmodule.jit._trace import FlatForward, trace_symbolic

#: The platforms every saved program is compiled for.
PLATFORMS = ("cpu", "cuda")


def serialization_version() -> int | None:
    """The ``jax.export`` serialization schema version of this jax (None if unknown)."""
    return _jx.serialization_version()


def _array_part(value: Any) -> tuple[bytes, dict[str, Any]]:
    arr = np.asarray(value)
    return arr.tobytes(order="C"), {"dtype": arr.dtype.name, "shape": list(arr.shape)}


def write(
    m: Any,
    f: str | os.PathLike | BinaryIO,
    _extra_files: Mapping[str, str | bytes] | None = None,
) -> None:
    """Write ScriptModule ``m``'s compiled forward and its state to one file.

    ``ScriptModule.save`` and ``jm.jit.save`` (which documents the file)
    come here; ``m`` is the ScriptModule, which this module does not import.

    Raises:
        NotTracedError: nothing has been traced yet.
        TracingError: the forward cannot be traced (e.g. for a symbolic batch).
    """
    loaded = m.__dict__["_jm_loaded"]
    with _state.lock(m.module):
        if loaded is not None:
            meta = {k: v for k, v in loaded.meta.items() if k not in ("tree", "arrays", "extra")}
            blob = loaded.blob
            constants = loaded.constants
        else:
            meta, blob, constants = _export(m)
        module = m.module
        meta["tree"] = describe_tree(module)
        flat = FlatForward(module, m._traced_forward)
        values = dict(zip(flat.names, flat.state_values()))
    parts: dict[str, bytes] = {"program": bytes(blob)}
    arrays = []
    for i, name in enumerate(meta["state"]):
        if name == _RNG_NAME:
            continue
        data, info = _array_part(values[name])
        parts[f"state/{i}"] = data
        arrays.append({"name": name, "part": f"state/{i}", **info})
    meta["arrays"] = arrays
    constant_infos = []
    for i, (name, value) in enumerate(constants.items()):
        if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type):
            try:
                data, info = _array_part(value)
            except (TypeError, ValueError):
                constant_infos.append({"name": name, "type": type(value).__name__})
                continue
            parts[f"constant/{i}"] = data
            constant_infos.append({"name": name, "part": f"constant/{i}", **info})
        else:
            constant_infos.append({"name": name, "type": type(value).__name__})
    meta["views"] = {**meta["views"], "constants": constant_infos}
    extra = []
    for i, (name, content) in enumerate((_extra_files or {}).items()):
        data = content.encode() if isinstance(content, str) else bytes(content)
        parts[f"extra/{i}"] = data
        extra.append({"name": name, "part": f"extra/{i}"})
    meta["extra"] = extra
    _format.write(f, _format.encode(meta, parts))


def _export(m: Any) -> tuple[dict[str, Any], bytes, dict[str, Any]]:
    """Export ``m``'s forward: (metadata, serialized program, code constants)."""
    d = m.__dict__
    signature = d["_jm_signature"]
    if signature is None:
        raise NotTracedError(NOT_TRACED.format(name=m._label(), what="program to save"))
    flat = FlatForward(m.module, m._traced_forward)
    if d["_jm_dynamic_batch"]:
        exported, constraint = trace_symbolic(lambda s: flat.export(s, PLATFORMS), signature)
    else:
        exported, constraint = flat.export(signature, PLATFORMS), ""
    code, constants = m.code_with_constants
    meta = {
        "format_version": _format.FORMAT_VERSION,
        "jmodule_version": __version__,
        "jax_version": jax.__version__,
        "serialization_version": serialization_version(),
        "calling_convention_version": exported.calling_convention_version,
        "platforms": list(exported.platforms),
        "byteorder": sys.byteorder,
        "original_name": m.original_name,
        "state": list(flat.names),
        "changed": [flat.names[i] for i in flat.changed],
        "modes": {p: bool(x.training) for p, x in m.module.named_modules()},
        "arg_names": d["_jm_arg_names"],
        "inputs": _spec.encode(signature.tree, "the arguments"),
        "output": _spec.encode(_spec.out_skeleton(flat.out_tree), "the output"),
        "dynamic_batch": d["_jm_dynamic_batch"],
        "batch_constraint": constraint,
        "views": {"graph": m.graph, "inlined_graph": m.inlined_graph, "code": code},
    }
    return meta, exported.serialize(), dict(constants.items())
