"""Optimizers with PyTorch's interface and optax's arithmetic (``torch.optim``).

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> model = jm.nn.Linear(3, 1)
>>> opt = jm.optim.Adam(model.parameters(), lr=1e-3)
>>> sched = jm.optim.lr_scheduler.StepLR(opt, step_size=10)
"""

from jmodule.optim import lr_scheduler as lr_scheduler
from jmodule.optim import swa_utils as swa_utils
from jmodule.optim._packed import PackedState as PackedState
from jmodule.optim.adadelta import Adadelta as Adadelta
from jmodule.optim.adafactor import Adafactor as Adafactor
from jmodule.optim.adagrad import Adagrad as Adagrad
from jmodule.optim.adam import Adam as Adam
from jmodule.optim.adam import AdamW as AdamW
from jmodule.optim.adamax import Adamax as Adamax
from jmodule.optim.asgd import ASGD as ASGD
from jmodule.optim.lbfgs import LBFGS as LBFGS
from jmodule.optim.muon import Muon as Muon
from jmodule.optim.nadam import NAdam as NAdam
from jmodule.optim.optimizer import Optimizer as Optimizer
from jmodule.optim.optimizer import TorchOptimizer as TorchOptimizer
from jmodule.optim.radam import RAdam as RAdam
from jmodule.optim.rmsprop import RMSprop as RMSprop
from jmodule.optim.rprop import Rprop as Rprop
from jmodule.optim.sgd import SGD as SGD
from jmodule.optim.sparse_adam import SparseAdam as SparseAdam
