"""What the tape reads off a traced function's jaxpr (``_lowering/jaxprs.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jmodule._lowering import jaxprs


def _labels_and_logits(x, t, key):
    hot = jax.lax.broadcasted_iota(t.dtype, x.shape, 1) == t[:, None]
    count = (t != -100).astype(x.dtype).sum()
    inner = jax.jit(lambda t: jnp.where(t != -100, t, 0) * 2)(t)  # cheap, inside a jit
    noise = jax.random.bernoulli(key, 0.5, x.shape)  # random bits: kept, not redone
    mixed = x * hot  # depends on the differentiated input
    return jnp.exp(x), hot, count, inner, noise, mixed, t


def test_recomputable_finds_what_cheap_operations_make_from_undifferentiated_inputs():
    x = jnp.arange(12.0).reshape(4, 3)
    t = jnp.array([0, 2, -100, 1])
    key = jax.random.key(0)
    closed = jax.make_jaxpr(_labels_and_logits)(x, t, key)
    found, inputs, fn = jaxprs.recomputable(closed, [0], range(7))
    assert found == (1, 2, 3)  # not exp (differentiated), noise (random), mixed, t itself
    assert inputs == (1,)  # made from the labels alone
    hot, count, inner = fn(t)
    want = _labels_and_logits(x, t, key)
    for got, ref in zip((hot, count, inner), want[1:4]):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    # Differentiating the labels too (a float target) leaves nothing to redo.
    assert jaxprs.recomputable(closed, [0, 1], range(7)) is None


def test_recomputable_keeps_the_constants_it_needs():
    table = np.array([0.5, 2.0, 3.0], np.float32)  # a closed-over array: a constvar
    closed = jax.make_jaxpr(lambda x, t: (x * 2, jnp.asarray(table)[t] + 1))(1.0, jnp.array([2, 0]))
    found, inputs, fn = jaxprs.recomputable(closed, [0], [0, 1])
    assert (found, inputs) == ((1,), (1,))
    np.testing.assert_array_equal(np.asarray(fn(jnp.array([1, 2]))[0]), table[[1, 2]] + 1)
