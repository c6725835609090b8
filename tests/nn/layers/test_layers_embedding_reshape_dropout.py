"""Embedding, EmbeddingBag, Flatten, Unflatten, Upsample, pixel/channel shuffles,
Bilinear, padding layers and the dropout variants against PyTorch.

The registry runs the shared parity checks (tests/layer_harness.py); random
layers compare in eval mode there, and their training-mode statistics are
compared with PyTorch's below.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm


def _x(*shape):
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


def _idx(*shape, high=10):
    return lambda rng: (rng.integers(0, high, shape),)


def _bag(n, offsets, weights=False):
    """1-D indices plus offsets (and per-sample weights)."""

    def make(rng):
        out = (rng.integers(0, 10, (n,)), np.array(offsets))
        if weights:
            out += (rng.standard_normal(n).astype(np.float32),)
        return out

    return make


CASES = [
    LayerCase("Embedding", (10, 3), inputs=_idx(2, 4)),
    LayerCase(
        "Embedding", (10, 3), {"padding_idx": 0}, inputs=lambda rng: (np.array([[0, 3, 0, 5]]),)
    ),
    LayerCase("Embedding", (10, 4), {"max_norm": 1.0}, inputs=_idx(3, 4)),
    LayerCase("Embedding", (10, 4), {"max_norm": 2.0, "norm_type": 1.0}, inputs=_idx(5)),
    LayerCase(
        "Embedding",
        (10, 3),
        {"scale_grad_by_freq": True, "padding_idx": -1},
        inputs=lambda rng: (np.array([1, 1, 1, 4, 9, 4]),),
    ),
    LayerCase("EmbeddingBag", (10, 3), inputs=_idx(3, 4)),
    LayerCase("EmbeddingBag", (10, 3), {"mode": "sum"}, inputs=_bag(7, [0, 2, 2, 5], weights=True)),
    LayerCase(
        "EmbeddingBag", (10, 3), {"mode": "max", "padding_idx": 2}, inputs=_bag(8, [0, 3, 3, 6])
    ),
    LayerCase(
        "EmbeddingBag",
        (10, 3),
        {"include_last_offset": True, "max_norm": 1.0},
        inputs=_bag(6, [0, 1, 4, 6]),
    ),
    LayerCase("Flatten", (0, -2), inputs=_x(2, 3, 4)),
    LayerCase("Unflatten", (-1, (2, -1)), inputs=_x(2, 3, 8)),
    LayerCase("Upsample", (), {"scale_factor": 2}, inputs=_x(1, 2, 3, 3)),
    LayerCase("Upsample", ((5, 7), None, "bilinear", True), inputs=_x(2, 2, 3, 4)),
    LayerCase("Upsample", (), {"scale_factor": 1.5, "mode": "bicubic"}, inputs=_x(1, 2, 4, 4)),
    LayerCase("Upsample", (), {"scale_factor": 2.5, "mode": "linear"}, inputs=_x(2, 3, 4)),
    LayerCase("Upsample", ((2, 5, 3),), {"mode": "trilinear"}, inputs=_x(1, 2, 3, 3, 2)),
    LayerCase(
        "Upsample", (), {"scale_factor": (2, 0.6), "mode": "nearest-exact"}, inputs=_x(1, 2, 3, 5)
    ),
    LayerCase("Upsample", (3,), {"mode": "area"}, inputs=_x(1, 2, 5, 7)),
    LayerCase("UpsamplingNearest2d", (), {"scale_factor": 3}, inputs=_x(1, 2, 2, 3)),
    LayerCase("UpsamplingBilinear2d", ((4, 5),), inputs=_x(1, 2, 2, 3)),
    LayerCase("PixelShuffle", (2,), inputs=_x(2, 8, 2, 3)),
    LayerCase("PixelUnshuffle", (2,), inputs=_x(2, 2, 4, 6)),
    LayerCase("ChannelShuffle", (3,), inputs=_x(2, 6, 2, 2)),
    LayerCase("Bilinear", (3, 4, 5), inputs=lambda rng: (_x(6, 3)(rng)[0], _x(6, 4)(rng)[0])),
    LayerCase(
        "Bilinear",
        (2, 3, 4),
        {"bias": False},
        inputs=lambda rng: (_x(2, 5, 2)(rng)[0], _x(2, 5, 3)(rng)[0]),
    ),
    LayerCase("ZeroPad2d", ((1, 0, 2, 1),), inputs=_x(1, 2, 3, 3)),
    LayerCase("ConstantPad3d", ((1, 0, 0, 1, -1, 1), -1.0), inputs=_x(1, 2, 3, 2, 2)),
    LayerCase("ReflectionPad1d", ((2, 1),), inputs=_x(2, 3, 4)),
    LayerCase("ReplicationPad2d", ((1, 2, 0, 1),), inputs=_x(1, 2, 3, 3)),
    LayerCase("CircularPad1d", ((2, -1),), inputs=_x(2, 3, 4)),
    LayerCase("Dropout1d", (0.3,), inputs=_x(2, 4, 5), random=True),
    LayerCase("Dropout2d", (0.3,), inputs=_x(2, 3, 4, 4), random=True),
    LayerCase("Dropout3d", (0.3,), inputs=_x(1, 2, 2, 3, 3), random=True),
    LayerCase("AlphaDropout", (0.2,), inputs=_x(4, 6), random=True),
    LayerCase("FeatureAlphaDropout", (0.2,), inputs=_x(2, 3, 4), random=True),
]

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_layer_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


# ----------------------------------------------------------------------------- dropout statistics


def _both(name, args, x, train=True):
    """Outputs of the torch and jmodule layer ``name`` on ``x`` in training mode."""
    torch.manual_seed(0)
    jm.manual_seed(0)
    ref = getattr(torch.nn, name)(*args).train(train)
    ours = getattr(jm.nn, name)(*args).train(train)
    return ref(torch.from_numpy(x)).numpy(), np.asarray(ours(jnp.asarray(x)))


@pytest.mark.torch
@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("Dropout1d", (32, 16, 5)),
        ("Dropout1d", (64, 5)),
        ("Dropout2d", (32, 16, 3, 3)),
        ("Dropout3d", (16, 16, 2, 2, 2)),
        ("Dropout3d", (64, 2, 2, 2)),
    ],
)
def test_channel_dropout_statistics(name, shape):
    p = 0.3
    x = np.ones(shape, np.float32)
    want, got = _both(name, (p,), x)
    batched = len(shape) == {"Dropout1d": 3, "Dropout2d": 4, "Dropout3d": 5}[name]
    channel_axes = 2 if batched else 1
    for out in (want, got):
        planes = out.reshape((*out.shape[:channel_axes], -1))
        # Whole channels are dropped or kept (and scaled by 1 / (1 - p)).
        assert np.all(planes.min(-1) == planes.max(-1))
        values = np.unique(out)
        assert np.all(np.isclose(values, 0.0) | np.isclose(values, 1 / (1 - p)))
    # Both drop about a fraction p of the channels (binomial, 512+ channels).
    drop_t, drop_j = (want == 0).mean(), (got == 0).mean()
    assert abs(drop_j - p) < 0.07 and abs(drop_t - p) < 0.07


@pytest.mark.torch
@pytest.mark.parametrize("name", ["AlphaDropout", "FeatureAlphaDropout"])
def test_alpha_dropout_statistics(name):
    p = 0.2
    x = np.random.default_rng(0).standard_normal((512, 64, 4)).astype(np.float32)
    want, got = _both(name, (p,), x)
    # Mean and variance of a standard normal input are kept, as PyTorch's.
    np.testing.assert_allclose(got.mean(), want.mean(), atol=0.03)
    np.testing.assert_allclose(got.std(), want.std(), atol=0.03)
    # Dropped elements all take one value, and kept ones are one affine map
    # of the input: both the same as PyTorch's.
    maps = []
    for out in (want, got):
        values, counts = np.unique(out, return_counts=True)
        dropped = values[counts.argmax()]
        kept = out != dropped
        slope, offset = np.polyfit(x[kept], out[kept], 1)
        maps.append((dropped, (~kept).mean(), slope, offset))
    np.testing.assert_allclose(maps[1][0], maps[0][0], rtol=1e-5)
    np.testing.assert_allclose(maps[1][1], maps[0][1], atol=0.03)
    np.testing.assert_allclose(maps[1][2:], maps[0][2:], rtol=1e-4, atol=1e-5)


@pytest.mark.torch
def test_rrelu_training_slopes():
    x = -np.abs(np.random.default_rng(0).standard_normal(20000)).astype(np.float32) - 0.1
    want, got = _both("RReLU", (0.1, 0.4), x)
    for slopes in (want / x, got / x):
        assert slopes.min() >= 0.1 - 1e-6 and slopes.max() <= 0.4 + 1e-6
    np.testing.assert_allclose((got / x).mean(), (want / x).mean(), atol=0.01)
    np.testing.assert_allclose((got / x).std(), (want / x).std(), atol=0.01)


@pytest.mark.parametrize("name", ["Dropout2d", "AlphaDropout", "RReLU"])
def test_random_layers_compiled_draw_like_eager(name):
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 6, 3, 3)), jnp.float32)
    layer = getattr(jm.nn, name)()
    compiled = getattr(jm.nn, name)()
    compiled.compile()
    for seed in range(2):
        jm.manual_seed(seed)
        want = np.asarray(layer(x))
        jm.manual_seed(seed)
        got = np.asarray(compiled(x))
        # The same draws (XLA may fuse the arithmetic differently: ulps).
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # Successive calls draw fresh masks.
    assert not np.array_equal(np.asarray(compiled(x)), np.asarray(compiled(x)))


@pytest.mark.torch
def test_dropout2d_on_3d_input_warns_and_drops_dim1_channels():
    x = np.ones((64, 8, 5), np.float32)
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        got = np.asarray(jm.nn.Dropout2d(0.5)(jnp.asarray(x)))
    assert np.all(got.min(-1) == got.max(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch.nn.Dropout2d(0.5)(torch.from_numpy(x)).numpy()
    assert np.all(want.min(-1) == want.max(-1))


def test_dropout_variants_errors():
    with pytest.raises(
        ValueError, match=r"dropout probability has to be between 0 and 1, but got 1\.5"
    ):
        jm.nn.Dropout2d(1.5)
    with pytest.raises(
        RuntimeError, match="dropout1d: Expected 2D or 3D input, but received a 4D input"
    ):
        jm.nn.functional.dropout1d(jnp.ones((2, 3, 4, 5)))


# ----------------------------------------------------------------------------- embeddings


@pytest.mark.torch
def test_embedding_from_pretrained_and_padding_row():
    table = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    ours = jm.nn.Embedding.from_pretrained(jnp.asarray(table), padding_idx=1)
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(table), padding_idx=1)
    assert ours.weight.requires_grad is ref.weight.requires_grad is False
    assert repr(ours) == repr(ref)
    idx = np.array([[1, 4], [0, 1]])
    np.testing.assert_array_equal(
        np.asarray(ours(jnp.asarray(idx))), ref(torch.from_numpy(idx)).numpy()
    )
    # A freshly drawn table has its padding row zeroed, as PyTorch's.
    assert np.all(np.asarray(jm.nn.Embedding(6, 4, padding_idx=-2).weight)[4] == 0)


@pytest.mark.torch
def test_embedding_bag_from_pretrained():
    table = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    ours = jm.nn.EmbeddingBag.from_pretrained(jnp.asarray(table), mode="max", freeze=False)
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(table), mode="max", freeze=False)
    assert ours.weight.requires_grad and repr(ours) == repr(ref)
    idx = np.array([[1, 4, 2], [0, 1, 1]])
    np.testing.assert_allclose(
        np.asarray(ours(jnp.asarray(idx))), ref(torch.from_numpy(idx)).detach().numpy()
    )


def test_embedding_errors():
    emb = jm.nn.Embedding(10, 3)
    with pytest.raises(
        IndexError, match="index out of range in self: index 10 for an embedding table of 10 rows"
    ):
        emb(jnp.array([1, 10]))
    # Compiled code cannot raise on values: out-of-range rows come out NaN, not clamped.
    emb.compile()
    rows = np.asarray(emb(jnp.array([1, 10, -1])))
    assert np.all(np.isfinite(rows[0])) and np.all(np.isnan(rows[1:]))
    with pytest.raises(RuntimeError, match="expected integer indices"):
        emb(jnp.array([1.0]))
    with pytest.raises(ValueError, match="Padding_idx must be within num_embeddings"):
        jm.nn.Embedding(10, 3, padding_idx=10)
    bag = jm.nn.EmbeddingBag(10, 3, mode="max")
    with pytest.raises(
        NotImplementedError, match="per_sample_weights is only supported for mode='sum'"
    ):
        bag(jnp.array([1, 2]), jnp.array([0, 1]), jnp.ones(2))
    with pytest.raises(ValueError, match="offsets has to be a 1D Tensor but got None"):
        bag(jnp.array([1, 2]))
    with pytest.raises(ValueError, match="if input is 2D, then offsets has to be None"):
        bag(jnp.array([[1, 2]]), jnp.array([0]))
    with pytest.raises(RuntimeError, match=r"offsets\[0\] has to be 0"):
        bag(jnp.array([1, 2]), jnp.array([1]))


@pytest.mark.torch
def test_embedding_max_norm_renormalises_inside_compiled_calls():
    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 4, max_norm=1.0)
    ours = jm.nn.Embedding(10, 4, max_norm=1.0)
    ours.load_state_dict(ref.state_dict())
    ours.compile()
    idx = np.array([[1, 2], [7, 2]])
    with torch.no_grad():
        want = ref(torch.from_numpy(idx)).numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(idx))), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(ours.weight), ref.weight.detach().numpy(), rtol=1e-6, atol=1e-6
    )


# ----------------------------------------------------------------------------- shapes and arguments


def test_flatten_unflatten_errors():
    with pytest.raises(
        IndexError,
        match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 3\)",
    ):
        jm.nn.Flatten(1, 3)(jnp.ones((2, 3)))
    with pytest.raises(
        RuntimeError,
        match=r"unflatten: Provided sizes \[2, 4\] don't multiply up to the size of dim 1 \(6\)",
    ):
        jm.nn.Unflatten(1, (2, 4))(jnp.ones((2, 6)))
    with pytest.raises(TypeError, match="unflattened_size must be tuple of ints"):
        jm.nn.Unflatten(1, 6)


def test_bilinear_errors():
    layer = jm.nn.Bilinear(2, 3, 4)
    with pytest.raises(
        RuntimeError,
        match="bilinear\\(\\): input2 size does not match weight size: got 4 but expected 3",
    ):
        layer(jnp.ones((5, 2)), jnp.ones((5, 4)))
    with pytest.raises(
        RuntimeError, match=r"input batch dimensions do not match: got \[5\] and \[6\]"
    ):
        layer(jnp.ones((5, 2)), jnp.ones((6, 3)))


def test_pixel_shuffle_error():
    with pytest.raises(RuntimeError, match=r"input.size\(-3\)=3 is not divisible by 4"):
        jm.nn.PixelShuffle(2)(jnp.ones((1, 3, 2, 2)))


# ----------------------------------------------------------------------------- meta construction

META_LAYERS = [
    ("Conv2d", (3, 4, 3)),
    ("ConvTranspose1d", (2, 3, 3)),
    ("Bilinear", (2, 3, 4)),
    ("PReLU", (3,)),
    ("Embedding", (5, 3, 0)),
    ("EmbeddingBag", (5, 3)),
    ("LayerNorm", (4,)),
    ("GroupNorm", (2, 4)),
    ("RMSNorm", (4,)),
    ("InstanceNorm2d", (3, 1e-5, 0.1, True, True)),
    ("BatchNorm3d", (3,)),
]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "args"), META_LAYERS, ids=[n for n, _ in META_LAYERS])
def test_meta_construction_then_to_empty(name, args):
    with jm.device("meta"):
        layer = getattr(jm.nn, name)(*args)
    ref = getattr(torch.nn, name)(*args)
    want = [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    assert [(k, tuple(v.shape)) for k, v in layer.state_dict().items()] == want
    layer.to_empty(device="cpu")
    layer.reset_parameters()
    for k, v in layer.state_dict().items():
        assert np.all(np.isfinite(np.asarray(v, np.float64))), k
    if name == "Embedding":
        assert np.all(np.asarray(layer.weight)[0] == 0)
