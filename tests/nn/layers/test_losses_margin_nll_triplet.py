"""The margin, soft-margin, Poisson/Gaussian NLL and distance-triplet losses against PyTorch live.

The registry runs the shared layer checks (tests/layer_harness.py: repr,
state_dict, outputs, gradients, compiled, bfloat16/float16) on each loss
module; the functional tests sweep each loss over the three reductions and
cover options, unbatched inputs, legacy arguments, compiled calls and errors.
"""

import contextlib
import warnings

import _torch
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm

TF = torch.nn.functional

F = jm.nn.functional

# Loss modules have no parameters (only weight buffers): the init check has nothing to see.
# The first case of each module runs the other checks (one low-precision dtype); its
# variants (options, unbatched inputs) compare outputs and gradients.
FIRST = tuple(k for k in ALL_CHECKS if k not in ("init", "float16"))
VARIANT = ("forward", "grads")


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def _uniform(*shape, lo=0.0, hi=1.0):
    return lambda rng: rng.uniform(lo, hi, shape).astype(np.float32)


def _signs(*shape):
    return lambda rng: np.where(rng.standard_normal(shape) > 0, 1, -1).astype(np.float32)


def _labels(*shape):
    return lambda rng: (rng.uniform(size=shape) > 0.5).astype(np.float32)


def _counts(*shape):
    return lambda rng: rng.integers(0, 5, shape).astype(np.float32)


def _classes(shape, n_classes):
    return lambda rng: rng.integers(0, n_classes, shape).astype(np.int64)


def _multilabel(*shape):
    """Per row: some distinct classes, then -1, then anything in [-1, C) (ignored)."""

    def make(rng):
        rows = []
        for _ in range(int(np.prod(shape[:-1]))):
            c = shape[-1]
            k = int(rng.integers(0, c + 1))
            row = list(rng.permutation(c)[:k])
            if k < c:
                row += [-1, *rng.integers(-1, c, c - k - 1)]
            rows.append(row)
        return np.asarray(rows, np.int64).reshape(shape)

    return make


def _ins(*makers):
    return lambda rng: tuple(m(rng) for m in makers)


W4 = torch.tensor([0.2, 1.0, 0.5, 2.0]) if _torch.INSTALLED else None  # the torch cases' weight


def _cosine_distance(nn):
    return nn.TripletMarginWithDistanceLoss(
        distance_function=lambda a, b: 1.0 - nn.functional.cosine_similarity(a, b),
        reduction="none",
    )


CASES = [
    LayerCase("HingeEmbeddingLoss", inputs=_ins(_normal(3, 4), _signs(3, 4)), grad_inputs=(0,),
              checks=FIRST),
    LayerCase("HingeEmbeddingLoss", kwargs={"margin": 0.5, "reduction": "none"},
              inputs=_ins(_normal(5), _signs(5)), grad_inputs=(0,), checks=VARIANT),
    LayerCase("SoftMarginLoss", inputs=_ins(_normal(3, 4), _signs(3, 4)), grad_inputs=(0,),
              checks=FIRST),
    LayerCase("SoftMarginLoss", kwargs={"reduction": "sum"}, inputs=_ins(_normal(5), _signs(5)),
              grad_inputs=(0,), checks=VARIANT),
    LayerCase("MultiLabelSoftMarginLoss", kwargs={"weight": W4},
              inputs=_ins(_normal(3, 4), _labels(3, 4)), checks=FIRST),
    LayerCase("MultiLabelSoftMarginLoss", kwargs={"reduction": "none"},
              inputs=_ins(_normal(4), _labels(4)), id="MultiLabelSoftMarginLoss-unbatched",
              checks=VARIANT),
    LayerCase("PoissonNLLLoss", inputs=_ins(_normal(3, 4), _counts(3, 4)), checks=FIRST),
    # full=True: PyTorch's target gradient is NaN at target == 0 (0 * log 0 under its mask).
    LayerCase("PoissonNLLLoss", kwargs={"log_input": False, "full": True, "reduction": "none"},
              inputs=_ins(_uniform(3, 4, lo=0.1, hi=3.0), _counts(3, 4)), grad_inputs=(0,),
              checks=VARIANT),
    LayerCase("GaussianNLLLoss",
              inputs=_ins(_normal(3, 4), _normal(3, 4), _uniform(3, 4, lo=0.1, hi=2.0)),
              checks=FIRST),
    # eps above most variances: the clamp is active, and its gradient passes through.
    LayerCase("GaussianNLLLoss", kwargs={"full": True, "eps": 0.5, "reduction": "none"},
              inputs=_ins(_normal(3, 4), _normal(3, 4), _uniform(3, lo=0.1, hi=1.0)),
              id="GaussianNLLLoss(full, eps=0.5)-var(N,)", checks=VARIANT),
    LayerCase("GaussianNLLLoss", kwargs={"reduction": "sum"},
              inputs=_ins(_normal(3, 4), _normal(3, 4), _uniform(3, 1, lo=0.1, hi=2.0)),
              id="GaussianNLLLoss-var(N,1)", checks=VARIANT),
    LayerCase("MultiMarginLoss", inputs=_ins(_normal(3, 4), _classes((3,), 4)), checks=FIRST),
    LayerCase("MultiMarginLoss", kwargs={"p": 2, "margin": 0.7, "weight": W4, "reduction": "none"},
              inputs=_ins(_normal(5, 4), _classes((5,), 4)), checks=VARIANT),
    LayerCase("MultiMarginLoss", kwargs={"reduction": "none"},
              inputs=_ins(_normal(4), _classes((), 4)), id="MultiMarginLoss-unbatched",
              checks=VARIANT),
    LayerCase("MultiLabelMarginLoss", inputs=_ins(_normal(5, 4), _multilabel(5, 4)),
              checks=FIRST),
    LayerCase("MultiLabelMarginLoss", kwargs={"reduction": "none"},
              inputs=_ins(_normal(5, 4), _multilabel(5, 4)), checks=VARIANT),
    LayerCase("MultiLabelMarginLoss", kwargs={"reduction": "none"},
              inputs=_ins(_normal(4), _multilabel(4)), id="MultiLabelMarginLoss-unbatched",
              checks=VARIANT),
    LayerCase("TripletMarginWithDistanceLoss",
              inputs=_ins(_normal(4, 5), _normal(4, 5), _normal(4, 5)), checks=FIRST),
    LayerCase("TripletMarginWithDistanceLoss",
              make=lambda nn: nn.TripletMarginWithDistanceLoss(
                  distance_function=nn.PairwiseDistance(p=1), margin=2.0, swap=True),
              inputs=_ins(_normal(4, 5), _normal(4, 5), _normal(4, 5)),
              id="TripletMarginWithDistanceLoss(PairwiseDistance(p=1), margin=2, swap)",
              checks=("repr", *VARIANT)),
    LayerCase("TripletMarginWithDistanceLoss", make=_cosine_distance,
              inputs=_ins(_normal(4, 5), _normal(4, 5), _normal(4, 5)),
              id="TripletMarginWithDistanceLoss(1 - cosine_similarity)", checks=("repr", *VARIANT)),
]  # fmt: skip

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_loss_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


# ----------------------------------------------------------------------------- functional

_R = np.random.default_rng(11)
_X, _Y = _R.standard_normal((2, 3, 4)).astype(np.float32)
_SIGNS = _signs(3, 4)(_R)
_LABELS = _labels(3, 4)(_R)
_COUNTS = _counts(3, 4)(_R)
_VAR = _uniform(3, 4, lo=0.1, hi=2.0)(_R)
_T = np.array([0, 3, 1])
_ML = np.array([[3, 0, -1, 1], [0, 1, 2, 3], [-1, 0, 0, 0]])

FUNCTIONAL = {
    "hinge_embedding_loss": (_X, _SIGNS),
    "soft_margin_loss": (_X, _SIGNS),
    "multilabel_soft_margin_loss": (_X, _LABELS),
    "poisson_nll_loss": (_X, _COUNTS),
    "gaussian_nll_loss": (_X, _Y, _VAR),
    "multi_margin_loss": (_X, _T),
    "multilabel_margin_loss": (_X, _ML),
    "triplet_margin_with_distance_loss": (_X, _Y, _VAR),
}


@pytest.mark.torch
@pytest.mark.parametrize("name", list(FUNCTIONAL))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_functional_loss_matches_torch(name, reduction):
    args = FUNCTIONAL[name]
    want = getattr(TF, name)(*[torch.from_numpy(a) for a in args], reduction=reduction)
    got = getattr(F, name)(*[jnp.asarray(a) for a in args], reduction=reduction)
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


def _compare(name, args, kwargs, rtol=1e-5):
    want = getattr(TF, name)(
        *[a if isinstance(a, float) else torch.from_numpy(np.asarray(a)) for a in args],
        **{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()},
    )
    got = getattr(F, name)(*args, **kwargs)
    assert got.shape == tuple(want.shape), (name, kwargs)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=rtol, atol=1e-6,
                               err_msg=f"{name} {kwargs}")  # fmt: skip


@pytest.mark.torch
def test_options_match_torch():
    pos = np.abs(_X) + 0.05
    counts = np.array(
        [[0.0, 0.5, 1.0, 1.5], [2.0, 3.0, 7.0, 0.0], [1.0, 4.0, 0.2, 9.0]], np.float32
    )
    for kwargs in [
        {"log_input": True, "full": True},
        {"log_input": False, "full": False},
        {"log_input": False, "full": True, "eps": 0.1},
    ]:
        _compare("poisson_nll_loss", (pos, counts), {**kwargs, "reduction": "none"})
    for kwargs in [{"full": True}, {"eps": 0.5}, {"full": True, "eps": 1.0, "reduction": "sum"}]:
        _compare("gaussian_nll_loss", (_X, _Y, _VAR), kwargs)
    _compare("gaussian_nll_loss", (_X, _Y, 0.3), {"reduction": "none"})  # a float variance
    for margin in (0.0, 0.3, 2.0):
        _compare("hinge_embedding_loss", (_X, _SIGNS), {"margin": margin, "reduction": "none"})
    weight = np.array([0.5, 1.0, 2.0, 0.1], np.float32)
    for p in (1, 2):
        for margin in (0.2, 1.5):
            _compare("multi_margin_loss", (_X, _T), {"p": p, "margin": margin, "weight": weight})
    _compare("multilabel_soft_margin_loss", (_X, _LABELS), {"weight": weight, "reduction": "none"})
    _compare("multilabel_soft_margin_loss", (_X, _LABELS), {"weight": weight[:, None][:3]})


@pytest.mark.slow
@pytest.mark.torch
def test_unbatched_and_broadcast_inputs_match_torch():
    _compare("multi_margin_loss", (_X[0], np.array(2)), {"reduction": "none"})
    _compare("multi_margin_loss", (_X[0], np.array([2])), {"reduction": "none"})  # (1,) out
    _compare("multi_margin_loss", (_X[:1], np.array(2)), {"reduction": "none"})  # () out
    _compare("multi_margin_loss", (np.float32(0.5), np.array(0)), {})
    _compare("multilabel_margin_loss", (_X[0], _ML[0]), {"reduction": "none"})
    _compare("multilabel_margin_loss", (_X[0], _ML[0]), {})
    # A repeated target counts twice; every class a target gives 0.
    x = np.array([[0.1, 0.2, 0.4, 0.8]], np.float32)
    for t in ([[3, 3, 0, -1]], [[3, 2, 1, 0]], [[-1, 2, 1, 0]]):
        _compare("multilabel_margin_loss", (x, np.array(t)), {"reduction": "none"})
    _compare("multilabel_soft_margin_loss", (_X[0], _LABELS[0]), {"reduction": "none"})
    _compare("multilabel_soft_margin_loss", (_X, _LABELS[0]), {"reduction": "none"})
    _compare("hinge_embedding_loss", (_X, _SIGNS[0]), {"reduction": "none"})
    _compare("hinge_embedding_loss", (np.array([0.3, 0.5], np.float32), np.array([0.0, 2.0])),
             {"reduction": "none"})  # fmt: skip
    _compare("soft_margin_loss", (_X, _SIGNS[0]), {"reduction": "none"})
    _compare("poisson_nll_loss", (_X, _COUNTS[0]), {"reduction": "none"})
    _compare("gaussian_nll_loss", (_X, _Y[0], _VAR), {"reduction": "none"})
    _compare("gaussian_nll_loss", (_X[0], _Y[0], np.float32(0.7)), {"reduction": "none"})
    _compare("gaussian_nll_loss", (_X, _Y, _VAR[:1]), {"reduction": "none"})  # (1, C)
    _compare("triplet_margin_with_distance_loss", (_X[0], _Y[0], _VAR[0]), {"reduction": "none"})


@pytest.mark.slow
@pytest.mark.torch
def test_gradients_of_the_functional_losses_match_torch():
    cases = [
        ("soft_margin_loss", (_X * 40, _SIGNS), {}),  # large margins: still finite
        ("gaussian_nll_loss", (_X, _Y, _VAR * 0.2), {"eps": 0.2, "full": True}),
        ("poisson_nll_loss", (_X, _COUNTS), {"full": True}),
        ("multi_margin_loss", (_X, _T), {"p": 2, "weight": np.array([1.0, 2, 3, 4], np.float32)}),
        ("multilabel_margin_loss", (_X, _ML), {}),
        ("multilabel_soft_margin_loss", (_X, _LABELS), {"reduction": "sum"}),
        ("hinge_embedding_loss", (_X, _SIGNS), {"margin": 0.5}),
        ("triplet_margin_with_distance_loss", (_X, _Y, _VAR), {"swap": True}),
    ]
    for name, args, kwargs in cases:
        leaf = torch.from_numpy(args[0]).requires_grad_(True)
        rest = [torch.from_numpy(np.asarray(a)) for a in args[1:]]
        t_kwargs = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                    for k, v in kwargs.items()}  # fmt: skip
        getattr(TF, name)(leaf, *rest, **t_kwargs).backward()

        def f(x, name=name, args=args, kwargs=kwargs):
            return getattr(F, name)(x, *args[1:], **kwargs)

        grad = jax.grad(f)(jnp.asarray(args[0]))
        assert np.isfinite(np.asarray(grad)).all(), name
        np.testing.assert_allclose(np.asarray(grad), leaf.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)  # fmt: skip


@pytest.mark.torch
def test_gaussian_variance_clamp_passes_gradients_like_torch():
    # var below eps: clamped in the value, yet its gradient is that of the clamped
    # point, as PyTorch's no_grad in-place clamp gives.
    var = np.array([[1e-3, 0.05, 0.5, 2.0]] * 3, np.float32)
    leaf = torch.from_numpy(var).requires_grad_(True)
    TF.gaussian_nll_loss(torch.from_numpy(_X), torch.from_numpy(_Y), leaf, eps=0.1).backward()
    grad = jax.grad(lambda v: F.gaussian_nll_loss(_X, _Y, v, eps=0.1))(jnp.asarray(var))
    np.testing.assert_allclose(np.asarray(grad), leaf.grad.numpy(), rtol=1e-5)
    assert np.all(np.asarray(grad)[:, :2] != 0)


@pytest.mark.torch
def test_losses_compile_under_jit_with_traced_targets():
    # Value checks (target range, negative variance) cannot run on traced values; the
    # losses themselves compile once and match torch.
    cases = [
        ("multi_margin_loss", (_X, _T), {"p": 2, "margin": 0.5}),
        ("multilabel_margin_loss", (_X, _ML), {}),
        ("gaussian_nll_loss", (_X, _Y, _VAR), {"full": True}),
        ("poisson_nll_loss", (_X, _COUNTS), {"full": True}),
    ]
    for name, args, kwargs in cases:
        compiled = jax.jit(lambda *a, name=name, kwargs=kwargs: getattr(F, name)(*a, **kwargs))
        want = getattr(TF, name)(*[torch.from_numpy(np.asarray(a)) for a in args], **kwargs)
        got = compiled(*[jnp.asarray(a) for a in args])
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, err_msg=name)
    loss = jm.nn.MultiMarginLoss(p=2, weight=np.array([1.0, 2, 3, 4], np.float32))
    loss.compile()
    want = torch.nn.MultiMarginLoss(p=2, weight=torch.tensor([1.0, 2, 3, 4]))(
        torch.from_numpy(_X), torch.from_numpy(_T)
    )
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(loss(_X, jnp.asarray(_T, jnp.int32))),
                                   want.numpy(), rtol=1e-5)  # fmt: skip


@pytest.mark.torch
def test_legacy_size_average_and_reduce_map_and_warn_like_torch():
    names = ["hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
             "poisson_nll_loss", "multi_margin_loss", "multilabel_margin_loss"]  # fmt: skip
    for name in names:
        args = FUNCTIONAL[name]
        for size_average, reduce in [(False, None), (None, False), (True, True)]:
            with pytest.warns(UserWarning, match="size_average and reduce args will be deprecated"):
                got = getattr(F, name)(*args, size_average=size_average, reduce=reduce)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = getattr(TF, name)(
                    *[torch.from_numpy(a) for a in args], size_average=size_average, reduce=reduce
                )
            np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, err_msg=name)
    modules = ["HingeEmbeddingLoss", "SoftMarginLoss", "MultiLabelSoftMarginLoss",
               "PoissonNLLLoss", "MultiMarginLoss", "MultiLabelMarginLoss"]  # fmt: skip
    for name in modules:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = getattr(torch.nn, name)(size_average=False)
        with pytest.warns(UserWarning, match="please use reduction='sum'"):
            ours = getattr(jm.nn, name)(size_average=False)
        assert ours.reduction == ref.reduction == "sum"


@pytest.mark.torch
def test_weights_are_buffers_and_reprs_match_torch():
    for name in ("MultiMarginLoss", "MultiLabelSoftMarginLoss"):
        ref = getattr(torch.nn, name)(weight=W4)
        ours = getattr(jm.nn, name)(weight=W4.numpy())
        assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight"]
        assert repr(ours) == repr(ref)
        ours.to(jnp.bfloat16)
        assert ours.weight.dtype == jnp.bfloat16
    mods = [
        ("GaussianNLLLoss", {"full": True, "eps": 1e-3}),
        ("PoissonNLLLoss", {"log_input": False}),
        ("TripletMarginWithDistanceLoss", {"margin": 0.5, "swap": True}),
        ("HingeEmbeddingLoss", {"margin": 2.0}),
    ]
    for name, kwargs in mods:
        assert repr(getattr(jm.nn, name)(**kwargs)) == repr(getattr(torch.nn, name)(**kwargs))
    # The default distance is a PairwiseDistance submodule, as in PyTorch.
    loss = jm.nn.TripletMarginWithDistanceLoss()
    assert isinstance(loss.distance_function, jm.nn.PairwiseDistance)
    assert [n for n, _ in loss.named_modules()] == ["", "distance_function"]


# ----------------------------------------------------------------------------- errors


def _torch_error(fn):
    with pytest.raises(Exception) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn()
    return info.value


def _t(*arrays):
    return [torch.from_numpy(np.asarray(a)) for a in arrays]


@pytest.mark.torch
def test_errors_match_torch():
    x, y, t, ml, var, signs = _t(_X, _Y, _T, _ML, _VAR, _SIGNS)
    cases = [
        (lambda: TF.hinge_embedding_loss(x, torch.ones(5)),
         lambda: F.hinge_embedding_loss(_X, np.ones(5))),
        (lambda: TF.hinge_embedding_loss(x, signs, reduction="avg"),
         lambda: F.hinge_embedding_loss(_X, _SIGNS, reduction="avg")),
        (lambda: TF.soft_margin_loss(x, torch.ones(5)), lambda: F.soft_margin_loss(_X, np.ones(5))),
        (lambda: TF.multilabel_soft_margin_loss(x, y, reduction="avg"),
         lambda: F.multilabel_soft_margin_loss(_X, _Y, reduction="avg")),
        (lambda: TF.multilabel_soft_margin_loss(x, y, weight=torch.ones(3)),
         lambda: F.multilabel_soft_margin_loss(_X, _Y, weight=np.ones(3))),
        (lambda: TF.multilabel_soft_margin_loss(torch.tensor(0.3), torch.tensor(1.0)),
         lambda: F.multilabel_soft_margin_loss(np.float32(0.3), np.float32(1.0))),
        (lambda: TF.poisson_nll_loss(x, torch.ones(5)), lambda: F.poisson_nll_loss(_X, np.ones(5))),
        (lambda: TF.poisson_nll_loss(x, y, reduction="avg"),
         lambda: F.poisson_nll_loss(_X, _Y, reduction="avg")),
        (lambda: TF.gaussian_nll_loss(x, y, -var), lambda: F.gaussian_nll_loss(_X, _Y, -_VAR)),
        (lambda: TF.gaussian_nll_loss(x, y, -1.0), lambda: F.gaussian_nll_loss(_X, _Y, -1.0)),
        (lambda: TF.gaussian_nll_loss(x, y, torch.ones(3, 2)),
         lambda: F.gaussian_nll_loss(_X, _Y, np.ones((3, 2)))),
        (lambda: TF.gaussian_nll_loss(x, y, torch.tensor(1.0)),
         lambda: F.gaussian_nll_loss(_X, _Y, jnp.ones(()))),
        (lambda: TF.gaussian_nll_loss(x, y, var, reduction="avg"),
         lambda: F.gaussian_nll_loss(_X, _Y, _VAR, reduction="avg")),
        (lambda: TF.gaussian_nll_loss(x, torch.ones(5), var),
         lambda: F.gaussian_nll_loss(_X, np.ones(5), _VAR)),
        (lambda: TF.multi_margin_loss(x, t, p=3), lambda: F.multi_margin_loss(_X, _T, p=3)),
        (lambda: TF.multi_margin_loss(x, t, weight=torch.ones(1, 4)),
         lambda: F.multi_margin_loss(_X, _T, weight=np.ones((1, 4)))),
        (lambda: TF.multi_margin_loss(x, t, weight=torch.ones(3)),
         lambda: F.multi_margin_loss(_X, _T, weight=np.ones(3))),
        (lambda: TF.multi_margin_loss(x, t[:2]), lambda: F.multi_margin_loss(_X, _T[:2])),
        (lambda: TF.multi_margin_loss(x, t[:, None]), lambda: F.multi_margin_loss(_X, _T[:, None])),
        (lambda: TF.multi_margin_loss(x, torch.tensor([0, 1, 4])),
         lambda: F.multi_margin_loss(_X, np.array([0, 1, 4]))),
        (lambda: TF.multi_margin_loss(x, torch.tensor([0, -1, 2])),
         lambda: F.multi_margin_loss(_X, np.array([0, -1, 2]))),
        (lambda: TF.multi_margin_loss(x, t.float()), lambda: F.multi_margin_loss(_X, _T * 1.0)),
        (lambda: TF.multi_margin_loss(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)),
         lambda: F.multi_margin_loss(np.ones((2, 3, 4)), np.zeros((2, 3), int))),
        (lambda: TF.multi_margin_loss(torch.randn(3, 0), t),
         lambda: F.multi_margin_loss(np.ones((3, 0)), _T)),
        (lambda: TF.multilabel_margin_loss(x, ml[:1]),
         lambda: F.multilabel_margin_loss(_X, _ML[:1])),
        (lambda: TF.multilabel_margin_loss(x[0], ml), lambda: F.multilabel_margin_loss(_X[0], _ML)),
        (lambda: TF.multilabel_margin_loss(x, ml.clamp(-1, 2) + torch.tensor([0, 0, 0, 2])),
         lambda: F.multilabel_margin_loss(_X, np.clip(_ML, -1, 2) + np.array([0, 0, 0, 2]))),
        (lambda: TF.multilabel_margin_loss(x, ml - 1),
         lambda: F.multilabel_margin_loss(_X, _ML - 1)),
        (lambda: TF.multilabel_margin_loss(x, ml.float()),
         lambda: F.multilabel_margin_loss(_X, _ML * 1.0)),
        (lambda: TF.triplet_margin_with_distance_loss(x, x, x[0]),
         lambda: F.triplet_margin_with_distance_loss(_X, _X, _X[0])),
        (lambda: TF.triplet_margin_with_distance_loss(x, x, x, margin=0),
         lambda: F.triplet_margin_with_distance_loss(_X, _X, _X, margin=0)),
        (lambda: TF.triplet_margin_with_distance_loss(x, x, x, reduction="avg"),
         lambda: F.triplet_margin_with_distance_loss(_X, _X, _X, reduction="avg")),
        (lambda: torch.nn.TripletMarginWithDistanceLoss(margin=-1.0),
         lambda: jm.nn.TripletMarginWithDistanceLoss(margin=-1.0)),
        (lambda: torch.nn.MultiMarginLoss(p=3), lambda: jm.nn.MultiMarginLoss(p=3)),
        (lambda: torch.nn.MultiMarginLoss(weight=torch.ones(2, 2)),
         lambda: jm.nn.MultiMarginLoss(weight=np.ones((2, 2)))),
    ]  # fmt: skip
    for torch_fn, jm_fn in cases:
        expected = _torch_error(torch_fn)
        with pytest.raises(type(expected)) as info:
            jm_fn()
        # The leading words of PyTorch's message (shapes are printed as tuples here).
        head = str(expected).split("(")[0].split("[")[0].split(" at ")[0].strip()
        assert head and str(info.value).startswith(head[:30]), (str(info.value), str(expected))


def test_reduction_checks_do_not_warn():
    # No stray warnings (the suite turns them into errors) from the new losses.
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("error")
        for name, args in FUNCTIONAL.items():
            getattr(F, name)(*args)
