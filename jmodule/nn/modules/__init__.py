"""The layer classes, as ``torch.nn.modules``."""

from jmodule.nn.modules._hooks import (
    RemovableHandle as RemovableHandle,
)
from jmodule.nn.modules._hooks import (
    register_module_forward_hook as register_module_forward_hook,
)
from jmodule.nn.modules._hooks import (
    register_module_forward_pre_hook as register_module_forward_pre_hook,
)
from jmodule.nn.modules._state_dict import IncompatibleKeys as IncompatibleKeys
from jmodule.nn.modules.activation import ReLU as ReLU
from jmodule.nn.modules.batchnorm import BatchNorm1d as BatchNorm1d
from jmodule.nn.modules.container import ModuleDict as ModuleDict
from jmodule.nn.modules.container import ModuleList as ModuleList
from jmodule.nn.modules.container import ParameterDict as ParameterDict
from jmodule.nn.modules.container import ParameterList as ParameterList
from jmodule.nn.modules.container import Sequential as Sequential
from jmodule.nn.modules.dropout import Dropout as Dropout
from jmodule.nn.modules.linear import Identity as Identity
from jmodule.nn.modules.linear import Linear as Linear
from jmodule.nn.modules.module import Module as Module
