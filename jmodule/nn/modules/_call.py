"""Calling a module: forward hooks, the eager path and ``compile()``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from jmodule import _tensor
from jmodule._lowering import errors as _errors
from jmodule._lowering import state
from jmodule._lowering import tracebacks as _tracebacks
from jmodule._lowering.recorder import BackwardHooks
from jmodule.nn.modules import _fusion, _hooks
from jmodule.nn.modules._hooks import RemovableHandle

# torch.compile keyword arguments and what jmodule does with them.
_TORCH_COMPILE_OPTIONS = {"fullgraph", "dynamic", "backend", "mode", "options", "disable"}
# jax.jit keyword arguments that make sense for a module's forward.
_JIT_OPTIONS = {"compiler_options", "keep_unused", "inline"}


class CallMixin:
    """Forward hooks and the call path of :class:`~jmodule.nn.Module`."""

    _compiled: Any

    def register_forward_pre_hook(
        self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False
    ) -> RemovableHandle:
        """Register ``hook(module, args)`` to run before ``forward``.

        It may return replacement args (a single value is wrapped in a
        tuple). With ``with_kwargs`` it is called as ``hook(module, args,
        kwargs)`` and may return ``(args, kwargs)``. In compiled code it runs
        when the program is traced, not on every call (use
        ``jax.debug.callback`` inside it for per-call side effects).

        >>> import jax.numpy as jnp
        >>> from jmodule import nn
        >>> m = nn.Identity()
        >>> h = m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
        >>> m(jnp.zeros(2))
        Array([1., 1.], dtype=float32)
        >>> h.remove()
        """
        handle = RemovableHandle(
            self._forward_pre_hooks, extra_dict=self._forward_pre_hooks_with_kwargs, owner=self
        )
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        state.touch(self)
        return handle

    def register_forward_hook(
        self,
        hook: Callable,
        *,
        prepend: bool = False,
        with_kwargs: bool = False,
        always_call: bool = False,
    ) -> RemovableHandle:
        """Register ``hook(module, args, output)`` to run after ``forward``.

        A non-None return value replaces the output. With ``with_kwargs`` it
        is called as ``hook(module, args, kwargs, output)``; with
        ``always_call`` it also runs when ``forward`` raises. Like pre-hooks,
        it runs at trace time in compiled code.
        """
        handle = RemovableHandle(
            self._forward_hooks,
            extra_dict=[self._forward_hooks_with_kwargs, self._forward_hooks_always_called],
            owner=self,
        )
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        state.touch(self)
        return handle

    def register_full_backward_pre_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Register ``hook(module, grad_output)`` to run when output gradients are ready.

        It may return a replacement ``grad_output`` tuple. It fires inside
        ``jm.backward``/``jm.grad``: eagerly with concrete arrays, and in
        compiled code once, when the program is traced.
        """
        handle = RemovableHandle(self._backward_pre_hooks, owner=self)
        self._backward_pre_hooks[handle.id] = hook
        if prepend:
            self._backward_pre_hooks.move_to_end(handle.id, last=False)
        state.touch(self)
        return handle

    def register_full_backward_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """Register ``hook(module, grad_input, grad_output)`` to run after input gradients.

        ``grad_input`` and ``grad_output`` are tuples aligned with the
        module's positional inputs and its outputs (``None`` where an input
        is not an array or does not depend on differentiated parameters).
        It may return a replacement ``grad_input``. Parameter gradients are
        not affected, as in PyTorch.

        Raises:
            RuntimeError: the module already has a non-full backward hook.

        >>> import jax.numpy as jnp
        >>> import jmodule as jm
        >>> lin, scale = jm.nn.Linear(2, 2), jm.nn.Linear(2, 1)
        >>> seen = []
        >>> _ = scale.register_full_backward_hook(lambda m, gi, go: seen.append(go[0].shape))
        >>> _ = jm.backward(lambda: scale(lin(jnp.ones((3, 2)))).sum())
        >>> seen
        [(3, 1)]
        """
        return self._add_backward_hook(hook, prepend, full=True)

    def register_backward_hook(self, hook: Callable) -> RemovableHandle:
        """Deprecated in PyTorch; here it behaves as :meth:`register_full_backward_hook`.

        PyTorch's old hook reports the gradients of the *last operation*
        inside the module, which has no meaning for a JAX program; jmodule
        gives it the full-hook semantics PyTorch recommends, and warns.
        """
        warnings.warn(
            "register_backward_hook is deprecated: jmodule runs it with "
            "register_full_backward_hook's semantics (grad_input = gradients of the module's "
            "inputs). Use register_full_backward_hook.",
            FutureWarning,
            stacklevel=2,
        )
        return self._add_backward_hook(hook, False, full=False)

    def _add_backward_hook(self, hook: Callable, prepend: bool, full: bool) -> RemovableHandle:
        if self._is_full_backward_hook is (not full):
            raise RuntimeError(
                "Cannot use both regular backward hooks and full backward hooks on a single "
                "Module. Please use only one of them."
            )
        self.__dict__["_is_full_backward_hook"] = full
        handle = RemovableHandle(self._backward_hooks, owner=self)
        self._backward_hooks[handle.id] = hook
        if prepend:
            self._backward_hooks.move_to_end(handle.id, last=False)
        state.touch(self)
        return handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            if _tensor.has(args, kwargs) and _tensor.recording():  # for loss.backward()
                return _tensor.in_graph(self.__call__, args, kwargs)
            compiled = self._compiled
            if compiled is not None:  # it tells a gradient recorder itself
                return compiled(args, kwargs)
            if _fusion.wanted(self):  # library layers only: one compiled program (_fusion.py)
                if _tensor.has(args, kwargs):  # jm.Tensors: arrays in, Tensors out
                    a, k = _tensor.unwrap_call(args, kwargs)
                    out = _fusion.call(self, a, k)
                    if out is not _fusion.NOT_FUSED:
                        return _tensor.wrap(out)
                else:
                    out = _fusion.call(self, args, kwargs)
                    if out is not _fusion.NOT_FUSED:
                        return out
            recorder = state.local.recorder
            if recorder is not None:  # a gradient is being taken: it may restore this module
                recorder.enter(self)
            return self._call_impl(*args, **kwargs)
        except Exception as e:  # jmodule's frames hidden; an input deleted by donation named
            deleted = _errors.deleted_input(e, (args, kwargs))
            if deleted is None:
                _tracebacks.hide(e)
                raise
            raise deleted from _tracebacks.cause(e)

    def _call_impl(self, *args: Any, **kwargs: Any) -> Any:
        """Run ``forward`` with the forward hooks, as PyTorch's ``_call_impl``."""
        recorder = state.local.recorder
        backward = recorder is not None and bool(self._backward_hooks or self._backward_pre_hooks)
        if not (
            backward
            or self._forward_pre_hooks
            or self._forward_hooks
            or _hooks._global_forward_pre_hooks
            or _hooks._global_forward_hooks
        ):
            return _forward(self, args, kwargs)
        called: set[int] = set()
        result = None
        try:
            for hook_id, hook in (
                *_hooks._global_forward_pre_hooks.items(),
                *self._forward_pre_hooks.items(),
            ):
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    out = hook(self, args, kwargs)
                    if out is not None:
                        if not (isinstance(out, tuple) and len(out) == 2):
                            raise RuntimeError(
                                "forward pre-hook must return None or a tuple of "
                                f"(new_args, new_kwargs), but got {out}."
                            )
                        args, kwargs = out
                else:
                    out = hook(self, args)
                    if out is not None:
                        args = out if isinstance(out, tuple) else (out,)
            if backward:
                bw_hook = BackwardHooks(self, recorder)
                args = bw_hook.setup_input_hook(args)
            result = _forward(self, args, kwargs)
            for hook_id, hook in (
                *_hooks._global_forward_hooks.items(),
                *self._forward_hooks.items(),
            ):
                if (
                    hook_id in self._forward_hooks_always_called
                    or hook_id in _hooks._global_forward_hooks_always_called
                ):
                    called.add(hook_id)
                if (
                    hook_id in self._forward_hooks_with_kwargs
                    or hook_id in _hooks._global_forward_hooks_with_kwargs
                ):
                    out = hook(self, args, kwargs, result)
                else:
                    out = hook(self, args, result)
                if out is not None:
                    result = out
            if backward:
                result = bw_hook.setup_output_hook(result)
            return result
        except Exception:
            self._run_always_called_hooks(args, kwargs, result, called)
            raise

    def _run_always_called_hooks(self, args: Any, kwargs: Any, result: Any, called: set) -> None:
        for hook_id, hook in _hooks._global_forward_hooks.items():
            if hook_id in _hooks._global_forward_hooks_always_called and hook_id not in called:
                try:
                    out = hook(self, args, result)
                    result = result if out is None else out
                except Exception as e:
                    warnings.warn(
                        "global module forward hook with ``always_call=True`` raised an "
                        f"exception that was silenced as another error was raised in forward: {e}",
                        stacklevel=3,
                    )
        for hook_id, hook in self._forward_hooks.items():
            if hook_id in self._forward_hooks_always_called and hook_id not in called:
                try:
                    if hook_id in self._forward_hooks_with_kwargs:
                        out = hook(self, args, kwargs, result)
                    else:
                        out = hook(self, args, result)
                    result = result if out is None else out
                except Exception as e:
                    warnings.warn(
                        "module forward hook with ``always_call=True`` raised an exception "
                        f"that was silenced as another error was raised in forward: {e}",
                        stacklevel=3,
                    )

    def compile(self, *args: Any, **options: Any) -> None:
        """Make later calls run as one ``jax.jit``-compiled XLA program.

        Parameters, buffers, the train/eval mode, hooks and the default
        generator's key are lowered into a pure function; buffer writes (e.g.
        BatchNorm statistics) and random draws (dropout) are carried in and
        out, so N compiled calls leave the module as N eager calls would. The
        program is recompiled only when something that changes it changes
        (input shapes/dtypes, mode, hooks, parameter structure, dtypes or
        ``requires_grad``); reasons are logged on the ``jmodule.compile``
        logger. Non-array arguments are static: a new value recompiles.

        Args:
            *args: not accepted (``torch.compile``'s positional model argument
                makes no sense here).
            **options: ``torch.compile`` options ``fullgraph`` (always whole
                forward), ``dynamic`` (``None``/``False`` only), ``backend``
                (``None``/``"inductor"``/``"xla"``, all meaning XLA), ``mode``
                and ``options`` (ignored), ``disable`` (True leaves the
                module eager); and ``jax.jit`` options ``compiler_options``,
                ``keep_unused``, ``inline``.

        Raises:
            TypeError: an option jmodule cannot honour.

        >>> import jax.numpy as jnp
        >>> from jmodule import nn
        >>> m = nn.Linear(4, 2)
        >>> m.compile()
        >>> m(jnp.ones((3, 4))).shape
        (3, 2)
        """
        from jmodule._lowering.compiled import CompiledForward

        if args:
            raise TypeError("Module.compile() takes keyword options only")
        unknown = set(options) - _TORCH_COMPILE_OPTIONS - _JIT_OPTIONS
        if unknown:
            raise TypeError(
                f"Module.compile() got unsupported option(s) {sorted(unknown)}; accepted: "
                f"{sorted(_TORCH_COMPILE_OPTIONS | _JIT_OPTIONS)}"
            )
        if options.get("dynamic"):
            raise TypeError(
                "compile(dynamic=True) is not supported: XLA programs have static shapes. "
                "Each new input shape compiles once and is cached; for a symbolic batch "
                "dimension in a saved program use jm.jit.trace(..., dynamic_batch=True)."
            )
        if options.get("backend") not in (None, "inductor", "xla"):
            raise TypeError(f"compile(backend={options['backend']!r}): jmodule compiles with XLA")
        if options.get("disable"):
            self.__dict__["_compiled"] = None
            return
        jit_options = {k: v for k, v in options.items() if k in _JIT_OPTIONS}
        self.__dict__["_compiled"] = CompiledForward(self, jit_options, options)


def _forward(module: Any, args: tuple, kwargs: dict) -> Any:
    """``module.forward(*args, **kwargs)``; a jmodule layer given ``jm.Tensor`` s computes
    with their arrays and returns Tensors (a user's ``forward`` gets the Tensors, as do
    containers that pass them on: ``_jm_passes_tensors``)."""
    if _tensor.has(args, kwargs):
        cls = type(module)
        if (cls.forward.__module__ or "").startswith("jmodule.") and not getattr(
            cls, "_jm_passes_tensors", False
        ):
            a, k = _tensor.unwrap_call(args, kwargs)
            return _tensor.wrap(module.forward(*a, **k))
    return module.forward(*args, **kwargs)
