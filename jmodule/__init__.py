"""jmodule: PyTorch's ``nn.Module`` programming model, compiled by JAX.

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> model = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.ReLU(), jm.nn.Linear(8, 2))
>>> model.compile()
>>> model(jnp.ones((3, 4))).shape
(3, 2)
"""

from jmodule import _array_patches as _array_patches
from jmodule import _compilation_cache
from jmodule import _einops as _einops
from jmodule import amp as amp
from jmodule import checkpoint as checkpoint
from jmodule import distributed as distributed
from jmodule import func as func
from jmodule import jit as jit
from jmodule import nn as nn
from jmodule import optim as optim
from jmodule import random as random
from jmodule import return_types as return_types
from jmodule import serialization as serialization
from jmodule import utils as utils
from jmodule._compilation_cache import compilation_cache_dir as compilation_cache_dir
from jmodule._compilation_cache import set_compilation_cache as set_compilation_cache
from jmodule._lowering import compiled as _compiled
from jmodule._lowering.binding import TracerLeakError as TracerLeakError
from jmodule._lowering.compiled import CompileStats as CompileStats
from jmodule._lowering.compiled import compile_stats as compile_stats
from jmodule._lowering.errors import DeletedArrayError as DeletedArrayError
from jmodule._lowering.program import DonatedHeldWarning as DonatedHeldWarning
from jmodule._placement import device as _device
from jmodule._placement.device import DeviceError as DeviceError
from jmodule._placement.device import DtypeError as DtypeError
from jmodule._placement.device import bfloat16 as bfloat16
from jmodule._placement.device import cdouble as cdouble
from jmodule._placement.device import cfloat as cfloat
from jmodule._placement.device import channels_last as channels_last
from jmodule._placement.device import channels_last_3d as channels_last_3d
from jmodule._placement.device import complex64 as complex64
from jmodule._placement.device import complex128 as complex128
from jmodule._placement.device import contiguous_format as contiguous_format
from jmodule._placement.device import device as device
from jmodule._placement.device import double as double
from jmodule._placement.device import float16 as float16
from jmodule._placement.device import float32 as float32
from jmodule._placement.device import float64 as float64
from jmodule._placement.device import get_default_dtype as get_default_dtype
from jmodule._placement.device import half as half
from jmodule._placement.device import int8 as int8
from jmodule._placement.device import int16 as int16
from jmodule._placement.device import int32 as int32
from jmodule._placement.device import int64 as int64
from jmodule._placement.device import is_meta as is_meta
from jmodule._placement.device import long as long
from jmodule._placement.device import preserve_format as preserve_format
from jmodule._placement.device import set_default_dtype as set_default_dtype
from jmodule._placement.device import short as short
from jmodule._placement.device import uint8 as uint8
from jmodule._tensor import Size as Size
from jmodule._tensor import Tensor as Tensor
from jmodule._torch_functions import *  # noqa: F403  (the torch.* functions; list in jmodule/_torch_functions)
from jmodule._torch_functions import BUILTIN_NAMED as _TORCH_BUILTIN_NAMED
from jmodule._version import __version__ as __version__
from jmodule.amp import autocast as autocast
from jmodule.autograd import backward as backward
from jmodule.autograd import enable_grad as enable_grad
from jmodule.autograd import grad as grad
from jmodule.autograd import inference_mode as inference_mode
from jmodule.autograd import is_grad_enabled as is_grad_enabled
from jmodule.autograd import no_grad as no_grad
from jmodule.autograd import set_grad_enabled as set_grad_enabled
from jmodule.autograd import value_and_grad as value_and_grad
from jmodule.nn.modules.module import Module as Module
from jmodule.nn.parameter import Parameter as Parameter
from jmodule.random import Generator as Generator
from jmodule.random import initial_seed as initial_seed
from jmodule.random import manual_seed as manual_seed
from jmodule.random import seed as seed
from jmodule.serialization import load as load
from jmodule.serialization import save as save
from jmodule.summary import summary as summary

_compilation_cache.configure_default()

# Public names that are also Python builtins: ``jm.bool``, ``jm.float``, ``jm.int``
# (``torch.bool``, ``torch.float`` = float32, ``torch.int`` = int32),
# ``jm.compile`` (``torch.compile``) and the torch functions ``jm.sum``, ``jm.max``,
# ``jm.min``, ``jm.abs``, ``jm.pow``, ``jm.round``, ``jm.all``, ``jm.any``.
# ``__getattr__`` serves them, so that no module of the package, this one
# included, rebinds a builtin.
_BUILTIN_NAMED = {
    "bool": _device.bool_,
    "float": _device.float_,
    "int": _device.int_,
    "compile": _compiled.compile_function,
    **_TORCH_BUILTIN_NAMED,
}


def __getattr__(name: str) -> object:
    try:
        return _BUILTIN_NAMED[name]
    except KeyError:
        raise AttributeError(f"module 'jmodule' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_BUILTIN_NAMED})
