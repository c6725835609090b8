"""``SparseAdam``: PyTorch's Adam for sparse gradients, with absent rows read off zeros.

PyTorch's ``SparseAdam`` takes the sparse gradient ``Embedding(sparse=True)``
produces (the rows looked up, coalesced) and updates the moments and the
parameter only on those rows; every other row, moments included, is left
alone. Its step count moves on every step the parameter has a gradient::

    step += 1
    exp_avg[rows]    += (1 - beta1) * (grad[rows] - exp_avg[rows])
    exp_avg_sq[rows] += (1 - beta2) * (grad[rows]**2 - exp_avg_sq[rows])
    param[rows] -= lr * sqrt(1 - beta2**step) / (1 - beta1**step)
                   * exp_avg[rows] / (sqrt(exp_avg_sq[rows]) + eps)

JAX has no sparse gradients: a gradient is dense, and the rows PyTorch's
sparse gradient leaves out are exactly zero in it. So a row (a slice along
the first dimension) whose gradient is entirely zero counts as absent.

The arithmetic is optax's ``scale_by_adam`` on every row, with the rows
that are absent put back as they were (moments and parameter). PyTorch adds
``eps`` to ``sqrt(exp_avg_sq)`` before the bias correction ``sqrt(1 -
beta2**step)`` applies, where optax adds it after: optax's ``eps`` is passed
as ``eps / sqrt(1 - beta2**step)``, which is the same update. Around it,
:func:`~jmodule.optim._transforms.torch_chain` (maximize, the learning rate).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jmodule.optim._transforms import LR, frame, moment_names, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["SparseAdam", "present_rows"]


def present_rows(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` on the rows of the gradient that are not entirely zero; the others kept.

    The state leaves shaped like the gradient keep their old rows where the
    gradient's row is zero, the update there is zero; other leaves (step
    counts) advance as ``tx`` advances them.

    >>> import jax.numpy as jnp, optax
    >>> tx = present_rows(optax.scale_by_adam())
    >>> g = jnp.array([[1.0, 2.0], [0.0, 0.0]])
    >>> updates, _ = tx.update(g, tx.init(g))
    >>> updates.tolist()[1]
    [0.0, 0.0]
    """

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        keep = jnp.any(updates != 0, axis=tuple(range(1, updates.ndim)))
        keep = keep.reshape(keep.shape + (1,) * max(updates.ndim - 1, 0))
        new_updates, new_state = tx.update(updates, state, params)

        def select(new: Any, old: Any) -> Any:
            if getattr(new, "shape", None) != updates.shape:
                return new
            return jnp.where(keep, new, old)

        new_state = jax.tree_util.tree_map(select, new_state, state)
        return jnp.where(keep, new_updates, 0).astype(new_updates.dtype), new_state

    return optax.GradientTransformation(tx.init, update)


class SparseAdam(TorchOptimizer):
    """Adam on the rows a sparse gradient holds (``torch.optim.SparseAdam``).

    Made for ``Embedding``: the rows of ``.grad`` that are entirely zero are
    the rows a PyTorch sparse gradient leaves out, and their moments and
    values are left alone (see the module docs). Two differences, both from
    JAX having dense gradients only:

    * PyTorch raises for a dense gradient ("SparseAdam does not support dense
      gradients"); here every gradient is dense, so there is no such error,
      and an all-zero row of any gradient is skipped.
    * A looked-up row whose gradient sums to exactly zero is in PyTorch's
      sparse gradient (its moments decay) but skipped here.

    As in PyTorch, the ``step`` count moves on every step the parameter has a
    gradient, and ``state_dict()`` gives it as a Python int.

    Args:
        params: Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate (> 0).
        betas: decay rates of the first and second moment averages.
        eps: added to the denominator (> 0).
        maximize: maximise the objective instead of minimising it.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> emb = jm.nn.Embedding(3, 2)
    >>> before = emb.weight.data
    >>> opt = jm.optim.SparseAdam(emb.parameters(), lr=0.1)
    >>> _ = jm.backward(lambda: emb(jnp.array([0, 2])).sum())
    >>> opt.step()
    >>> bool((emb.weight.data[1] == before[1]).all())  # row 1 was not looked up
    True
    """

    _hyper = (LR, ("beta1", "betas", 0), ("eps", "eps", None))
    _state_names = moment_names("adam")
    _state_order = ("step", "exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        maximize: bool = False,
    ):
        if not 0.0 < lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "maximize": maximize}
        super().__init__(params, defaults)
        complex_params = [
            [i, j]
            for i, group in enumerate(self.param_groups)
            for j, p in enumerate(group["params"])
            if jnp.issubdtype(p.dtype, jnp.complexfloating)
        ]
        if complex_params:
            raise ValueError(
                f"Complex params at indices {complex_params}: SparseAdam does not support "
                "complex parameters"
            )

    def _structure(self, group: dict[str, Any]) -> tuple:
        # PyTorch's SparseAdam reads group.get("maximize", False): older groups lack it
        return (
            *frame({"maximize": False, **group}, decay=False),
            ("beta2", float(group["betas"][1])),
        )

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        b2 = cfg["beta2"]
        step = 1 if state is None else state["step"] + 1
        eps = hp["eps"] / jnp.sqrt(1 - b2**step)  # PyTorch's eps, before the bias correction
        return torch_chain(
            cfg, hp, ("adam", present_rows(optax.scale_by_adam(hp["beta1"], b2, eps)))
        )

    def _classify(self, cfg: tuple, dtype: Any) -> tuple | None:
        return None  # rows are per parameter: never packed flat with others

    def _packed_state(self, index: dict[int, int]) -> dict[str, Any]:
        out = super()._packed_state(index)
        for entry in out["state"].values():
            entry["step"] = int(entry["step"])  # PyTorch keeps SparseAdam's step as an int
        return out
