"""Loaded programs: a module tree rebuilt from a file, running an exported program.

A saved file holds the module tree's *shape* (names, parameters, buffers,
modes, ``repr`` text) and its state, but no Python class. Loading rebuilds
the tree from :class:`RestoredModule` objects, so ``state_dict()``,
``load_state_dict()``, ``parameters()`` and ``to()`` work as on the original,
and the root's ``forward`` calls the deserialized ``jax.export`` program
(:class:`LoadedProgram`) with the tree's current state, writing back the
buffers the program updates.

The program comes from a file that may have been rewritten (its digests
recomputed). ``jm.jit.load`` has had it deserialized, parsed and lowered in a
child process for its saved shapes; the first call for each input signature
lowers it once more, alone, here, for the inputs given, so that a program that
cannot be lowered (``Cannot lower jaxpr with verifier errors``, a name MLIR
cannot read) raises :class:`ProgramFileError` naming the file, chained to
JAX's error, rather than that error from inside the caller's compilation.
Inputs that do not fit the saved signature keep JAX's own errors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jax

from jmodule import random as _random
from jmodule._lowering import state, structure
from jmodule._lowering.state import RNG_NAME as _RNG_NAME
from jmodule._lowering.state import slot_value as _slot_value
from jmodule.jit import _spec
from jmodule.jit._errors import JitError, ProgramFileError
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter


class RestoredModule(Module):
    """A module of a loaded program: state and structure, without the original class.

    Only the root runs (the whole forward was saved as one program); its
    ``repr`` shows the original class names and settings.
    """

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        program = self.__dict__.get("_jm_program")
        if program is None:
            raise JitError(
                f"'{self._get_name()}' is a submodule of a loaded jm.jit program; only the "
                "whole program was saved, so only the loaded root module can be called."
            )
        return program.run(self, args, kwargs)

    def _get_name(self) -> str:
        return self.__dict__.get("_jm_original_name", "RestoredModule")

    def extra_repr(self) -> str:
        return self.__dict__.get("_jm_extra_repr", "")


class _RestoredWithExtraState(RestoredModule):
    """A restored module whose original saved extra state in its ``state_dict``."""

    def get_extra_state(self) -> Any:
        return self.__dict__["_jm_extra_state"]

    def set_extra_state(self, state: Any) -> None:
        self.__dict__["_jm_extra_state"] = state


def _slot_id(slot: tuple) -> tuple[int, str]:
    return (id(slot[0]), slot[1])


def describe_tree(root: Module) -> list[dict[str, Any]]:
    """The structure of ``root``'s tree as JSON: each module once, in ``named_modules`` order."""
    desc = structure.describe(root)
    slot_names = {_slot_id(s): n for s, n in zip(desc.slots, desc.names)}
    modules = list(root.named_modules())
    index = {id(m): i for i, (_, m) in enumerate(modules)}
    entries = []
    for path, m in modules:
        d = m.__dict__
        entry: dict[str, Any] = {
            "path": path,
            "class": m._get_name(),
            "extra_repr": m.extra_repr(),
            "training": bool(d["training"]),
            "version": getattr(m, "_version", 1),
            "params": [
                [n, None if p is None else slot_names[_slot_id(state.value_slot(p))], _rg(p)]
                for n, p in d["_parameters"].items()
            ],
            "buffers": [
                [
                    n,
                    None if b is None else slot_names[_slot_id((d["_buffers"], n))],
                    n not in d["_non_persistent_buffers_set"],
                ]
                for n, b in d["_buffers"].items()
            ],
            "children": [
                [n, None if c is None else index[id(c)]] for n, c in d["_modules"].items()
            ],
        }
        if m._has_extra_state():
            extra = m.get_extra_state()
            try:
                json.dumps(extra)
            except TypeError:
                raise JitError(
                    f"Cannot save the program: the extra state of {path or 'the root module'} "
                    f"({type(extra).__name__}) is not JSON data (dicts, lists, numbers, "
                    "strings), the only extra state a program file stores."
                ) from None
            entry["extra_state"] = extra
        entries.append(entry)
    return entries


def _rg(p: Any) -> bool | None:
    return None if p is None else bool(p.requires_grad)


def _pairs(value: Any, what: str, slot: tuple[type, ...], third: tuple[type, ...] | None) -> None:
    width = 2 if third is None else 3
    if not isinstance(value, list) or not all(
        isinstance(x, list)
        and len(x) == width
        and isinstance(x[0], str)
        and isinstance(x[1], slot)
        and not isinstance(x[1], bool)
        and (third is None or isinstance(x[2], third))
        for x in value
    ):
        raise ValueError(f"malformed {what}")


def check_tree(entries: Any, state: set[str]) -> None:
    """Check a module tree description from a file before :func:`restore_tree` uses it.

    Args:
        entries: what :func:`describe_tree` wrote (untrusted).
        state: the names of the state arrays the file holds.

    Raises:
        ValueError: a malformed entry, a slot that is not in ``state``, a
            child index out of range, or a module that contains itself.
    """
    if not isinstance(entries, list) or not entries:
        raise ValueError("no module entries")
    n = len(entries)
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"module entry {i} is not an object")
        for key, kind in (("path", str), ("class", str), ("extra_repr", str), ("training", bool)):
            if not isinstance(e.get(key), kind):
                raise ValueError(f"module entry {i} has no {kind.__name__} '{key}'")
        if type(e.get("version")) is not int:
            raise ValueError(f"module entry {i} has no int 'version'")
        _pairs(e.get("params"), f"parameters of module {i}", (str, type(None)), (bool, type(None)))
        _pairs(e.get("buffers"), f"buffers of module {i}", (str, type(None)), (bool,))
        _pairs(e.get("children"), f"children of module {i}", (int, type(None)), None)
        for _, slot, *_ in (*e["params"], *e["buffers"]):
            if slot is not None and slot not in state:
                raise ValueError(f"module {i} refers to '{slot}', which the file does not hold")
        for _, child in e["children"]:
            if child is not None and not 0 < child < n:
                raise ValueError(f"module {i} has a child index {child} out of range")
    # Depth-first from the root: a child on the current path would make the tree a cycle.
    state_of = [0] * n  # 0 unvisited, 1 on the path, 2 done
    stack = [(0, iter(entries[0]["children"]))]
    state_of[0] = 1
    while stack:
        node, children = stack[-1]
        for _, child in children:
            if child is None or state_of[child] == 2:
                continue
            if state_of[child] == 1:
                raise ValueError(f"module {child} contains itself")
            state_of[child] = 1
            stack.append((child, iter(entries[child]["children"])))
            break
        else:
            state_of[node] = 2
            stack.pop()


def restore_tree(entries: Sequence[dict[str, Any]], state: dict[str, Any]) -> RestoredModule:
    """Rebuild a module tree from :func:`describe_tree` output and state arrays by name."""
    modules: list[RestoredModule] = []
    params: dict[str, Parameter] = {}
    for entry in entries:
        cls = _RestoredWithExtraState if "extra_state" in entry else RestoredModule
        m = cls()
        d = m.__dict__
        d["_jm_original_name"] = entry["class"]
        d["_jm_extra_repr"] = entry["extra_repr"]
        d["_version"] = entry["version"]
        d["training"] = entry["training"]
        if "extra_state" in entry:
            d["_jm_extra_state"] = entry["extra_state"]
        for name, slot, requires_grad in entry["params"]:
            if slot is None:
                d["_parameters"][name] = None
                continue
            if slot not in params:
                params[slot] = Parameter(state[slot], requires_grad=requires_grad)
            d["_parameters"][name] = params[slot]
        for name, slot, persistent in entry["buffers"]:
            d["_buffers"][name] = None if slot is None else state[slot]
            if not persistent:
                d["_non_persistent_buffers_set"].add(name)
        modules.append(m)
    for entry, m in zip(entries, modules):
        for name, child in entry["children"]:
            m.__dict__["_modules"][name] = None if child is None else modules[child]
    return modules[0]


class LoadedProgram:
    """A deserialized forward: ``jax.export.Exported`` plus how to feed it.

    Attributes:
        exported: the program.
        meta: the program's description from the file (state names, trees, modes).
        where: the file, for messages.
    """

    def __init__(self, exported: Any, meta: dict[str, Any], where: str = "the loaded program"):
        self.exported = exported
        self.meta = meta
        self.where = where
        self.names: list[str] = meta["state"]
        self.changed: list[str] = meta["changed"]
        self.modes: dict[str, bool] = meta["modes"]
        # Input signatures (shapes and dtypes of state and inputs) the program lowered for.
        self._lowered: set[tuple] = set()

    def _slots(self, root: Module) -> list[tuple[dict, str]]:
        desc = structure.describe(root)
        by_name = dict(zip(desc.names, desc.slots))
        _random.default_generator.materialize()
        by_name[_RNG_NAME] = (_random.default_generator.__dict__, "_key")
        missing = [n for n in self.names if n not in by_name]
        if missing:
            raise JitError(
                f"The loaded program reads {missing}, which the module no longer has. A loaded "
                "program's parameters and buffers can change value but not name."
            )
        return [by_name[n] for n in self.names]

    def _check_modes(self, root: Module) -> None:
        for path, m in root.named_modules():
            saved = self.modes.get(path)
            if saved is not None and m.training != saved:
                now, then = ("training", "eval") if m.training else ("eval", "training")
                where = f"'{path}'" if path else "the root module"
                raise JitError(
                    f"This program was saved with {where} in {then} mode and {where} is now in "
                    f"{now} mode. A loaded program cannot change mode (it holds no Python code "
                    f"to retrace); call .{'train()' if saved else 'eval()'} to run it, or save "
                    f"the original model again in {now} mode."
                )

    def _check_state(self, values: Sequence[Any]) -> None:
        for name, value, aval in zip(self.names, values, self.exported.in_avals):
            if value.dtype != aval.dtype or tuple(value.shape) != tuple(aval.shape):
                raise JitError(
                    f"'{name}' is {value.dtype}{list(value.shape)} but the loaded program was "
                    f"compiled for {aval.dtype}{list(aval.shape)}. A loaded program cannot "
                    "change the dtype or shape of its state (to(dtype), half(), ...); cast it "
                    "back, or save the original model again after the change."
                )

    def _check_batch(self, leaves: Sequence[Any]) -> None:
        constraint = self.meta.get("batch_constraint")
        if not constraint:
            return
        minimum = int(constraint.rpartition(">=")[2])
        for leaf in leaves:
            if leaf.ndim and leaf.shape[0] < minimum:
                raise JitError(
                    f"This program was saved with a symbolic batch constrained to "
                    f"{constraint} (its forward needs at least {minimum} samples, e.g. "
                    f"training-mode batch norm), and got a batch of {leaf.shape[0]}."
                )

    def run(self, root: Module, args: tuple, kwargs: dict) -> Any:
        """Call the program with ``root``'s state; write back what it updated."""
        platform = jax.default_backend()
        if platform not in self.exported.platforms:
            raise JitError(
                f"This program was compiled for {list(self.exported.platforms)}; JAX is "
                f"running on {platform}."
            )
        self._check_modes(root)
        slots = self._slots(root)
        for c, k in slots:  # a scanned block's parameter held as a block of a stack
            _slot_value(c, k)
        state = [c[k] for c, k in slots]
        self._check_state(state)
        leaves: list[Any] = []
        args_spec, kwargs_spec = self.meta["inputs"]["tuple"]
        _spec.match(args_spec, tuple(args), "the positional arguments", leaves)
        _spec.match(kwargs_spec, dict(kwargs), "the keyword arguments", leaves)
        self._check_batch(leaves)
        out_leaves, new = self._call(state, leaves)
        by_name = dict(zip(self.names, slots))
        for name, value in zip(self.changed, new):
            c, k = by_name[name]
            c[k] = value
        return _spec.build(self.meta["output"], iter(out_leaves))

    def _fits(self, values: Sequence[Any]) -> bool:
        """Whether ``values`` have the saved dtypes, ranks and fixed dimensions."""
        if len(values) != len(self.exported.in_avals):
            return False
        for value, aval in zip(values, self.exported.in_avals):
            if value.dtype != aval.dtype or len(value.shape) != len(aval.shape):
                return False
            if any(type(d) is int and d != v for d, v in zip(aval.shape, value.shape)):
                return False
        return True

    def _call(self, state: list[Any], leaves: list[Any]) -> Any:
        """``exported.call(state, leaves)``, lowered alone first for each new input signature.

        Raises:
            ProgramFileError: the program cannot be traced or lowered for inputs
                that fit its saved signature.
        """
        values = [*state, *leaves]
        key = tuple((tuple(v.shape), str(v.dtype)) for v in values)
        if key not in self._lowered:
            specs = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in values]
            call = jax.jit(self.exported.call)
            try:
                call.trace(specs[: len(state)], specs[len(state) :]).lower()
            except Exception as e:
                if not self._fits(values):
                    raise  # wrong inputs: JAX's message says which
                raise ProgramFileError(
                    f"{self.where}: its program cannot be compiled, for inputs of the shapes it "
                    f"was saved for ({type(e).__name__}: {str(e)[:300]}). It was rewritten or "
                    "damaged; save the program again with jm.jit.save."
                ) from e
            self._lowered.add(key)
        return self.exported.call(state, leaves)
