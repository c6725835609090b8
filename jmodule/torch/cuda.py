"""``torch.cuda`` as ported scripts ask it: whether JAX sees a GPU, and how many.

>>> import jmodule.torch as torch
>>> device = "cuda" if torch.cuda.is_available() else "cpu"
>>> device in ("cuda", "cpu")
True
"""

from __future__ import annotations

import jax

__all__ = [
    "device_count",
    "empty_cache",
    "is_available",
    "manual_seed",
    "manual_seed_all",
    "synchronize",
]


def _gpus() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def is_available() -> bool:
    """Whether JAX sees a GPU."""
    return bool(_gpus())


def device_count() -> int:
    """How many GPUs JAX sees."""
    return len(_gpus())


def synchronize(device: object = None) -> None:
    """Wait for the work JAX has dispatched (``jax.effects_barrier``)."""
    jax.effects_barrier()


def empty_cache() -> None:
    """Nothing to free: XLA manages GPU memory (set ``XLA_PYTHON_CLIENT_PREALLOCATE``)."""


def manual_seed(seed: int) -> None:
    """Accepted, as PyTorch accepts it without a GPU: jmodule has one generator for every
    device, which ``torch.manual_seed`` (``jm.manual_seed``) seeds."""
    del seed


manual_seed_all = manual_seed


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether a GPU is there to compute in bfloat16 (XLA supports it wherever it runs)."""
    return is_available()


class amp:
    """``torch.cuda.amp``: ``GradScaler`` and ``autocast`` for the ``"cuda"`` device."""

    @staticmethod
    def GradScaler(*args: object, **kwargs: object) -> object:
        """``jm.amp.GradScaler("cuda", ...)`` (torch's deprecated spelling)."""
        from jmodule.amp import GradScaler

        return GradScaler("cuda", *args, **kwargs)

    @staticmethod
    def autocast(*args: object, **kwargs: object) -> object:
        """``jm.autocast("cuda", ...)`` (torch's deprecated spelling)."""
        from jmodule.amp import autocast

        return autocast("cuda", *args, **kwargs)
