"""``Adadelta``: PyTorch's Adadelta, as an optax chain.

PyTorch, per parameter::

    g = -grad if maximize else grad;  g = g + weight_decay * param
    square_avg = rho * square_avg + (1 - rho) * g**2
    delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
    acc_delta = rho * acc_delta + (1 - rho) * delta**2
    param -= lr * delta

``optax.scale_by_adadelta`` is this arithmetic exactly (its ``e_g`` is
``square_avg``, its ``e_x`` is ``acc_delta``); around it
:func:`~jmodule.optim._transforms.torch_chain` (maximize, L2 weight decay,
the learning rate). optax's ``adadelta`` keeps no step count, so PyTorch's
``step`` comes from :func:`~jmodule.optim._transforms.count_steps`.
"""

from __future__ import annotations

from typing import Any

import optax

from jmodule.optim._transforms import LR, WEIGHT_DECAY, count_steps, frame, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["Adadelta"]


class Adadelta(TorchOptimizer):
    """Adadelta (``torch.optim.Adadelta``).

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: scale applied to the delta before it is added to the parameter.
        rho: decay rate of the running averages of squared gradients and deltas.
        eps: added inside both square roots.
        weight_decay: L2 penalty added to the gradient.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        capturable: accepted for PyTorch compatibility.
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.Adadelta([w], lr=1.0, eps=1e-2)
    >>> w.grad = jnp.ones(2)
    >>> opt.step()
    >>> [round(v, 4) for v in w.data.tolist()]  # -sqrt(eps) / sqrt(0.1 + eps) on step one
    [-0.3015, -0.3015]
    """

    _hyper = (LR, ("rho", "rho", None), ("eps", "eps", None), WEIGHT_DECAY)
    _state_names = {
        ("step", "count"): "step",
        ("adadelta", "e_g"): "square_avg",
        ("adadelta", "e_x"): "acc_delta",
    }
    _state_order = ("step", "square_avg", "acc_delta")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {
            "lr": lr,
            "rho": rho,
            "eps": eps,
            "weight_decay": weight_decay,
            "maximize": maximize,
            "capturable": capturable,
            "foreach": foreach,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return frame(group)

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        adadelta = optax.scale_by_adadelta(hp["rho"], hp["eps"])
        return torch_chain(cfg, hp, ("adadelta", adadelta), first=[("step", count_steps())])
