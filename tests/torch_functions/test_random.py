"""jm.manual_seed, jm.Generator: initialisation and dropout draw from them."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _monitoring import LOWER, counting
from _torch import torch

import jmodule as jm
from jmodule import _threefry, nn
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
    # normal_ draws through XLA: one program per size bucket, not per shape
    init._flat_program.cache_clear()
    widths = range(64, 84)
    layers = [jm.nn.Embedding(w, w + 1) for w in widths]
    sizes = {init._bucket(w * (w + 1)) for w in widths}
    assert init._flat_program.cache_info().currsize == len(sizes) < len(widths)
    for layer, w in zip(layers, widths):
        assert layer.weight.shape == (w, w + 1) and not layer.weight.data.committed


# On a CPU, seeding, the initialisers' key splits and uniform and constant fills are
# computed on the host (jmodule._threefry): JAX's threefry bits, bit for bit, no program.
SEEDS = [0, 1, 7, 2**31 - 1, 2**31, 2**32 - 1, 67280421310721]


def _ulp(magnitude: float, dtype) -> float:
    return float(jnp.finfo(dtype).eps) * 2.0 ** math.ceil(math.log2(magnitude))


@pytest.mark.parametrize("x64", [False, True])
def test_host_threefry_keys_splits_and_bits_are_jaxs(x64):
    with jax.enable_x64(x64):
        for seed in SEEDS:
            key = _threefry.seed_key(seed % 2**32)
            np.testing.assert_array_equal(key, jax.random.PRNGKey(seed % 2**32))
            new, sub = _threefry.split(key)
            np.testing.assert_array_equal(np.stack([new, sub]), jax.random.split(jnp.asarray(key)))
            for count in (0, 1, 2, 7, 1000, 20_000):  # 20_000 crosses the hash's chunks
                want = jax.random.bits(jnp.asarray(sub), (count,), jnp.uint32)
                np.testing.assert_array_equal(_threefry.bits(sub, count), want)


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-0.5, 2.0), (-1 / 28, 1 / 28), (3.0, 3.5)])
def test_host_uniform_is_jaxs_to_the_last_bit_or_one_ulp(bounds):
    low, high = bounds
    key = _threefry.split(_threefry.seed_key(5))[1]
    draw = jax.jit(lambda k: jax.random.uniform(k, (5000,), jnp.float32, low, high))
    want = np.asarray(draw(jnp.asarray(key)))
    got = _threefry.uniform(key, low, high, 5000)
    assert got.dtype == np.float32 and got.min() >= low and got.max() < high
    # u * (high - low) + low: XLA fuses it into a multiply-add where the CPU has one (as
    # exact as ours), else the sum may differ in its last bit at the bound's magnitude
    np.testing.assert_allclose(got, want, rtol=0, atol=_ulp(max(-low, high), jnp.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_building_a_model_on_the_cpu_compiles_nothing_and_draws_jaxs_values(dtype):
    jm.manual_seed(3)
    with counting(LOWER) as seen:
        model = jm.nn.Sequential(
            jm.nn.Conv2d(3, 8, 3),
            jm.nn.BatchNorm2d(8),
            jm.nn.Flatten(),
            jm.nn.Linear(8 * 6 * 6, 300),  # 86,400 weights, drawn on the host
            jm.nn.LayerNorm(300),
            jm.nn.Linear(300, 10),
        ).to(dtype)
    assert seen == []
    # the values: the default stream's keys, drawn by jax.random
    key = jax.random.PRNGKey(3)
    for name, p in model.named_parameters():
        if name.startswith(("1.", "4.")):  # BatchNorm2d, LayerNorm: ones and zeros
            fill = 1.0 if name.endswith("weight") else 0.0
            np.testing.assert_array_equal(np.asarray(p.data, np.float32), fill)
            continue
        key, sub = jax.random.split(key)
        fan_in = math.prod(model[int(name[0])].weight.shape[1:])
        bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) and the bias's bound agree
        want = jax.random.uniform(sub, p.shape, jnp.float32, -bound, bound)
        np.testing.assert_allclose(
            np.asarray(p.data.astype(jnp.float32)),
            np.asarray(want.astype(dtype), np.float32),
            rtol=0,
            atol=_ulp(bound, dtype),
        )
    np.testing.assert_array_equal(model[1].running_var, np.ones(8))
    assert model[1].num_batches_tracked.shape == () and int(model[1].num_batches_tracked) == 0


def test_a_large_draw_goes_to_xla_with_the_same_stream():
    g = jm.Generator().manual_seed(9)
    count = init._HOST_DRAW + 1
    big = init.uniform_(jm.nn.Parameter(jnp.zeros(count)), -1.0, 1.0, generator=g)
    small = init.uniform_(jm.nn.Parameter(jnp.zeros(5)), -1.0, 1.0, generator=g)
    key = jax.random.PRNGKey(9)
    key, k1 = jax.random.split(key)
    key, k2 = jax.random.split(key)
    np.testing.assert_allclose(big, jax.random.uniform(k1, (count,), jnp.float32, -1, 1), atol=1e-7)
    np.testing.assert_allclose(small, jax.random.uniform(k2, (5,), jnp.float32, -1, 1), atol=1e-7)


def test_other_prng_settings_draw_through_jax():
    with jax.threefry_partitionable(False):
        assert not _threefry.available()
        g = jm.Generator().manual_seed(4)
        got = init.uniform_(jm.nn.Parameter(jnp.zeros(6)), generator=g)
        _, sub = jax.random.split(jax.random.PRNGKey(4))
        np.testing.assert_allclose(got, jax.random.uniform(sub, (6,)), atol=1e-7)


def test_a_committed_parameter_stays_committed_and_host_keys_continue_the_stream():
    cpu = jax.devices("cpu")[0]
    p = jm.nn.Parameter(jax.device_put(jnp.zeros((4, 3)), cpu))
    g = jm.Generator().manual_seed(2)
    init.uniform_(p, generator=g)
    init.constant_(p, 0.1)
    assert p.data.committed and p.data.sharding.device_set == {cpu}
    np.testing.assert_array_equal(p.data, jnp.full((4, 3), 0.1))
    # a device split (dropout's path) continues where the host splits left off
    after_host = g.next_key()
    key = jax.random.split(jax.random.PRNGKey(2))[0]
    np.testing.assert_array_equal(after_host, jax.random.split(key)[1])
