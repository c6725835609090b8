"""Small eager programs compiled quick (``jmodule/_lowering/quick.py``, issue 25's first step).

A program of the eager tape or an optimizer update whose arrays are all small
is compiled with options that compile faster (XLA:CPU's older loop emitters
before JAX 0.12, 128-bit vectors on 0.12) when called eagerly, and as a plain
``jax.jit`` program when traced into another (``jax.jit`` refuses
``compiler_options`` there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _monitoring import LOWER, counting

import jmodule as jm
from jmodule import _jax_internals as _jx
from jmodule import nn
from jmodule._lowering import quick, tape
from jmodule.optim.optimizer import _UPDATES

F = jm.nn.functional


def test_the_options_are_ones_this_xla_has():
    """The older emitters where this XLA has them (jaxlib before 0.12), else narrower
    vectors; either way options XLA accepts and computes with."""
    quick_options = jax.jit(lambda x: x + 1, compiler_options=_jx.QUICK_COMPILE_OPTIONS)
    assert quick_options(jnp.ones(2)).tolist() == [2.0, 2.0]
    emitters = jax.jit(lambda x: x + 1, compiler_options={"xla_cpu_use_fusion_emitters": False})
    if "xla_cpu_use_fusion_emitters" in _jx.QUICK_COMPILE_OPTIONS:
        assert emitters(jnp.ones(2)).tolist() == [2.0, 2.0]
    else:
        with pytest.raises(Exception, match="No such compile option"):
            emitters(jnp.ones(2))


def test_traced_into_another_program_it_is_the_plain_one():
    f = quick.Jit(lambda x: jnp.sin(x) * 2, quick=True)
    x = jnp.linspace(0.0, 1.0, 8)
    expected = np.sin(np.asarray(x)) * 2
    np.testing.assert_allclose(jax.jit(lambda v: f(v) + 1)(x), expected + 1, rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda v: f(v).sum())(x), 2 * np.cos(np.asarray(x)), rtol=1e-6
    )
    np.testing.assert_allclose(jax.vmap(f)(x[None]), expected[None], rtol=1e-6)
    assert f._quick is None  # no eager call yet: no second program
    np.testing.assert_allclose(f(x), expected, rtol=1e-6)
    assert f._quick is not None
    np.testing.assert_allclose(jax.jit(lambda v: f(v) * 3)(x), expected * 3, rtol=1e-6)


def test_an_update_decides_from_its_arguments():
    small = quick.Jit(lambda a, b: (a * 2, b), None)
    large = quick.Jit(lambda a, b: (a * 2, b), None)
    small(jnp.ones(quick.BACKWARD_LIMIT), [jnp.ones(3)])
    large(jnp.ones(3), [jnp.ones(quick.BACKWARD_LIMIT + 1)])
    assert small._quick is not None
    assert large._quick is None


def _step(model, x, y):
    """One eager SGD step of ``model``: the tape's programs and the updates it made first."""
    ops, updates = set(map(id, tape._OPS.values())), set(map(id, _UPDATES.values()))
    opt = jm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = jm.backward(lambda: F.cross_entropy(model(x), y))
    opt.step()
    float(loss)
    new_ops = [op for op in tape._OPS.values() if id(op) not in ops]
    new_updates = [fn for fn in _UPDATES.values() if id(fn) not in updates]
    return new_ops, [*new_updates, *opt._jitted.values()], opt


def test_an_eager_step_compiles_its_small_programs_quick_and_its_large_ones_plain():
    """A layer with a weight past the backward limit compiles plain, forward and
    backward; the loss on small logits quick; gradients as jax.grad's either way."""
    rng = np.random.default_rng(0)
    wide = quick.BACKWARD_LIMIT // 256 + 1  # a (256, wide) weight: past the limit
    model = nn.Sequential(nn.Linear(256, wide), nn.Tanh(), nn.Linear(wide, 3), nn.Tanh())
    model[1].register_forward_hook(lambda *a: None)  # two tape nodes: the layers apart
    x = jnp.asarray(rng.standard_normal((4, 256)), jnp.float32)
    y = jnp.asarray([0, 1, 2, 0])
    names = [n for n, _ in model.named_parameters()]
    params = [jnp.asarray(p.data) for p in model.parameters()]

    def reference(ps):
        out = jm.func.functional_call(model, dict(zip(names, ps)), (x,))
        return F.cross_entropy(out, y)

    expected = jax.grad(reference)(params)
    ops, _, _ = _step(model, x, y)
    grads = [p.grad for p in model.parameters()]
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)

    assert [op.small for op in ops].count(False) == 1 and len(ops) > 2, ops  # the wide layer's
    for op in ops:
        assert (op.fwd._quick is not None) == op.fwd._small, op
        for program in op.bwd.values():
            assert (program._quick is not None) == op.small, op


def test_the_first_small_step_lowers_each_program_once_and_the_optimizer_update_is_quick():
    model = nn.Sequential(nn.Linear(9, 6), nn.ReLU(), nn.Linear(6, 4))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((5, 9)), jnp.float32)
    y = jnp.asarray([0, 1, 2, 3, 0])
    tape._OPS.clear()
    _UPDATES.clear()  # made again: this test sees the first step of each program
    with counting(LOWER) as seen:
        ops, updates, opt = _step(model, x, y)
    assert len(seen) == 5, seen  # quick or plain, one program each
    assert len(ops) == 2 and all(op.small for op in ops)
    for op in ops:
        assert op.fwd._quick is not None
        assert all(p._quick is not None for p in op.bwd.values())
    assert len(updates) == 1 and updates[0]._quick is not None

    # The same optimizer in a compiled step: its update traced into the step, plain.
    @jm.compile
    def step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    before = [jnp.asarray(p.data) for p in model.parameters()]
    float(step(model, opt, x, y))
    after = [jnp.asarray(p.data) for p in model.parameters()]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_a_node_with_a_large_matrix_product_compiles_plain():
    """Small arrays, but a product of more than PRODUCT_LIMIT elements: its backward
    transposes that many, which the quicker emitters write slower."""
    rows = quick.PRODUCT_LIMIT // 128 + 1
    rng = np.random.default_rng(2)
    lin = nn.Linear(8, 128)
    x = jnp.asarray(rng.standard_normal((rows, 8)), jnp.float32)
    for n, plain in ((rows, 1), (rows - 2, 0)):
        tape._OPS.clear()
        jm.backward(lambda n=n: jnp.tanh(lin(x[:n])).sum())  # linear, tanh, sum
        ops = list(tape._OPS.values())
        assert len(ops) == 3 and [op.small for op in ops].count(False) == plain, n
        assert [op.fwd._small for op in ops].count(True) == 3 - plain, n


@pytest.mark.parametrize(("name", "elementwise"), [("Adam", True), ("Muon", False)])
def test_only_elementwise_updates_compile_quick(name, elementwise):
    lin = nn.Linear(6, 4, bias=False)
    opt = getattr(jm.optim, name)(lin.parameters(), lr=0.01)
    _UPDATES.clear()
    jm.backward(lambda: (lin(jnp.ones((3, 6))) ** 2).sum())
    opt.step()
    (update,) = _UPDATES.values()
    assert (update._quick is not None) == elementwise
