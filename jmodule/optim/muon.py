"""``Muon``: PyTorch's Muon (momentum, then Newton-Schulz orthogonalisation), 2-D only.

PyTorch (``torch.optim.Muon``), per 2-D parameter of shape ``(A, B)``::

    buf = buf.lerp(grad, 1 - momentum)           # momentum * buf + (1 - momentum) * grad
    u = grad.lerp(buf, momentum) if nesterov else buf
    O = NS(u)                                    # in bfloat16, see below
    param *= 1 - lr * weight_decay
    param -= lr * ratio * O                      # ratio from adjust_lr_fn and (A, B)

with ``ratio = sqrt(max(1, A / B))`` (``adjust_lr_fn=None`` or
``"original"``) or ``0.2 * sqrt(max(A, B))`` (``"match_rms_adamw"``).

``NS`` is ``ns_steps`` quintic Newton-Schulz iterations run in bfloat16
(whatever the parameter's dtype): ``X = u / max(||u||_F, eps)`` (the norm
summed in float32; ``X`` transposed when ``A > B``), then
``G = X X^T; X = a X + (b G + c G G) X``, each product accumulated in
float32 and rounded to bfloat16, the coefficients float32.

optax pieces: ``optax.ema(momentum, debias=False)`` is the buffer (PyTorch's
``momentum_buffer``); :func:`~jmodule.optim._transforms.torch_chain`'s
decoupled weight decay (always on, as in PyTorch) and learning rate give
``-lr * (ratio * O + weight_decay * param)``; Muon has no ``maximize``. The Newton-Schulz step
is written here, not ``optax.contrib.orthogonalize_via_newton_schulz``:
optax casts the coefficients to the input's dtype (bfloat16's 3.4375 for
3.4445) and divides by ``||u|| + eps``, which moves the result by ~1e-2 from
PyTorch's; this copy rounds where PyTorch's bfloat16 kernels round (with
``lax.reduce_precision``, which XLA keeps when it compiles), so it gives
PyTorch's bfloat16 values. Because one bfloat16 step in the input moves the
output by ~1e-2, the momentum is ``torch.lerp``'s formula too, with PyTorch's
``1 - momentum`` computed in Python (see ``_muon_momentum``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jmodule.optim._transforms import ALWAYS_DECOUPLED, LR, WEIGHT_DECAY, torch_chain
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["Muon", "zeropower_via_newtonschulz"]

EPS = 1e-7
DEFAULT_A = 3.4445
DEFAULT_B = -4.7750
DEFAULT_C = 2.0315
DEFAULT_NS_STEPS = 5


def zeropower_via_newtonschulz(
    grad: jax.Array, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> jax.Array:
    """PyTorch's Newton-Schulz orthogonalisation of a matrix, in bfloat16.

    Args:
        grad: a 2-D array.
        ns_coefficients: the quintic's ``(a, b, c)``.
        ns_steps: iterations (< 100).
        eps: the smallest norm divided by.

    Returns:
        A bfloat16 array of ``grad``'s shape, close to ``U V^T`` of its SVD.

    >>> import jax.numpy as jnp
    >>> out = zeropower_via_newtonschulz(jnp.eye(2) * 5, (3.4445, -4.775, 2.0315), 5, 1e-7)
    >>> out.dtype
    dtype(bfloat16)
    """
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if grad.ndim != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = (jnp.float32(v) for v in ns_coefficients)
    f32 = jnp.float32

    def bf16(v: jax.Array) -> jax.Array:
        # A float32 array rounded to bfloat16's values. ``reduce_precision``, not a
        # cast there and back, which XLA may fold away when compiling.
        return jax.lax.reduce_precision(v, exponent_bits=8, mantissa_bits=7)

    def mm(p: jax.Array, q: jax.Array) -> jax.Array:  # float32 products, never TF32
        return jnp.matmul(p, q, precision=jax.lax.Precision.HIGHEST)

    x = bf16(grad).astype(f32)  # one rounding, from float64 too
    tall = grad.shape[0] > grad.shape[1]
    if tall:
        x = x.T
    norm = bf16(jnp.sqrt(jnp.sum(jnp.square(x))))  # summed in float32, as torch's
    x = bf16(x / jnp.maximum(norm, bf16(jnp.asarray(eps, f32))))
    for _ in range(ns_steps):
        gram = bf16(mm(x, x.T))
        gram_update = bf16(b * gram + c * mm(gram, gram))
        x = bf16(a * x + mm(gram_update, x))
    x = x.astype(jnp.bfloat16)
    return x.T if tall else x


def _adjust_ratio(adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


def _lerp(start: Any, end: Any, weight: Any) -> Any:
    """``torch.lerp``'s formula (its rounding: the update is cast to bfloat16 next)."""
    return jnp.where(
        weight < 0.5, start + weight * (end - start), end - (end - start) * (1 - weight)
    )


def _muon_momentum(momentum: Any, complement: Any, nesterov: bool) -> optax.GradientTransformation:
    """PyTorch's buffer ``buf.lerp_(grad, 1 - momentum)``, then ``grad.lerp(buf, momentum)``.

    The state is ``optax.ema``'s (``ema`` is the buffer), but the arithmetic is
    ``torch.lerp``'s: optax's ``(1 - m) * grad + m * buf`` rounds differently
    in the last bit, and a last-bit difference changes which bfloat16 the
    Newton-Schulz step starts from, which moves its result by ~1e-2.
    """
    ema = optax.ema(momentum, debias=False)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        buf = _lerp(state.ema, updates, complement).astype(state.ema.dtype)
        new_state = state._replace(count=optax.safe_int32_increment(state.count), ema=buf)
        if nesterov:
            return _lerp(updates, buf, momentum), new_state
        return buf, new_state

    return optax.GradientTransformation(ema.init, update)


def _orthogonalize(
    ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float, adjust_lr_fn: Any
) -> optax.GradientTransformation:
    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        if updates.ndim != 2:
            raise ValueError("Param gradient must be a 2D matrix")
        ortho = zeropower_via_newtonschulz(updates, ns_coefficients, ns_steps, eps)
        ratio = _adjust_ratio(adjust_lr_fn, updates.shape)
        return ortho.astype(updates.dtype) * jnp.asarray(ratio, updates.dtype), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class Muon(TorchOptimizer):
    """Muon (``torch.optim.Muon``): orthogonalised momentum for 2-D weights.

    Momentum (optionally Nesterov), then the Newton-Schulz orthogonalisation
    in bfloat16 as PyTorch runs it, decoupled weight decay and a learning
    rate scaled by the matrix's shape (see the module docs). Only 2-D
    parameters: give biases, embeddings and the like to another optimizer
    (AdamW), as PyTorch's docs advise.

    Args:
        params: 2-D Parameters, ``(name, Parameter)`` pairs, or param-group dicts.
        lr: learning rate.
        weight_decay: decoupled weight decay (``param *= 1 - lr * weight_decay``).
        momentum: momentum factor.
        nesterov: Nesterov momentum.
        ns_coefficients: the Newton-Schulz quintic's ``(a, b, c)``.
        eps: the smallest norm the update is divided by.
        ns_steps: Newton-Schulz iterations.
        adjust_lr_fn: ``None`` / ``"original"`` (``sqrt(max(1, A / B))``) or
            ``"match_rms_adamw"`` (``0.2 * sqrt(max(A, B))``).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.zeros((2, 2)))
    >>> opt = jm.optim.Muon([w], lr=0.1)
    >>> w.grad = jnp.eye(2)
    >>> opt.step()
    >>> [round(v, 1) for v in w.data[0].tolist()]
    [-0.1, 0.0]
    """

    _hyper = (
        LR,
        WEIGHT_DECAY,
        ("momentum", "momentum", None),
        ("1-momentum", "momentum", "1-"),  # PyTorch's Python float 1 - momentum
    )
    _state_names = {("momentum", "ema"): "momentum_buffer"}
    _state_order = ("momentum_buffer",)
    _elementwise = False  # matrix products (Newton-Schulz)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (DEFAULT_A, DEFAULT_B, DEFAULT_C),
        eps: float = EPS,
        ns_steps: int = DEFAULT_NS_STEPS,
        adjust_lr_fn: str | None = None,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn is not None and adjust_lr_fn not in ["original", "match_rms_adamw"]:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": ns_coefficients,
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(
                        "Muon only supports 2D parameters whereas we found a parameter with "
                        f"size: torch.Size({list(p.shape)})"
                    )

    def _hyper_floats(self, group: dict[str, Any]) -> tuple[float, ...]:
        return tuple(
            1 - float(group[k]) if j == "1-" else float(group[k]) for _, k, j in self._hyper
        )

    def _structure(self, group: dict[str, Any]) -> tuple:
        return (
            *ALWAYS_DECOUPLED,  # PyTorch's Muon decays even by 0
            ("nesterov", bool(group["nesterov"])),
            ("ns_coefficients", tuple(float(v) for v in group["ns_coefficients"])),
            ("eps", float(group["eps"])),
            ("ns_steps", int(group["ns_steps"])),
            ("adjust_lr_fn", group["adjust_lr_fn"]),
        )

    @classmethod
    def _transformation(
        cls, cfg: dict[str, Any], hp: dict[str, Any], state: dict[str, Any] | None
    ) -> optax.GradientTransformation:
        ortho = _orthogonalize(
            cfg["ns_coefficients"], cfg["ns_steps"], cfg["eps"], cfg["adjust_lr_fn"]
        )
        buffer = _muon_momentum(hp["momentum"], hp["1-momentum"], cfg["nesterov"])
        return torch_chain(cfg, hp, ("momentum", buffer), ("orthogonalize", ortho))

    def _classify(self, cfg: tuple, dtype: Any) -> tuple | None:
        return None  # each matrix is orthogonalised whole: never packed flat with others
