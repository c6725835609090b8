"""Fold/Unfold, LPPool1d/2d/3d and MaxUnpool1d/2d/3d against live PyTorch.

Modules go through the shared layer harness; the functional forms are
compared directly (values, gradients of a random cotangent, values under
``jax.jit``) over kernel/stride/padding/dilation/ceil_mode combinations,
unbatched inputs and PyTorch's errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm
import jmodule.nn.functional as F

TF = torch.nn.functional


def _x(*shape):
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


def _pooled(nd, shape, *args):
    """``(pooled, indices)`` of PyTorch's max pool of a random input."""

    def make(rng):
        x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
        out, idx = getattr(TF, f"max_pool{nd}d")(x, *args, return_indices=True)
        return out.numpy(), idx.numpy()

    return make


CASES = [
    LayerCase("Unfold", ((2, 3),), {"dilation": 2, "padding": 1, "stride": (1, 2)}, _x(3, 5, 6)),
    LayerCase("Fold", ((4, 5), 2), inputs=_x(2, 12, 12)),
    LayerCase("Fold", (5, (2, 3)), {"stride": 2, "padding": 1, "dilation": (2, 1)}, _x(6, 9)),
    LayerCase("LPPool1d", (1, 4, 3), {"ceil_mode": True}, inputs=_x(3, 11)),
    LayerCase("LPPool2d", (2, (2, 3)), {"stride": 1}, inputs=_x(2, 3, 5, 6)),
    LayerCase("LPPool2d", (float("inf"), 3, 2), {"ceil_mode": True}, inputs=_x(3, 6, 7)),
    LayerCase("LPPool3d", (2, 2), {"ceil_mode": True}, inputs=_x(1, 2, 3, 4, 5)),
    LayerCase(
        "MaxUnpool1d", (3, 1, 1), inputs=_pooled(1, (3, 7), 3, 1, 1), grad_inputs=[0]
    ),  # overlapping windows: repeated indices
    LayerCase(
        "MaxUnpool2d",
        (2,),
        inputs=_pooled(2, (2, 3, 5, 5), 2),
        call_kwargs={"output_size": [5, 5]},
        grad_inputs=[0],
    ),
    LayerCase(
        "MaxUnpool2d",
        ((3, 2), (2, 1), 1),
        inputs=_pooled(2, (2, 6, 5), (3, 2), (2, 1), 1),
        call_kwargs={"output_size": [6, 5]},
        grad_inputs=[0],
    ),
    LayerCase("MaxUnpool3d", (2,), inputs=_pooled(3, (1, 2, 4, 4, 6), 2), grad_inputs=[0]),
]

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_fold_unpool_layers_match_pytorch(check, case):
    ALL_CHECKS[check](case)


def _compare(jm_fn, torch_fn, *arrays, grad=True, equal_nan=False):
    """Value, jit value and (for the first array) gradient of a random cotangent."""
    want = torch_fn(*[torch.from_numpy(a) for a in arrays])
    got = jm_fn(*[jnp.asarray(a) for a in arrays])
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    jitted = jax.jit(jm_fn)(*[jnp.asarray(a) for a in arrays])
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(got), rtol=1e-6, atol=1e-6)
    if not grad:
        return
    cot = np.random.default_rng(7).standard_normal(tuple(want.shape)).astype(np.float32)
    leaf = torch.from_numpy(arrays[0]).requires_grad_(True)
    rest = [torch.from_numpy(a) for a in arrays[1:]]
    (torch_fn(leaf, *rest) * torch.from_numpy(cot)).sum().backward()
    rest_j = [jnp.asarray(a) for a in arrays[1:]]
    g = jax.grad(lambda v: (jm_fn(v, *rest_j) * cot).sum())(jnp.asarray(arrays[0]))
    np.testing.assert_allclose(np.asarray(g), leaf.grad.numpy(), rtol=1e-4, atol=1e-5)
    if equal_nan:
        return
    assert np.isfinite(np.asarray(g)).all()


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


UNFOLD_ARGS = [
    ((2, 1, 0, 1), False),
    (((2, 3), 1, 1, 1), True),
    ((3, 2, 1, 2), True),
    (((1, 2), (2, 1), (0, 1), (2, 3)), False),
]


@pytest.mark.torch
@pytest.mark.parametrize(("args", "batched"), UNFOLD_ARGS, ids=str)
def test_unfold_fold_functional(args, batched):
    k, d, p, s = args
    x = _rand(2, 3, 7, 6) if batched else _rand(3, 7, 6)
    _compare(lambda a: F.unfold(a, k, d, p, s), lambda a: TF.unfold(a, k, d, p, s), x)
    cols = np.asarray(TF.unfold(torch.from_numpy(x), k, d, p, s))
    y = _rand(*cols.shape, seed=1)
    _compare(lambda a: F.fold(a, (7, 6), k, d, p, s), lambda a: TF.fold(a, (7, 6), k, d, p, s), y)


@pytest.mark.torch
def test_fold_sums_overlaps_and_empty_batch():
    y = np.ones((1, 4, 9), np.float32)
    np.testing.assert_array_equal(
        np.asarray(F.fold(y, 4, 2)), TF.fold(torch.from_numpy(y), 4, 2).numpy()
    )
    assert F.unfold(jnp.zeros((0, 2, 3, 3)), 2).shape == TF.unfold(torch.zeros(0, 2, 3, 3), 2).shape


LP_ARGS = [  # (nd, shape, norm_type, kernel_size, stride, ceil_mode); inputs have negatives
    (1, (2, 3, 11), 2, 3, None, False),
    (1, (3, 11), 3, 2, 1, False),
    (1, (2, 3, 11), float("-inf"), 2, None, False),
    (2, (3, 6, 7), 1.5, (2, 3), None, False),
    (2, (2, 3, 6, 7), -1, 2, 1, False),
    (2, (3, 6, 7), float("inf"), 3, 2, True),
    (2, (2, 3, 6, 7), 2, (4, 3), 3, True),
    (3, (1, 2, 4, 5, 6), 1, 2, (1, 2, 2), True),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("nd", "shape", "p", "k", "s", "ceil"), LP_ARGS)
def test_lp_pool_functional(nd, shape, p, k, s, ceil):
    nan = p not in (2, float("inf"))  # negative window sums: NaN roots, as PyTorch
    x = _rand(*shape)
    _compare(
        lambda a: getattr(F, f"lp_pool{nd}d")(a, p, k, s, ceil),
        lambda a: getattr(TF, f"lp_pool{nd}d")(a, p, k, s, ceil),
        x,
        equal_nan=nan,
    )


@pytest.mark.torch
def test_lp_pool_zero_window_has_zero_gradient():
    x = np.array([[[0.0, 0.0, 1.0, -2.0]]], np.float32)
    _compare(lambda a: F.lp_pool1d(a, 2, 2), lambda a: TF.lp_pool1d(a, 2, 2), x)


UNPOOL_ARGS = [
    (1, (2, 3, 9), (2,), None),
    (1, (3, 8), (3, 1, 1), None),
    (1, (2, 2, 9), (3, 2), [1, 2, 9]),
    (2, (2, 3, 5, 5), (2,), (5, 5)),
    (2, (3, 6, 5), ((3, 2), (2, 1), 1), (6, 5)),
    (2, (1, 2, 5, 6), (3, 1, 1), None),
    (3, (1, 2, 4, 5, 4), (2,), [4, 5, 4]),
    (3, (2, 5, 4, 5), (3, 2, 1), (5, 4, 5)),
]


@pytest.mark.torch
@pytest.mark.parametrize("args", UNPOOL_ARGS, ids=str)
def test_max_unpool_functional_with_jmodule_indices(args):
    nd, shape, pool, size = args
    x = _rand(*shape)
    _, idx = getattr(F, f"max_pool{nd}d")(jnp.asarray(x), *pool, return_indices=True)
    t_out, t_idx = getattr(TF, f"max_pool{nd}d")(torch.from_numpy(x), *pool, return_indices=True)
    np.testing.assert_array_equal(np.asarray(idx), t_idx.numpy())
    j_idx = np.asarray(idx)
    unpool, t_unpool = getattr(F, f"max_unpool{nd}d"), getattr(TF, f"max_unpool{nd}d")
    _compare(
        lambda a: unpool(a, jnp.asarray(j_idx), *pool, output_size=size),
        lambda a: t_unpool(a, t_idx, *pool, output_size=size),
        t_out.numpy(),
    )


@pytest.mark.torch
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_pool_with_indices_aliases(nd):
    x = _rand(*(2, 3, 5, 6, 7)[: nd + 2])
    got = getattr(F, f"max_pool{nd}d_with_indices")(jnp.asarray(x), 3, 2, 1, ceil_mode=True)
    want = getattr(TF, f"max_pool{nd}d_with_indices")(torch.from_numpy(x), 3, 2, 1, ceil_mode=True)
    assert isinstance(got, tuple) and len(got) == 2
    np.testing.assert_array_equal(np.asarray(got[0]), want[0].numpy())
    np.testing.assert_array_equal(np.asarray(got[1]), want[1].numpy())


def _both_raise(jm_call, torch_call, exc, match):
    with pytest.raises(exc, match=match):
        torch_call()
    with pytest.raises(exc, match=match):
        jm_call()


@pytest.mark.torch
def test_fold_unpool_errors_match_pytorch():
    x, c = _rand(2, 3, 5, 6), _rand(2, 12, 9)
    cases = [
        ("unfold", (x[None], 2), RuntimeError, r"Expected 3D or 4D \(batch mode\) tensor"),
        ("unfold", (x, 7), RuntimeError, r"sliding blocks as \(-1, 0\), but its components"),
        ("unfold", (x, 2, 1, -1), RuntimeError, "padding should be non-negative"),
        ("unfold", (x, 0), RuntimeError, "kernel size should be greater than zero"),
        ("unfold", (x, 2, 1, 0, 0), RuntimeError, "stride should be greater than zero"),
        ("unfold", (x, 2, 0), RuntimeError, "dilation should be greater than zero"),
        (
            "unfold",
            (x, (2, 2, 2)),
            RuntimeError,
            "expected kernel_size equals to 2, but got size 3",
        ),
        ("fold", (c, (4, 4), (2, 3)), RuntimeError, r"sliding blocks 3 \* 2 = 6, but got input"),
        ("fold", (c[0, 0], 4, 2), RuntimeError, r"Expected 2D or 3D \(batch mode\) tensor"),
        ("fold", (c[:, :10], 4, 2), RuntimeError, "divisible by the product of kernel_size"),
        ("lp_pool1d", (x[0], 0, 2), ZeroDivisionError, "division by zero"),
    ]
    for name, args, exc, match in cases:
        _both_raise(
            lambda: getattr(F, name)(
                *[jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            ),
            lambda: getattr(TF, name)(
                *[torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
            ),
            exc,
            match,
        )
    p, i = TF.max_pool2d(torch.from_numpy(x[:1]), 2, return_indices=True)
    jp, ji = jnp.asarray(p.numpy()), jnp.asarray(i.numpy())
    unpool_cases = [
        (
            (p, i, 2),
            (jp, ji, 2),
            {"output_size": (6, 5)},
            ValueError,
            r"dim 0 must be between 2 and 6",
        ),
        ((p, i, 2), (jp, ji, 2), {"output_size": (5,)}, ValueError, "2 or 4 elements"),
        (
            (p, i * 10, 2),
            (jp, ji * 10, 2),
            {},
            RuntimeError,
            r"invalid max index: \d+ \(output volumes are of size 4x6\)",
        ),
        ((p, -i - 1, 2), (jp, -ji - 1, 2), {}, RuntimeError, r"invalid max index: -\d+"),
        (
            (p, i[..., :1], 2),
            (jp, ji[..., :1], 2),
            {},
            RuntimeError,
            "Expected shape of indices to be same",
        ),
        (
            (p[0, 0], i[0, 0], 2),
            (jp[0, 0], ji[0, 0], 2),
            {},
            RuntimeError,
            "should be a 3d or 4d Tensor",
        ),
    ]
    for t_args, j_args, kw, exc, match in unpool_cases:
        _both_raise(
            lambda: F.max_unpool2d(*j_args, **kw),
            lambda: TF.max_unpool2d(*t_args, **kw),
            exc,
            match,
        )
    with pytest.raises(RuntimeError, match="elements in indices should be"):
        F.max_unpool2d(jp, ji.astype(jnp.float32), 2)


def test_max_unpool_under_jit_drops_out_of_range_indices():
    p, i = F.max_pool1d(jnp.asarray(_rand(1, 2, 6)), 2, return_indices=True)
    out = jax.jit(lambda a, b: F.max_unpool1d(a, b, 2))(p, i.at[0, 0, 0].set(-1))
    assert float(out[0, 0].sum()) == pytest.approx(float(p[0, 0, 1:].sum()))


NEW_PUBLIC = [
    *(f"{f}{nd}d" for f in ("lp_pool", "max_unpool") for nd in (1, 2, 3)),
    *(f"max_pool{nd}d_with_indices" for nd in (1, 2, 3)),
    *(f"{m}{nd}d" for m in ("LPPool", "MaxUnpool") for nd in (1, 2, 3)),
    "fold",
    "unfold",
    "Fold",
    "Unfold",
]


@pytest.mark.parametrize("name", NEW_PUBLIC)
def test_new_public_names_have_docstring_examples(name):
    # tests/project/test_docstrings.py runs them, with every other example of the package.
    obj = getattr(F, name, None) or getattr(jm.nn, name)
    assert ">>>" in (obj.__doc__ or ""), name
