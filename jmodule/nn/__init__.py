"""Neural-network building blocks, as ``torch.nn``."""

from jmodule.nn import functional as functional
from jmodule.nn import init as init
from jmodule.nn.modules import BatchNorm1d as BatchNorm1d
from jmodule.nn.modules import Dropout as Dropout
from jmodule.nn.modules import Identity as Identity
from jmodule.nn.modules import IncompatibleKeys as IncompatibleKeys
from jmodule.nn.modules import Linear as Linear
from jmodule.nn.modules import Module as Module
from jmodule.nn.modules import ModuleDict as ModuleDict
from jmodule.nn.modules import ModuleList as ModuleList
from jmodule.nn.modules import ParameterDict as ParameterDict
from jmodule.nn.modules import ParameterList as ParameterList
from jmodule.nn.modules import ReLU as ReLU
from jmodule.nn.modules import RemovableHandle as RemovableHandle
from jmodule.nn.modules import Sequential as Sequential
from jmodule.nn.modules import (
    register_module_forward_hook as register_module_forward_hook,
)
from jmodule.nn.modules import (
    register_module_forward_pre_hook as register_module_forward_pre_hook,
)
from jmodule.nn.parameter import Buffer as Buffer
from jmodule.nn.parameter import Parameter as Parameter
