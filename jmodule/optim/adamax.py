"""``Adamax``: PyTorch's Adamax (Adam with the infinity norm), as an optax chain.

PyTorch, per parameter::

    g = -grad if maximize else grad;  g = g + weight_decay * param
    exp_avg = beta1 * exp_avg + (1 - beta1) * g
    exp_inf = max(beta2 * exp_inf, |g| + eps)
    param -= lr / (1 - beta1**step) * exp_avg / exp_inf

``optax.scale_by_adamax`` is this arithmetic exactly (its ``mu`` is
``exp_avg``, its ``nu`` is ``exp_inf``, its count is ``step``); around it
:func:`~jmodule.optim._transforms.torch_chain` (maximize, L2 weight decay,
the learning rate). Both betas are hyper-parameter arrays: ``beta2``
only multiplies (no ``1 - beta2`` that float32 would round, as in Adam).
"""

from __future__ import annotations

from typing import Any

import optax

from jmodule.optim._transforms import LR, WEIGHT_DECAY, frame, torch_chain
from jmodule.optim.adam import _check
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["Adamax"]


class Adamax(TorchOptimizer):
    """Adamax (``torch.optim.Adamax``).

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        betas: decay rates of the first moment and of the infinity norm.
        eps: added to the absolute gradient before the running maximum.
        weight_decay: L2 penalty added to the gradient.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False.
        capturable: accepted for PyTorch compatibility.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.Adamax([w], lr=0.1)
    >>> w.grad = jnp.array([1.0, -2.0])
    >>> opt.step()
    >>> [round(v, 4) for v in w.data.tolist()]  # -lr * sign(grad) on the first step
    [-0.1, 0.1]
    """

    _hyper = (LR, ("beta1", "betas", 0), ("beta2", "betas", 1), ("eps", "eps", None), WEIGHT_DECAY)
    _state_names = {
        ("adamax", "count"): "step",
        ("adamax", "mu"): "exp_avg",
        ("adamax", "nu"): "exp_inf",
    }
    _state_order = ("step", "exp_avg", "exp_inf")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ):
        _check(lr, betas, eps, weight_decay)
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": differentiable,
            "capturable": capturable,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return frame(group)

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        adamax = optax.scale_by_adamax(hp["beta1"], hp["beta2"], hp["eps"])
        return torch_chain(cfg, hp, ("adamax", adamax))
