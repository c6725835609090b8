"""``Module``: PyTorch's module object model over JAX arrays.

The class keeps *structure* (submodules, hooks, mode, names) in ordinary
Python attributes and *state* (parameter values, buffers) in slots that the
lowering machinery (``jmodule._lowering``) can read and write without walking
the tree. Registration, lookup and iteration live here; hooks and the call
path in ``_call.py``; ``state_dict`` in ``_state_dict.py``; device and dtype
moves in ``_casting.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax
import numpy as np

from jmodule._lowering import binding, state, structure
from jmodule.nn.modules._call import CallMixin
from jmodule.nn.modules._casting import CastingMixin
from jmodule.nn.modules._hooks import RemovableHandle as RemovableHandle
from jmodule.nn.modules._hooks import (
    register_module_forward_hook as register_module_forward_hook,
)
from jmodule.nn.modules._hooks import (
    register_module_forward_pre_hook as register_module_forward_pre_hook,
)
from jmodule.nn.modules._state_dict import StateDictMixin
from jmodule.nn.parameter import Buffer, Parameter, as_array

# The global hooks live here too, where PyTorch users import them from
# (``torch.nn.modules.module.register_module_forward_hook``).
__all__ = ["Module", "register_module_forward_hook", "register_module_forward_pre_hook"]

T = TypeVar("T", bound="Module")

# Attributes whose assignment does not change what the module's forward computes.
_UNSTAMPED = frozenset({"training", "_compiled", "_compile_options"}) | state.PRIVATE


def _typename(obj: Any) -> str:
    if isinstance(obj, jax.Array):
        return "jax.Array"
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


#: The frameworks of einops' layer modules (``einops.layers.<name>``), as users know them.
_EINOPS_FRAMEWORKS = {"torch": "PyTorch", "flax": "Flax", "keras": "Keras"}


def _not_a_module(value: Any) -> str:
    """The error for a child that is not a jmodule Module (an einops layer: which one to use)."""
    what = _typename(value)
    where = type(value).__module__
    if not where.startswith("einops.layers."):
        return f"{what} is not a Module subclass"
    name = type(value).__name__
    framework = _EINOPS_FRAMEWORKS.get(where.rpartition(".")[2], where)
    if name in ("Rearrange", "Reduce"):
        return (
            f"{what} is not a Module subclass: it is einops' layer for {framework}. Use "
            f"jm.nn.{name}, the same layer as a jmodule Module, with the same arguments: "
            f"jm.nn.{name}{_einops_args(value)}."
        )
    return (
        f"{what} is not a Module subclass: it is einops' layer for {framework}, and jmodule "
        "has only jm.nn.Rearrange and jm.nn.Reduce. Compute it in forward with einops "
        "functions (einops.einsum, einops.rearrange) over jm.nn.Parameter weights."
    )


def _einops_args(layer: Any) -> str:
    """``('b c -> c b', h=2)``: an einops layer's arguments (torch's and flax's name them
    differently: ``axes_lengths``, ``sizes``)."""
    pattern = getattr(layer, "pattern", None)
    if not isinstance(pattern, str):
        return "(pattern, ...)"
    parts = [repr(pattern)]
    if type(layer).__name__ == "Reduce":
        parts.append(repr(getattr(layer, "reduction", "...")))
    lengths = getattr(layer, "axes_lengths", None) or getattr(layer, "sizes", None) or {}
    parts += [f"{axis}={length}" for axis, length in dict(lengths).items()]
    return "(" + ", ".join(parts) + ")"


def _looks_like_nnx(value: Any) -> bool:
    """A Flax NNX module (it becomes a ``FlaxModule`` submodule when assigned)."""
    return any(
        c.__name__ == "Module" and c.__module__.startswith("flax.nnx")
        for c in type(value).__mro__[1:]
    )


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)) or (
        "_jm_tensor" in type(value).__dict__  # a jm.Tensor: its array is stored
    )


class Module(CallMixin, StateDictMixin, CastingMixin):
    """Base class for all neural network modules, as ``torch.nn.Module``.

    Subclass it, assign layers and parameters as attributes in ``__init__``
    and write ``forward``. Calling the module runs ``forward`` eagerly with
    its hooks; after ``compile()`` calls run as one XLA program.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(4, 2)
    ...
    ...     def forward(self, x):
    ...         return self.fc(x).sum(-1)
    >>> Net()(jnp.ones((3, 4))).shape
    (3,)
    """

    training: bool
    _version: int = 1
    #: Its description for compiled programs changes only with its version.
    _jm_versioned = True
    #: How a Flax NNX module assigned as an attribute becomes a submodule
    #: (``FlaxModule``): set by ``jmodule.nn.flax``, which ``jmodule.nn`` imports.
    _nnx_adapter: Callable[[Any], Module] | None = None
    _compiled: Any = None
    dump_patches: bool = False
    call_super_init: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not self.call_super_init and kwargs:
            raise TypeError(
                f"{type(self).__name__}.__init__() got an unexpected keyword argument "
                f"'{next(iter(kwargs))}'"
            )
        if not self.call_super_init and args:
            raise TypeError(
                f"{type(self).__name__}.__init__() takes 1 positional argument but "
                f"{len(args) + 1} were given"
            )
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}
        for name in structure.HOOK_DICTS:
            d[name] = OrderedDict()
        d["_is_full_backward_hook"] = None
        # A fresh token: the identity of this module's plain attributes (a new one
        # on every write), part of the structure key of the programs it is in.
        d["_stamp"] = object()
        if self.call_super_init:  # cooperative multiple inheritance, as PyTorch
            super().__init__(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function'
        )

    # ------------------------------------------------------------------ registration

    def _check_new_name(self, kind: str, name: Any, own: dict) -> None:
        # PyTorch's checks, in its order and words (add_module differs slightly).
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {_typename(name)}")
        exists = hasattr(self, name) and name not in own
        if kind == "module" and exists:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            got = f", got: {name}" if kind == "module" else ""
            raise KeyError(f'{kind} name can\'t contain "."{got}')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if exists:
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or a ``None`` placeholder) under ``name``.

        Raises:
            TypeError: ``param`` is neither a Parameter nor None.
            KeyError: the name is empty, has a dot, or is taken by another attribute.
        """
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_new_name("parameter", name, self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                "(jmodule.nn.Parameter or None required)"
            )
        self._parameters[name] = param
        state.touch(self)

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        """Add a buffer: state that is not a parameter (e.g. running statistics).

        Args:
            name: attribute name.
            tensor: a ``jax.Array`` (numpy arrays are converted), or None.
            persistent: whether it is part of ``state_dict()``.
        """
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_new_name("buffer", name, self._buffers)
        if isinstance(tensor, (Buffer, Parameter)):
            tensor = tensor.data  # a buffer holds the plain array
        if tensor is not None and not _is_array(tensor):
            raise TypeError(
                f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                "(jax.Array or None required)"
            )
        self._buffers[name] = None if tensor is None else as_array(tensor)
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)
        state.touch(self)

    def add_module(self, name: str, module: Module | None) -> None:
        """Add a child module under ``name`` (``None`` is a placeholder)."""
        if not isinstance(module, Module) and module is not None:
            raise TypeError(_not_a_module(module))
        self._check_new_name("module", name, self._modules)
        self._modules[name] = module
        state.touch(self)

    def register_module(self, name: str, module: Module | None) -> None:
        """Alias for :meth:`add_module`."""
        self.add_module(name, module)

    # ------------------------------------------------------------------ attribute routing

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            members = d.get(store)
            if members is not None and name in members:
                return members[name]
        # Attributes computed on every read (``name -> fn(module)``): the weight of the
        # old-style ``nn.utils.weight_norm``/``spectral_norm``, a plain attribute in PyTorch.
        computed = d.get("_computed_attributes")
        if computed is not None and name in computed:
            return computed[name](self)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if _looks_like_nnx(value) and Module._nnx_adapter is not None:
            value = Module._nnx_adapter(value)
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            self._forget(name, keep="_parameters")
            self.register_parameter(name, value)
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as parameter '{name}' "
                    "(jmodule.nn.Parameter or None expected)"
                )
            self.register_parameter(name, value)
            return
        modules = d.get("_modules")
        if isinstance(value, Module):
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            self._forget(name, keep="_modules")
            modules[name] = value
            state.touch(self)
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as child module '{name}' "
                    "(jmodule.nn.Module or None expected)"
                )
            modules[name] = value
            state.touch(self)
            return
        buffers = d.get("_buffers")
        if isinstance(value, Buffer):
            # As PyTorch: no clearing of other attributes first, so assigning a
            # Buffer to a name already used by a plain attribute raises KeyError.
            self.register_buffer(name, value.data, value.persistent)
            return
        if buffers is not None and name in buffers:
            self._set_buffer(buffers, name, value)
            return
        described = getattr(type(self), name, None)
        if isinstance(described, property) and getattr(described.fset, "_assigns_state", False):
            # A setter that only writes parameters and buffers (a parametrized tensor's,
            # through ``right_inverse``): a traced value is fine, no attribute changes.
            described.__set__(self, value)
            return
        if isinstance(value, jax.core.Tracer):
            raise binding.TracerLeakError(
                binding.LEAK_HELP.format(
                    what=f"attribute '{name}' of {type(self).__name__}"
                    f" (use self.register_buffer('{name}', ...) to carry it across calls)"
                )
            )
        object.__setattr__(self, name, value)
        if name not in _UNSTAMPED:
            d["_stamp"] = object()
            state.touch(self)
        elif name == "training":  # part of the structure key: compiled calls re-check it
            state.touch(self)

    def _set_buffer(self, buffers: dict, name: str, value: Any) -> None:
        if "_jm_tensor" in type(value).__dict__:  # a jm.Tensor: the buffer holds its array
            value = value.array
        if value is not None and not _is_array(value):
            raise TypeError(
                f"cannot assign '{_typename(value)}' as buffer '{name}' "
                "(jmodule.nn.Buffer, jax.Array or None expected)"
            )
        recorder = state.local.recorder
        if recorder is not None and recorder.owns(value):
            recorder.note_write(buffers, name)  # a gradient's trace: restored when it ends
        elif isinstance(value, jax.core.Tracer) and not state.is_bound(buffers):
            raise binding.TracerLeakError(
                f"Buffer '{name}' of {type(self).__name__} was assigned a traced value, but "
                "this module's state is not part of the program being traced (a bare "
                "jax.jit/jax.grad around a module call, or a module used inside jm.compile "
                "without being passed as an argument). Compile with model.compile() or pass "
                "the module to the jm.compile'd function as an argument."
            )
        if isinstance(value, np.ndarray):
            value = as_array(value)
        if (buffers[name] is None) != (value is None):
            state.touch(self)
        buffers[name] = value

    def _forget(self, name: str, keep: str) -> None:
        d = self.__dict__
        d.pop(name, None)
        for store in ("_parameters", "_buffers", "_modules"):
            if store != keep:
                d[store].pop(name, None)
        if keep != "_buffers":
            d["_non_persistent_buffers_set"].discard(name)

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if name in d[store]:
                del d[store][name]
                d["_non_persistent_buffers_set"].discard(name)
                state.touch(self)
                return
        object.__delattr__(self, name)
        d["_stamp"] = object()
        state.touch(self)

    def __dir__(self) -> list[str]:
        keys = [*dir(type(self)), *self.__dict__, *self._parameters, *self._modules]
        keys += list(self._buffers)
        return sorted(k for k in set(keys) if not k[0].isdigit())

    # ------------------------------------------------------------------ lookup

    def _get_name(self) -> str:
        return type(self).__name__

    def get_submodule(self, target: str) -> Module:
        """The submodule at dotted path ``target`` (``""`` is ``self``).

        Raises:
            AttributeError: a path element does not exist or is not a Module.
        """
        if target == "":
            return self
        mod: Module = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def set_submodule(self, target: str, module: Module, strict: bool = False) -> None:
        """Set the submodule at dotted path ``target``.

        Args:
            target: dotted path to the submodule.
            module: the module to put there.
            strict: when True, the final attribute must already exist.

        Raises:
            ValueError: ``target`` is empty or ``module`` is not a Module.
            AttributeError: the path does not resolve, or (``strict``) the
                attribute does not exist, or it exists and is not a Module.
        """
        if target == "":
            raise ValueError("Cannot set the submodule without a target name!")
        atoms = target.split(".")
        if not isinstance(module, Module):
            raise ValueError(f"`module` is not an nn.Module, found {type(module)}")
        parent = self if len(atoms) == 1 else self.get_submodule(".".join(atoms[:-1]))
        if strict and not hasattr(parent, atoms[-1]):
            raise AttributeError(parent._get_name() + " has no attribute `" + atoms[-1] + "`")
        if hasattr(parent, atoms[-1]) and not isinstance(getattr(parent, atoms[-1]), Module):
            raise AttributeError("`" + atoms[-1] + "` is not an nn.Module")
        setattr(parent, atoms[-1], module)

    def _get_member(self, target: str, store: str, kind: str) -> Any:
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        value = mod.__dict__[store].get(name)
        if name not in mod.__dict__[store] or (kind == "an nn.Parameter" and value is None):
            raise AttributeError("`" + name + f"` is not {kind}")
        return value

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at dotted path ``target``.

        Raises:
            AttributeError: the path does not resolve or is not a parameter
                (a ``None`` placeholder is not one).
        """
        return self._get_member(target, "_parameters", "an nn.Parameter")

    def get_buffer(self, target: str) -> jax.Array:
        """The buffer at dotted path ``target``.

        Raises:
            AttributeError: the path does not resolve or is not a buffer.
        """
        return self._get_member(target, "_buffers", "a buffer")

    # ------------------------------------------------------------------ iteration

    def named_modules(
        self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Module]]:
        """All modules in the tree (self first, depth first), with dotted names."""
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self, remove_duplicate: bool = True) -> Iterator[Module]:
        """All modules in the tree, self first."""
        for _, module in self.named_modules(remove_duplicate=remove_duplicate):
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """Immediate children, each module once."""
        memo = set()
        for name, module in self._modules.items():
            if module is not None and module not in memo:
                memo.add(module)
                yield name, module

    def children(self) -> Iterator[Module]:
        """Immediate children, each module once."""
        for _, module in self.named_children():
            yield module

    def _named_members(
        self,
        get_members: Callable[[Module], Any],
        prefix: str = "",
        recurse: bool = True,
        remove_duplicate: bool = True,
    ) -> Iterator[tuple[str, Any]]:
        memo: set[int] = set()
        modules = (
            self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
            if recurse
            else [(prefix, self)]
        )
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or id(v) in memo:
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield module_prefix + ("." if module_prefix else "") + k, v

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        """Parameters with dotted names; tied parameters once unless asked."""
        return self._named_members(
            lambda m: m._parameters.items(), prefix, recurse, remove_duplicate
        )

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Parameters of this module (and its descendants with ``recurse``)."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, jax.Array]]:
        """Buffers with dotted names."""
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[jax.Array]:
        """Buffers of this module (and its descendants with ``recurse``)."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # ------------------------------------------------------------------ modes

    def apply(self: T, fn: Callable[[Module], None]) -> T:
        """Call ``fn`` on every submodule (children first), then on self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def train(self: T, mode: bool = True) -> T:
        """Set training mode on this module and all descendants."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.__dict__["training"] = mode
        for module in self.children():
            module.train(mode)
        state.touch(self)
        return self

    def eval(self: T) -> T:
        """Set evaluation mode (``train(False)``)."""
        return self.train(False)

    def requires_grad_(self: T, requires_grad: bool = True) -> T:
        """Set ``requires_grad`` on every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad`` (to None, or to zeros)."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None  # without reading it: a compiled step then needs no old grads
            elif p.grad is not None:
                p.grad = jax.numpy.zeros_like(p.grad)

    def share_memory(self: T) -> T:
        """No-op returning self: JAX arrays are immutable, so there is nothing to share.

        PyTorch moves storages to shared memory for ``torch.multiprocessing``;
        with JAX, pass arrays between processes explicitly.
        """
        return self

    # ------------------------------------------------------------------ repr

    def extra_repr(self) -> str:
        """Extra text shown inside this module's ``repr`` (override it)."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = []
        for key, module in self._modules.items():
            text = _indent(repr(module), 2)
            child_lines.append(f"({key}): {text}")
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """Jupyter's HTML: the module's treescope tree (``text/plain`` stays ``repr``)."""
        from jmodule._display import module_html

        return {"text/html": module_html(self)}

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        from jmodule._display import treescope_repr

        return treescope_repr(self, path, subtree_renderer)

    def _jm_describe(self) -> Any:
        """Structure key and state slots, for compiled programs (cached per version)."""
        return structure.describe(self)

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict:
        saved = self.__dict__.copy()
        compiled = saved.pop("_compiled", None)
        for k in state.PRIVATE:
            saved.pop(k, None)
        if compiled is not None:
            saved["_compile_options"] = compiled.options
        return saved

    def __setstate__(self, saved: dict) -> None:
        options = saved.pop("_compile_options", None)
        self.__dict__.update(saved)
        self.__dict__["_stamp"] = object()
        state.touch(self)
        if options is not None:
            self.compile(**options)


def _indent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    pad = " " * spaces
    return lines[0] + "\n" + "\n".join(pad + line for line in lines[1:])
