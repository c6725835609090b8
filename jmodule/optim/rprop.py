"""``Rprop``: PyTorch's resilient backpropagation.

PyTorch, per parameter (``step_size`` starts at ``lr`` on the first step)::

    g = -grad if maximize else grad
    s = sign(g * prev)
    step_size = clamp(step_size * (etaplus if s > 0 else etaminus if s < 0 else 1),
                      step_size_min, step_size_max)
    g = 0 where s < 0
    param -= sign(g) * step_size
    prev = g

``optax.scale_by_rprop`` is the same idea with different arithmetic and
state: it leaves a step size alone (unclamped) where ``s == 0``, where
PyTorch multiplies it by 1 and clamps it, so the first step differs whenever
``lr`` lies outside ``step_sizes``; and its state keeps the previous
*update* (``step_size * sign(g)``) where PyTorch's ``prev`` keeps the
(masked) gradient, so PyTorch's state dict could not be loaded into it. So
:func:`scale_by_rprop` is a small optax transformation with PyTorch's
arithmetic and state (``prev``, ``step_size``), giving the full update
(``-sign(g) * step_size``: ``lr`` is only the first step size). ``etas``
are ``(etaminus, etaplus)`` and ``step_sizes`` ``(min, max)``, as in
PyTorch (optax's arguments are ``eta_minus, eta_plus, min_step_size,
max_step_size``). ``maximize`` is :func:`~jmodule.optim._transforms.torch_chain`'s.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jmodule.optim._transforms import LR, frame, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["Rprop", "ScaleByRpropState", "scale_by_rprop"]


class ScaleByRpropState(NamedTuple):
    """State of :func:`scale_by_rprop`: PyTorch's ``step``, ``prev`` and ``step_size``."""

    count: jax.Array
    prev: optax.Updates
    step_size: optax.Updates


def scale_by_rprop(
    lr: Any = 1e-2,
    etaminus: Any = 0.5,
    etaplus: Any = 1.2,
    step_size_min: Any = 1e-6,
    step_size_max: Any = 50.0,
) -> optax.GradientTransformation:
    """PyTorch's Rprop update as an optax transformation (the update, ``lr`` included).

    >>> import jax.numpy as jnp
    >>> tx = scale_by_rprop(lr=0.5)
    >>> state = tx.init(jnp.zeros(2))
    >>> updates, state = tx.update(jnp.array([1.0, -2.0]), state)
    >>> updates.tolist()
    [-0.5, 0.5]
    >>> updates, state = tx.update(jnp.array([1.0, 2.0]), state)  # same sign, sign change
    >>> [round(v, 4) for v in state.step_size.tolist()]
    [0.6, 0.25]
    """

    def init(params: Any) -> ScaleByRpropState:
        return ScaleByRpropState(
            count=jnp.zeros([], jnp.int32),
            prev=optax.tree.zeros_like(params),
            step_size=optax.tree.zeros_like(params),  # lr, set on the first step
        )

    def update(updates: Any, state: ScaleByRpropState, params: Any = None) -> tuple:
        del params
        first = state.count == 0

        def one(g: Any, prev: Any, size: Any) -> tuple:
            size = jnp.where(first, jnp.asarray(lr, size.dtype), size)
            s = jnp.sign(g * prev)
            factor = jnp.where(s > 0, etaplus, jnp.where(s < 0, etaminus, 1))
            size = jnp.clip(size * factor.astype(size.dtype), step_size_min, step_size_max)
            g = jnp.where(s < 0, jnp.zeros_like(g), g)
            return -jnp.sign(g) * size, g, size.astype(g.dtype)

        out = jax.tree.map(one, updates, state.prev, state.step_size)
        pick = lambda k: jax.tree.map(lambda _, o: o[k], updates, out)
        count = optax.safe_increment(state.count)
        return pick(0), ScaleByRpropState(count, pick(1), pick(2))

    return optax.GradientTransformation(init, update)


class Rprop(TorchOptimizer):
    """Rprop (``torch.optim.Rprop``).

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: the first step size of every element.
        etas: ``(etaminus, etaplus)``: the factors a step size is multiplied by
            when the gradient's sign flips, and when it holds.
        step_sizes: ``(min, max)`` step sizes.
        capturable: accepted for PyTorch compatibility.
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros(2))
    >>> opt = jm.optim.Rprop([w], lr=0.1)
    >>> for _ in range(2):
    ...     w.grad = jnp.array([1.0, -3.0])
    ...     opt.step()
    >>> [round(v, 4) for v in w.data.tolist()]  # 0.1, then 0.1 * etaplus
    [-0.22, 0.22]
    """

    _hyper = (
        LR,
        ("etaminus", "etas", 0),
        ("etaplus", "etas", 1),
        ("step_size_min", "step_sizes", 0),
        ("step_size_max", "step_sizes", 1),
    )
    _state_names = {
        ("rprop", "count"): "step",
        ("rprop", "prev"): "prev",
        ("rprop", "step_size"): "step_size",
    }
    _state_order = ("step", "prev", "step_size")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50),
        *,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        defaults = {
            "lr": lr,
            "etas": tuple(etas),
            "step_sizes": tuple(step_sizes),
            "foreach": foreach,
            "maximize": maximize,
            "differentiable": differentiable,
            "capturable": capturable,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return frame(group, decay=False)

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        rprop = scale_by_rprop(
            hp["lr"], hp["etaminus"], hp["etaplus"], hp["step_size_min"], hp["step_size_max"]
        )
        return torch_chain(cfg, hp, ("rprop", rprop), lr=False)
