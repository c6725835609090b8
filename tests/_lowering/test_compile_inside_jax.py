"""A compiled function called inside a JAX transformation that jmodule does not manage.

``jax.jit``, ``jax.grad`` or ``jax.vmap`` around a ``jm.compile`` step (or a
``model.compile()`` forward) make its outputs that transformation's tracers. A
function that changes no state runs as usual; one that changes module or
optimizer state refuses with ``FOREIGN_TRACE_HELP`` and changes nothing (it used
to write the tracers into the modules, and every later call failed with JAX's
``UnexpectedTracerError``; under ``jax.grad`` its donated buffers were deleted).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from shared_models import ResidualBlock

import jmodule as jm
from jmodule._lowering.program import FOREIGN_TRACE_HELP

HELP = FOREIGN_TRACE_HELP.split("(", 1)[0]


def _model(scan: bool):
    jm.manual_seed(0)
    blocks = jm.nn.ModuleList([ResidualBlock(4) for _ in range(3)])
    return jm.nn.scan(blocks) if scan else jm.nn.Sequential(*blocks)


@jm.compile
def _step(m, opt, x):
    opt.zero_grad()
    loss = jm.backward(lambda: (m(x) ** 2).mean())
    opt.step()
    return loss


def _values(model) -> dict:
    return {k: np.asarray(v) for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True], ids=["sequential", "scan"])
@pytest.mark.parametrize(
    "around",
    [
        lambda f, x: jax.jit(f)(x),
        lambda f, x: jax.grad(f)(x),
        lambda f, x: jax.jit(lambda: f(x))(),
    ],
    ids=["jit", "grad", "jit-closure"],
)
def test_a_state_changing_step_inside_a_jax_transformation_refuses_and_changes_nothing(
    scan, around
):
    model, x = _model(scan), jnp.linspace(-1, 1, 8).reshape(2, 4)
    opt = jm.optim.SGD(model.parameters(), lr=0.1)
    _step(model, opt, x)  # a settled donating program: the fast path is armed
    before = _values(model)
    with pytest.raises(RuntimeError, match=HELP):
        around(lambda x: _step(model, opt, x), x)
    after = _values(model)  # readable: nothing was donated away, nothing leaked
    assert after.keys() == before.keys()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    # The next top-level step is the one that would have come next.
    reference = _model(scan)
    reference.load_state_dict(before)
    ref_opt = jm.optim.SGD(reference.parameters(), lr=0.1)
    want = float(_step(reference, ref_opt, x))
    assert float(_step(model, opt, x)) == pytest.approx(want, rel=1e-6)


@pytest.mark.slow
def test_a_compiled_forward_that_changes_nothing_runs_under_vmap_and_grad():
    model = _model(False).eval()
    compiled = jm.nn.Sequential(*model).eval()
    compiled.compile()
    xs = jnp.linspace(-1, 1, 24).reshape(3, 2, 4)
    np.testing.assert_allclose(jax.vmap(compiled)(xs), jax.vmap(model)(xs), rtol=1e-6)
    g = jax.grad(lambda x: compiled(x).sum())(xs[0])
    np.testing.assert_allclose(g, jax.grad(lambda x: model(x).sum())(xs[0]), rtol=1e-6)


def test_a_training_batchnorm_forward_under_vmap_refuses_and_keeps_its_statistics():
    jm.manual_seed(0)
    bn = jm.nn.BatchNorm1d(4)
    bn.compile()
    x = jnp.linspace(-1, 1, 24).reshape(3, 2, 4)
    bn(x[0])  # compiled once outside
    before = _values(bn)
    with pytest.raises(RuntimeError, match=HELP):
        jax.vmap(bn)(x)
    for k, v in _values(bn).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    bn(x[1])  # and it still runs outside
    assert int(bn.num_batches_tracked) == 2
