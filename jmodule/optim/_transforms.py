"""The pieces PyTorch's optimizers are composed of, each written once, as optax composes.

Every PyTorch optimizer (``torch.optim``) wraps its own scaling of the
gradient in the same frame, per parameter::

    g = -grad if maximize else grad           negate             ("maximize")
    g = g + weight_decay * param              L2 weight decay    ("weight_decay")
    u = scaling(g)                            the optimizer's own arithmetic
    u = u + weight_decay * param              decoupled decay    ("weight_decay")
    param -= lr * u                           the learning rate  ("lr")

(AdamW's ``param *= 1 - lr * weight_decay`` is the decoupled line:
``-lr * (u + weight_decay * param)``.) :func:`torch_chain` builds that frame
around an optimizer's scaling steps as one ``optax.named_chain``, so each
optimizer is ``torch_chain(cfg, hp, ("adam", optax.scale_by_adam(...)))``, the
way optax writes ``chain(scale_by_adam, add_decayed_weights, scale_by_lr)``.
Which frame pieces a param group gets is its structure (:func:`frame`, part of
the optimizer's ``_structure``): ``maximize``, ``decay`` (a nonzero
``weight_decay``) and ``decoupled``. The float options the pieces read are
hyper-parameter arrays (:data:`LR`, :data:`WEIGHT_DECAY`, entries of an
optimizer's ``_hyper``), so a scheduler changing them never recompiles.

The other shared pieces: :func:`momentum` (``optax.trace``: SGD's and
RMSprop's ``momentum_buffer``), :func:`count_steps` (PyTorch's ``step`` for
a chain that keeps no count), and the Adam moments NAdam and RAdam update
(:func:`zero_moments`, :func:`adam_moments`: optax's ``ScaleByAdamState``,
named by :func:`moment_names`).

The names of the steps are the first part of the optax state's leaf paths, and
so of the names the optimizers map to PyTorch's (``("adam", "mu")`` is
``exp_avg``); the frame's pieces keep no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import optax

__all__ = [
    "ALWAYS_DECOUPLED",
    "LR",
    "WEIGHT_DECAY",
    "Step",
    "adam_moments",
    "count_steps",
    "frame",
    "learning_rate",
    "moment_names",
    "momentum",
    "negate",
    "torch_chain",
    "weight_decay",
    "zero_moments",
]

#: One named step of an optimizer's chain: ``(label, transformation)``.
Step = tuple[str, optax.GradientTransformation]

#: The ``_hyper`` entry of the group's ``lr`` (``hp["lr"]``, which :func:`learning_rate` reads).
LR = ("lr", "lr", None)
#: The ``_hyper`` entry of the weight decay, which :func:`weight_decay` reads.
WEIGHT_DECAY = ("weight_decay", "weight_decay", None)


def frame(
    group: Mapping[str, Any], *, decay: bool = True, decoupled: bool = False
) -> tuple[tuple[str, Any], ...]:
    """The structure entries saying which of the frame's pieces a param group gets.

    Args:
        group: the param group (its options; ``maximize`` is always one).
        decay: the optimizer has a ``weight_decay`` option (``("decay", nonzero)``).
        decoupled: it has a ``decoupled_weight_decay`` option (``("decoupled", bool)``).

    Returns:
        The entries, to start the optimizer's ``_structure`` with.

    >>> frame({"maximize": True, "weight_decay": 0.0})
    (('maximize', True), ('decay', False))
    """
    entries: list[tuple[str, Any]] = [("maximize", bool(group["maximize"]))]
    if decay:
        entries.append(("decay", group["weight_decay"] != 0))
    if decoupled:
        entries.append(("decoupled", bool(group["decoupled_weight_decay"])))
    return tuple(entries)


#: The structure entries of an optimizer that always decays, decoupled, even by 0 (Muon).
ALWAYS_DECOUPLED = (("decay", True), ("decoupled", True))


def negate() -> Step:
    """PyTorch's ``maximize``: the gradient negated, before anything else reads it.

    >>> import jax.numpy as jnp
    >>> name, tx = negate()
    >>> name, tx.update(jnp.array([1.0, -2.0]), tx.init(None))[0].tolist()
    ('maximize', [-1.0, 2.0])
    """
    return "maximize", optax.scale(-1.0)


def weight_decay(hp: Mapping[str, Any]) -> Step:
    """``update + weight_decay * param``: L2 before the scaling, decoupled after it.

    Args:
        hp: the hyper-parameters (``hp["weight_decay"]``, see :data:`WEIGHT_DECAY`).

    >>> import jax.numpy as jnp
    >>> _, tx = weight_decay({"weight_decay": 0.5})
    >>> tx.update(jnp.ones(2), tx.init(None), jnp.full(2, 4.0))[0].tolist()
    [3.0, 3.0]
    """
    return "weight_decay", optax.add_decayed_weights(hp["weight_decay"])


def learning_rate(hp: Mapping[str, Any]) -> Step:
    """The last step: ``-lr`` times the update (``optax.scale_by_learning_rate``).

    Args:
        hp: the hyper-parameters (``hp["lr"]``, see :data:`LR`).

    >>> import jax.numpy as jnp
    >>> _, tx = learning_rate({"lr": 0.5})
    >>> tx.update(jnp.ones(2), tx.init(None))[0].tolist()
    [-0.5, -0.5]
    """
    return "lr", optax.scale_by_learning_rate(hp["lr"])


def momentum(hp: Mapping[str, Any], nesterov: bool = False) -> Step:
    """PyTorch's ``momentum_buffer``: ``buf = momentum * buf + g`` (``optax.trace``).

    The buffer starts at zero, so its first value is ``g``, as PyTorch's.
    With ``nesterov`` the update is ``g + momentum * buf``, else ``buf``.

    Args:
        hp: the hyper-parameters (``hp["momentum"]``).
        nesterov: Nesterov momentum.

    >>> import jax.numpy as jnp
    >>> _, tx = momentum({"momentum": 0.5})
    >>> state = tx.init(jnp.zeros(1))
    >>> for _ in range(2):
    ...     update, state = tx.update(jnp.ones(1), state)
    >>> update.tolist()
    [1.5]
    """
    return "momentum", optax.trace(hp["momentum"], nesterov=nesterov)


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


def adam_moments(updates: Any, state: Any, b1: Any, b2: Any) -> optax.ScaleByAdamState:
    """Adam's moments one step on: ``step + 1``, ``exp_avg`` and ``exp_avg_sq`` updated.

    ``exp_avg = b1 * exp_avg + (1 - b1) * g`` and ``exp_avg_sq = b2 *
    exp_avg_sq + (1 - b2) * g**2`` (optax's ``update_moment``), as PyTorch's
    Adam, NAdam and RAdam update them. ``state`` has optax's
    ``ScaleByAdamState`` fields (``count``, ``mu``, ``nu``), fresh from
    :func:`zero_moments`.

    >>> import jax.numpy as jnp
    >>> g = jnp.array([2.0])
    >>> state = adam_moments(g, zero_moments(g), 0.5, 0.75)
    >>> int(state.count), state.mu.tolist(), state.nu.tolist()
    (1, [1.0], [1.0])
    """
    return optax.ScaleByAdamState(
        count=optax.safe_increment(state.count),
        mu=optax.tree.update_moment(updates, state.mu, b1, 1),
        nu=optax.tree.update_moment(updates, state.nu, b2, 2),
    )


def zero_moments(params: Any) -> optax.ScaleByAdamState:
    """Fresh Adam moments: ``step`` 0 and zero ``exp_avg``, ``exp_avg_sq`` (optax's init).

    >>> import jax.numpy as jnp
    >>> zero_moments(jnp.ones(2)).nu.tolist()
    [0.0, 0.0]
    """
    return optax.scale_by_adam().init(params)


def moment_names(label: str) -> dict[tuple[str, str], str]:
    """PyTorch's names of the Adam moments of the chain step ``label`` (``_state_names``).

    >>> moment_names("radam")[("radam", "mu")]
    'exp_avg'
    """
    return {(label, "count"): "step", (label, "mu"): "exp_avg", (label, "nu"): "exp_avg_sq"}


def torch_chain(
    cfg: Mapping[str, Any],
    hp: Mapping[str, Any],
    *scaling: Step,
    first: Sequence[Step] = (),
    lr: bool = True,
) -> optax.GradientTransformation:
    """An optimizer's scaling steps in PyTorch's frame, as one ``optax.named_chain``.

    In order: ``first`` (steps that pass the gradient through, such as
    :func:`count_steps`), :func:`negate` (``cfg["maximize"]``), L2
    :func:`weight_decay` (``cfg["decay"]`` and not ``cfg["decoupled"]``),
    ``scaling``, decoupled :func:`weight_decay` (``cfg["decay"]`` and
    ``cfg["decoupled"]``), :func:`learning_rate`. A ``cfg`` key that is
    absent is False (the optimizer has no such option).

    Args:
        cfg: the param group's structure (the optimizer's ``_structure``, see :func:`frame`).
        hp: the hyper-parameters.
        *scaling: the optimizer's own steps.
        first: steps before the frame.
        lr: end with the learning rate (False where the scaling applies it itself).

    Returns:
        The chain of one parameter.

    >>> import jax.numpy as jnp
    >>> tx = torch_chain({"maximize": True, "decay": True}, {"lr": 0.5, "weight_decay": 1.0})
    >>> p = jnp.array([2.0])
    >>> tx.update(jnp.array([1.0]), tx.init(p), p)[0].tolist()  # -lr * (-g + wd * p)
    [-0.5]
    """
    decay = cfg.get("decay", False)
    decoupled = cfg.get("decoupled", False)
    steps = list(first)
    if cfg.get("maximize", False):
        steps.append(negate())
    if decay and not decoupled:
        steps.append(weight_decay(hp))
    steps.extend(scaling)
    if decay and decoupled:
        steps.append(weight_decay(hp))
    if lr:
        steps.append(learning_rate(hp))
    return optax.named_chain(*steps)
