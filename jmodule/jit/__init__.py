"""Compiled modules you can inspect, save and load: TorchScript's surface, done with JAX.

``script``/``trace`` wrap a module in a :class:`ScriptModule` that shares its
state and runs as one XLA program; ``graph``, ``inlined_graph``, ``code`` and
``code_with_constants`` show the program; ``save``/``load`` write it to one
file (``jax.export`` StableHLO plus the state) that loads where the model's
Python class does not exist.

>>> import io, jax.numpy as jnp
>>> import jmodule as jm
>>> import jmodule.jit
>>> model = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.ReLU(), jm.nn.Linear(8, 2))
>>> sm = jm.jit.trace(model, jnp.ones((3, 4)))
>>> buf = io.BytesIO()
>>> sm.save(buf)
>>> _ = buf.seek(0)
>>> loaded = jm.jit.load(buf)
>>> bool(jnp.allclose(loaded(jnp.ones((3, 4))), model(jnp.ones((3, 4)))))
True
"""

from jmodule.jit import ops as ops
from jmodule.jit._code import ConstMap as ConstMap
from jmodule.jit._debug import DebugOptions as DebugOptions
from jmodule.jit._errors import IncompatibleVersionError as IncompatibleVersionError
from jmodule.jit._errors import JitError as JitError
from jmodule.jit._errors import NotTracedError as NotTracedError
from jmodule.jit._errors import ProgramFileError as ProgramFileError
from jmodule.jit._errors import TracingError as TracingError
from jmodule.jit._format import FORMAT_VERSION as FORMAT_VERSION
from jmodule.jit._io import load as load
from jmodule.jit._io import save as save
from jmodule.jit._script import ScriptModule as ScriptModule
from jmodule.jit._script import script as script
from jmodule.jit._script import trace as trace
