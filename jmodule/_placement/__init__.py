"""Where arrays live: devices, dtypes, the placement language and sharding rules.

One package for placement, bottom up:

- ``device.py``: ``jm.device`` (PyTorch's device names mapped onto ``jax.Device``,
  the ``with jm.device(...)`` default, ``"meta"``), the dtype names and
  ``set_default_dtype``;
- ``factory.py``: array creation that honours ``with jm.device(...)`` and meta
  construction (every ``jm.zeros``, layer initialiser and ``Module`` built under
  a device context goes through it);
- ``parse.py``: the placement language ``Module.to``, ``to_empty``, ``jm.load``'s
  and ``jm.jit.load``'s ``map_location`` share, and moving one array there
  (re-exported here: ``_placement.parse``, ``_placement.move``, ...);
- ``sharding.py``: sharding rule sets (``state_dict`` name patterns to
  ``PartitionSpec`` s), checked against shapes and meshes before anything moves.

It imports nothing from ``jmodule.nn`` or ``jmodule.serialization``: both build on it.
"""

from jmodule._placement.parse import Place as Place
from jmodule._placement.parse import Target as Target
from jmodule._placement.parse import cast as cast
from jmodule._placement.parse import cast_floating as cast_floating
from jmodule._placement.parse import default_place as default_place
from jmodule._placement.parse import floating_dtype as floating_dtype
from jmodule._placement.parse import is_dtype as is_dtype
from jmodule._placement.parse import is_meta as is_meta
from jmodule._placement.parse import move as move
from jmodule._placement.parse import one as one
from jmodule._placement.parse import parse as parse
from jmodule._placement.parse import put as put
