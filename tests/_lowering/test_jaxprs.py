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


def _rearranged(w, x, h):
    wt = w.T  # what x @ w.T's derivative needs: a rearrangement of w, as large as w
    flat = jax.jit(lambda w: w.reshape(-1))(w)  # inside a jit
    wide = jnp.broadcast_to(w, (2, *w.shape))  # larger than w
    narrow = w.astype(jnp.bfloat16)  # narrowed: keeping w would cost more than the copy
    part = w[:, :1]  # a slice: keeping w would cost more
    scaled = w * 2  # arithmetic on a differentiated input: kept
    return x @ wt, wt, flat, wide, narrow, part, scaled, jnp.tanh(h).T


def test_recomputable_finds_rearrangements_of_differentiated_inputs_no_larger():
    w = jnp.arange(6.0).reshape(2, 3)
    x = jnp.ones((4, 3))
    h = jnp.ones((2, 2), jnp.float32)
    closed = jax.make_jaxpr(_rearranged)(w, x, h)
    found, inputs, fn = jaxprs.recomputable(closed, [0, 1, 2], range(1, 8))
    # Not the narrowing cast or slice (smaller than w), the product, or tanh(h).T (a
    # rearrangement of something the forward computed, not of an input).
    assert found == (1, 2, 3)
    assert inputs == (0,)
    want = _rearranged(w, x, h)
    for got, ref in zip(fn(w), want[1:4]):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
