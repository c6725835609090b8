"""``Adafactor``: PyTorch's Adafactor (``torch.optim.Adafactor``).

PyTorch, per parameter (``t`` the step; a parameter with two or more
dimensions keeps row and column factors of its second moment, over its last
two dimensions; a vector or scalar keeps the full ``variance``)::

    g = -grad if maximize else grad
    w = t ** beta2_decay                                (1 - beta2_t)
    rho = min(lr, 1 / sqrt(t))
    alpha = max(eps2, rms(param)) * rho
    param *= 1 - lr * weight_decay
    row_var += w * (mean(g**2, dim=-1) - row_var)       (matrices)
    col_var += w * (mean(g**2, dim=-2) - col_var)
    v = row_var * col_var / max(mean(row_var, dim=-2), eps1)
    variance += w * (g**2 - variance);  v = variance    (vectors)
    u = g / sqrt(max(v, eps1**2))
    param -= alpha / max(1, rms(u) / d) * u

(``eps1`` None is the parameter dtype's machine epsilon.) optax's
``adafactor`` / ``scale_by_factored_rms`` is a different algorithm in several
places: it factors only dimensions of at least 128 elements (PyTorch factors
every matrix, over its last two dimensions), adds its ``epsilon`` (1e-30) to
the squared gradient before averaging (PyTorch applies ``eps1`` only when it
divides by the row mean and when it takes the root), normalises the
factored estimate by the row mean clamped at nothing (PyTorch clamps it at
``eps1``), uses a decay ``1 - (t+1)**-0.8`` counted from zero, takes its
relative step size and parameter scale (``scale_by_param_block_rms``,
``min_dim_size_to_factor``) as separate pieces with their own epsilons, and
has no ``lr``-capped ``rho`` or ``lr``-scaled decoupled weight decay. So
:func:`scale_by_adafactor` is a small optax transformation with PyTorch's
arithmetic and state (``row_var``/``col_var`` or ``variance``), giving the
full update (its weight decay included: it is scaled by ``lr``, not by the
update's ``alpha``), after :func:`~jmodule.optim._transforms.torch_chain`'s
maximize.

Its state's shape depends on the parameter's (factored or not), so each
parameter's structure says which (``_param_structure``), and its state is
never packed: the update of one parameter reads its whole norm, which a
concatenation of small parameters would mix.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jmodule._lowering import state as _state
from jmodule.nn.parameter import Parameter
from jmodule.optim._transforms import LR, WEIGHT_DECAY, frame, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = [
    "Adafactor",
    "ScaleByAdafactorState",
    "ScaleByFactoredAdafactorState",
    "scale_by_adafactor",
]


class ScaleByFactoredAdafactorState(NamedTuple):
    """State of :func:`scale_by_adafactor` for a parameter of two or more dimensions."""

    count: jax.Array
    row_var: jax.Array
    col_var: jax.Array


class ScaleByAdafactorState(NamedTuple):
    """State of :func:`scale_by_adafactor` for a vector or a scalar."""

    count: jax.Array
    variance: jax.Array


def _rms(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(x * x)) / math.sqrt(max(x.size, 1))


def scale_by_adafactor(
    lr: Any = 1e-2,
    beta2_decay: Any = -0.8,
    eps1: float | None = None,
    eps2: Any = 1e-3,
    d: Any = 1.0,
    weight_decay: Any = 0.0,
) -> optax.GradientTransformation:
    """PyTorch's Adafactor update of one parameter (an array, not a pytree), as optax.

    Needs the parameter (its RMS scales the step); the update includes
    ``lr`` and the weight decay.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_adafactor()
    >>> params = jnp.ones((2, 3))
    >>> updates, state = tx.update(jnp.ones((2, 3)), tx.init(params), params)
    >>> [round(v, 4) for v in updates[0].tolist()], state.row_var.shape, state.col_var.shape
    ([-0.01, -0.01, -0.01], (2, 1), (1, 3))
    """

    def init(params: jax.Array) -> Any:
        count = jnp.zeros([], jnp.int32)
        if params.ndim > 1:
            row = (*params.shape[:-1], 1)
            col = (*params.shape[:-2], 1, params.shape[-1])
            return ScaleByFactoredAdafactorState(
                count, jnp.zeros(row, params.dtype), jnp.zeros(col, params.dtype)
            )
        return ScaleByAdafactorState(count, jnp.zeros_like(params))

    def update(g: jax.Array, state: Any, params: jax.Array | None = None) -> tuple:
        if params is None:
            raise ValueError(
                "scale_by_adafactor needs the parameters: tx.update(grads, state, params)"
            )
        dtype = params.dtype
        e1 = jnp.finfo(dtype).eps if eps1 is None else eps1
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.result_type(lr, beta2_decay, float))
        w = jnp.asarray(t**beta2_decay, dtype)
        rho = jnp.minimum(lr, 1 / jnp.sqrt(t))
        alpha = jnp.asarray(jnp.maximum(eps2, _rms(params)) * rho, dtype)
        g2 = g * g
        if params.ndim > 1:
            row_var = state.row_var + w * (jnp.mean(g2, axis=-1, keepdims=True) - state.row_var)
            col_var = state.col_var + w * (jnp.mean(g2, axis=-2, keepdims=True) - state.col_var)
            row_mean = jnp.mean(row_var, axis=-2, keepdims=True)
            v = row_var * col_var / jnp.maximum(row_mean, e1)
            new_state: Any = ScaleByFactoredAdafactorState(count, row_var, col_var)
        else:
            v = state.variance + w * (g2 - state.variance)
            new_state = ScaleByAdafactorState(count, v)
        u = g * jax.lax.rsqrt(jnp.maximum(v, e1 * e1))
        scale = alpha / jnp.asarray(jnp.maximum(1, _rms(u) / d), dtype)
        updates = -scale * u - jnp.asarray(lr * weight_decay, dtype) * params
        return updates, new_state

    return optax.GradientTransformation(init, update)


class Adafactor(TorchOptimizer):
    """Adafactor (``torch.optim.Adafactor``), PyTorch's variant (see the module docstring).

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: the cap of the relative step size ``min(lr, 1 / sqrt(step))``,
            and the scale of the weight decay.
        beta2_decay: the second moment's decay is ``1 - step ** beta2_decay``.
        eps: ``(eps1, eps2)``: ``eps1`` (None: the dtype's machine epsilon)
            guards the denominators, ``eps2`` is the smallest parameter scale.
        d: clipping threshold of the update's RMS.
        weight_decay: decoupled weight decay (``param *= 1 - lr * weight_decay``).
        foreach: accepted for PyTorch compatibility (XLA fuses the update).
        maximize: maximise the objective instead of minimising it.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.ones((2, 2)))
    >>> b = jm.nn.Parameter(jnp.ones(2))
    >>> opt = jm.optim.Adafactor([w, b])
    >>> w.grad, b.grad = jnp.ones((2, 2)), jnp.ones(2)
    >>> opt.step()
    >>> sorted(opt.state[w]), sorted(opt.state[b])
    (['col_var', 'row_var', 'step'], ['step', 'variance'])
    >>> round(float(w.data[0, 0]), 4)  # 1 - lr * rms(param) on the first step
    0.99
    """

    _hyper = (
        LR,
        ("beta2_decay", "beta2_decay", None),
        ("eps2", "eps", 1),
        ("d", "d", None),
        WEIGHT_DECAY,
    )
    _state_names = {
        ("adafactor", "count"): "step",
        ("adafactor", "row_var"): "row_var",
        ("adafactor", "col_var"): "col_var",
        ("adafactor", "variance"): "variance",
    }
    _state_order = ("step", "row_var", "col_var", "variance")
    _elementwise = False  # row and column reductions

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        beta2_decay: float = -0.8,
        eps: tuple[float | None, float] = (None, 1e-3),
        d: float = 1.0,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 >= beta2_decay:
            raise ValueError(f"beta2_decay should be <= 0 but is: {beta2_decay}")
        if eps[0] is not None and not 0.0 <= eps[0]:
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not 0.0 <= eps[1]:
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
        if not 1.0 <= d:
            raise ValueError(f"Clipping threshold d should be >= 1 but is: {d}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight_decay should be >= 0 but is: {weight_decay}")
        defaults = {
            "lr": lr,
            "beta2_decay": beta2_decay,
            "eps": tuple(eps),
            "d": d,
            "weight_decay": weight_decay,
            "foreach": foreach,
            "maximize": maximize,
        }
        super().__init__(params, defaults)

    def _structure(self, group: dict[str, Any]) -> tuple:
        eps1 = group["eps"][0]
        return (*frame(group, decay=False), ("eps1", None if eps1 is None else float(eps1)))

    def _param_structure(self, group: dict[str, Any], p: Parameter) -> tuple:
        return (*self._structure(group), ("factored", _state.peek(p).ndim > 1))

    def _classify(self, cfg: tuple, dtype: Any) -> None:
        return None  # never packed: each update reads its parameter's whole norm

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        adafactor = scale_by_adafactor(
            hp["lr"], hp["beta2_decay"], cfg["eps1"], hp["eps2"], hp["d"], hp["weight_decay"]
        )
        return torch_chain(cfg, hp, ("adafactor", adafactor), lr=False)
