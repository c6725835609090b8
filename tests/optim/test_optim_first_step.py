"""An optimizer's first step makes its state without a program per parameter shape.

The state an optax chain starts from is constants (zeros, counts at 0,
Adagrad's initial accumulator): the optimizer fills them on the host and packs
small parameters' state in NumPy, so the first eager ``step()`` compiles only
the update (it used to compile a ``zeros`` per parameter shape and a reshape
and concatenation per packed entry: a tenth of a second or more in a notebook's
first step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _monitoring import counting

import jmodule as jm
from jmodule import nn

F = jm.nn.functional


def _model():
    # Shapes no other test uses, so no program for them is cached in this process.
    return nn.Sequential(nn.Linear(13, 11), nn.ReLU(), nn.Linear(11, 7), nn.Linear(7, 5))


OPTIMIZERS = {
    "SGD momentum": (
        lambda ps: jm.optim.SGD(ps, lr=0.1, momentum=0.9),
        optax.sgd(0.1, momentum=0.9),
    ),
    "Adam": (lambda ps: jm.optim.Adam(ps, lr=0.01), optax.adam(0.01)),
    "Adagrad, initial accumulator": (
        lambda ps: jm.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.5, eps=1e-10),
        optax.adagrad(0.1, initial_accumulator_value=0.5, eps=1e-10),
    ),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_first_step_compiles_only_the_update(name):
    make, reference = OPTIMIZERS[name]
    model = _model()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 13)), jnp.float32)
    params = {n: jnp.array(p.data) for n, p in model.named_parameters()}
    jm.backward(lambda: (model(x) ** 2).mean())
    grads = {n: p.grad for n, p in model.named_parameters()}
    opt = make(model.parameters())
    with counting() as seen:
        opt.step()
    assert len(seen) <= 1, seen  # the update (one program for the packed parameters)
    # The state it started from is optax's: the step equals the reference's.
    updates, _ = reference.update(grads, reference.init(params), params)
    want = optax.apply_updates(params, updates)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(
            np.asarray(p.data), np.asarray(want[n]), rtol=1e-5, atol=1e-7, err_msg=n
        )


def test_state_filled_on_the_host_lives_where_the_parameters_do():
    """A parameter placed on a device: its state is committed there, as ``zeros_like``'s."""
    device = jax.devices()[-1]
    model = _model()
    for p in model.parameters():
        p.data = jax.device_put(p.data, device)
    x = jax.device_put(jnp.ones((3, 13)), device)
    jm.backward(lambda: model(x).sum())
    opt = jm.optim.Adam(model.parameters(), lr=0.01)
    opt.step()
    for p in model.parameters():
        for k, v in opt.state[p].items():
            assert v.devices() == {device}, k
        assert p.data.committed and p.data.devices() == {device}
    bucket = next(iter(opt._buckets[0]))  # the packed store itself
    for k, v in bucket.store.items():
        assert v.committed and v.devices() == {device}, k
