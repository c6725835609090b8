"""``NAdam``: PyTorch's NAdam (Adam with Nesterov momentum and momentum decay).

PyTorch, per parameter (``t`` the step)::

    g = -grad if maximize else grad
    param *= 1 - lr * weight_decay        (decoupled_weight_decay)
    g = g + weight_decay * param          (otherwise)
    mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
    mu_next = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
    mu_product *= mu_t                     (a float32 scalar in the state)
    exp_avg, exp_avg_sq: Adam's moments;  denom = sqrt(exp_avg_sq / (1 - beta2**t)) + eps
    param -= lr * (1 - mu_t) / (1 - mu_product) * g / denom
    param -= lr * mu_next / (1 - mu_product * mu_next) * exp_avg / denom

optax's NAdam (``scale_by_adam(nesterov=True)``) is a different algorithm:
its momentum coefficient is the constant ``beta1`` and its Nesterov term is
``beta1 * exp_avg / (1 - beta1**(t+1)) + (1 - beta1) * g / (1 - beta1**t)``,
with no ``mu_t`` schedule and no ``mu_product`` (its updates differ from
PyTorch's from the first step, even with ``momentum_decay=0``, where
PyTorch's ``mu_t`` is ``beta1 / 2``). So :func:`scale_by_nadam` is a small
optax transformation with PyTorch's arithmetic (its moments are Adam's,
:func:`~jmodule.optim._transforms.adam_moments`). ``mu_product`` is
float32, multiplied in float32, as PyTorch keeps it (its scalar dtype), also
for float64 parameters.

Maximize, weight decay (before the scaling for L2, after it for decoupled)
and the learning rate are :func:`~jmodule.optim._transforms.torch_chain`'s.
``betas[1]`` is a compile-time constant, as in Adam.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jmodule.optim._transforms import (
    LR,
    WEIGHT_DECAY,
    adam_moments,
    frame,
    moment_names,
    torch_chain,
    zero_moments,
)
from jmodule.optim.adam import _check
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["NAdam", "ScaleByNAdamState", "scale_by_nadam"]


class ScaleByNAdamState(NamedTuple):
    """State of :func:`scale_by_nadam`."""

    count: jax.Array
    mu_product: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def scale_by_nadam(
    b1: Any = 0.9, b2: float = 0.999, eps: Any = 1e-8, momentum_decay: Any = 4e-3
) -> optax.GradientTransformation:
    """PyTorch's NAdam scaling (``mu_t`` momentum schedule), as an optax transformation.

    Returns the update before the learning rate (``-lr`` times it is PyTorch's
    step); its state is the count, the float32 ``mu_product`` and the two moments.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_nadam()
    >>> updates, state = tx.update(jnp.array([1.0, -2.0]), tx.init(jnp.zeros(2)))
    >>> [round(v, 4) for v in updates.tolist()]  # (1 + 0.1 * mu_next / (1 - mu_1 mu_next)) sign(g)
    [1.0564, -1.0564]
    """

    def init(params: Any) -> ScaleByNAdamState:
        count, mu, nu = zero_moments(params)
        return ScaleByNAdamState(count, jnp.ones([], jnp.float32), mu, nu)

    def update(updates: Any, state: ScaleByNAdamState, params: Any = None) -> tuple:
        del params
        count, mu, nu = adam_moments(updates, state, b1, b2)
        t = count.astype(jnp.result_type(b1, momentum_decay, float))
        mu_t = b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
        mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
        mu_product = state.mu_product * mu_t.astype(jnp.float32)
        product = mu_product.astype(t.dtype)
        grad_coef = (1 - mu_t) / (1 - product)
        avg_coef = mu_next / (1 - product * mu_next)
        bc2 = 1 - b2**count

        def scale(g: Any, m: Any, v: Any) -> Any:
            denom = jnp.sqrt(v / bc2.astype(v.dtype)) + eps
            return grad_coef * g / denom + avg_coef * m / denom

        updates = jax.tree.map(scale, updates, mu, nu)
        return updates, ScaleByNAdamState(count, mu_product, mu, nu)

    return optax.GradientTransformation(init, update)


class NAdam(TorchOptimizer):
    """NAdam (``torch.optim.NAdam``), with momentum decay and optional decoupled weight decay.

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        betas: decay rates of the first and second moment averages.
        eps: added to the denominator, outside the square root.
        weight_decay: L2 penalty (decoupled, as AdamW, with
            ``decoupled_weight_decay=True``).
        momentum_decay: the rate of the momentum schedule ``mu_t``.
        decoupled_weight_decay: apply weight decay as AdamW does.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        capturable: accepted for PyTorch compatibility.
        differentiable: must be False.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.NAdam([w], lr=0.1)
    >>> w.grad = jnp.array([1.0, -2.0])
    >>> opt.step()
    >>> [round(v, 4) for v in w.data.tolist()]
    [-0.1056, 0.1056]
    >>> sorted(opt.state[w])
    ['exp_avg', 'exp_avg_sq', 'mu_product', 'step']
    """

    _hyper = (
        LR,
        ("beta1", "betas", 0),
        ("eps", "eps", None),
        WEIGHT_DECAY,
        ("momentum_decay", "momentum_decay", None),
    )
    _state_names = {**moment_names("nadam"), ("nadam", "mu_product"): "mu_product"}
    _state_order = ("step", "mu_product", "exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ):
        _check(lr, betas, eps, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum_decay": momentum_decay,
            "decoupled_weight_decay": decoupled_weight_decay,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return (*frame(group, decoupled=True), ("beta2", float(group["betas"][1])))

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        nadam = scale_by_nadam(hp["beta1"], cfg["beta2"], hp["eps"], hp["momentum_decay"])
        return torch_chain(cfg, hp, ("nadam", nadam))
