"""Training utilities, as ``torch.nn.utils``: gradient clipping, flat parameter vectors,
BatchNorm fusion, ``skip_init``, ``stateless.functional_call``, ``rnn`` (padded
and packed sequences), parametrizations (``parametrize``, ``parametrizations``)
and the old-style ``weight_norm`` / ``spectral_norm``.

Every function reads and writes state through jmodule's own cells (a
parameter's ``.grad`` and value), so the gradient functions work eagerly and
inside a ``jm.compile``d training step:

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> model = jm.nn.Linear(3, 1)
>>> opt = jm.optim.SGD(model.parameters(), lr=0.1)
>>> @jm.compile
... def step(model, opt, x):
...     opt.zero_grad()
...     loss = jm.backward(lambda: (100 * model(x)).sum())
...     norm = jm.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
...     opt.step()
...     return loss, norm
>>> loss, norm = step(model, opt, jnp.ones((2, 3)))
>>> norm.shape, bool(norm > 1.0)
((), True)
"""

from jmodule.nn.utils import parametrizations as parametrizations
from jmodule.nn.utils import parametrize as parametrize
from jmodule.nn.utils import rnn as rnn
from jmodule.nn.utils import stateless as stateless
from jmodule.nn.utils.clip_grad import clip_grad_norm_ as clip_grad_norm_
from jmodule.nn.utils.clip_grad import clip_grad_value_ as clip_grad_value_
from jmodule.nn.utils.clip_grad import clip_grads_with_norm_ as clip_grads_with_norm_
from jmodule.nn.utils.clip_grad import get_total_norm as get_total_norm
from jmodule.nn.utils.convert_parameters import parameters_to_vector as parameters_to_vector
from jmodule.nn.utils.convert_parameters import vector_to_parameters as vector_to_parameters
from jmodule.nn.utils.fusion import fuse_conv_bn_eval as fuse_conv_bn_eval
from jmodule.nn.utils.fusion import fuse_conv_bn_weights as fuse_conv_bn_weights
from jmodule.nn.utils.fusion import fuse_linear_bn_eval as fuse_linear_bn_eval
from jmodule.nn.utils.fusion import fuse_linear_bn_weights as fuse_linear_bn_weights
from jmodule.nn.utils.init import skip_init as skip_init
from jmodule.nn.utils.spectral_norm import remove_spectral_norm as remove_spectral_norm
from jmodule.nn.utils.spectral_norm import spectral_norm as spectral_norm
from jmodule.nn.utils.weight_norm import remove_weight_norm as remove_weight_norm
from jmodule.nn.utils.weight_norm import weight_norm as weight_norm
