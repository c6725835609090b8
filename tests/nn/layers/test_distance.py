"""``CosineSimilarity``, ``PairwiseDistance`` and ``F.pdist`` against PyTorch live."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm

TF = torch.nn.functional

F = jm.nn.functional

# No parameters to initialise. The first case of each module runs the other checks (one
# low-precision dtype); its variants compare outputs and gradients.
CHECKS = ("repr", "state_dict", "forward", "grads", "compiled", "bfloat16")
VARIANT = ("forward", "grads")


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def _ins(*makers):
    return lambda rng: tuple(m(rng) for m in makers)


CASES = [
    LayerCase("CosineSimilarity", inputs=_ins(_normal(3, 4), _normal(3, 4)), checks=CHECKS),
    LayerCase("CosineSimilarity", kwargs={"dim": 0, "eps": 0.5},
              inputs=_ins(_normal(3, 4), _normal(1, 4)), checks=VARIANT),
    LayerCase("PairwiseDistance", inputs=_ins(_normal(3, 4), _normal(3, 4)), checks=CHECKS),
    LayerCase("PairwiseDistance", kwargs={"p": 1.0, "keepdim": True},
              inputs=_ins(_normal(3, 4), _normal(4)), checks=VARIANT),
    LayerCase("PairwiseDistance", kwargs={"p": math.inf, "eps": 0.0},
              inputs=_ins(_normal(5), _normal(5)), id="PairwiseDistance(p=inf)-unbatched",
              checks=VARIANT),
]  # fmt: skip

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_distance_module_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


_R = np.random.default_rng(3)
_X, _Y = _R.standard_normal((2, 3, 4)).astype(np.float32)
_P = [0, 0.5, 1, 2, 3, math.inf]


def _grad_pair(torch_fn, jm_fn, *arrays):
    """(jmodule gradients, torch gradients) of sum(f(*arrays) * w) for a fixed w."""
    leaves = [torch.from_numpy(a).requires_grad_(True) for a in arrays]
    out = torch_fn(*leaves)
    w = torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)
    (out * w).sum().backward()
    grads = jax.grad(lambda *xs: (jm_fn(*xs) * jnp.asarray(w.numpy())).sum(),
                     argnums=tuple(range(len(arrays))))(*map(jnp.asarray, arrays))  # fmt: skip
    return [np.asarray(g) for g in grads], [leaf.grad.numpy() for leaf in leaves]


@pytest.mark.slow
@pytest.mark.torch
def test_pairwise_distance_every_norm_matches_torch():
    for p in [*_P, -1, -math.inf]:
        for keepdim in (False, True):
            want = TF.pairwise_distance(torch.from_numpy(_X), torch.from_numpy(_Y), p=p,
                                        keepdim=keepdim)  # fmt: skip
            got = F.pairwise_distance(_X, _Y, p=p, keepdim=keepdim)
            assert got.shape == tuple(want.shape)
            np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, err_msg=str(p))
        if p > 0:
            got, want = _grad_pair(
                lambda a, b, p=p: TF.pairwise_distance(a, b, p=p),
                lambda a, b, p=p: F.pairwise_distance(a, b, p=p),
                _X,
                _Y,
            )
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6, err_msg=str(p))


@pytest.mark.torch
def test_pairwise_distance_adds_eps_to_the_difference_and_takes_scalars_and_ints():
    zeros = np.zeros((2, 3), np.float32)
    for eps in (1e-6, 0.5):
        want = TF.pairwise_distance(torch.from_numpy(zeros), torch.from_numpy(zeros), eps=eps)
        np.testing.assert_allclose(np.asarray(F.pairwise_distance(zeros, zeros, eps=eps)),
                                   want.numpy(), rtol=1e-6)  # fmt: skip
    want = TF.pairwise_distance(torch.tensor(1.0), torch.tensor(3.0))
    got = F.pairwise_distance(jnp.float32(1.0), jnp.float32(3.0))
    assert got.shape == () and np.isclose(float(got), want.item())
    ints = np.arange(6).reshape(2, 3)
    want = TF.pairwise_distance(torch.from_numpy(ints), torch.from_numpy(ints[::-1].copy()))
    got = F.pairwise_distance(ints, ints[::-1])
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-6)


@pytest.mark.torch
def test_cosine_similarity_clamps_each_norm_like_torch():
    # Norms 1e-5 each: their product (1e-10) is below eps = 1e-8 but neither norm is,
    # so PyTorch 2.x (per-norm clamping) gives exactly 1, not 1e-10 / 1e-8.
    a = np.full((1, 4), 5e-6, np.float32)
    want = TF.cosine_similarity(torch.from_numpy(a), torch.from_numpy(a))
    got = F.cosine_similarity(a, a)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got), 1.0, rtol=1e-6)
    for dim in (0, 1, -1):
        want = TF.cosine_similarity(torch.from_numpy(_X), torch.from_numpy(_Y), dim=dim)
        np.testing.assert_allclose(np.asarray(F.cosine_similarity(_X, _Y, dim=dim)), want.numpy(),
                                   rtol=1e-5, atol=1e-7)  # fmt: skip
    want = TF.cosine_similarity(torch.tensor(2.0), torch.tensor(-3.0), dim=0)
    assert float(F.cosine_similarity(jnp.float32(2.0), jnp.float32(-3.0), dim=0)) == want.item()


@pytest.mark.torch
def test_cosine_similarity_gradients_pass_through_the_clamp_like_torch():
    # A zero row and a row whose norm is below eps: PyTorch's clamp runs under no_grad,
    # so the gradient flows through the norm as if unclamped.
    x1 = np.concatenate([_X, np.zeros((1, 4)), np.full((1, 4), 1e-9)]).astype(np.float32)
    x2 = np.concatenate([_Y, np.ones((2, 4))]).astype(np.float32)
    got, want = _grad_pair(TF.cosine_similarity, F.cosine_similarity, x1, x2)
    for g, w in zip(got, want):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.torch
@pytest.mark.parametrize("p", _P)
def test_pdist_values_and_gradients_match_torch(p):
    x = np.concatenate([_X, _X[:1]])  # a repeated row: a zero distance
    want = TF.pdist(torch.from_numpy(x), p=p)
    got = F.pdist(x, p=p)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-7)
    if p >= 1:
        g, w = _grad_pair(lambda a: TF.pdist(a, p=p), lambda a: F.pdist(a, p=p), x)
        assert np.isfinite(g[0]).all()
        np.testing.assert_allclose(g[0], w[0], rtol=1e-4, atol=1e-6)


@pytest.mark.torch
def test_pdist_of_fewer_than_two_rows_is_empty_like_torch():
    for n in (0, 1):
        x = np.ones((n, 3), np.float32)
        assert F.pdist(x).shape == tuple(TF.pdist(torch.from_numpy(x)).shape) == (0,)


def test_distances_compile_under_jit():
    for fn, args in [
        (lambda a, b: F.cosine_similarity(a, b, dim=-1, eps=1e-3), (_X, _Y)),
        (lambda a, b: F.pairwise_distance(a, b, p=3.0, keepdim=True), (_X, _Y)),
        (lambda a: F.pdist(a, p=1), (_X,)),
    ]:
        np.testing.assert_allclose(np.asarray(jax.jit(fn)(*args)), np.asarray(fn(*args)),
                                   rtol=1e-6)  # fmt: skip


def _torch_error(fn):
    with pytest.raises(Exception) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn()
    return info.value


@pytest.mark.torch
def test_errors_match_torch():
    x, y = torch.from_numpy(_X), torch.from_numpy(_Y)
    ints = np.ones((3, 4), np.int64)
    cases = [
        (lambda: TF.cosine_similarity(x, torch.ones(3, 5)),
         lambda: F.cosine_similarity(_X, np.ones((3, 5), np.float32))),
        (lambda: TF.cosine_similarity(x, y, dim=2), lambda: F.cosine_similarity(_X, _Y, dim=2)),
        (lambda: TF.cosine_similarity(torch.from_numpy(ints), torch.from_numpy(ints)),
         lambda: F.cosine_similarity(ints, ints)),
        (lambda: TF.pairwise_distance(x, torch.ones(3, 5)),
         lambda: F.pairwise_distance(_X, np.ones((3, 5), np.float32))),
        (lambda: TF.pdist(torch.ones(2, 3, 4)), lambda: F.pdist(np.ones((2, 3, 4), np.float32))),
        (lambda: TF.pdist(x[0]), lambda: F.pdist(_X[0])),
        (lambda: TF.pdist(x, p=-1), lambda: F.pdist(_X, p=-1)),
        (lambda: TF.pdist(torch.from_numpy(ints)), lambda: F.pdist(ints)),
    ]  # fmt: skip
    for torch_fn, jm_fn in cases:
        expected = _torch_error(torch_fn)
        with pytest.raises(type(expected)) as info:
            jm_fn()
        head = str(expected).split("(")[0].split("[")[0].split(" at ")[0].strip()
        assert head and str(info.value).startswith(head[:30]), (str(info.value), str(expected))
