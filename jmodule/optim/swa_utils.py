"""Stochastic weight averaging and EMA (``torch.optim.swa_utils``).

``AveragedModel`` keeps a copy of a model whose parameters (and, with
``use_buffers=True``, buffers) are a running average of the model's: SWA's
equal-weight mean by default, an exponential moving average with
``multi_avg_fn=get_ema_multi_avg_fn(decay)``. ``SWALR`` anneals each group's
rate to a fixed SWA rate, and ``update_bn`` recomputes BatchNorm statistics
for the averaged weights with one pass over the data.

The averaging functions differ from PyTorch's in one way JAX forces: arrays
are immutable, so an ``avg_fn(averaged, current, n_averaged)`` returns the
new average (as PyTorch's does), and a ``multi_avg_fn(averaged_list,
current_list, n_averaged)`` returns the list of new averages, where
PyTorch's updates the tensors in place (``torch._foreach_lerp_``) and
returns None. ``update_parameters`` works eagerly and inside ``jm.compile``
(pass the ``AveragedModel`` as an argument): compiled, whether it is the
first update is read from the ``n_averaged`` buffer with ``jnp.where``, not
a Python ``if``, so the program is the same for every call (and the
averaging function runs on the first call too, its result discarded).

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> from jmodule.optim.swa_utils import AveragedModel
>>> model = jm.nn.Linear(2, 1)
>>> swa = AveragedModel(model)
>>> swa.update_parameters(model)
>>> int(swa.n_averaged)
1
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

from jmodule.nn.modules.batchnorm import _BatchNorm
from jmodule.nn.modules.module import Module
from jmodule.optim.lr_scheduler import LRScheduler, _per_group
from jmodule.optim.optimizer import Optimizer

__all__ = [
    "SWALR",
    "AveragedModel",
    "get_ema_avg_fn",
    "get_ema_multi_avg_fn",
    "get_swa_avg_fn",
    "get_swa_multi_avg_fn",
    "update_bn",
]

MULTI_RETURNS_HELP = (
    "multi_avg_fn returned {got}, not a list of arrays. JAX arrays cannot be updated in place, "
    "so a jmodule multi_avg_fn(averaged_list, current_list, n_averaged) returns the new "
    "averages (one per array of averaged_list, in order) instead of changing them as "
    "torch._foreach_lerp_ would."
)


def _floating(x: Any) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))


def _lerp(start: jax.Array, end: jax.Array, weight: Any) -> jax.Array:
    """``torch.lerp``'s formula (``_foreach_lerp_``'s rounding)."""
    weight = jnp.asarray(weight, start.dtype)
    return jnp.where(
        jnp.abs(weight) < 0.5, start + weight * (end - start), end - (end - start) * (1 - weight)
    )


def get_ema_multi_avg_fn(decay: float = 0.999) -> Callable:
    """An exponential moving average over lists: ``ema.lerp(current, 1 - decay)``.

    Args:
        decay: the weight of the old average, in [0, 1].

    Returns:
        ``fn(ema_list, current_list, n_averaged) -> new ema_list``.

    >>> import jax.numpy as jnp
    >>> fn = get_ema_multi_avg_fn(0.5)
    >>> fn([jnp.zeros(2)], [jnp.ones(2)], 1)[0].tolist()
    [0.5, 0.5]
    """
    if decay < 0.0 or decay > 1.0:
        raise ValueError(
            f"Invalid decay value {decay} provided. Please provide a value in [0,1] range."
        )

    def ema_update(ema_list: Sequence[Any], current_list: Sequence[Any], _: Any) -> list[Any]:
        if _floating(ema_list[0]):
            return [_lerp(e, c, 1 - decay) for e, c in zip(ema_list, current_list)]
        return [
            (e * decay + c * (1 - decay)).astype(e.dtype) for e, c in zip(ema_list, current_list)
        ]

    return ema_update


def get_swa_multi_avg_fn() -> Callable:
    """The equal-weight running mean over lists: ``avg.lerp(current, 1 / (n + 1))``.

    Returns:
        ``fn(averaged_list, current_list, n_averaged) -> new averaged_list``.

    >>> import jax.numpy as jnp
    >>> fn = get_swa_multi_avg_fn()
    >>> fn([jnp.zeros(2)], [jnp.full(2, 3.0)], 2)[0].tolist()
    [1.0, 1.0]
    """

    def swa_update(avg_list: Sequence[Any], current_list: Sequence[Any], n: Any) -> list[Any]:
        if _floating(avg_list[0]):
            # As torch's: ``1 / (n + 1)`` of an integer tensor is a float32 tensor.
            weight = jnp.float32(1) / (jnp.asarray(n) + 1).astype(jnp.float32)
            return [_lerp(a, c, weight) for a, c in zip(avg_list, current_list)]
        return [
            (a + (c - a) / (jnp.asarray(n) + 1)).astype(a.dtype)
            for a, c in zip(avg_list, current_list)
        ]

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> Callable:
    """An exponential moving average of one array: ``decay * ema + (1 - decay) * current``.

    Args:
        decay: the weight of the old average, in [0, 1].

    >>> import jax.numpy as jnp
    >>> get_ema_avg_fn(0.75)(jnp.zeros(1), jnp.ones(1), 3).tolist()
    [0.25]
    """
    if decay < 0.0 or decay > 1.0:
        raise ValueError(
            f"Invalid decay value {decay} provided. Please provide a value in [0,1] range."
        )

    def ema_update(ema: Any, current: Any, n_averaged: Any) -> Any:
        return decay * ema + (1 - decay) * current

    return ema_update


def get_swa_avg_fn() -> Callable:
    """The equal-weight running mean of one array: ``avg + (current - avg) / (n + 1)``.

    >>> import jax.numpy as jnp
    >>> get_swa_avg_fn()(jnp.zeros(1), jnp.full(1, 3.0), 2).tolist()
    [1.0]
    """

    def swa_update(averaged: Any, current: Any, n_averaged: Any) -> Any:
        return averaged + (current - averaged) / (n_averaged + 1)

    return swa_update


def _buffer_slots(module: Module) -> list[tuple[Module, str]]:
    """``(owner, name)`` of each buffer, in ``module.buffers()`` order."""
    slots, seen = [], set()
    for _, owner in module.named_modules():
        for name, value in owner._buffers.items():
            if value is not None and id(value) not in seen:
                seen.add(id(value))
                slots.append((owner, name))
    return slots


class AveragedModel(Module):
    """A running average of a model's parameters: SWA, or EMA (``swa_utils.AveragedModel``).

    ``AveragedModel(model)`` deep-copies ``model`` into ``self.module`` and
    keeps ``n_averaged``, the number of updates (an int64 buffer; int32 with
    x64 off). Each ``update_parameters(model)`` copies the model's values on
    the first call and averages them in afterwards, with ``avg_fn`` (per
    array), ``multi_avg_fn`` (per list of arrays of one dtype) or, by
    default, the equal-weight mean ``avg + (p - avg) / (n + 1)``. Buffers
    are copied from the model each update (BatchNorm statistics: recompute
    them with :func:`update_bn`), or averaged too with ``use_buffers=True``.
    ``state_dict()`` has PyTorch's keys: ``n_averaged``, ``module.*``.

    Unlike PyTorch, a ``multi_avg_fn`` returns the new arrays (JAX arrays
    are immutable; see the module docs). PyTorch's default average is the
    per-tensor formula on CPU and a ``_foreach_lerp_`` on CUDA, which round
    differently in the last bit; this is the per-tensor formula everywhere.

    Args:
        model: the model to average.
        device: where to put the copy (as ``Module.to``).
        avg_fn: ``fn(averaged, current, n_averaged) -> new averaged``.
        multi_avg_fn: ``fn(averaged_list, current_list, n_averaged) -> new list``.
        use_buffers: average the buffers too (and iterate parameters and
            buffers of the copy).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> from jmodule.optim import swa_utils
    >>> model = jm.nn.Linear(1, 1, bias=False)
    >>> ema = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.5))
    >>> for value in (2.0, 4.0):
    ...     model.weight.data = jnp.full((1, 1), value)
    ...     ema.update_parameters(model)
    >>> ema.module.weight.data.tolist()
    [[3.0]]
    """

    #: Its forward calls modules that may be user code: a jm.Tensor passes on to them.
    _jm_passes_tensors = True

    def __init__(
        self,
        model: Module,
        device: Any = None,
        avg_fn: Callable[[Any, Any, Any], Any] | None = None,
        multi_avg_fn: Callable[[Sequence[Any], Sequence[Any], Any], list[Any]] | None = None,
        use_buffers: bool = False,
    ):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        dtype = jnp.int64 if jax.config.read("jax_enable_x64") else jnp.int32
        self.register_buffer("n_averaged", jnp.zeros((), dtype))
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The averaged model's forward."""
        return self.module(*args, **kwargs)

    def _averaged_slots(self, model: Module) -> list[tuple[Any, Any, Any]]:
        """``(set_fn, averaged value, model value)`` for each averaged array."""
        out: list[tuple[Any, Any, Any]] = []
        mine, theirs = list(self.module.parameters()), list(model.parameters())
        for p, q in zip(mine, theirs):
            out.append((lambda v, p=p: setattr(p, "data", v), p.data, q.data))
        if self.use_buffers:
            for (owner, name), (their_owner, their_name) in zip(
                _buffer_slots(self.module), _buffer_slots(model)
            ):
                value = their_owner._buffers[their_name]
                out.append(
                    (
                        lambda v, o=owner, n=name: setattr(o, n, v),
                        owner._buffers[name],
                        value,
                    )
                )
        return out

    def update_parameters(self, model: Module) -> None:
        """Average ``model``'s current values into this copy; count one more update.

        Args:
            model: the model being trained (the same architecture).

        Raises:
            TypeError: ``multi_avg_fn`` returned something other than a list.
        """
        slots = self._averaged_slots(model)
        n = self.n_averaged
        first = n == 0
        averaged = [a for _, a, _ in slots]
        current = [jnp.asarray(c).astype(a.dtype) for _, a, c in slots]
        if not isinstance(n, jax.core.Tracer) and int(n) == 0:
            new = current  # the first update copies (eagerly no average is computed)
        elif self.avg_fn is not None and self.multi_avg_fn is None:
            new = [self.avg_fn(a, c, n) for a, c in zip(averaged, current)]
        else:
            fn = self.multi_avg_fn
            new = list(averaged)
            groups: dict[Any, list[int]] = {}
            for i, a in enumerate(averaged):
                groups.setdefault(str(a.dtype), []).append(i)
            for members in groups.values():
                avg = [averaged[i] for i in members]
                cur = [current[i] for i in members]
                if fn is None:
                    result = [get_swa_avg_fn()(a, c, n) for a, c in zip(avg, cur)]
                else:
                    result = fn(avg, cur, n)
                    if not isinstance(result, (list, tuple)) or len(result) != len(avg):
                        got = "None" if result is None else type(result).__name__
                        raise TypeError(MULTI_RETURNS_HELP.format(got=got))
                for i, r in zip(members, result):
                    new[i] = r
        for (set_value, a, _), c, r in zip(slots, current, new):
            set_value(jnp.where(first, c, jnp.asarray(r).astype(a.dtype)))
        if not self.use_buffers:  # keep the buffers in sync with the model's
            for (owner, name), (their_owner, their_name) in zip(
                _buffer_slots(self.module), _buffer_slots(model)
            ):
                mine = owner._buffers[name]
                setattr(owner, name, jnp.asarray(their_owner._buffers[their_name], mine.dtype))
        self.n_averaged = self.n_averaged + 1


def update_bn(loader: Iterable[Any], model: Module, device: Any = None) -> None:
    """Recompute the BatchNorm running statistics of ``model`` with one pass over ``loader``.

    Every BatchNorm's statistics are reset and accumulated as a cumulative
    average (``momentum=None``) over the batches, in training mode; the
    momenta and the training flag are restored afterwards. Batches that are
    lists or tuples give their first element. It runs ``model`` eagerly (or
    compiled, if it is a ``model.compile()``'d model).

    Args:
        loader: an iterable of batches.
        model: the model (e.g. ``averaged.module`` or the AveragedModel).
        device: where to move each batch first (``jax.device_put``).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> from jmodule.optim import swa_utils
    >>> model = jm.nn.BatchNorm1d(2)
    >>> swa_utils.update_bn([jnp.array([[1.0, 2.0], [3.0, 6.0]])], model)
    >>> model.running_mean.tolist()
    [2.0, 4.0]
    """
    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    try:
        for batch in loader:
            if isinstance(batch, (list, tuple)):
                batch = batch[0]
            if device is not None:
                batch = jax.device_put(batch, device)
            model(batch)
    finally:
        for module, momentum in momenta.items():
            module.momentum = momentum
        model.train(was_training)


class SWALR(LRScheduler):
    """Anneal each group's rate to ``swa_lr`` over ``anneal_epochs``, then hold it.

    Args:
        optimizer: the optimizer.
        swa_lr: the SWA rate (or one per group).
        anneal_epochs: epochs of the annealing (0: jump at once).
        anneal_strategy: ``"cos"`` or ``"linear"``.
        last_epoch: see :class:`~jmodule.optim.lr_scheduler.LRScheduler`.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> from jmodule.optim import swa_utils
    >>> opt = jm.optim.SGD([jm.nn.Parameter(jnp.ones(1))], lr=1.0)
    >>> sched = swa_utils.SWALR(opt, swa_lr=0.1, anneal_epochs=2, anneal_strategy="linear")
    >>> lrs = []
    >>> for _ in range(3):
    ...     opt.step()
    ...     sched.step()
    ...     lrs.append(round(sched.get_last_lr()[0], 4))
    >>> lrs
    [0.55, 0.1, 0.1]
    """

    def __init__(
        self,
        optimizer: Optimizer,
        swa_lr: float | list[float],
        anneal_epochs: int = 10,
        anneal_strategy: Literal["cos", "linear"] = "cos",
        last_epoch: int = -1,
    ):
        swa_lrs = _per_group("swa_lr", optimizer, swa_lr)
        for lr, group in zip(swa_lrs, optimizer.param_groups):
            group["swa_lr"] = lr
        if anneal_strategy not in ["cos", "linear"]:
            raise ValueError(
                f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}"
            )
        self._set_anneal_func(anneal_strategy)
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear_anneal(t: float) -> float:
        return t

    @staticmethod
    def _cosine_anneal(t: float) -> float:
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr: float, swa_lr: float, alpha: float) -> float:
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self) -> list[float]:
        if not self._get_lr_called_within_step:
            warnings.warn(
                "To get the last learning rate computed by the scheduler, please use "
                "`get_last_lr()`.",
                UserWarning,
                stacklevel=2,
            )
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0, min(1, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self.anneal_func(prev_t)
        prev_lrs = [
            self._get_initial_lr(group["lr"], group["swa_lr"], prev_alpha)
            for group in self.optimizer.param_groups
        ]
        t = max(0, min(1, step / max(1, self.anneal_epochs)))
        alpha = self.anneal_func(t)
        return [
            group["swa_lr"] * alpha + lr * (1 - alpha)
            for group, lr in zip(self.optimizer.param_groups, prev_lrs)
        ]

    def _set_anneal_func(self, anneal_strategy: str) -> None:
        self._anneal_strategy = anneal_strategy
        self.anneal_func = self._cosine_anneal if anneal_strategy == "cos" else self._linear_anneal

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer and the anneal function (as PyTorch)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "anneal_func")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.__dict__.update(state_dict)
        self._set_anneal_func(self._anneal_strategy)
