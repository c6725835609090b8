"""``RAdam``: PyTorch's rectified Adam, as an optax chain.

PyTorch, per parameter (``t`` the step, ``bc2 = 1 - beta2**t``)::

    g = -grad if maximize else grad
    param *= 1 - lr * weight_decay        (decoupled_weight_decay)
    g = g + weight_decay * param          (otherwise)
    exp_avg, exp_avg_sq: Adam's moments;  m_hat = exp_avg / (1 - beta1**t)
    rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 t beta2**t / bc2
    rho_t > 5:  param -= lr * m_hat * rect(rho_t) * sqrt(bc2) / (sqrt(exp_avg_sq) + eps)
    otherwise:  param -= lr * m_hat

``optax.scale_by_radam`` has the same moments and rectification term, but
its arithmetic differs from PyTorch's in three ways, so
:func:`scale_by_radam` is a small optax transformation with PyTorch's (its
moments and state are Adam's, :func:`~jmodule.optim._transforms.adam_moments`,
optax's ``ScaleByAdamState``):

* optax adds ``eps`` to the square root of the *bias-corrected* second
  moment, ``m_hat / (sqrt(exp_avg_sq / bc2) + eps)``; PyTorch adds it to the
  raw one, ``m_hat * sqrt(bc2) / (sqrt(exp_avg_sq) + eps)``.
* optax rectifies when ``rho_t >= threshold``, PyTorch when ``rho_t > 5``.
* optax computes ``rho_t`` in the parameters' precision straight from the
  formula, which in float32 loses most of it: ``rho_inf - 2 t beta2**t /
  bc2`` is a difference of two numbers near 2000 (for ``beta2 = 0.999``), and
  float32's ``0.999`` is 1.3e-8 off, so ``rho_t`` comes out ~0.03 low and the
  rectification term ~0.6% off in the first steps where it applies. PyTorch
  computes it in float64. Here ``rho_t`` is computed without the
  cancellation: with ``x = -t log(beta2)``, ``rho_t = rho_inf - (2 / -log
  beta2) x / expm1(x)``, and for ``x < 0.5`` the Bernoulli series of
  ``x / expm1(x)`` gives ``rho_t = t + c - (2 / -log beta2) (x**2/12 -
  x**4/720 + x**6/30240 - x**8/1209600)`` (``c`` computed in float64 in
  Python); ``bc2 = -expm1(-x)``. ``beta2`` is a compile-time constant (as in
  Adam), so the constants are exact.

Maximize, weight decay (before the scaling for L2, after it, before the
learning rate, for decoupled, as in Adam) and the learning rate are
:func:`~jmodule.optim._transforms.torch_chain`'s.
"""

from __future__ import annotations

import math
from typing import Any

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

__all__ = ["RAdam", "scale_by_radam"]


def scale_by_radam(
    b1: Any = 0.9, b2: float = 0.999, eps: Any = 1e-8
) -> optax.GradientTransformation:
    """PyTorch's RAdam scaling (before the learning rate), as an optax transformation.

    ``b2`` must be a Python float (its constants are computed in float64).

    >>> import jax.numpy as jnp
    >>> tx = scale_by_radam()
    >>> updates, state = tx.update(jnp.array([1.0, -2.0]), tx.init(jnp.zeros(2)))
    >>> updates.tolist()  # not rectified on the first step: the bias-corrected momentum
    [1.0, -2.0]
    """
    b2 = float(b2)
    rho_inf = 2 / (1 - b2) - 1
    rate = -math.log(b2) if b2 > 0 else math.inf  # beta2**t = exp(-rate * t)
    scale = 2 / rate
    offset = rho_inf - scale  # rho_t = t + offset - scale * (x/expm1(x) - 1 + x/2)

    def rho_and_bc2(t: jax.Array) -> tuple[jax.Array, jax.Array]:
        if b2 == 0:  # beta2**t is 0: rho_t = rho_inf = 1, bc2 = 1
            return jnp.ones_like(t), jnp.ones_like(t)
        x = rate * t
        x2 = x * x
        series = (
            t + offset - scale * x2 * (1 / 12 - x2 * (1 / 720 - x2 * (1 / 30240 - x2 / 1209600)))
        )
        direct = rho_inf - scale * x / jnp.expm1(jnp.maximum(x, 0.5))
        return jnp.where(x < 0.5, series, direct), -jnp.expm1(-x)

    def update(updates: Any, state: optax.ScaleByAdamState, params: Any = None) -> tuple:
        del params
        moments = adam_moments(updates, state, b1, b2)
        t = moments.count.astype(jnp.result_type(b1, eps, float))
        rho, bc2 = rho_and_bc2(t)
        bc1 = 1 - b1**t
        rectify = rho > 5
        safe = jnp.where(rectify, rho, 5.0)
        rect = jnp.sqrt((safe - 4) * (safe - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * safe))

        def one(m: Any, v: Any) -> Any:
            m_hat = m / bc1.astype(m.dtype)
            adaptive = (rect * jnp.sqrt(bc2)).astype(v.dtype) / (jnp.sqrt(v) + eps)
            return jnp.where(rectify, m_hat * adaptive, m_hat)

        return jax.tree.map(one, moments.mu, moments.nu), moments

    return optax.GradientTransformation(zero_moments, update)


class RAdam(TorchOptimizer):
    """RAdam (``torch.optim.RAdam``), with optional decoupled weight decay.

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        betas: decay rates of the first and second moment averages.
        eps: added to the denominator, outside the square root.
        weight_decay: L2 penalty (decoupled, as AdamW, with
            ``decoupled_weight_decay=True``).
        decoupled_weight_decay: apply weight decay as AdamW does.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        capturable: accepted for PyTorch compatibility.
        differentiable: must be False.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.RAdam([w], lr=0.1)
    >>> w.grad = jnp.array([1.0, -2.0])
    >>> opt.step()
    >>> [round(v, 4) for v in w.data.tolist()]  # not rectified yet: -lr * m_hat
    [-0.1, 0.2]
    """

    _hyper = (LR, ("beta1", "betas", 0), ("eps", "eps", None), WEIGHT_DECAY)
    _state_names = moment_names("radam")
    _state_order = ("step", "exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ):
        _check(lr, betas, eps, weight_decay)
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "decoupled_weight_decay": decoupled_weight_decay,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return (*frame(group, decoupled=True), ("beta2", float(group["betas"][1])))

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        return torch_chain(cfg, hp, ("radam", scale_by_radam(hp["beta1"], cfg["beta2"], hp["eps"])))
