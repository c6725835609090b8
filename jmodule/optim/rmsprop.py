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
PyTorch adds it outside) and no bias correction, then ``trace(momentum)``
*before* ``scale_by_learning_rate``: ``optax.rmsprop`` applies the learning
rate before the momentum trace, which equals PyTorch only while the learning
rate is constant, and PyTorch's ``momentum_buffer`` holds the unscaled sum.
The ``step`` PyTorch counts comes from :func:`count_steps`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax

from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["RMSprop", "count_steps"]


def count_steps() -> optax.GradientTransformation:
    """An optax transformation that passes updates through and counts its calls.

    Its state is ``optax.ScaleByScheduleState(count)``: PyTorch's ``step`` for
    an optimizer whose optax pieces keep no count of their own.

    >>> import jax.numpy as jnp
    >>> tx = count_steps()
    >>> _, state = tx.update(jnp.ones(2), tx.init(jnp.ones(2)))
    >>> state.count
    Array(1, dtype=int32)
    """

    def init(params: Any) -> optax.ScaleByScheduleState:
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates: Any, state: optax.ScaleByScheduleState, params: Any = None) -> tuple:
        del params
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init, update)


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
        ("lr", "lr", None),
        ("alpha", "alpha", None),
        ("eps", "eps", None),
        ("weight_decay", "weight_decay", None),
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
            ("maximize", bool(group["maximize"])),
            ("decay", group["weight_decay"] != 0),
            ("centered", bool(group["centered"])),
            ("momentum", group["momentum"] > 0),
        )

    def _transformation(
        self, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        chain = [("step", count_steps())]
        if cfg["maximize"]:
            chain.append(("maximize", optax.scale(-1.0)))
        if cfg["decay"]:
            chain.append(("weight_decay", optax.add_decayed_weights(hp["weight_decay"])))
        scale_by = optax.scale_by_stddev if cfg["centered"] else optax.scale_by_rms
        chain.append(("rms", scale_by(decay=hp["alpha"], eps=hp["eps"], eps_in_sqrt=False)))
        if cfg["momentum"]:
            chain.append(("momentum", optax.trace(hp["momentum"])))
        chain.append(("lr", optax.scale_by_learning_rate(hp["lr"])))
        return optax.named_chain(*chain)
