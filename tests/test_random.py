"""jm.manual_seed, jm.Generator: initialisation and dropout draw from them."""

import jax
import jax.numpy as jnp
import numpy as np
import torch

import jmodule as jm
from jmodule import nn
from jmodule.nn import init


def test_manual_seed_repeats_initialisation_and_seeds_differ():
    jm.manual_seed(11)
    a = nn.Linear(5, 4)
    jm.manual_seed(11)
    b = nn.Linear(5, 4)
    jm.manual_seed(12)
    c = nn.Linear(5, 4)
    np.testing.assert_array_equal(a.weight, b.weight)
    np.testing.assert_array_equal(a.bias, b.bias)
    assert not np.array_equal(a.weight, c.weight)
    assert jm.initial_seed() == 12


def test_generator_streams_are_independent_of_the_default_one():
    g1 = jm.Generator().manual_seed(3)
    g2 = jm.Generator().manual_seed(3)
    w1 = init.normal_(nn.Parameter(jnp.zeros((4, 4))), generator=g1)
    jm.manual_seed(99)
    init.normal_(nn.Parameter(jnp.zeros((4, 4))))  # the default stream moves on its own
    w2 = init.normal_(nn.Parameter(jnp.zeros((4, 4))), generator=g2)
    np.testing.assert_array_equal(w1, w2)
    state = g1.get_state()
    x = init.uniform_(nn.Parameter(jnp.zeros(8)), generator=g1)
    g1.set_state(state)
    y = init.uniform_(nn.Parameter(jnp.zeros(8)), generator=g1)
    np.testing.assert_array_equal(x, y)


def test_linear_default_init_matches_pytorch_distribution():
    fan_in, fan_out = 64, 512
    ours = nn.Linear(fan_in, fan_out)
    theirs = torch.nn.Linear(fan_in, fan_out)
    w, tw = np.asarray(ours.weight), theirs.weight.detach().numpy()
    bound = float(np.abs(tw).max())  # PyTorch's own U(-1/sqrt(in), 1/sqrt(in)) bound, observed
    assert np.abs(w).max() <= 1 / np.sqrt(fan_in)
    np.testing.assert_allclose(np.abs(w).max(), bound, rtol=0.02)
    np.testing.assert_allclose(w.std(), tw.std(), rtol=0.05)
    np.testing.assert_allclose(w.mean(), tw.mean(), atol=0.01)
    b, tb = np.asarray(ours.bias), theirs.bias.detach().numpy()
    np.testing.assert_allclose(b.std(), tb.std(), rtol=0.2)


def test_dropout_eager_draws_fresh_masks_and_respects_eval():
    drop = nn.Dropout(0.25)
    x = jnp.ones((4000,))
    a, b = drop(x), drop(x)
    assert not np.array_equal(a, b)
    kept = float((a != 0).mean())
    np.testing.assert_allclose(kept, 0.75, atol=0.03)
    np.testing.assert_allclose(float(a.max()), 1 / 0.75, rtol=1e-6)
    drop.eval()
    np.testing.assert_array_equal(drop(x), x)


def test_default_generator_key_is_a_plain_array():
    key = jm.random.default_generator.get_state()
    assert isinstance(key, jax.Array) and key.dtype == jnp.uint32
