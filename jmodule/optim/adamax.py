"""``Adamax``: PyTorch's Adamax (Adam with the infinity norm), as an optax chain.

PyTorch, per parameter::

    g = -grad if maximize else grad;  g = g + weight_decay * param
    exp_avg = beta1 * exp_avg + (1 - beta1) * g
    exp_inf = max(beta2 * exp_inf, |g| + eps)
    param -= lr / (1 - beta1**step) * exp_avg / exp_inf

``optax.scale_by_adamax`` is this arithmetic exactly (its ``mu`` is
``exp_avg``, its ``nu`` is ``exp_inf``, its count is ``step``); around it
``scale(-1)`` (maximize), ``add_decayed_weights`` (L2 weight decay) and
``scale_by_learning_rate``. Both betas are hyper-parameter arrays: ``beta2``
only multiplies (no ``1 - beta2`` that float32 would round, as in Adam).
"""

from __future__ import annotations

from typing import Any

import optax

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

    _hyper = (
        ("lr", "lr", None),
        ("beta1", "betas", 0),
        ("beta2", "betas", 1),
        ("eps", "eps", None),
        ("weight_decay", "weight_decay", None),
    )
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
        return (
            ("maximize", bool(group["maximize"])),
            ("decay", group["weight_decay"] != 0),
        )

    def _transformation(
        self, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        chain = []
        if cfg["maximize"]:
            chain.append(("maximize", optax.scale(-1.0)))
        if cfg["decay"]:
            chain.append(("weight_decay", optax.add_decayed_weights(hp["weight_decay"])))
        chain.append(("adamax", optax.scale_by_adamax(hp["beta1"], hp["beta2"], hp["eps"])))
        chain.append(("lr", optax.scale_by_learning_rate(hp["lr"])))
        return optax.named_chain(*chain)
