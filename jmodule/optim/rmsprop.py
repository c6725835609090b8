"""``RMSprop``: PyTorch's RMSprop, as an optax chain.

PyTorch, per parameter::

    g = -grad if maximize else grad;  g = g + weight_decay * param
    square_avg = alpha * square_avg + (1 - alpha) * g**2
    grad_avg = alpha * grad_avg + (1 - alpha) * g            (centered)
    avg = sqrt(square_avg - grad_avg**2 if centered else square_avg) + eps
    buf = momentum * buf + g / avg;  param -= lr * buf        (momentum > 0)
    param -= lr * g / avg                                     (otherwise)

optax pieces: ``scale_by_rms`` / ``scale_by_stddev`` (centered) with
``eps_in_sqrt=False`` (optax's default puts ``eps`` inside the square root;
PyTorch adds it outside) and no bias correction, then the momentum trace
(:func:`~jmodule.optim._transforms.momentum`) *before* the learning rate:
``optax.rmsprop`` applies the learning rate before the momentum trace, which
equals PyTorch only while the learning rate is constant, and PyTorch's
``momentum_buffer`` holds the unscaled sum. Around them,
:func:`~jmodule.optim._transforms.torch_chain` (maximize, L2 weight decay,
the learning rate); the ``step`` PyTorch counts comes from
:func:`~jmodule.optim._transforms.count_steps`.
"""

from __future__ import annotations

from typing import Any

import optax

from jmodule.optim._transforms import (
    LR,
    WEIGHT_DECAY,
    Step,
    count_steps,
    frame,
    momentum,
    torch_chain,
)
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["RMSprop", "count_steps"]


class RMSprop(TorchOptimizer):
    """RMSprop (``torch.optim.RMSprop``), optionally centered and with momentum.

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        alpha: smoothing constant of the squared-gradient average.
        eps: added to the denominator, outside the square root.
        weight_decay: L2 penalty added to the gradient.
        momentum: momentum factor.
        centered: normalise by the estimated variance of the gradient.
        capturable: accepted for PyTorch compatibility.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.RMSprop([w], lr=0.1, alpha=0.75)
    >>> w.grad = jnp.ones(2)
    >>> opt.step()
    >>> w.data
    Array([-0.2, -0.2], dtype=float32)
    """

    _hyper = (
        LR,
        ("alpha", "alpha", None),
        ("eps", "eps", None),
        WEIGHT_DECAY,
        ("momentum", "momentum", None),
    )
    _state_names = {
        ("step", "count"): "step",
        ("rms", "nu"): "square_avg",
        ("rms", "mu"): "grad_avg",
        ("momentum", "trace"): "momentum_buffer",
    }
    _state_order = ("step", "square_avg", "momentum_buffer", "grad_avg")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        for name, value in (
            ("learning rate", lr),
            ("epsilon value", eps),
            ("momentum value", momentum),
            ("weight_decay value", weight_decay),
            ("alpha value", alpha),
        ):
            if not 0.0 <= value:
                raise ValueError(f"Invalid {name}: {value}")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "alpha": alpha,
            "eps": eps,
            "centered": centered,
            "weight_decay": weight_decay,
            "capturable": capturable,
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return (
            *frame(group),
            ("centered", bool(group["centered"])),
            ("momentum", group["momentum"] > 0),
        )

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        scale_by = optax.scale_by_stddev if cfg["centered"] else optax.scale_by_rms
        scaling: list[Step] = [
            ("rms", scale_by(decay=hp["alpha"], eps=hp["eps"], eps_in_sqrt=False))
        ]
        if cfg["momentum"]:
            scaling.append(momentum(hp))
        return torch_chain(cfg, hp, *scaling, first=[("step", count_steps())])
