"""Functional forms of the layers, as ``torch.nn.functional``.

Functions take and return ``jax.Array``s (Parameters are accepted anywhere).
Where PyTorch mutates an argument in place, JAX arrays are immutable: each
such function documents what it returns instead. One file per family of
layers; each defines ``__all__`` and is re-exported here.
"""

from jmodule.nn.functional._basic import *  # noqa: F403
