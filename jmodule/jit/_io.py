"""``jm.jit.save`` and ``jm.jit.load``: a compiled forward and its state in one file.

The program is the forward as ``jax.export`` serializes it (StableHLO, for
CPU and CUDA, with a symbolic batch dimension when asked), taking the state
as inputs; the state is stored beside it as raw arrays (written by
``_save``, which ``ScriptModule.save`` calls too). Loading verifies
every checksum and both versions before anything is deserialized, has the
program verified in a child process, one per process and reused
(``_validate.verify_program``), then
rebuilds the module tree (``_restored``) so the result is a ScriptModule
whose ``state_dict()`` has the original's keys.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import jax
import numpy as np

from jmodule._lowering import structure
from jmodule.jit import _format, _validate
from jmodule.jit._code import ConstMap
from jmodule.jit._errors import IncompatibleVersionError, JitError, ProgramFileError
from jmodule.jit._restored import LoadedProgram, restore_tree
from jmodule.jit._save import serialization_version, write
from jmodule.jit._script import ScriptModule


@dataclass
class Loaded:
    """What a loaded ScriptModule keeps from its file."""

    program: LoadedProgram
    blob: bytes
    meta: dict[str, Any]
    constants: dict[str, Any]

    def view(self, what: str) -> Any:
        """A saved view (``graph``, ``inlined_graph``, ``code``, ``code_with_constants``)."""
        views = self.meta["views"]
        if what == "code_with_constants":
            unsaved = [c["name"] for c in views["constants"] if "part" not in c]
            if unsaved:
                raise JitError(
                    f"The constants {unsaved} of this program's code could not be stored in "
                    "the file (they are not arrays); .code is available without them."
                )
            return views["code"], ConstMap(self.constants)
        return views[what]


def _array(data: memoryview, info: Mapping[str, Any], where: str) -> np.ndarray:
    dtype = np.dtype(jax.numpy.dtype(info["dtype"]))
    shape = tuple(int(d) for d in info["shape"])
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise ProgramFileError(f"{where} is corrupted: an array part has the wrong size.")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def save(
    m: ScriptModule,
    f: str | os.PathLike | BinaryIO,
    _extra_files: Mapping[str, str | bytes] | None = None,
) -> None:
    """Write ``m``'s compiled forward and its state to one file.

    The file holds the program serialized with ``jax.export`` (StableHLO for
    CPU and CUDA; with ``dynamic_batch=True`` dimension 0 of every array
    input is symbolic), the parameters and buffers, the module tree's
    structure and ``state_dict`` keys, the input and output tree structures,
    the views, and ``_extra_files`` (name -> str or bytes). Every part is
    checksummed. The program is the forward in the module's current mode,
    for the inputs of its latest compilation (or its example inputs);
    non-array arguments are compile-time constants of the saved program.

    Args:
        m: a ScriptModule (from ``jm.jit.script``/``trace``/``load``).
        f: a path (written atomically) or a binary file object.
        _extra_files: extra named files to store, as ``torch.jit.save``.

    Raises:
        TypeError: ``m`` is not a ScriptModule.
        NotTracedError: nothing has been traced yet.
        TracingError: the forward cannot be traced (e.g. for a symbolic batch).

    >>> import io, jax.numpy as jnp
    >>> import jmodule as jm
    >>> import jmodule.jit
    >>> sm = jm.jit.trace(jm.nn.Linear(4, 2), jnp.ones((3, 4)))
    >>> buf = io.BytesIO(); sm.save(buf); _ = buf.seek(0)
    >>> jm.jit.load(buf)(jnp.ones((3, 4))).shape
    (3, 2)
    """
    if not isinstance(m, ScriptModule):
        raise TypeError(
            f"jm.jit.save takes a ScriptModule, got {type(m).__name__}; make one with "
            "jm.jit.trace(model, example_inputs) or jm.jit.script(model)."
        )
    write(m, f, _extra_files)


def _check_versions(meta: Mapping[str, Any], where: str) -> None:
    if meta.get("byteorder", sys.byteorder) not in ("little", "big"):
        raise ProgramFileError(f"{where} has a malformed byte order {meta['byteorder']!r}.")
    if meta.get("byteorder", sys.byteorder) != sys.byteorder:
        raise IncompatibleVersionError(
            f"{where} was written on a {meta['byteorder']}-endian machine; this one is "
            f"{sys.byteorder}-endian."
        )
    saved_jax = meta.get("jax_version", "?")
    version = meta.get("calling_convention_version")
    lo = jax.export.minimum_supported_calling_convention_version
    hi = jax.export.maximum_supported_calling_convention_version
    if not isinstance(version, int) or not lo <= version <= hi:
        raise IncompatibleVersionError(
            f"{where} holds a program in jax.export calling convention {version} (written "
            f"with jax {saved_jax}); this jax ({jax.__version__}) runs versions {lo} to {hi}. "
            f"Load it with a jax that supports that version, or save the model again with "
            f"this one."
        )
    saved = meta.get("serialization_version")
    current = serialization_version()
    if saved is not None and type(saved) is not int:
        raise ProgramFileError(f"{where} has a malformed serialization version {saved!r}.")
    if saved is not None and current is not None and saved > current:
        raise IncompatibleVersionError(
            f"{where} was serialized by jax {saved_jax} in jax.export serialization version "
            f"{saved}; this jax ({jax.__version__}) reads versions up to {current}. Upgrade "
            "jax to load it, or save the model again with this jax."
        )


def load(
    f: str | os.PathLike | BinaryIO,
    map_location: Any = None,
    _extra_files: dict[str, Any] | None = None,
    *,
    verify_timeout: float | None = None,
) -> ScriptModule:
    """Load a program saved by :func:`save` as a ScriptModule; no Python class is needed.

    The result runs the saved program (deserialized and compiled, not
    retraced), and its ``state_dict()``, ``load_state_dict()``,
    ``parameters()``, ``to()`` (device moves) and views work. A program saved
    in training mode keeps updating its buffers (e.g. BatchNorm statistics).
    It cannot change mode or dtype: it has no Python code to retrace.

    A file's digests only catch damage, so before this process reads the
    program, a child process (``sys.executable``, importing only JAX, on the
    CPU) deserializes it, parses its StableHLO and lowers it, within
    ``verify_timeout`` seconds: a program rewritten to hang or crash JAX's
    reader makes the load raise :class:`ProgramFileError` instead. The child
    is started by the first load in a process (about a second: it imports
    JAX) and kept for the next ones, which take it about 10 ms per program
    not verified before (loads in other threads take turns); the verdict is
    kept in this process by the program's sha256, so loading a program again
    costs nothing more. A child that times out or dies is replaced at the
    next load. The first call of the loaded program for each input
    signature lowers it again, here, and an error of the program there is a
    ``ProgramFileError`` too (wrong inputs keep their own errors).

    Args:
        f: a path or a binary file object.
        map_location: where to put the state: anything ``Module.to`` accepts
            as a device (``"cpu"``, ``"cuda:0"``, a ``jax.Device`` or sharding).
        _extra_files: a dict whose keys name extra files to read; their
            contents (bytes) are filled in, as ``torch.jit.load`` does (names
            the file lacks are left as they are).
        verify_timeout: seconds the verification of the program may take,
            the child's start included when this is the process's first
            (default: the environment variable ``JMODULE_JIT_VERIFY_TIMEOUT``,
            else 60). Only a program not verified before in this process
            is verified.

    Raises:
        ProgramFileError: the file is truncated, corrupted, not a program
            file, not a regular file (a FIFO, a device), names a part that is
            not a plain name, its header does not describe its program, or its
            program cannot be deserialized, parsed and lowered (checked here,
            so a rewritten file fails here rather than at its first call), or
            could not be verified within ``verify_timeout`` seconds.
        IncompatibleVersionError: written by a newer jmodule, or a jax whose
            program versions this jax cannot read.
        ValueError: ``verify_timeout`` (or ``JMODULE_JIT_VERIFY_TIMEOUT``) is
            not a positive number of seconds.

    >>> import io, jax.numpy as jnp
    >>> import jmodule as jm
    >>> import jmodule.jit
    >>> buf = io.BytesIO()
    >>> jm.jit.trace(jm.nn.BatchNorm1d(3), jnp.ones((4, 3))).save(buf)
    >>> _ = buf.seek(0)
    >>> bn = jm.jit.load(buf)
    >>> _ = bn(jnp.ones((4, 3)))
    >>> list(bn.state_dict()), int(bn.state_dict()["num_batches_tracked"])
    (['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked'], 1)
    """
    limit = _validate.verify_timeout(verify_timeout)  # a bad setting fails before any reading
    data, where = _format.read_bytes(f)
    meta, parts = _format.decode(data, where)
    _check_versions(meta, where)
    _validate.check_meta(meta, parts, where)
    try:
        state = {a["name"]: _array(parts[a["part"]], a, where) for a in meta["arrays"]}
        constants = {
            c["name"]: _array(parts[c["part"]], c, where)
            for c in meta["views"]["constants"]
            if "part" in c
        }
        extra = {e["name"]: bytes(parts[e["part"]]) for e in meta["extra"]}
        blob = bytes(parts["program"])
    except (KeyError, TypeError, ValueError) as e:
        raise ProgramFileError(f"{where} has an inconsistent table of contents ({e}).") from None
    # Deserialized, parsed and lowered in a child process first: only then in this one.
    _validate.verify_program(blob, meta, where, limit)
    try:
        exported = jax.export.deserialize(bytearray(blob))
    except Exception as e:  # the child deserialized it: not expected
        raise ProgramFileError(f"{where}: its program cannot be deserialized ({e}).") from e
    _validate.check_program(meta, exported, where)
    # device_put is a plain transfer (jnp.asarray would compile a conversion per shape).
    arrays = {name: jax.device_put(np.array(value)) for name, value in state.items()}
    try:
        root = restore_tree(meta["tree"], arrays)
        slots = set(structure.describe(root).names)
        unknown = [n for n in meta["state"][:-1] if n not in slots]
        if unknown:
            raise ValueError(f"the program reads {unknown[:4]}, which the tree does not hold")
        program = LoadedProgram(exported, meta, where)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ProgramFileError(f"{where} describes an inconsistent module tree ({e}).") from None
    root.__dict__["_jm_program"] = program
    sm = ScriptModule(root)
    sm.__dict__["_jm_loaded"] = Loaded(program, blob, meta, constants)
    sm.__dict__["_jm_arg_names"] = meta.get("arg_names")
    sm.__dict__["_compiled"].program.arg_names = meta.get("arg_names")
    if map_location is not None:
        sm.to(map_location)
    if _extra_files is not None:
        for name in _extra_files:
            if name in extra:
                _extra_files[name] = extra[name]
    return sm
