"""jm.manual_seed, jm.Generator: initialisation and dropout draw from them."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

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


@pytest.mark.torch
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


# Elementwise initialisers draw through one program per size bucket (jm.nn.init._bucket)
# and keep the first prod(shape) values: the same values as drawing the shape itself.
SHAPES = [(), (0,), (1,), (7,), (1024,), (1025,), (3, 5), (65, 64), (2, 3, 4, 5), (300, 301)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_elementwise_inits_equal_a_direct_draw_of_the_shape(shape, dtype):
    def draw(fill, direct):
        p = jm.nn.Parameter(jnp.zeros(shape, dtype))
        fill(p, jm.Generator().manual_seed(7))
        key = jm.Generator().manual_seed(7).next_key()
        want = direct(key)
        assert p.data.dtype == dtype and p.data.shape == shape
        # one fused program instead of op-by-op: float32 results may differ in the last bit
        tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == jnp.float32 else {"rtol": 2**-7}
        np.testing.assert_allclose(
            np.asarray(p.data, np.float32), np.asarray(want, np.float32), **tol
        )

    f32 = jnp.float32
    draw(
        lambda p, g: init.uniform_(p, -0.5, 2.0, generator=g),
        lambda k: jax.random.uniform(k, shape, f32, -0.5, 2.0).astype(dtype),
    )
    draw(
        lambda p, g: init.normal_(p, 0.5, 3.0, generator=g),
        lambda k: (0.5 + 3.0 * jax.random.normal(k, shape, f32)).astype(dtype),
    )
    draw(
        lambda p, g: init.trunc_normal_(p, 0.0, 2.0, -1.0, 3.0, generator=g),
        lambda k: (2.0 * jax.random.truncated_normal(k, -0.5, 1.5, shape, f32)).astype(dtype),
    )
    p = init.constant_(jm.nn.Parameter(jnp.ones(shape, dtype)), 0.25)
    np.testing.assert_array_equal(np.asarray(p.data, np.float32), np.full(shape, 0.25))


@pytest.mark.slow
def test_building_a_model_of_many_shapes_compiles_one_random_program_per_bucket():
    init._flat_program.cache_clear()
    widths = range(64, 84)
    model = jm.nn.Sequential(*[jm.nn.Linear(w, w + 1) for w in widths])
    sizes = {init._bucket(w * (w + 1)) for w in widths} | {init._bucket(w + 1) for w in widths}
    # kaiming_uniform_ (weights) and uniform_ (biases): one program per bucket, not per shape
    assert init._flat_program.cache_info().currsize == len(sizes) < 2 * len(widths)
    for layer, w in zip(model, widths):
        bound = 1 / math.sqrt(w)
        assert layer.weight.shape == (w + 1, w) and not layer.weight.data.committed
        assert float(jnp.max(jnp.abs(layer.bias.data))) <= bound
