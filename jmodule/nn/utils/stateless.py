"""``torch.nn.utils.stateless``: the module-call-with-other-state API, before ``torch.func``.

PyTorch keeps ``stateless.functional_call`` as a deprecated alias of
``torch.func.functional_call``; here it is likewise :func:`jmodule.func.functional_call`
under PyTorch's older argument names, with PyTorch's ``FutureWarning``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from jmodule import func as _func

__all__ = ["functional_call"]

_DEPRECATED = (
    "`jm.nn.utils.stateless.functional_call` is deprecated as of PyTorch 2.0 and will be "
    "removed in a future version of PyTorch. Please use `jm.func.functional_call` instead "
    "which is a drop-in replacement."
)


def functional_call(
    module: Any,
    parameters_and_buffers: Mapping[str, Any],
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """Call ``module`` with ``parameters_and_buffers`` in place of its state (deprecated).

    As ``torch.nn.utils.stateless.functional_call``: warns (``FutureWarning``)
    and calls :func:`jmodule.func.functional_call`, which documents the
    behaviour.

    Args:
        module: the module to call.
        parameters_and_buffers: ``{name: array}`` keyed like ``state_dict()``.
        args: positional arguments (None: none; a non-tuple: one argument).
        kwargs: keyword arguments.
        tie_weights: as ``jm.func.functional_call``.
        strict: require every parameter and buffer to be given.

    Returns:
        Whatever ``forward`` returns.

    >>> import warnings
    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Linear(2, 1)
    >>> zeros = {k: jnp.zeros_like(v) for k, v in model.state_dict().items()}
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", FutureWarning)
    ...     jm.nn.utils.stateless.functional_call(model, zeros, jnp.ones((1, 2)))
    Array([[0.]], dtype=float32)
    """
    warnings.warn(_DEPRECATED, FutureWarning, stacklevel=2)
    return _func.functional_call(
        module,
        parameters_and_buffers,
        () if args is None else args,
        kwargs,
        tie_weights=tie_weights,
        strict=strict,
    )
