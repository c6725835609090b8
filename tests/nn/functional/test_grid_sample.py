"""``F.affine_grid`` and ``F.grid_sample`` against ``torch.nn.functional``: values and
gradients (input and grid) for every mode, padding mode and ``align_corners``,
probing grids outside ``[-1, 1]``, exactly on the borders and on rounding ties."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule.nn.functional as F

TF = torch.nn.functional

RNG = np.random.default_rng(0)
MODES = ["bilinear", "nearest", "bicubic"]
PADDINGS = ["zeros", "border", "reflection"]
# Probe values for grid coordinates: borders, ties for nearest (W = H = 4), outside
# [-1, 1] (several reflections), and a few random ones.
PROBES = [-3.1, -1.25, -1.0, -0.5, 0.0, 0.5, 1.0, 1.25, 2.7]


def _grid(shape, d):
    g = RNG.uniform(-1.5, 1.5, (*shape, d)).astype(np.float32)
    flat = g.reshape(-1, d)
    pairs = list(itertools.product(PROBES, repeat=2))
    for i in range(min(len(flat), len(pairs))):
        flat[i, :2] = pairs[i]
    return flat.reshape(g.shape)


X4 = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
G4 = _grid((2, 7, 6), 2)
X5 = RNG.standard_normal((2, 2, 3, 4, 4)).astype(np.float32)
G5 = _grid((2, 3, 4, 5), 3)


def _parity(x, g, mode, padding, align, rtol=1e-5, atol=2e-5):
    tx = torch.tensor(x, requires_grad=True)
    tg = torch.tensor(g, requires_grad=True)
    want = TF.grid_sample(tx, tg, mode, padding, align)
    w = RNG.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.tensor(w)).sum().backward()

    @jax.jit
    def value_and_grads(u, v):  # one compilation for the value and both gradients
        out, vjp = jax.vjp(lambda a, b: F.grid_sample(a, b, mode, padding, align), u, v)
        return (out, *vjp(jnp.asarray(w)))

    got, gx, gg = value_and_grads(jnp.asarray(x), jnp.asarray(g))
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol, atol)
    np.testing.assert_allclose(np.asarray(gx), tx.grad.numpy(), rtol, atol)
    np.testing.assert_allclose(np.asarray(gg), tg.grad.numpy(), rtol, atol * 5)


@pytest.mark.torch
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_grid_sample_4d_matches_torch(mode, padding, align):
    _parity(X4, G4, mode, padding, align)


@pytest.mark.torch
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_5d_matches_torch(mode, padding, align):
    _parity(X5, G5, mode, padding, align)


@pytest.mark.torch
def test_nearest_rounds_half_to_even():
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    # align_corners=False, W=4: pixel coordinate 2 * g + 1.5, so g = 0 -> 1.5, g = 0.5 -> 2.5
    g = np.array([[[[0.0, 0.0], [0.5, 0.0], [-0.5, 0.0]]]], np.float32)
    want = TF.grid_sample(torch.tensor(x), torch.tensor(g), "nearest", align_corners=False)
    got = F.grid_sample(x, g, "nearest", align_corners=False)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize(
    ("size", "shape"), [((2, 3, 4, 5), (2, 2, 3)), ((2, 1, 2, 3, 4), (2, 3, 4))]
)
def test_affine_grid_matches_torch(size, shape, align):
    theta = RNG.standard_normal(shape).astype(np.float32)
    tt = torch.tensor(theta, requires_grad=True)
    want = TF.affine_grid(tt, size, align)
    w = RNG.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.tensor(w)).sum().backward()
    got = F.affine_grid(jnp.asarray(theta), size, align)
    grad = jax.grad(lambda t: (F.affine_grid(t, size, align) * w).sum())(jnp.asarray(theta))
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), 1e-5, 1e-6)
    np.testing.assert_allclose(np.asarray(grad), tt.grad.numpy(), 1e-5, 1e-5)


@pytest.mark.torch
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("dims", [2, 3])
def test_identity_spatial_transformer_round_trip(dims, align):
    x = X4 if dims == 2 else X5
    eye = np.eye(dims, dims + 1, dtype=np.float32)[None].repeat(x.shape[0], 0)
    tg = TF.affine_grid(torch.tensor(eye), list(x.shape), align)
    want = TF.grid_sample(torch.tensor(x), tg, align_corners=align)
    got = F.grid_sample(x, F.affine_grid(eye, x.shape, align), align_corners=align)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), 1e-5, 1e-5)
    np.testing.assert_allclose(np.asarray(got), x, 1e-5, 1e-5)


@pytest.mark.torch
def test_rotation_under_jit_matches_torch():
    angle = 0.3
    theta = np.array(
        [[[np.cos(angle), -np.sin(angle), 0.1], [np.sin(angle), np.cos(angle), -0.2]]] * 2,
        np.float32,
    )

    @jax.jit
    def stn(x, t):
        grid = F.affine_grid(t, x.shape, align_corners=False)
        return F.grid_sample(x, grid, "bicubic", "reflection", align_corners=False)

    tg = TF.affine_grid(torch.tensor(theta), list(X4.shape), False)
    want = TF.grid_sample(torch.tensor(X4), tg, "bicubic", "reflection", False)
    np.testing.assert_allclose(np.asarray(stn(X4, theta)), want.numpy(), 1e-5, 2e-5)


def test_default_align_corners_warns_like_torch():
    with pytest.warns(UserWarning, match="align_corners=False since 1.3.0"):
        got = F.grid_sample(X4, G4)
    with pytest.warns(UserWarning, match="align_corners=False since 1.3.0"):
        grid = F.affine_grid(np.eye(2, 3, dtype=np.float32)[None], (1, 1, 3, 3))
    np.testing.assert_array_equal(
        np.asarray(got), np.asarray(F.grid_sample(X4, G4, align_corners=False))
    )
    np.testing.assert_array_equal(
        np.asarray(grid),
        np.asarray(F.affine_grid(np.eye(2, 3, dtype=np.float32)[None], (1, 1, 3, 3), False)),
    )
    with pytest.warns(UserWarning, match="unit-size grids"):
        F.affine_grid(np.eye(2, 3, dtype=np.float32)[None], (1, 1, 1, 3), True)


Z = np.zeros


@pytest.mark.torch
@pytest.mark.parametrize(
    ("x", "g", "kwargs", "error", "match"),
    [
        (Z((1, 1, 2, 2)), Z((1, 1, 1, 2)), {"mode": "linear"}, ValueError, "expected mode to be"),
        (Z((1, 1, 2, 2)), Z((1, 1, 1, 2)), {"padding_mode": "wrap"}, ValueError, "padding_mode"),
        (Z((1, 1, 2, 2, 2)), Z((1, 1, 1, 1, 3)), {"mode": "bicubic"}, RuntimeError, "bicubic"),
        (Z((1, 1, 2, 2)), Z((2, 1, 1, 2)), {}, RuntimeError, "same batch size"),
        (Z((1, 1, 2, 2)), Z((1, 1, 1, 3)), {}, RuntimeError, "size 2 in last dimension"),
        (Z((1, 1, 2, 2)), Z((1, 1, 1, 1, 2)), {}, RuntimeError, "expected 4D input"),
        (Z((1, 1, 2, 2, 2, 2)), Z((1, 1, 1, 1, 1, 4)), {}, RuntimeError, "expected 5D input"),
        (Z((1, 1, 0, 2)), Z((1, 1, 1, 2)), {}, RuntimeError, "non-empty spatial dimensions"),
        (Z((1, 1, 2, 2)), Z((1, 1, 1, 2), np.float16), {}, RuntimeError, "Float but found Half"),
    ],
)  # fmt: skip
def test_grid_sample_errors_match_torch(x, g, kwargs, error, match):
    x = x.astype(np.float32)
    g = g if g.dtype == np.float16 else g.astype(np.float32)
    with pytest.raises(Exception, match=match):
        TF.grid_sample(torch.tensor(x), torch.tensor(g), align_corners=False, **kwargs)
    with pytest.raises(error, match=match):
        F.grid_sample(jnp.asarray(x), jnp.asarray(g), align_corners=False, **kwargs)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("theta", "size", "error", "match"),
    [
        (Z((1, 2, 3), np.int32), (1, 1, 2, 2), ValueError, "floating point type"),
        (Z((1, 3, 4), np.float32), (1, 1, 2, 2), ValueError, "shape Nx2x3"),
        (Z((1, 2, 3), np.float32), (1, 1, 2, 2, 2), ValueError, "shape Nx3x4"),
        (Z((1, 2, 3), np.float32), (1, 1, 2), NotImplementedError, "only supports 4D and 5D sizes"),
        (Z((1, 2, 3), np.float32), (1, 1, 0, 2), ValueError, "non-zero, positive output size"),
    ],
)  # fmt: skip
def test_affine_grid_errors_match_torch(theta, size, error, match):
    with pytest.raises(error, match=match):
        TF.affine_grid(torch.tensor(theta), size, align_corners=False)
    with pytest.raises(error, match=match):
        F.affine_grid(jnp.asarray(theta), size, align_corners=False)


def test_integer_input_raises():
    with pytest.raises(RuntimeError, match="floating-point"):
        x = jnp.zeros((1, 1, 2, 2), jnp.int32)
        F.grid_sample(x, jnp.zeros((1, 1, 1, 2), jnp.int32), align_corners=False)


def test_exported():
    # tests/project/test_docstrings.py runs the module's docstring examples.
    import jmodule.nn.functional._grid as module

    # exported as the jm.Tensor-preserving wrappers of these functions (jmodule/_tensor.py)
    assert F.affine_grid.__wrapped__ is module.affine_grid
    assert F.grid_sample.__wrapped__ is module.grid_sample
