"""``SGD``: PyTorch's stochastic gradient descent, as an optax chain.

PyTorch, per parameter::

    g = -grad if maximize else grad
    g = g + weight_decay * param
    buf = g                                   (first step)
    buf = momentum * buf + (1 - dampening) * g (later steps)
    g = g + momentum * buf if nesterov else buf
    param -= lr * g

Composed with :func:`~jmodule.optim._transforms.torch_chain` (maximize, L2
weight decay, the learning rate) around
:func:`~jmodule.optim._transforms.momentum` (``optax.trace(momentum,
nesterov)``: the buffer starts at zero, so its first step is ``buf = g`` as
in PyTorch). Dampening has no optax counterpart and PyTorch does not dampen
the first step, so it is ``scale_by_schedule`` giving 1 on a parameter's
first step and ``1 - dampening`` after (its step count is kept but not saved:
PyTorch's ``state_dict`` has only ``momentum_buffer``, and loading one means
the first step is past).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax

from jmodule.optim._transforms import LR, WEIGHT_DECAY, Step, frame, momentum, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["SGD"]


class SGD(TorchOptimizer):
    """Stochastic gradient descent, optionally with momentum (``torch.optim.SGD``).

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        momentum: momentum factor.
        dampening: dampening for momentum (not applied on the first step).
        weight_decay: L2 penalty added to the gradient.
        nesterov: Nesterov momentum (needs momentum > 0 and no dampening).
        maximize: maximise the objective instead of minimising it.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        differentiable: must be False.
        fused: accepted for PyTorch compatibility (XLA fuses the update).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.ones(2))
    >>> opt = jm.optim.SGD([w], lr=0.1, momentum=0.9)
    >>> w.grad = jnp.ones(2)
    >>> opt.step()
    >>> w.data
    Array([0.9, 0.9], dtype=float32)
    """

    _hyper = (LR, ("momentum", "momentum", None), ("dampening", "dampening", None), WEIGHT_DECAY)
    _state_names = {("momentum", "trace"): "momentum_buffer"}
    _state_order = ("momentum_buffer",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
            "differentiable": differentiable,
            "fused": fused,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        on = group["momentum"] != 0
        return (
            *frame(group),
            ("momentum", on),
            ("dampening", on and group["dampening"] != 0),
            ("nesterov", on and bool(group["nesterov"])),
        )

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        scaling: list[Step] = []
        if cfg["dampening"]:
            undamped = 1 - hp["dampening"]
            damp = optax.scale_by_schedule(lambda count: jnp.where(count == 0, 1.0, undamped))
            scaling.append(("dampening", damp))
        if cfg["momentum"]:
            scaling.append(momentum(hp, cfg["nesterov"]))
        return torch_chain(cfg, hp, *scaling)

    def _derive_hidden(self, cfg: dict[str, Any], public: dict[str, Any], hidden: dict) -> None:
        if "dampening.count" in hidden:  # a saved buffer means its first step is past
            hidden["dampening.count"] = jnp.ones_like(hidden["dampening.count"])
