"""``Adam`` and ``AdamW``: PyTorch's Adam family, as optax chains.

optax's ``scale_by_adam`` is PyTorch's Adam update exactly: the same moment
updates, bias corrections and ``eps`` added outside the square root of the
bias-corrected second moment (optax's ``eps_root``, inside the root, stays
0). Around it, :func:`~jmodule.optim._transforms.torch_chain`:

* ``maximize`` negates the gradient first, as PyTorch does.
* Adam's ``weight_decay`` is L2 added to the gradient (before the Adam
  scaling); AdamW's (and ``decoupled_weight_decay=True``) is
  ``param *= 1 - lr * weight_decay``, which is the same piece after the Adam
  scaling and before the learning rate: ``-lr * (adam + wd * param)``.
* ``amsgrad`` differs: PyTorch keeps the running maximum of the *raw* second
  moment and bias-corrects it with the current step,
  ``m_hat / (sqrt(max_v) / sqrt(bc2) + eps)``; ``optax.scale_by_amsgrad``
  takes the maximum of the bias-corrected moments. With
  ``bias_correction_nu=False`` optax keeps PyTorch's raw maximum
  (``max_exp_avg_sq``), and ``m_hat / (sqrt(max_v) / s + eps)`` with
  ``s = sqrt(bc2)`` equals ``s * m_hat / (sqrt(max_v) + eps * s)``: so the
  chain passes ``eps * s`` as optax's ``eps`` and scales by ``s`` after, ``s``
  computed from the parameter's step count.

The hyper-parameters are arrays (float32, float64 for a float64 group; a
compiled step reads them as inputs, so schedulers never recompile it), except
``betas[1]``: float32
cannot hold ``1 - 0.999`` closely (1.3e-5 off, which shows in
``exp_avg_sq``), so it is a compile-time constant, as no scheduler changes it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax

from jmodule.optim._transforms import LR, WEIGHT_DECAY, frame, moment_names, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["Adam", "AdamW"]


class Adam(TorchOptimizer):
    """Adam (``torch.optim.Adam``), with optional AMSGrad and decoupled weight decay.

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        betas: decay rates of the first and second moment averages.
        eps: added to the denominator, outside the square root.
        weight_decay: L2 penalty (decoupled, as AdamW, with
            ``decoupled_weight_decay=True``).
        amsgrad: use the maximum of past second moments.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        capturable: accepted for PyTorch compatibility (compiled steps always
            keep the step count on the device).
        differentiable: must be False.
        fused: accepted for PyTorch compatibility.
        decoupled_weight_decay: apply weight decay as AdamW does.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.Adam([w], lr=0.1)
    >>> w.grad = jnp.array([1.0, -2.0])
    >>> opt.step()
    >>> [round(v, 4) for v in w.data.tolist()]  # -lr * sign(grad) on the first step
    [-0.1, 0.1]
    """

    _hyper = (LR, ("beta1", "betas", 0), ("eps", "eps", None), WEIGHT_DECAY)
    _state_names = {**moment_names("adam"), ("adam", "nu_max"): "max_exp_avg_sq"}
    _state_order = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ):
        _check(lr, betas, eps, weight_decay)
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
            "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return (
            *frame(group, decoupled=True),
            ("amsgrad", bool(group["amsgrad"])),
            ("beta2", float(group["betas"][1])),
        )

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        b1, b2, eps = hp["beta1"], cfg["beta2"], hp["eps"]
        if not cfg["amsgrad"]:
            return torch_chain(cfg, hp, ("adam", optax.scale_by_adam(b1, b2, eps)))
        step = 1 if state is None else state["step"] + 1
        s = jnp.sqrt(1 - b2**step)
        amsgrad = optax.scale_by_amsgrad(b1, b2, eps * s, bias_correction_nu=False)
        return torch_chain(cfg, hp, ("adam", amsgrad), ("bias_correction2", optax.scale(s)))


class AdamW(Adam):
    """AdamW (``torch.optim.AdamW``): Adam with decoupled weight decay.

    Same options as :class:`Adam` (``weight_decay`` defaults to 0.01 and is
    always decoupled: ``param *= 1 - lr * weight_decay`` each step).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.ones(2))
    >>> opt = jm.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    >>> w.grad = jnp.zeros(2)
    >>> opt.step()
    >>> w.data
    Array([0.95, 0.95], dtype=float32)
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )


def _check(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
