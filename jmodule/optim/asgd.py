"""``ASGD``: PyTorch's averaged stochastic gradient descent.

PyTorch, per parameter (``eta`` starts at ``lr``, ``mu`` at 1; both are
float32 scalars in the state, as PyTorch's scalar dtype)::

    g = -grad if maximize else grad;  g = g + weight_decay * param
    param *= 1 - lambd * eta
    param -= eta * g
    ax = param if mu == 1 else ax + mu * (param - ax)
    eta = lr / (1 + lambd * lr * step) ** alpha
    mu = 1 / max(1, step - t0)

optax has no averaged SGD, so :func:`scale_by_asgd` is a small optax
transformation with PyTorch's arithmetic, giving the full update (``lr`` and
the ``lambd`` decay included), after
:func:`~jmodule.optim._transforms.torch_chain`'s maximize and L2 weight decay.
The step uses the ``eta`` in the state
(float32, so a float64 parameter moves by float32's ``lr`` on its first
step, as in PyTorch); the new ``eta`` comes from the group's current ``lr``.
The averaged parameters are ``opt.state[p]["ax"]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jmodule.optim._transforms import LR, WEIGHT_DECAY, frame, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["ASGD", "ScaleByASGDState", "scale_by_asgd"]


class ScaleByASGDState(NamedTuple):
    """State of :func:`scale_by_asgd`: PyTorch's ``step``, ``eta``, ``mu`` and ``ax``."""

    count: jax.Array
    eta: jax.Array
    mu: jax.Array
    ax: optax.Updates


def scale_by_asgd(
    lr: Any = 1e-2, lambd: Any = 1e-4, alpha: Any = 0.75, t0: Any = 1e6
) -> optax.GradientTransformation:
    """PyTorch's ASGD update as an optax transformation (needs the parameters).

    >>> import jax.numpy as jnp
    >>> tx = scale_by_asgd(lr=0.5, lambd=0.0)
    >>> params = jnp.ones(2)
    >>> updates, state = tx.update(jnp.array([1.0, -2.0]), tx.init(params), params)
    >>> updates.tolist(), state.ax.tolist()
    ([-0.5, 1.0], [0.5, 2.0])
    """

    def init(params: Any) -> ScaleByASGDState:
        return ScaleByASGDState(
            count=jnp.zeros([], jnp.int32),
            eta=jnp.zeros([], jnp.float32),  # lr, set on the first step
            mu=jnp.ones([], jnp.float32),
            ax=optax.tree.zeros_like(params),
        )

    def update(updates: Any, state: ScaleByASGDState, params: Any = None) -> tuple:
        if params is None:
            raise ValueError("scale_by_asgd needs the parameters: tx.update(grads, state, params)")
        dtype = jnp.result_type(lr, lambd, float)
        eta = jnp.where(state.count == 0, jnp.asarray(lr).astype(jnp.float32), state.eta)
        eta_value = eta.astype(dtype)

        def one(g: Any, p: Any, ax: Any) -> tuple:
            new = p * (1 - lambd * eta_value).astype(p.dtype) - eta_value.astype(p.dtype) * g
            mu = state.mu.astype(p.dtype)
            ax = jnp.where(state.mu == 1, new, ax + (new - ax) * mu)
            return new - p, ax

        out = jax.tree.map(one, updates, params, state.ax)
        pick = lambda k: jax.tree.map(lambda _, o: o[k], updates, out)
        count = optax.safe_increment(state.count)
        step = count.astype(dtype)
        new_eta = (lr / (1 + lambd * lr * step) ** alpha).astype(jnp.float32)
        new_mu = (1 / jnp.maximum(1, step - t0)).astype(jnp.float32)
        return pick(0), ScaleByASGDState(count, new_eta, new_mu, pick(1))

    return optax.GradientTransformation(init, update)


class ASGD(TorchOptimizer):
    """Averaged SGD (``torch.optim.ASGD``); the running average is ``state[p]["ax"]``.

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        lambd: decay term.
        alpha: power of the ``eta`` update.
        t0: the step at which averaging starts.
        weight_decay: L2 penalty added to the gradient.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False.
        capturable: accepted for PyTorch compatibility.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.ones(2))
    >>> opt = jm.optim.ASGD([w], lr=0.1, lambd=0.0, t0=0)
    >>> for _ in range(3):  # from step 2 on (t0=0), ax averages: (0.8 + 0.7) / 2
    ...     w.grad = jnp.ones(2)
    ...     opt.step()
    >>> [round(v, 4) for v in w.data.tolist()], [round(v, 4) for v in opt.state[w]["ax"].tolist()]
    ([0.7, 0.7], [0.75, 0.75])
    """

    _hyper = (
        LR,
        ("lambd", "lambd", None),
        ("alpha", "alpha", None),
        ("t0", "t0", None),
        WEIGHT_DECAY,
    )
    _state_names = {
        ("asgd", "count"): "step",
        ("asgd", "eta"): "eta",
        ("asgd", "mu"): "mu",
        ("asgd", "ax"): "ax",
    }
    _state_order = ("step", "eta", "mu", "ax")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = {
            "lr": lr,
            "lambd": lambd,
            "alpha": alpha,
            "t0": t0,
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
        asgd = scale_by_asgd(hp["lr"], hp["lambd"], hp["alpha"], hp["t0"])
        return torch_chain(cfg, hp, ("asgd", asgd), lr=False)
