"""``ScriptModule``: a module that runs compiled and shows, saves and loads its program.

A ScriptModule *shares* its state with the module it wraps: its parameter,
buffer, submodule and hook dictionaries are the original's own dictionaries,
so ``parameters()``, ``state_dict()``, ``to()``, ``train()`` and hooks act on
one set of state, under the original's ``state_dict`` keys. Calls go through
the same fast path as ``model.compile()`` (a ``CompiledForward`` of the
original), so a ScriptModule call costs what a compiled module's call costs.

The views (``graph``, ``inlined_graph``, ``code``, ``code_with_constants``)
trace the forward for the inputs of the latest compilation (or the example
inputs) with the current state and structure.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import jax

from jmodule._lowering import state
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.compiled import CompiledForward, _forward_arg_names, _is_param
from jmodule.jit import _code, _errors, _graph, _save
from jmodule.jit._debug import DebugOptions, WithDumps, WithFallback
from jmodule.jit._errors import NotTracedError, TracingError
from jmodule.jit._trace import FlatForward, Signature, Traced, trace_symbolic
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Buffer

logger = logging.getLogger("jmodule.jit")

_JIT_OPTIONS = frozenset({"compiler_options", "keep_unused", "inline"})

_FALLBACK_WARNING = (
    "jm.jit could not compile the forward of {name}; it runs eagerly (uncompiled) from now "
    "on, as fallback='eager' asked.\n{error}"
)


@dataclass
class _Views:
    """The traces behind the views, valid for one version of the module and one signature."""

    version: int
    signature: Signature
    traced: Traced  # symbolic in the batch with dynamic_batch
    constraint: str = ""
    concrete: Traced | None = None
    texts: dict | None = None


class ScriptModule(Module):
    """A module that runs compiled and has a program to inspect and save.

    ``jm.jit.script`` and ``jm.jit.trace`` return one; it can also be made
    directly, as ``ORTModule(module, debug_options)`` is. It shares its
    parameters, buffers, submodules, hooks and mode with ``module``:
    ``state_dict()`` keys are the original's, ``to()``/``train()``/``eval()``
    and hooks act on the shared state, and structural changes recompile on
    the next call. Calls cost what ``model.compile()`` calls cost.

    Args:
        module: the module to compile (left usable and uncompiled itself).
        debug_options: logging and dumping of compilations, see :class:`DebugOptions`.
        dynamic_batch: make dimension 0 of every array input symbolic in the
            views and the saved program (XLA still compiles one executable
            per concrete batch size at run time).
        fallback: ``"eager"`` to run the module uncompiled, with one warning,
            if its forward cannot be traced; None (default) to raise
            :class:`TracingError`.
        **jit_options: ``jax.jit`` options ``compiler_options``,
            ``keep_unused``, ``inline``.

    Raises:
        TypeError: ``module`` is not a Module, or an unknown option.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> import jmodule.jit
    >>> net = jm.nn.Linear(3, 2)
    >>> sm = jm.jit.ScriptModule(net)
    >>> sm(jnp.ones((4, 3))).shape
    (4, 2)
    >>> sm.module is net, list(sm.state_dict())
    (True, ['weight', 'bias'])
    """

    #: Its forward calls modules that may be user code: a jm.Tensor passes on to them.
    _jm_passes_tensors = True

    def __init__(
        self,
        module: Module,
        debug_options: DebugOptions | None = None,
        *,
        dynamic_batch: bool = False,
        fallback: str | None = None,
        **jit_options: Any,
    ) -> None:
        if isinstance(module, ScriptModule):
            module = module.module
        if not isinstance(module, Module):
            raise TypeError(f"ScriptModule wraps a jm.nn.Module, got {type(module).__name__}")
        if fallback not in (None, "eager"):
            raise TypeError(f"fallback must be None or 'eager', got {fallback!r}")
        if debug_options is not None and not isinstance(debug_options, DebugOptions):
            raise TypeError("debug_options must be a jm.jit.DebugOptions")
        unknown = set(jit_options) - _JIT_OPTIONS
        if unknown:
            raise TypeError(
                f"ScriptModule got unsupported option(s) {sorted(unknown)}; jax.jit options "
                f"accepted: {sorted(_JIT_OPTIONS)}"
            )
        super().__init__()
        d = self.__dict__
        # Share every container of state, structure and hooks with the original.
        for name, value in list(d.items()):
            if isinstance(value, (dict, set)) and name in module.__dict__:
                d[name] = module.__dict__[name]
        d["training"] = module.training
        d["_jm_module"] = module
        # Hooks, mode and attributes set on the wrapper are changes of the module it runs.
        state.link(self, module)
        d["_jm_debug"] = debug_options
        d["_jm_dynamic_batch"] = bool(dynamic_batch)
        d["_jm_fallback"] = fallback
        d["_jm_jit_options"] = dict(jit_options)
        d["_jm_signature"] = None
        d["_jm_views"] = None
        d["_jm_pending"] = []
        d["_jm_loaded"] = None
        d["_jm_arg_names"] = _forward_arg_names(module)
        fast = CompiledForward(module, dict(jit_options), {})
        fast.program.fn = self._traced_forward
        fast.program.on_trace.append(self._on_trace)
        call: Any = fast
        if fallback == "eager":
            call = WithFallback(call, self._fall_back, module)
        if debug_options is not None and debug_options.save_dir is not None:
            call = WithDumps(call, self._dump_pending)
        d["_compiled"] = call

    # ------------------------------------------------------------------ sharing

    @property
    def module(self) -> Module:
        """The wrapped module (the original; for a loaded program, the rebuilt tree)."""
        return self.__dict__["_jm_module"]

    @property
    def original_name(self) -> str:
        """The class name of the wrapped module."""
        return self.module._get_name()

    @property
    def training(self) -> bool:  # type: ignore[override]
        """The wrapped module's mode."""
        return self.module.training

    @training.setter
    def training(self, mode: bool) -> None:
        self.module.training = mode
        self.__dict__["training"] = mode

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_jm_module")
            if module is None or name.startswith("__"):
                raise
            return getattr(module, name)

    # ------------------------------------------------------------------ fixed structure
    # As TorchScript's ScriptModule (RuntimeError, in its words), the wrapper's own
    # structure is fixed: no new submodules, parameters or buffers, no deletions.
    # Replacing the value of an existing parameter or buffer is allowed, as there.
    # The wrapped ``.module`` is an ordinary Module: change it (the next call recompiles).

    def _refuse_module(self, name: Any, module: Any) -> RuntimeError:
        return RuntimeError(
            "Cannot re-assign modules in a ScriptModule with non-scripted module, tried to "
            f"replace existing module '{name}': {module!r}. A jm.jit.ScriptModule's own "
            "structure is fixed (as TorchScript's): change the wrapped module instead, e.g. "
            f"script_module.module.add_module({name!r}, ...); the next call recompiles."
        )

    def _refuse_new(self, name: Any) -> RuntimeError:
        return RuntimeError(
            f"Can't add a new parameter after ScriptModule construction. Tried to add '{name}'. "
            "A jm.jit.ScriptModule's own structure is fixed (as TorchScript's): register it on "
            "the wrapped module instead (script_module.module.register_parameter / "
            "register_buffer / attribute assignment); the next call recompiles."
        )

    def _has_state(self, name: Any) -> bool:
        m = self.module.__dict__
        return name in m["_parameters"] or name in m["_buffers"]

    def add_module(self, name: str, module: Module | None) -> None:
        """Refused: raises ``RuntimeError`` (change the wrapped ``.module`` instead)."""
        raise self._refuse_module(name, module)

    def register_module(self, name: str, module: Module | None) -> None:
        """Refused: raises ``RuntimeError`` (change the wrapped ``.module`` instead)."""
        raise self._refuse_module(name, module)

    def set_submodule(self, target: str, module: Module, strict: bool = False) -> None:
        """Refused: raises ``RuntimeError`` (change the wrapped ``.module`` instead)."""
        raise self._refuse_module(target, module)

    def register_parameter(self, name: str, param: Any) -> None:
        """Replace an existing parameter of the wrapped module; a new name raises
        ``RuntimeError`` (register it on the wrapped ``.module`` instead)."""
        if not self._has_state(name):
            raise self._refuse_new(name)
        self.module.register_parameter(name, param)

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        """Replace an existing buffer of the wrapped module; a new name raises
        ``RuntimeError`` (register it on the wrapped ``.module`` instead)."""
        if not self._has_state(name):
            raise self._refuse_new(name)
        self.module.register_buffer(name, tensor, persistent)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "training":
            ScriptModule.training.fset(self, value)  # type: ignore[attr-defined]
        elif name in self.__dict__ and not _is_state(value):
            self.__dict__[name] = value
        elif isinstance(value, Module) or name in self.module.__dict__["_modules"]:
            raise self._refuse_module(name, value)
        elif (_is_param(value) or isinstance(value, Buffer)) and not self._has_state(name):
            raise self._refuse_new(name)
        elif value is None and self._has_state(name):
            raise RuntimeError(
                f"cannot delete methods or parameters of a script module ('{name}' = None): set "
                "it on the wrapped module instead (script_module.module.<name> = None); the next "
                "call recompiles."
            )
        else:
            setattr(self.module, name, value)

    def __delattr__(self, name: str) -> None:
        m = self.module.__dict__
        if name in m["_modules"] or self._has_state(name):
            raise RuntimeError(
                f"cannot delete methods or parameters of a script module ('{name}'): delete it "
                "from the wrapped module instead (del script_module.module.<name>); the next "
                "call recompiles."
            )
        delattr(self.module, name)

    def train(self, mode: bool = True) -> ScriptModule:
        """Set the mode of the wrapped module (and so of this one)."""
        self.module.train(mode)
        self.__dict__["training"] = mode
        return self

    def _apply(self, fn: Callable[[Any], Any], recurse: bool = True) -> ScriptModule:
        self.module._apply(fn, recurse)
        return self

    def apply(self, fn: Callable[[Module], None]) -> ScriptModule:
        """Call ``fn`` on every module of the wrapped tree (the original root last)."""
        self.module.apply(fn)
        return self

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's ``state_dict`` (same keys, no prefix)."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the wrapped module; returns its ``IncompatibleKeys``."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward, uncompiled (calling the ScriptModule compiles)."""
        return self.module.forward(*args, **kwargs)

    def compile(self, *args: Any, **options: Any) -> None:
        """Does nothing: a ScriptModule is compiled already."""

    def _get_name(self) -> str:
        return "ScriptModule"

    def extra_repr(self) -> str:
        inner = self.module.extra_repr()
        return f"original_name={self.original_name}" + (f", {inner}" if inner else "")

    def __deepcopy__(self, memo: dict) -> ScriptModule:
        d = self.__dict__
        loaded = d["_jm_loaded"]
        if loaded is not None:  # the program is immutable: share it
            memo[id(loaded.program)] = loaded.program
        out = ScriptModule(
            copy.deepcopy(self.module, memo),
            d["_jm_debug"],
            dynamic_batch=d["_jm_dynamic_batch"],
            fallback=d["_jm_fallback"],
            **d["_jm_jit_options"],
        )
        for name in ("_jm_signature", "_jm_loaded", "_jm_arg_names"):
            out.__dict__[name] = d[name]
        out.__dict__["_compiled"].program.arg_names = d["_compiled"].program.arg_names
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, protocol: int) -> Any:
        raise pickle.PickleError(
            "A ScriptModule cannot be pickled. Save its program with script_module.save(f) "
            "(or jm.jit.save) and load it with jm.jit.load; copy it with copy.deepcopy."
        )

    # ------------------------------------------------------------------ tracing

    def _traced_forward(self, objects: Sequence[Any], args: tuple, kwargs: dict) -> Any:
        """The forward, as compiled programs run it: hooks included, errors explained."""
        module = objects[0]
        try:
            out = module._call_impl(*args, **kwargs)
        except _errors.untraceable_types() as e:
            raise _errors.untraceable(e, tuple(module.named_modules())) from _tracebacks.cause(e)
        _check_output(out, module)
        return out

    def _on_trace(self, key: Any, vals: Any, args: Any, kwargs: Any, reason: str) -> None:
        d = self.__dict__
        signature = Signature.of(args, kwargs)
        d["_jm_signature"] = signature
        options = d["_jm_debug"]
        if options is None:
            return
        program = d["_compiled"].program
        logger.log(
            options.level,
            "%s: compiling (trace %d) for %s: %s",
            self.original_name,
            program.num_traces,
            signature.describe(d["_jm_arg_names"]),
            reason,
        )
        if options.save_dir is not None:
            d["_jm_pending"].append((program.num_traces, reason, signature))

    def _dump_pending(self) -> None:
        d = self.__dict__
        if not d["_jm_pending"]:
            return
        options = d["_jm_debug"]
        os.makedirs(options.save_dir, exist_ok=True)
        prefix = options.prefix or self.original_name
        with state.lock(self.module):
            pending, d["_jm_pending"] = d["_jm_pending"], []
            for number, reason, signature in pending:
                traced = FlatForward(self.module, self._traced_forward).trace(signature)
                base = os.path.join(os.fspath(options.save_dir), f"{prefix}_{number:03d}")
                header = [*self._header(traced, "jaxpr"), f"compilation {number}: {reason}"]
                with open(base + ".jaxpr.txt", "w") as f:
                    f.write(self._render_graph(traced, header, inlined=False))
                with open(base + ".stablehlo.mlir", "w") as f:
                    f.write(f"// {self.original_name} compilation {number}: {reason}\n")
                    f.write(traced.lowered.lower().as_text())
                logger.debug("%s: wrote %s.jaxpr.txt and .stablehlo.mlir", self.original_name, base)

    def _fall_back(self, error: TracingError) -> None:
        warnings.warn(
            _FALLBACK_WARNING.format(name=self.original_name, error=error),
            UserWarning,
            stacklevel=4,
        )
        compiled = self.__dict__["_compiled"]
        while not isinstance(compiled, WithFallback):
            compiled = compiled.inner
        compiled.eager = True

    def _example(self, example_inputs: Any, example_kwarg_inputs: dict | None) -> None:
        """Record example inputs and check the forward traces for them."""
        if example_inputs is None:
            args: tuple = ()
        elif isinstance(example_inputs, tuple):
            args = example_inputs
        else:
            args = (example_inputs,)
        signature = Signature.of(args, dict(example_kwarg_inputs or {}))
        self.__dict__["_jm_signature"] = signature
        try:
            self._views()
        except TracingError as e:
            if self.__dict__["_jm_fallback"] != "eager":
                raise
            self._fall_back(e)

    def _views(self, what: str = "program") -> _Views:
        d = self.__dict__
        loaded = d["_jm_loaded"]
        if loaded is not None:
            raise AssertionError("loaded programs keep their views as text")
        with state.lock(self.module):
            signature = d["_jm_signature"]
            if signature is None:
                raise NotTracedError(_errors.NOT_TRACED.format(name=self._label(), what=what))
            views = d["_jm_views"]
            if (
                views is not None
                and views.version == state.version(self.module)
                and views.signature is signature
            ):
                return views
            flat = FlatForward(self.module, self._traced_forward)
            if d["_jm_dynamic_batch"]:
                traced, constraint = trace_symbolic(flat.trace, signature)
            else:
                traced, constraint = flat.trace(signature), ""
            views = _Views(state.version(self.module), signature, traced, constraint)
            d["_jm_views"] = views
            return views

    def _concrete(self, views: _Views) -> Traced:
        if views.concrete is None:
            if not self.__dict__["_jm_dynamic_batch"]:
                views.concrete = views.traced
            else:
                with state.lock(self.module):
                    flat = FlatForward(self.module, self._traced_forward)
                    views.concrete = flat.trace(views.signature)
        return views.concrete

    def _label(self) -> str:
        return f"jm.jit.ScriptModule of {self.original_name}"

    # ------------------------------------------------------------------ views

    def _header(self, traced: Traced, kind: str, constraint: str = "") -> list[str]:
        mode = "training" if self.module.training else "eval"
        lines = [
            f"{kind} of the forward of {self.original_name} ({mode} mode), traced for "
            f"{traced.signature.describe(self.__dict__['_jm_arg_names'])}",
        ]
        if any(_is_symbolic(s) for s in jax.tree_util.tree_leaves(traced.signature.tree)):
            lines.append(
                "dimension 0 of every array argument is the symbolic 'batch'"
                + (f" ({constraint})" if constraint else "")
            )
        return lines

    def _render_graph(self, traced: Traced, header: list[str], inlined: bool) -> str:
        names = _graph.input_names(traced, self.__dict__["_jm_arg_names"])
        closed = _graph.inline(traced.jaxpr) if inlined else traced.jaxpr
        header = [
            *header,
            "inputs: parameters and buffers by state_dict key, rng_key (the default "
            "generator's key), then the arguments",
            "outputs: forward's result (out...), then the new value of each buffer the "
            "forward wrote (<key>.new)",
        ]
        return _graph.render(closed, names, _graph.output_names(traced), header)

    def _text(self, what: str) -> Any:
        loaded = self.__dict__["_jm_loaded"]
        if loaded is not None:
            return loaded.view(what)
        views = self._views(what)
        if views.texts is None:
            views.texts = {}
        if what not in views.texts:
            if what in ("graph", "inlined_graph"):
                header = self._header(views.traced, "graph", views.constraint)
                views.texts[what] = self._render_graph(views.traced, header, what != "graph")
            else:
                concrete = self._concrete(views)
                header = [
                    *self._header(concrete, "code"),
                    "run: ns = {'CONSTANTS': constants}; exec(code, ns); "
                    "out = ns['forward'](module, *args)",
                ]
                with state.lock(self.module):
                    names = _graph.input_names(concrete, self.__dict__["_jm_arg_names"])
                    code, consts = _code.render(
                        concrete, names, self.__dict__["_jm_arg_names"], header
                    )
                views.texts["code"] = code
                views.texts["code_with_constants"] = (code, consts)
        return views.texts[what]

    @property
    def graph(self) -> str:
        """The forward's jaxpr as text, inputs named by ``state_dict`` key and argument name.

        Raises:
            NotTracedError: nothing has been traced yet.
        """
        return self._text("graph")

    @property
    def inlined_graph(self) -> str:
        """:attr:`graph` with nested calls (``jit``, custom_jvp/vjp, ...) inlined."""
        return self._text("inlined_graph")

    @property
    def code(self) -> str:
        """The forward's program as Python (one statement per primitive).

        ``forward(self, *args)`` in the code reads the module's parameters and
        buffers by ``state_dict`` key, writes back the buffers the forward
        updates, and returns the forward's output. Constants too large to
        inline are ``CONSTANTS.c<N>`` (see :attr:`code_with_constants`).
        """
        return self._text("code")

    @property
    def code_with_constants(self) -> tuple[str, _code.ConstMap]:
        """``(code, ConstMap)``: :attr:`code` and the constants it refers to."""
        return self._text("code_with_constants")

    # ------------------------------------------------------------------ saving

    def save(
        self, f: str | os.PathLike | BinaryIO, _extra_files: dict[str, Any] | None = None
    ) -> None:
        """Write the compiled program and its state to one file (see :func:`jm.jit.save`)."""
        _save.write(self, f, _extra_files)


def _is_state(value: Any) -> bool:
    return isinstance(value, Module) or _is_param(value)


def _is_symbolic(x: Any) -> bool:
    shape = getattr(x, "shape", ())
    return any(not isinstance(d, int) for d in shape)


def _check_output(out: Any, module: Module) -> None:
    leaves = jax.tree_util.tree_flatten_with_path(out, is_leaf=_is_param)[0]
    for path, leaf in leaves:
        if _is_param(leaf) or isinstance(leaf, (jax.Array, int, float, complex, bool)):
            continue
        if hasattr(leaf, "__array__") and hasattr(leaf, "dtype"):
            continue
        what = f"a {type(leaf).__name__} ({leaf!r:.40})"
        named = tuple(module.named_modules())
        raise _errors.bad_output(what, jax.tree_util.keystr(path), named)


def script(
    model: Module,
    example_inputs: Any = None,
    *,
    example_kwarg_inputs: dict | None = None,
    debug_options: DebugOptions | None = None,
    dynamic_batch: bool = False,
    fallback: str | None = None,
    **jit_options: Any,
) -> ScriptModule:
    """Compile ``model`` into a :class:`ScriptModule` sharing its state.

    Its views (``graph``, ``code``, ...) and ``save`` are available after the
    first call, or at once when example inputs are given (the forward is then
    traced, without running, to check it compiles).

    Args:
        model: the module.
        example_inputs: positional inputs: a tuple, or a single array.
        example_kwarg_inputs: keyword inputs.
        debug_options: see :class:`DebugOptions`.
        dynamic_batch: dimension 0 of every array input symbolic in the views
            and the saved program.
        fallback: ``"eager"`` to run uncompiled (one warning) if tracing fails.
        **jit_options: ``compiler_options``, ``keep_unused``, ``inline``.

    Raises:
        TracingError: the forward cannot be traced for the example inputs
            (the message names the module, the line and the fix).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> import jmodule.jit
    >>> sm = jm.jit.script(jm.nn.ReLU())
    >>> sm(jnp.array([-1.0, 2.0]))
    Array([0., 2.], dtype=float32)
    >>> "max" in sm.graph
    True
    """
    sm = ScriptModule(
        model, debug_options, dynamic_batch=dynamic_batch, fallback=fallback, **jit_options
    )
    if example_inputs is not None or example_kwarg_inputs is not None:
        sm._example(example_inputs, example_kwarg_inputs)
    return sm


def trace(
    model: Module,
    example_inputs: Any,
    *,
    example_kwarg_inputs: dict | None = None,
    debug_options: DebugOptions | None = None,
    dynamic_batch: bool = False,
    fallback: str | None = None,
    **jit_options: Any,
) -> ScriptModule:
    """Trace ``model`` for ``example_inputs`` into a :class:`ScriptModule`, as ``torch.jit.trace``.

    The views are available at once. Tracing does not run the forward, so it
    changes no state (no BatchNorm statistics update, no random draws).

    Args:
        model: the module.
        example_inputs: a tuple of positional arguments, or a single array.
        example_kwarg_inputs: keyword arguments, if any.
        debug_options: see :class:`DebugOptions`.
        dynamic_batch: dimension 0 of every array input symbolic in the views
            and the saved program.
        fallback: ``"eager"`` to run uncompiled (one warning) if tracing fails.
        **jit_options: ``compiler_options``, ``keep_unused``, ``inline``.

    Raises:
        TracingError: the forward cannot be traced.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> import jmodule.jit
    >>> sm = jm.jit.trace(jm.nn.Linear(4, 2), jnp.ones((3, 4)))
    >>> "weight" in sm.graph
    True
    """
    return script(
        model,
        example_inputs,
        example_kwarg_inputs=example_kwarg_inputs,
        debug_options=debug_options,
        dynamic_batch=dynamic_batch,
        fallback=fallback,
        **jit_options,
    )
