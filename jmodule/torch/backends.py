"""``torch.backends`` as training scripts set it: TF32 matmuls, cuDNN switches.

``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``
set JAX's default matmul and convolution precision
(``jax_default_matmul_precision``: ``"tensorfloat32"`` when allowed, ``"highest"``
when not), which is what they decide in PyTorch. ``cudnn.benchmark`` and
``cudnn.deterministic`` are accepted and kept, with no effect: XLA chooses its
kernels when it compiles (autotuning on GPU is on), and its GPU ops are
deterministic except scatter-adds (``XLA_FLAGS=--xla_gpu_deterministic_ops=true``
before the first computation makes those deterministic too).

>>> import jmodule.torch as torch
>>> torch.backends.cudnn.benchmark = True
>>> torch.backends.cuda.matmul.allow_tf32
True
"""

from __future__ import annotations

import jax

__all__ = ["cuda", "cudnn"]


def _tf32() -> bool:
    precision = jax.config.jax_default_matmul_precision
    return precision is None or str(precision).lower() not in ("highest", "float32", "fp32")


def _set_tf32(allowed: bool) -> None:
    jax.config.update("jax_default_matmul_precision", "tensorfloat32" if allowed else "highest")


class _Matmul:
    @property
    def allow_tf32(self) -> bool:
        """Whether float32 matmuls may use TF32 (JAX's default precision)."""
        return _tf32()

    @allow_tf32.setter
    def allow_tf32(self, allowed: bool) -> None:
        _set_tf32(bool(allowed))


class _Cuda:
    matmul = _Matmul()

    @staticmethod
    def is_built() -> bool:
        """Whether JAX has a CUDA backend here."""
        try:
            return bool(jax.devices("gpu"))
        except RuntimeError:
            return False


class _Cudnn:
    benchmark = False
    deterministic = False

    @property
    def allow_tf32(self) -> bool:
        """Whether float32 convolutions may use TF32 (JAX's default precision)."""
        return _tf32()

    @allow_tf32.setter
    def allow_tf32(self, allowed: bool) -> None:
        _set_tf32(bool(allowed))

    @staticmethod
    def is_available() -> bool:
        """Whether JAX has a GPU backend here."""
        return _Cuda.is_built()


cuda = _Cuda()
cudnn = _Cudnn()
