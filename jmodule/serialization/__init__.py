"""Checkpoints and weight files: ``jm.save``, ``jm.load`` and their errors.

``jm.save(obj, path)`` writes an Orbax checkpoint directory (atomically,
with a CRC-32 per array), for ``*.safetensors`` paths a safetensors file, and
for ``*.pt``/``*.pth``/``*.bin`` paths a PyTorch zip file (weights only, written
without PyTorch, read by ``torch.load(path, weights_only=True)``).
``jm.load(path)`` reads those, Hugging Face sharded checkpoints and PyTorch
``.pt``/``.bin`` files (without PyTorch, refusing pickles that run code).
Numbered, asynchronous checkpoints are :class:`jmodule.checkpoint.CheckpointManager`.

>>> import tempfile, jax.numpy as jnp, jmodule as jm
>>> path = tempfile.mkdtemp() + "/ckpt"
>>> jm.save({"model": {"w": jnp.zeros(3)}, "epoch": 1}, path)
>>> sorted(jm.load(path))
['epoch', 'model']
"""

from jmodule.serialization._api import load as load
from jmodule.serialization._api import read_metadata as read_metadata
from jmodule.serialization._api import save as save
from jmodule.serialization._errors import CheckpointError as CheckpointError
from jmodule.serialization._errors import CheckpointExistsError as CheckpointExistsError
from jmodule.serialization._errors import CheckpointNotFoundError as CheckpointNotFoundError
from jmodule.serialization._errors import CorruptCheckpointError as CorruptCheckpointError
from jmodule.serialization._errors import DiskFullError as DiskFullError
from jmodule.serialization._errors import NotWritableError as NotWritableError
from jmodule.serialization._errors import UnsafePickleError as UnsafePickleError

__all__ = [
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "DiskFullError",
    "NotWritableError",
    "UnsafePickleError",
    "load",
    "read_metadata",
    "save",
]
