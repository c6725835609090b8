"""``jm.amp.GradScaler``: dynamic loss scaling, as ``torch.amp.GradScaler``.

The scale and the growth tracker live in a slot container (``_store``), as
optimizer state does, so a ``jm.compile``d training step that is given the
scaler reads and writes them as program inputs and outputs: a new scale
never recompiles. Inside such a program the inf/NaN check is a traced flag,
and ``step`` keeps or drops the optimizer's update with ``jnp.where`` on it
(no Python branch on a value). Eagerly the flag is concrete and ``step``
calls ``optimizer.step()`` only when it is zero, exactly as PyTorch.

The scaler sees the optimizer only through ``param_groups``, the
parameters' ``.grad`` and, in a compiled step, the optimizer's state slots
(``_jm_describe``), so any jmodule optimizer works.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import state as _state
from jmodule._lowering import structure
from jmodule.amp._autocast import _cuda_available

__all__ = ["GradScaler", "OptState"]


class OptState:
    """Where an optimizer is in the scaler's iteration (PyTorch's ``OptState`` names)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


_NOT_GIVEN = (
    "GradScaler.{what} ran inside a compiled function that was not given the scaler, so its "
    "scale could not be carried in and out of the program. Pass the scaler as an argument, "
    "as optimizers are: `@jm.compile def train_step(model, opt, scaler, x, y): ...`."
)
_TRACED_VALUE = (
    "GradScaler.{what} reads the value of the scale, which a compiled function does not have "
    "while it is traced. Call it outside the compiled step (the scale is carried out of the "
    "program after each call)."
)
_SPLIT = (
    "GradScaler: the inf/NaN check of this iteration was computed inside a compiled function "
    "that has finished, so {what} cannot use it. Call unscale_(), step() and update() in the "
    "same compiled function (or all eagerly)."
)


@jax.jit
def _unscale(grads: list[Any], inv_scale: jax.Array) -> tuple[list[Any], jax.Array]:
    """Every gradient times ``inv_scale`` and 1.0 if any of them has an inf or NaN, else 0.0."""
    found = jnp.zeros((), jnp.float32)
    out = []
    for g in grads:
        found = jnp.maximum(found, jnp.any(~jnp.isfinite(g)).astype(jnp.float32))
        out.append((g.astype(jnp.promote_types(g.dtype, jnp.float32)) * inv_scale).astype(g.dtype))
    return out, found


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _update_scale(
    scale: jax.Array,
    tracker: jax.Array,
    found_inf: jax.Array,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> tuple[jax.Array, jax.Array]:
    """PyTorch's ``_amp_update_scale_``: back off on inf, grow after ``growth_interval`` steps."""
    found = found_inf > 0
    successful = tracker + 1
    grow = successful == growth_interval
    grown = scale * jnp.float32(growth_factor)
    grown = jnp.where(jnp.isfinite(grown), grown, scale)
    new_scale = jnp.where(found, scale * jnp.float32(backoff_factor), jnp.where(grow, grown, scale))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(tracker), successful)
    return new_scale.astype(jnp.float32), new_tracker.astype(jnp.int32)


def _traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


class GradScaler:
    """Dynamic loss scaling for mixed-precision training, as ``torch.amp.GradScaler``.

    ``scale(loss)`` multiplies the loss by the scale; ``unscale_(opt)``
    divides the optimizer's gradients by it and records whether any is inf or
    NaN; ``step(opt)`` unscales (if not done yet) and steps the optimizer
    unless a gradient was inf/NaN; ``update()`` multiplies the scale by
    ``backoff_factor`` after a skipped step and by ``growth_factor`` after
    ``growth_interval`` steps in a row without one. ``enabled=False`` makes
    every method a pass-through.

    In a compiled step, pass the scaler to the ``jm.compile``d function as
    an argument, as optimizers are; then ``scale``/``unscale_``/``step``/
    ``update`` run inside the program, skipping is data-dependent
    (``jnp.where`` on the inf flag) and a new scale never recompiles. Call
    ``unscale_``, ``step`` and ``update`` of one iteration in the same
    compiled function, and ``get_scale()``/``state_dict()`` outside it.

    Differences JAX forces: the scale and growth tracker exist from
    construction (PyTorch makes them on the first ``scale()``; the values
    are the same). A step skipped inside a compiled program leaves the
    optimizer's state as it was, but an optimizer that had never stepped
    holds its initial state (zeros, ``step`` 0) where PyTorch holds none.

    Args:
        device: ``"cuda"`` (PyTorch's default) or ``"cpu"``; ``"cuda"``
            without a GPU warns and disables the scaler, as PyTorch does.
        init_scale: the initial scale.
        growth_factor: the scale's growth factor (> 1).
        backoff_factor: the scale's backoff factor (< 1).
        growth_interval: unskipped steps in a row before the scale grows.
        enabled: False makes every method a pass-through.

    Raises:
        AssertionError: ``growth_factor <= 1`` or ``backoff_factor >= 1``
            (PyTorch's exception type).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.ones(2))
    >>> opt = jm.optim.SGD([w], lr=0.1)
    >>> scaler = jm.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    >>> loss = jm.backward(lambda: scaler.scale((w * w).sum()))
    >>> scaler.step(opt); scaler.update()
    >>> w.data, scaler.get_scale()
    (Array([0.8, 0.8], dtype=float32), 8.0)
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        self._device = device
        self._enabled = enabled
        if device == "cuda" and enabled and not _cuda_available():
            warnings.warn(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                stacklevel=2,
            )
            self._enabled = False
        #: The slot container ``jm.compile`` binds: the scale and the growth tracker.
        self._store: dict[str, Any] = {}
        self._desc: structure.Description | None = None
        self._desc_key: Any = None
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._store["scale"] = jnp.full((), init_scale, jnp.float32)
            self._store["growth_tracker"] = jnp.zeros((), jnp.int32)
            self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ jm.compile

    def _jm_describe(self) -> structure.Description:
        """Structure key and state slots, for ``jm.compile`` (cached; cheap per call)."""
        key = (
            "jm.amp.GradScaler",
            self._enabled,
            *(
                (self._growth_factor, self._backoff_factor, self._growth_interval)
                if self._enabled
                else ()
            ),
        )
        if key != self._desc_key or self._desc is None:
            slots = [(self._store, k) for k in self._store]
            names = ["scale", "_growth_tracker"][: len(slots)]
            self._desc = structure.stateful(key, slots, names)
            self._desc_key = key
        return self._desc

    def _check_given(self, what: str) -> None:
        if _state.tracing() and not _state.is_bound(self._store):
            raise RuntimeError(_NOT_GIVEN.format(what=what))

    def _opt_state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(
            id(optimizer), {"stage": OptState.READY, "found_inf": None}
        )

    # ------------------------------------------------------------------ the iteration

    def scale(self, outputs: Any) -> Any:
        """``outputs`` (an array, or a list/tuple/iterable of them) times the scale.

        The product has PyTorch's dtype: an array of one or more dimensions
        keeps its dtype, a scalar promotes with the float32 scale.

        Raises:
            ValueError: something other than arrays.
        """
        if not self._enabled:
            return outputs
        self._check_given("scale()")
        scale = self._store["scale"]

        def apply(val: Any) -> Any:
            if _state.is_cell(val):
                val = _state.value(val)
            if isinstance(val, jax.Array):
                if val.ndim > 0 and jnp.issubdtype(val.dtype, jnp.floating):
                    dtype = val.dtype
                else:
                    dtype = jnp.promote_types(val.dtype, jnp.float32)
                return (val.astype(jnp.promote_types(dtype, jnp.float32)) * scale).astype(dtype)
            if isinstance(val, Iterable):
                mapped = map(apply, val)
                return type(val)(mapped) if isinstance(val, (list, tuple)) else mapped
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply(outputs)

    def unscale_(self, optimizer: Any) -> None:
        """Divide the gradients of ``optimizer``'s parameters by the scale, in place.

        Records whether any of them is inf or NaN (for :meth:`step`). Call it
        at most once per optimizer between :meth:`update` calls, after every
        gradient is accumulated (e.g. before ``clip_grad_norm_``).

        Raises:
            RuntimeError: called twice, or after :meth:`step`, since the last update.
            ValueError: a float16 gradient (PyTorch refuses to unscale them).
        """
        if not self._enabled:
            return
        self._check_given("unscale_()")
        st = self._opt_state(optimizer)
        if st["stage"] == OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if st["stage"] == OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        params = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if g.dtype == jnp.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                params.append(p)
        if params:
            inv_scale = jnp.float32(1.0) / self._store["scale"]
            grads, found = _unscale([p.grad for p in params], inv_scale)
            for p, g in zip(params, grads):
                p.grad = g
            st["found_inf"] = found
        st["stage"] = OptState.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless :meth:`unscale_` did) and step ``optimizer`` unless a grad is inf/NaN.

        Returns:
            What ``optimizer.step(*args, **kwargs)`` returned, or None for a skipped step.

        Raises:
            RuntimeError: a ``closure`` (unsupported, as in PyTorch), or a second step
                since the last update.
            AssertionError: no gradient was checked (no parameter has a ``.grad``).
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_given("step()")
        st = self._opt_state(optimizer)
        if st["stage"] == OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if st["stage"] == OptState.READY:
            self.unscale_(optimizer)
        found = st["found_inf"]
        if found is None:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        if _traced(found) and not _state.is_bound(self._store):
            raise RuntimeError(_SPLIT.format(what="step()"))
        retval = None
        if _traced(found):
            retval = self._step_where(optimizer, found, args, kwargs)
        elif not float(found):
            retval = optimizer.step(*args, **kwargs)
        st["stage"] = OptState.STEPPED
        return retval

    @staticmethod
    def _step_where(optimizer: Any, found: jax.Array, args: tuple, kwargs: dict) -> Any:
        """Step, then keep each state slot's old value where ``found`` (traced: no branch)."""
        slots = optimizer._jm_describe().slots
        before = [c.get(k) for c, k in slots]
        retval = optimizer.step(*args, **kwargs)
        skip = found > 0
        for (c, k), old in zip(slots, before):
            new = c.get(k)
            if new is not old and old is not None and new is not None:
                c[k] = jnp.where(skip, old, new)
        return retval

    def update(self, new_scale: float | jax.Array | None = None) -> None:
        """Update the scale: back off after a skipped step, grow after ``growth_interval`` more.

        Args:
            new_scale: set the scale to this value instead.

        Raises:
            AssertionError: no inf check was recorded since the last update, or a
                ``new_scale`` array with more than one element.
        """
        if not self._enabled:
            return
        self._check_given("update()")
        store = self._store
        if new_scale is not None:
            if isinstance(new_scale, (int, float)):
                store["scale"] = jnp.full((), new_scale, jnp.float32)
            else:
                value = jnp.asarray(new_scale)
                if value.size != 1:
                    raise AssertionError(
                        "new_scale should be a float or a 1-element array with requires_grad=False."
                    )
                store["scale"] = value.reshape(()).astype(jnp.float32)
        else:
            found_infs = [
                st["found_inf"]
                for st in self._per_optimizer_states.values()
                if st["found_inf"] is not None
            ]
            if not found_infs:
                raise AssertionError("No inf checks were recorded prior to update.")
            if any(map(_traced, found_infs)) and not _state.is_bound(store):
                raise RuntimeError(_SPLIT.format(what="update()"))
            found = functools.reduce(jnp.add, found_infs)
            store["scale"], store["growth_tracker"] = _update_scale(
                store["scale"],
                store["growth_tracker"],
                found,
                float(self._growth_factor),
                float(self._backoff_factor),
                int(self._growth_interval),
            )
        self._per_optimizer_states = {}

    # ------------------------------------------------------------------ inspection

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled).

        Raises:
            RuntimeError: inside a compiled function (the value is not known there).
        """
        if not self._enabled:
            return 1.0
        scale = self._store["scale"]
        if _traced(scale):
            raise RuntimeError(_TRACED_VALUE.format(what="get_scale()"))
        return float(scale)

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        tracker = self._store["growth_tracker"]
        if _traced(tracker):
            raise RuntimeError(_TRACED_VALUE.format(what="state_dict()"))
        return int(tracker)

    def get_growth_factor(self) -> float:
        """The scale's growth factor."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor (a compiled step using the scaler traces again)."""
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        """The scale's backoff factor."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor (a compiled step using the scaler traces again)."""
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        """The number of unskipped steps in a row before the scale grows."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval (a compiled step using the scaler traces again)."""
        self._growth_interval = new_interval

    def is_enabled(self) -> bool:
        """Whether the scaler scales (False: every method is a pass-through)."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's five entries (``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker``) as Python numbers; ``{}`` when disabled."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load :meth:`state_dict` (or ``torch.amp.GradScaler``'s); a no-op when disabled.

        Raises:
            RuntimeError: an empty state dict (saved from a disabled scaler).
        """
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        self._init_scale = float(state_dict["scale"])
        self._store["scale"] = jnp.full((), state_dict["scale"], jnp.float32)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        self._store["growth_tracker"] = jnp.full((), state_dict["_growth_tracker"], jnp.int32)

    def __getstate__(self) -> dict[str, Any]:
        if self._enabled and self._per_optimizer_states:
            raise AssertionError(
                "A GradScaler instance may only be pickled at the beginning "
                "of an iteration, or at the end after scaler.update()."
            )
        return {**_state.without_private(self.__dict__), "_desc": None, "_desc_key": None}

    def __repr__(self) -> str:
        if not self._enabled:
            return f"GradScaler(device={self._device!r}, enabled=False)"
        return (
            f"GradScaler(device={self._device!r}, growth_factor={self._growth_factor}, "
            f"backoff_factor={self._backoff_factor}, growth_interval={self._growth_interval})"
        )
