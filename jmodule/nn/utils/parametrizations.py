"""Ready-made parametrizations, as ``torch.nn.utils.parametrizations``: ``orthogonal``,
``weight_norm`` and ``spectral_norm``, each registered with
:func:`~jmodule.nn.utils.parametrize.register_parametrization`.

State-dict keys and values are PyTorch's (``parametrizations.weight.original0``
/ ``original1`` for weight norm, ``parametrizations.weight.0._u`` / ``_v`` for
spectral norm, ``parametrizations.weight.0.base`` for orthogonal), so a
PyTorch model's ``state_dict()`` loads into the same jmodule model and back.

>>> import jmodule as jm
>>> m = jm.nn.utils.parametrizations.weight_norm(jm.nn.Linear(3, 2))
>>> list(m.state_dict())
['bias', 'parametrizations.weight.original0', 'parametrizations.weight.original1']
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Any

import jax
import jax.numpy as jnp

from jmodule import random as _random
from jmodule._lowering import state as _state
from jmodule.nn import functional as F
from jmodule.nn.modules.conv import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from jmodule.nn.modules.module import Module
from jmodule.nn.utils import parametrize

__all__ = ["orthogonal", "spectral_norm", "weight_norm"]


def _array(x: Any) -> Any:
    return _state.as_array(x)


def _mT(x: Any) -> Any:
    return jnp.swapaxes(x, -1, -2)


def _mH(x: Any) -> Any:
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _is_float_or_complex(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


# ----------------------------------------------------------------------------- orthogonal


def _householder_product(A: Any, tau: Any) -> Any:
    """``torch.linalg.householder_product``: the first ``k`` columns of
    ``H_1 ... H_k``, ``H_i = I - tau_i v_i v_i^H`` (``v_i``: column ``i`` of ``A``
    below the diagonal, 1 on it). Differentiable (JAX's primitive is not).

    One ``lax.scan`` over the reflectors, applied last to first to the first
    ``k`` columns of the identity. Measured on this CPU for a 64x32 matrix
    (value and gradient, jitted): about 4x faster than the compact WY form
    ``I - V T V^H`` (its triangular solve); an unrolled loop ran about as fast
    but took 30 s to compile.
    """
    n, k = A.shape[-2], A.shape[-1]
    V = jnp.tril(A, -1) + jnp.eye(n, k, dtype=A.dtype)
    Q = jnp.broadcast_to(jnp.eye(n, k, dtype=A.dtype), A.shape)

    def apply(Q: Any, column: tuple[Any, Any]) -> tuple[Any, None]:
        v, t = column  # (..., n), (...)
        w = jnp.einsum("...n,...nk->...k", jnp.conj(v), Q)
        return Q - t[..., None, None] * v[..., :, None] * w[..., None, :], None

    columns = (jnp.moveaxis(V, -1, 0), jnp.moveaxis(tau, -1, 0))
    Q, _ = jax.lax.scan(apply, Q, columns, reverse=True)
    return Q


def _is_orthogonal(Q: Any) -> Any:
    n, k = Q.shape[-2], Q.shape[-1]
    Id = jnp.eye(k, dtype=Q.dtype)
    eps = 10.0 * n * jnp.finfo(Q.dtype).eps
    return jnp.allclose(_mH(Q) @ Q, Id, rtol=1e-5, atol=eps)  # torch.allclose's rtol


def _make_orthogonal(A: Any) -> Any:
    """The Q factor of ``A = QR`` (``A`` tall) with ``diag(R)`` real and non-negative."""
    Q, R = jnp.linalg.qr(A)
    return Q * jnp.sign(jnp.diagonal(R, axis1=-2, axis2=-1))[..., None, :]


class _OrthMaps(Enum):
    matrix_exp = auto()
    cayley = auto()
    householder = auto()


class _Orthogonal(Module):
    """The orthogonal parametrization (see :func:`orthogonal`)."""

    base: Any

    def __init__(
        self, weight: Any, orthogonal_map: _OrthMaps, *, use_trivialization: bool = True
    ) -> None:
        super().__init__()
        if jnp.iscomplexobj(weight) and orthogonal_map == _OrthMaps.householder:
            raise ValueError("The householder parametrization does not support complex tensors.")
        self.shape = tuple(weight.shape)
        self.orthogonal_map = orthogonal_map
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, X: Any) -> Any:
        X = _array(X)
        n, k = X.shape[-2], X.shape[-1]
        transposed = n < k
        if transposed:
            X = _mT(X)
            n, k = k, n
        if self.orthogonal_map in (_OrthMaps.matrix_exp, _OrthMaps.cayley):
            X = jnp.tril(X)
            if n != k:
                zeros = jnp.zeros((*X.shape[:-2], n, n - k), X.dtype)
                X = jnp.concatenate([X, zeros], axis=-1)
            A = X - _mH(X)
            if self.orthogonal_map == _OrthMaps.matrix_exp:
                Q = jax.scipy.linalg.expm(A)
            else:
                Id = jnp.eye(n, dtype=A.dtype)
                Q = jnp.linalg.solve(Id - 0.5 * A, Id + 0.5 * A)
            if n != k:
                Q = Q[..., :k]
        else:
            A = jnp.tril(X, -1)
            tau = 2.0 / (1.0 + (A * A).sum(axis=-2))
            Q = _householder_product(A, tau)
            # ``.int()``: truncated towards zero, as PyTorch (no gradient through it)
            sign = jnp.diagonal(X, axis1=-2, axis2=-1).astype(jnp.int32)
            Q = Q * sign[..., None, :]
        if hasattr(self, "base"):
            Q = _array(self.base) @ Q
        if transposed:
            Q = _mT(Q)
        return Q

    def right_inverse(self, Q: Any) -> Any:
        """Store ``Q`` (orthogonal or not: it is orthogonalised) in this parametrization.

        With the trivialization, ``base`` becomes ``Q`` made orthogonal (its
        QR factor; a tall or wide ``Q`` is completed with random columns from
        jmodule's generator, where PyTorch draws from its own) and the
        original becomes ``-I``; without it, the original is ``Q``'s Householder
        reflectors. ``torch.no_grad`` in PyTorch: no gradient flows.

        Raises:
            ValueError: ``Q`` does not have the parametrized shape.
            NotImplementedError: matrix_exp/cayley without the trivialization.
        """
        Q = jax.lax.stop_gradient(_array(Q))
        if tuple(Q.shape) != self.shape:
            raise ValueError(
                "Expected a matrix or batch of matrices of shape "
                f"{parametrize._size(self.shape)}. "
                f"Got a tensor of shape {parametrize._size(Q.shape)}."
            )
        Q_init = Q
        n, k = Q.shape[-2], Q.shape[-1]
        transpose = n < k
        if transpose:
            Q = _mT(Q)
            n, k = k, n
        if not hasattr(self, "base"):
            if self.orthogonal_map in (_OrthMaps.cayley, _OrthMaps.matrix_exp):
                raise NotImplementedError(
                    "It is not possible to assign to the matrix exponential "
                    "or the Cayley parametrizations when use_trivialization=False."
                )
            H, tau = jnp.linalg.qr(Q, mode="raw")  # LAPACK's geqrf, transposed as NumPy's
            A = _mT(H)
            diag = jnp.sign(jnp.diagonal(A, axis1=-2, axis2=-1))
            diag = jnp.where(tau == 0.0, -diag, diag)
            eye = jnp.eye(n, k, dtype=bool)
            A = jnp.where(eye, diag[..., None, :], A)
            return _mT(A) if transpose else A
        if n == k:
            Q = jnp.where(_is_orthogonal(Q), Q, _make_orthogonal(Q))
        else:
            key = _random.next_key()
            N = jax.random.normal(key, (*Q.shape[:-2], n, n - k), Q.dtype)
            Q = _make_orthogonal(jnp.concatenate([Q, N], axis=-1))
        self.base = Q
        eye = jnp.eye(Q_init.shape[-2], Q_init.shape[-1], dtype=bool)
        return jnp.where(eye, jnp.asarray(-1, Q_init.dtype), jnp.zeros_like(Q_init))


def orthogonal(
    module: Module,
    name: str = "weight",
    orthogonal_map: str | None = None,
    *,
    use_trivialization: bool = True,
) -> Module:
    """Make ``module.<name>`` an orthogonal (or unitary) matrix, or a batch of them.

    As ``torch.nn.utils.parametrizations.orthogonal``: ``Q`` has orthonormal
    columns when it is tall (orthonormal rows when wide), computed from the
    original tensor by ``orthogonal_map``: ``"matrix_exp"`` (of a
    skew-symmetric matrix; ``jax.scipy.linalg.expm``), ``"cayley"``, or
    ``"householder"`` (a product of Householder reflectors). With
    ``use_trivialization`` (the default) an extra buffer
    ``parametrizations.<name>.0.base`` holds an orthogonal matrix that
    ``Q`` is relative to, as PyTorch's dynamic trivialization.

    The initial ``Q`` is the original tensor made orthogonal (its QR Q factor)
    when it is not already. A non-square weight with the trivialization is
    completed with random columns first: drawn from jmodule's generator
    (``jm.manual_seed``), so the ``base`` differs from PyTorch's draw; load
    PyTorch's ``state_dict()`` to get its values.

    Args:
        module: the module holding the tensor.
        name: the tensor to make orthogonal (at least 2-D). Default ``"weight"``.
        orthogonal_map: ``"matrix_exp"``, ``"cayley"`` or ``"householder"``.
            Default: ``"matrix_exp"`` for a square or complex matrix,
            ``"householder"`` otherwise (PyTorch's choice).
        use_trivialization: use the dynamic trivialization framework.

    Returns:
        ``module``, parametrized.

    Raises:
        ValueError: no such tensor, fewer than 2 dimensions, an unknown map,
            or householder on a complex tensor.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> m = jm.nn.utils.parametrizations.orthogonal(jm.nn.Linear(3, 3))
    >>> Q = m.weight
    >>> bool(jnp.allclose(Q.T @ Q, jnp.eye(3), atol=1e-5))
    True
    """
    weight = getattr(module, name, None)
    if not parametrize._is_tensor(weight):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if weight.ndim < 2:
        raise ValueError(
            f"Expected a matrix or batch of matrices. Got a tensor of {weight.ndim} dimensions."
        )
    if orthogonal_map is None:
        square = weight.shape[-2] == weight.shape[-1]
        orthogonal_map = "matrix_exp" if square or jnp.iscomplexobj(weight) else "householder"
    orth_enum = getattr(_OrthMaps, orthogonal_map, None)
    if orth_enum is None:
        raise ValueError(
            'orthogonal_map has to be one of "matrix_exp", "cayley", "householder". '
            f"Got: {orthogonal_map}"
        )
    orth = _Orthogonal(weight, orth_enum, use_trivialization=use_trivialization)
    parametrize.register_parametrization(module, name, orth, unsafe=True)
    return module


# ----------------------------------------------------------------------------- weight norm


def _norm_except_dim(v: Any, pow: float, dim: int) -> Any:
    """``torch.norm_except_dim``: the norm over every dimension but ``dim``, kept as size-1
    dimensions; ``dim=-1`` is the norm of the whole tensor (a 0-d array), as PyTorch."""
    v = _array(v)
    if dim == -1:
        return jnp.linalg.norm(v.reshape(-1), ord=pow)
    dim = dim % v.ndim
    axes = tuple(d for d in range(v.ndim) if d != dim)
    if pow == 2:
        return jnp.sqrt(jnp.sum(jnp.abs(v) ** 2, axis=axes, keepdims=True))
    return jnp.sum(jnp.abs(v) ** pow, axis=axes, keepdims=True) ** (1.0 / pow)


def _weight_norm(v: Any, g: Any, dim: int) -> Any:
    """``torch._weight_norm``: ``v * (g / ||v||)``, the norm as :func:`_norm_except_dim`."""
    v = _array(v)
    return v * (_array(g) / _norm_except_dim(v, 2, dim))


class _WeightNorm(Module):
    """The weight-norm parametrization (see :func:`weight_norm`)."""

    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        if dim is None:
            dim = -1
        self.dim = dim

    def forward(self, weight_g: Any, weight_v: Any) -> Any:
        return _weight_norm(weight_v, weight_g, self.dim)

    def right_inverse(self, weight: Any) -> tuple[Any, Any]:
        weight_g = _norm_except_dim(weight, 2, self.dim)
        return weight_g, _array(weight)


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Weight normalization ``w = g * v / ||v||`` of ``module.<name>``, as PyTorch's.

    The magnitude is ``parametrizations.<name>.original0`` (PyTorch's
    ``weight_g``) and the direction ``original1`` (``weight_v``); a state dict
    of the old :func:`jmodule.nn.utils.weight_norm` (``weight_g``/``weight_v``
    keys) loads too. ``dim`` is the dimension that keeps its own norm
    (``None``: one norm for the whole tensor; ``-1`` means the same, as in
    PyTorch, not the last dimension).

    Args:
        module: the module holding the tensor.
        name: the parameter's name. Default ``"weight"``.
        dim: the dimension over which the norms are not taken. Default ``0``.

    Returns:
        ``module``, parametrized.

    >>> import jmodule as jm
    >>> m = jm.nn.utils.parametrizations.weight_norm(jm.nn.Linear(3, 2))
    >>> m.parametrizations.weight.original0.shape, m.parametrizations.weight.original1.shape
    ((2, 1), (2, 3))
    """
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)

    def _weight_norm_compat_hook(
        module: Module,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        g_key = f"{prefix}{name}_g"
        v_key = f"{prefix}{name}_v"
        if g_key in state_dict and v_key in state_dict:
            original0 = state_dict.pop(g_key)
            original1 = state_dict.pop(v_key)
            state_dict[f"{prefix}parametrizations.{name}.original0"] = original0
            state_dict[f"{prefix}parametrizations.{name}.original1"] = original1

    module.register_load_state_dict_pre_hook(_weight_norm_compat_hook)
    return module


# ----------------------------------------------------------------------------- spectral norm


class _SpectralNorm(Module):
    """The spectral-norm parametrization (see :func:`spectral_norm`)."""

    def __init__(
        self, weight: Any, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12
    ) -> None:
        super().__init__()
        ndim = weight.ndim
        if dim >= ndim or dim < -ndim:
            raise IndexError(
                "Dimension out of range (expected to be in range of "
                f"[-{ndim}, {ndim - 1}] but got {dim})"
            )
        if n_power_iterations <= 0:
            raise ValueError(
                "Expected n_power_iterations to be positive, but "
                f"got n_power_iterations={n_power_iterations}"
            )
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            weight_mat = self._reshape_weight_to_matrix(jax.lax.stop_gradient(_array(weight)))
            h, w = weight_mat.shape
            k_u, k_v = jax.random.split(_random.next_key())
            u = jax.random.normal(k_u, (h,), weight_mat.dtype)
            v = jax.random.normal(k_v, (w,), weight_mat.dtype)
            self.register_buffer("_u", F.normalize(u, dim=0, eps=self.eps))
            self.register_buffer("_v", F.normalize(v, dim=0, eps=self.eps))
            self._power_method(weight_mat, 15)

    def _reshape_weight_to_matrix(self, weight: Any) -> Any:
        if weight.ndim <= 1:
            raise AssertionError(
                f"Expected weight to have more than 1 dimension, got {weight.ndim}"
            )
        if self.dim != 0:
            weight = jnp.transpose(
                weight, (self.dim, *(d for d in range(weight.ndim) if d != self.dim))
            )
        return weight.reshape(weight.shape[0], -1)

    def _power_method(self, weight_mat: Any, n_power_iterations: int) -> None:
        # torch.no_grad: the estimates are not differentiated
        weight_mat = jax.lax.stop_gradient(weight_mat)
        for _ in range(n_power_iterations):
            self._u = F.normalize(weight_mat @ self._v, dim=0, eps=self.eps)
            self._v = F.normalize(_mH(weight_mat) @ self._u, dim=0, eps=self.eps)

    def forward(self, weight: Any) -> Any:
        weight = _array(weight)
        if weight.ndim == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        weight_mat = self._reshape_weight_to_matrix(weight)
        if self.training:
            self._power_method(weight_mat, self.n_power_iterations)
        u, v = self._u, self._v
        sigma = jnp.vdot(u, weight_mat @ v)
        return weight / sigma

    def right_inverse(self, value: Any) -> Any:
        return value


def spectral_norm(
    module: Module,
    name: str = "weight",
    n_power_iterations: int = 1,
    eps: float = 1e-12,
    dim: int | None = None,
) -> Module:
    """Spectral normalization ``W / sigma(W)`` of ``module.<name>``, as PyTorch's.

    ``sigma`` is estimated by power iteration with the vectors in the buffers
    ``parametrizations.<name>.0._u`` and ``_v``: 15 iterations at
    registration (plus the one the registration's check runs, as PyTorch),
    then ``n_power_iterations`` each time the weight is read in training mode
    (eagerly and inside ``jm.compile``, where the buffer updates are part of
    the program); in eval mode the buffers are left alone. The vectors start
    from jmodule's generator (``jm.manual_seed``), not PyTorch's: load
    PyTorch's ``state_dict()`` (which holds them) for the same numbers.

    Args:
        module: the module holding the tensor.
        name: the parameter's name. Default ``"weight"``.
        n_power_iterations: power iterations per read in training mode.
        eps: added for numerical stability in the norms.
        dim: the dimension of the outputs. Default ``0``, ``1`` for
            ``ConvTranspose1d/2d/3d``.

    Returns:
        ``module``, parametrized.

    Raises:
        ValueError: no such tensor, or ``n_power_iterations <= 0``.
        IndexError: ``dim`` out of range.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> m = jm.nn.utils.parametrizations.spectral_norm(jm.nn.Linear(4, 3))
    >>> round(float(jnp.linalg.norm(m.weight, 2)), 2)
    1.0
    """
    weight = getattr(module, name, None)
    if not parametrize._is_tensor(weight):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        transposed = (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)
        dim = 1 if isinstance(module, transposed) else 0
    parametrize.register_parametrization(
        module, name, _SpectralNorm(weight, n_power_iterations, dim, eps)
    )
    return module
