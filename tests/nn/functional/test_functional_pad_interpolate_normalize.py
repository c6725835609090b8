"""Functional-only behaviour of ``jm.nn.functional`` against ``torch.nn.functional``:
padding modes, interpolation, one_hot, normalize, softmax's implicit dim, and
the error messages (each with ``pytest.raises(match=...)``)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule.nn.functional as F

TF = torch.nn.functional

RNG = np.random.default_rng(0)
X4 = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
X3 = RNG.standard_normal((2, 3, 7)).astype(np.float32)
X5 = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)


def same(got, want, rtol=1e-5, atol=1e-6):
    """Compare a jmodule result (array or tuple) with PyTorch's."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.detach().numpy()
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float64), w.astype(np.float64), rtol, atol)


# ----------------------------------------------------------------------------- pad


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize(
    ("x", "pad"),
    [
        (X3, (2, 1)),
        (X3[0], (0, 3)),  # unbatched
        (X3, (-2, 3)),  # negative amounts crop
        (X4, (1, 2, 2, 0)),
        (X4, (-1, 2, 1, -2)),
        (X5, (1, 0, 2, 1, 1, 1)),
    ],
)
def test_pad_modes(x, pad, mode):
    same(F.pad(jnp.asarray(x), pad, mode=mode), TF.pad(torch.from_numpy(x), pad, mode=mode))


@pytest.mark.torch
def test_pad_constant_value_and_any_rank():
    x = RNG.standard_normal((2, 3, 2, 2, 2, 2)).astype(np.float32)
    pad = (1, 0, 0, 2, 1, 1, 0, 1, 2, 0)
    same(F.pad(jnp.asarray(x), pad, value=2.5), TF.pad(torch.from_numpy(x), pad, value=2.5))


@pytest.mark.slow
@pytest.mark.torch
def test_pad_gradients_match():
    x = torch.from_numpy(X4).requires_grad_(True)
    cot = RNG.standard_normal((2, 3, 7, 9)).astype(np.float32)
    for mode in ["reflect", "replicate", "circular"]:
        x.grad = None
        (TF.pad(x, (1, 2, 1, 1), mode=mode) * torch.from_numpy(cot)).sum().backward()
        got = jax.grad(lambda v: (F.pad(v, (1, 2, 1, 1), mode=mode) * cot).sum())(jnp.asarray(X4))
        same(got, x.grad)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((X3, (1, 2, 3)), {}, RuntimeError, "Padding length must be divisible by 2"),
        ((X3, (1,) * 8), {}, RuntimeError, "should be less than or equal to two times"),
        ((X3, (7, 0)), {"mode": "reflect"}, RuntimeError, r"padding \(7, 0\) at dimension 2"),
        ((X3, (8, 0)), {"mode": "circular"}, RuntimeError, "wrapping around more than once"),
        (
            (X4, (1, 1)),
            {"mode": "replicate"},
            NotImplementedError,
            "Padding size 2 is not supported for 4D",
        ),
        ((X3, (1, 1)), {"mode": "mirror"}, NotImplementedError, "Unrecognised padding mode mirror"),
        ((X3, (1, 1)), {"mode": "reflect", "value": 1.0}, RuntimeError, "doesn't take in value"),
    ],
)
def test_pad_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        F.pad(jnp.asarray(args[0]), args[1], **kwargs)


# ----------------------------------------------------------------------------- interpolate


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic", "area"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": (4, 9)},
        {"scale_factor": 2},
        {"scale_factor": (1.7, 0.6)},
        {"scale_factor": (1.7, 0.6), "recompute_scale_factor": True},
        {"size": 3},
    ],
)
def test_interpolate_2d(mode, kwargs):
    corners = [None] if mode in ("nearest", "nearest-exact", "area") else [False, True]
    for align_corners in corners:
        got = F.interpolate(jnp.asarray(X4), mode=mode, align_corners=align_corners, **kwargs)
        want = TF.interpolate(
            torch.from_numpy(X4), mode=mode, align_corners=align_corners, **kwargs
        )
        same(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("x", "mode", "kwargs"),
    [
        (X3, "linear", {"scale_factor": 2.5}),
        (X3, "linear", {"size": 4, "align_corners": True}),
        (X3, "nearest", {"scale_factor": 0.5}),
        (X5, "trilinear", {"size": (2, 7, 3)}),
        (X5, "nearest", {"scale_factor": (2, 1, 0.5)}),
        (X5, "area", {"size": (2, 3, 4)}),
    ],
)
def test_interpolate_1d_3d(x, mode, kwargs):
    got = F.interpolate(jnp.asarray(x), mode=mode, **kwargs)
    same(got, TF.interpolate(torch.from_numpy(x), mode=mode, **kwargs), atol=1e-5)


@pytest.mark.torch
def test_interpolate_half_precision_and_jit():
    x = jnp.asarray(X4, jnp.bfloat16)
    got = jax.jit(lambda v: F.interpolate(v, scale_factor=2, mode="bilinear"))(x)
    assert got.dtype == jnp.bfloat16
    want = TF.interpolate(torch.from_numpy(X4).bfloat16(), scale_factor=2, mode="bilinear")
    same(got.astype(jnp.float32), want.float(), rtol=0, atol=0.02)


@pytest.mark.parametrize(
    ("x", "kwargs", "error", "match"),
    [
        (X4, {}, ValueError, "either size or scale_factor should be defined"),
        (X4, {"size": 2, "scale_factor": 2}, ValueError, "only one of size or scale_factor"),
        (
            X4,
            {"size": 2, "align_corners": True},
            ValueError,
            "align_corners option can only be set",
        ),
        (
            X3,
            {"size": 2, "mode": "bilinear"},
            NotImplementedError,
            "Got 3D input, but bilinear mode needs 4D",
        ),
        (X4, {"size": 2, "mode": "cubic"}, NotImplementedError, "nearest | linear | bilinear"),
        (X4, {"size": (2, 3, 4)}, ValueError, "same number of spatial dimensions"),
        (X4, {"size": 2, "mode": "bilinear", "antialias": True}, NotImplementedError, "antialias"),
        (
            X4,
            {"size": 2, "recompute_scale_factor": True},
            ValueError,
            "not meaningful with an explicit size",
        ),
    ],
)
def test_interpolate_errors(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        F.interpolate(jnp.asarray(x), **kwargs)


# ----------------------------------------------------------------------------- one_hot


@pytest.mark.torch
def test_one_hot_matches_pytorch():
    labels = np.array([[0, 3], [4, 1]])
    same(F.one_hot(jnp.asarray(labels)), TF.one_hot(torch.from_numpy(labels)))
    same(F.one_hot(jnp.asarray(labels), 7), TF.one_hot(torch.from_numpy(labels), 7))
    out = jax.jit(lambda v: F.one_hot(v, 5))(jnp.asarray(labels))
    assert jnp.issubdtype(out.dtype, jnp.integer)
    same(out, TF.one_hot(torch.from_numpy(labels), 5))


def test_one_hot_errors():
    with pytest.raises(RuntimeError, match=r"Class values must be non-negative\."):
        F.one_hot(jnp.array([-1, 2]))
    with pytest.raises(
        RuntimeError, match=r"Class values must be smaller than num_classes \(2\), got 3"
    ):
        F.one_hot(jnp.array([3]), 2)
    with pytest.raises(RuntimeError, match="only applicable to index tensor of integer type"):
        F.one_hot(jnp.array([1.0]))
    with pytest.raises(RuntimeError, match="Pass num_classes explicitly"):
        jax.jit(F.one_hot)(jnp.array([1, 2]))


# ----------------------------------------------------------------------------- normalize


@pytest.mark.torch
@pytest.mark.parametrize(("p", "dim"), [(2.0, 1), (1.0, -1), (3.0, 2), (float("inf"), 1), (0.5, 0)])
def test_normalize_matches_pytorch(p, dim):
    same(F.normalize(jnp.asarray(X4), p, dim), TF.normalize(torch.from_numpy(X4), p, dim))


@pytest.mark.torch
def test_normalize_zero_vector_and_its_gradient():
    x = np.zeros((2, 3), np.float32)
    x[1] = [3.0, 0.0, 4.0]
    xt = torch.from_numpy(x).requires_grad_(True)
    TF.normalize(xt).sum().backward()
    got = jax.grad(lambda v: F.normalize(v).sum())(jnp.asarray(x))
    same(F.normalize(jnp.asarray(x)), TF.normalize(torch.from_numpy(x)))
    same(got, xt.grad)
    assert np.all(np.isfinite(np.asarray(got)))
    with pytest.raises(TypeError, match=r"out=.* is not supported"):
        F.normalize(jnp.asarray(x), out=jnp.zeros((2, 3)))


# ----------------------------------------------------------------------------- softmax, activations


@pytest.mark.torch
def test_softmax_implicit_dim_warns_and_matches():
    for x in (X3, X4, X3[0, 0]):
        with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
            got = F.softmax(jnp.asarray(x))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = TF.softmax(torch.from_numpy(x))
        same(got, want)


@pytest.mark.torch
def test_softmax_dtype_argument():
    got = F.log_softmax(jnp.asarray(X3, jnp.bfloat16), dim=-1, dtype=jnp.float32)
    assert got.dtype == jnp.float32
    want = TF.log_softmax(torch.from_numpy(X3).bfloat16(), dim=-1, dtype=torch.float32)
    same(got, want)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("relu6", {}),
        ("leaky_relu", {"negative_slope": 0.3}),
        ("elu", {"alpha": 0.5}),
        ("selu", {}),
        ("celu", {"alpha": 2.0}),
        ("gelu", {"approximate": "tanh"}),
        ("silu", {}),
        ("mish", {}),
        ("hardtanh", {"min_val": -0.5, "max_val": 2.0}),
        ("hardswish", {}),
        ("hardsigmoid", {}),
        ("softplus", {"beta": 3.0, "threshold": 4.0}),
        ("softsign", {}),
        ("logsigmoid", {}),
        ("hardshrink", {"lambd": 1.0}),
        ("softshrink", {"lambd": 0.2}),
        ("tanhshrink", {}),
        ("threshold", {"threshold": 0.3, "value": -3.0}),
        ("rrelu", {"lower": 0.1, "upper": 0.2}),
        ("glu", {"dim": -1}),
        ("softmin", {"dim": 2}),
    ],
)
def test_activation_functions_match(name, kwargs):
    x = 3 * X4
    same(
        getattr(F, name)(jnp.asarray(x), **kwargs), getattr(TF, name)(torch.from_numpy(x), **kwargs)
    )


@pytest.mark.torch
def test_prelu_per_channel_and_errors():
    w = np.array([0.1, 0.2, 0.3], np.float32)
    same(
        F.prelu(jnp.asarray(X4), jnp.asarray(w)),
        TF.prelu(torch.from_numpy(X4), torch.from_numpy(w)),
    )
    with pytest.raises(RuntimeError, match="Found parameter numbers = 3 and channel size = 7"):
        F.prelu(jnp.ones((2, 7)), jnp.asarray(w))
    with pytest.raises(RuntimeError, match="approximate argument must be either none or tanh"):
        F.gelu(jnp.ones(2), approximate="sigmoid")
    with pytest.raises(
        RuntimeError, match="Halving dimension must be even, but dimension 2 is size 7"
    ):
        F.glu(jnp.asarray(X3), dim=2)


# ----------------------------------------------------------------------------- normalisation


@pytest.mark.torch
def test_rms_norm_default_eps_follows_compute_dtype():
    x = torch.from_numpy(0.01 * X3).bfloat16()
    got = F.rms_norm(jnp.asarray(x.float().numpy(), jnp.bfloat16), (7,))
    same(got.astype(jnp.float32), TF.rms_norm(x, (7,)).float(), rtol=0, atol=0.02)


@pytest.mark.torch
def test_instance_norm_update_matches_pytorch_in_place_update():
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    trm, trv = torch.from_numpy(rm.copy()), torch.from_numpy(rv.copy())
    want = TF.instance_norm(torch.from_numpy(X4), trm, trv, momentum=0.2)
    out, new_rm, new_rv = F.instance_norm_update(
        jnp.asarray(X4), jnp.asarray(rm), jnp.asarray(rv), momentum=0.2
    )
    same(out, want)
    same(new_rm, trm)
    same(new_rv, trv)


@pytest.mark.torch
def test_functional_norms_match():
    w, b = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    tw, tb = torch.from_numpy(w), torch.from_numpy(b)
    xt = torch.from_numpy(X4)
    same(F.group_norm(jnp.asarray(X4), 3, w, b, 1e-3), TF.group_norm(xt, 3, tw, tb, 1e-3))
    same(F.layer_norm(jnp.asarray(X4), (5, 6)), TF.layer_norm(xt, (5, 6)))
    same(F.local_response_norm(jnp.asarray(X5), 3), TF.local_response_norm(torch.from_numpy(X5), 3))
    with pytest.raises(
        RuntimeError,
        match=r"Expected weight to be a vector of size equal to the number of channels",
    ):
        F.group_norm(jnp.asarray(X4), 3, jnp.ones(4))


# ----------------------------------------------------------------------------- embedding, misc


@pytest.mark.slow
@pytest.mark.torch
def test_embedding_max_norm_on_a_plain_array():
    table = RNG.standard_normal((6, 4)).astype(np.float32) * 2
    idx = np.array([1, 3, 3])
    got = F.embedding(jnp.asarray(idx), jnp.asarray(table), max_norm=1.0)
    tt = torch.from_numpy(table.copy())
    same(got, TF.embedding(torch.from_numpy(idx), tt, max_norm=1.0))


@pytest.mark.torch
def test_embedding_bag_offsets_and_empty_bags():
    table = RNG.standard_normal((10, 3)).astype(np.float32)
    idx, off = np.array([1, 2, 4, 5, 4, 3, 2, 9]), np.array([0, 2, 2, 5])
    for mode in ("sum", "mean", "max"):
        got = F.embedding_bag(jnp.asarray(idx), jnp.asarray(table), jnp.asarray(off), mode=mode)
        want = TF.embedding_bag(
            torch.from_numpy(idx), torch.from_numpy(table), torch.from_numpy(off), mode=mode
        )
        same(got, want)


@pytest.mark.torch
def test_shuffles_and_bilinear():
    same(
        F.pixel_shuffle(jnp.asarray(X4[:, :, :4]).reshape(1, 12, 2, 6), 2),
        TF.pixel_shuffle(torch.from_numpy(X4[:, :, :4]).reshape(1, 12, 2, 6), 2),
    )
    same(
        F.pixel_unshuffle(jnp.asarray(X4[:, :, :4]), 2),
        TF.pixel_unshuffle(torch.from_numpy(X4[:, :, :4]), 2),
    )
    same(F.channel_shuffle(jnp.asarray(X4), 3), TF.channel_shuffle(torch.from_numpy(X4), 3))
    a, b = (
        RNG.standard_normal((4, 2)).astype(np.float32),
        RNG.standard_normal((4, 3)).astype(np.float32),
    )
    w = RNG.standard_normal((5, 2, 3)).astype(np.float32)
    same(F.bilinear(a, b, w), TF.bilinear(*map(torch.from_numpy, (a, b, w))))


@pytest.mark.torch
def test_conv_functional_forms():
    w = RNG.standard_normal((6, 1, 3, 2)).astype(np.float32)
    kw = {"stride": (1, 2), "padding": (2, 1), "dilation": 2, "groups": 3}
    same(
        F.conv2d(jnp.asarray(X4), jnp.asarray(w), **kw),
        TF.conv2d(torch.from_numpy(X4), torch.from_numpy(w), **kw),
        atol=1e-5,
    )
    wt = RNG.standard_normal((3, 2, 3)).astype(np.float32)
    kw = {"stride": 3, "padding": 2, "output_padding": 1, "dilation": 2}
    same(
        F.conv_transpose1d(jnp.asarray(X3), jnp.asarray(wt), **kw),
        TF.conv_transpose1d(torch.from_numpy(X3), torch.from_numpy(wt), **kw),
        atol=1e-5,
    )


@pytest.mark.torch
def test_pooling_functional_forms():
    x = torch.from_numpy(X4)
    same(
        F.max_pool2d(jnp.asarray(X4), 2, return_indices=True, ceil_mode=True),
        TF.max_pool2d(x, 2, return_indices=True, ceil_mode=True),
    )
    same(
        F.max_pool2d(jnp.asarray(X4), 3, 1, 1, dilation=(2, 1), return_indices=True),
        TF.max_pool2d(x, 3, 1, 1, dilation=(2, 1), return_indices=True),
    )
    same(
        F.avg_pool2d(jnp.asarray(X4), 3, 2, 1, True, False), TF.avg_pool2d(x, 3, 2, 1, True, False)
    )
    same(
        F.adaptive_max_pool2d(jnp.asarray(X4), (2, 4), True),
        TF.adaptive_max_pool2d(x, (2, 4), True),
    )
    same(F.adaptive_avg_pool1d(jnp.asarray(X3), 3), TF.adaptive_avg_pool1d(torch.from_numpy(X3), 3))


@pytest.mark.torch
def test_max_pool_gradient_goes_to_the_first_maximum():
    # Ties (ReLU zeros, repeated values): PyTorch sends the gradient to the
    # first maximum of each window; so must the plain and dilated paths.
    x = np.array([[[1.0, 3.0, 3.0, 3.0, 0.0, 0.0, 0.0, 2.0]]], np.float32)
    for kwargs in ({"kernel_size": 3, "stride": 1}, {"kernel_size": 2, "stride": 1, "dilation": 2}):
        xt = torch.from_numpy(x).requires_grad_(True)
        out = TF.max_pool1d(xt, **kwargs)
        cot = np.arange(1.0, out.shape[-1] + 1, dtype=np.float32)
        (out * torch.from_numpy(cot)).sum().backward()
        got = jax.grad(lambda v: (F.max_pool1d(v, **kwargs) * cot).sum())(jnp.asarray(x))
        same(got, xt.grad)


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (lambda x: F.avg_pool2d(x, 2), "avg_pool2d"),
        (lambda x: F.adaptive_avg_pool2d(x, 1), "adaptive_avg_pool2d"),
        (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), "interpolate"),
        (lambda x: F.layer_norm(x, (6,)), "layer_norm"),
        (lambda x: F.group_norm(x, 1), "group_norm"),
    ],
)
def test_integer_inputs_are_refused_where_pytorch_refuses(fn, name):
    with pytest.raises(RuntimeError, match=f"{name}.*expected a floating-point input, got dtype"):
        fn(jnp.ones((1, 2, 4, 6), jnp.int32))


@pytest.mark.torch
def test_integer_inputs_work_where_pytorch_allows_them():
    # Nearest resampling and max pooling work on integers, as PyTorch's.
    x = np.arange(48, dtype=np.uint8).reshape(1, 2, 4, 6)
    same(F.max_pool2d(jnp.asarray(x), 2), TF.max_pool2d(torch.from_numpy(x), 2))
    got = F.interpolate(jnp.asarray(x), scale_factor=2)
    assert got.dtype == jnp.uint8
    same(got, TF.interpolate(torch.from_numpy(x), scale_factor=2))
