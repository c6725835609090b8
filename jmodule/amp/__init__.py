"""Mixed precision, as ``torch.amp``: :class:`autocast` and :class:`GradScaler`.

>>> import jax.numpy as jnp
>>> import jmodule as jm
>>> with jm.amp.autocast("cpu"):
...     y = jm.nn.functional.linear(jnp.ones((2, 3)), jnp.ones((4, 3)))
>>> y.dtype
dtype(bfloat16)
"""

from jmodule.amp._autocast import autocast as autocast
from jmodule.amp._autocast import get_autocast_dtype as get_autocast_dtype
from jmodule.amp._autocast import is_autocast_available as is_autocast_available
from jmodule.amp._autocast import is_autocast_enabled as is_autocast_enabled
from jmodule.amp._grad_scaler import GradScaler as GradScaler
from jmodule.amp._grad_scaler import OptState as OptState
