"""``Adagrad``: PyTorch's Adagrad, as an optax chain.

PyTorch, per parameter (``sum`` starts at ``initial_accumulator_value``)::

    g = -grad if maximize else grad;  g = g + weight_decay * param
    clr = lr / (1 + (step - 1) * lr_decay)
    sum += g**2
    param -= clr * g / (sqrt(sum) + eps)

``optax.scale_by_rss`` accumulates the same sum but divides by
``sqrt(sum + eps)`` (``eps`` inside the root, default 1e-7, and an
accumulator starting at 0.1). No optax piece moves ``eps`` out of the root,
so :func:`scale_by_root_sum_of_squares` is ``scale_by_rss`` with PyTorch's
denominator (same ``ScaleByRssState``). ``lr_decay`` is
``scale_by_schedule(count -> 1 / (1 + count * lr_decay))``, whose count is
PyTorch's ``step``. Around them, :func:`~jmodule.optim._transforms.torch_chain`
(maximize, L2 weight decay, the learning rate).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jmodule.optim._transforms import LR, WEIGHT_DECAY, frame, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["Adagrad", "scale_by_root_sum_of_squares"]


def scale_by_root_sum_of_squares(
    initial_accumulator_value: float = 0.0, eps: Any = 1e-10
) -> optax.GradientTransformation:
    """``optax.scale_by_rss`` with ``eps`` outside the square root, as PyTorch's Adagrad.

    ``sum += g**2; g / (sqrt(sum) + eps)``.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_root_sum_of_squares()
    >>> tx.update(jnp.array([3.0]), tx.init(jnp.zeros(1)))[0].round(4)
    Array([1.], dtype=float32)
    """

    def init(params: Any) -> optax.ScaleByRssState:
        return optax.ScaleByRssState(
            sum_of_squares=optax.tree.full_like(params, initial_accumulator_value)
        )

    def update(updates: Any, state: optax.ScaleByRssState, params: Any = None) -> tuple:
        del params
        sums = jax.tree.map(lambda g, s: s + g * g, updates, state.sum_of_squares)
        updates = jax.tree.map(lambda g, s: g / (jnp.sqrt(s) + eps), updates, sums)
        return updates, optax.ScaleByRssState(sum_of_squares=sums)

    return optax.GradientTransformation(init, update)


class Adagrad(TorchOptimizer):
    """Adagrad (``torch.optim.Adagrad``).

    As in PyTorch, the state (``step`` 0, ``sum`` filled with
    ``initial_accumulator_value``) is created for every parameter when the
    optimizer is built.

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        lr_decay: learning-rate decay per step.
        weight_decay: L2 penalty added to the gradient.
        initial_accumulator_value: starting value of the sum of squares.
        eps: added to the denominator, outside the square root.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False.
        fused: accepted for PyTorch compatibility.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.Adagrad([w], lr=0.5)
    >>> w.grad = jnp.array([2.0, 4.0])
    >>> opt.step()
    >>> w.data.round(4)
    Array([-0.5, -0.5], dtype=float32)
    """

    _hyper = (LR, ("lr_decay", "lr_decay", None), ("eps", "eps", None), WEIGHT_DECAY)
    _state_names = {("lr_decay", "count"): "step", ("sum", "sum_of_squares"): "sum"}
    _state_order = ("step", "sum")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        for name, value in (
            ("learning rate", lr),
            ("lr_decay value", lr_decay),
            ("weight_decay value", weight_decay),
            ("initial_accumulator_value value", initial_accumulator_value),
            ("epsilon value", eps),
        ):
            if not 0.0 <= value:
                raise ValueError(f"Invalid {name}: {value}")
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "eps": eps,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": differentiable,
            "fused": fused,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self._materialize(p, self._record(group, p).public)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return (
            *frame(group),
            ("initial_accumulator_value", float(group["initial_accumulator_value"])),
        )

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        rss = scale_by_root_sum_of_squares(cfg["initial_accumulator_value"], hp["eps"])
        lr_decay = hp["lr_decay"]
        decay = optax.scale_by_schedule(lambda count: 1 / (1 + count * lr_decay))
        return torch_chain(cfg, hp, ("sum", rss), ("lr_decay", decay))
