"""``jm.checkpoint``: numbered checkpoints of a training run, saved in the background.

The public home of :class:`CheckpointManager`; it lives in
``jmodule/serialization/_manager.py`` beside the atomic writer it uses. (Activation
checkpointing, recomputing a block in the backward pass, is ``jm.utils.checkpoint``.)

>>> import tempfile, jax.numpy as jnp, jmodule as jm
>>> mngr = jm.checkpoint.CheckpointManager(tempfile.mkdtemp(), max_to_keep=2)
>>> for step in range(3):
...     _ = mngr.save(step, {"w": jnp.full(2, step)})
>>> mngr.wait_until_finished()
>>> mngr.all_steps(), int(mngr.restore()["w"][0])
([1, 2], 2)
"""

from jmodule.serialization._manager import CheckpointManager as CheckpointManager

__all__ = ["CheckpointManager"]
