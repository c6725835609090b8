"""Losses (modules and ``F``) against PyTorch live.

The registry runs the shared layer checks (tests/layer_harness.py) on each loss
module; the functional tests sweep every loss over the three reductions, and
the rest covers what a registry cannot: CTC gradients, legacy arguments,
warnings and error messages.
"""

import contextlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm

pytestmark = pytest.mark.torch

F = jm.nn.functional

# Loss modules have no parameters (only weight buffers): the init check has nothing to see.
NO_INIT = tuple(k for k in ALL_CHECKS if k != "init")
# For a variant whose gradient code path another case already differentiates.
NO_GRADS = tuple(k for k in NO_INIT if k != "grads")


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def _uniform(*shape, lo=0.0, hi=1.0):
    return lambda rng: rng.uniform(lo, hi, shape).astype(np.float32)


def _classes(shape, n_classes, ignore=False):
    def make(rng):
        t = rng.integers(0, n_classes, shape).astype(np.int64)
        if ignore:
            t.flat[::3] = -100
        return t

    return make


def _probs(*shape):
    return lambda rng: np.asarray(torch.from_numpy(rng.standard_normal(shape)).float().softmax(1))


def _log_probs(*shape):
    return lambda rng: np.asarray(
        torch.from_numpy(rng.standard_normal(shape)).float().log_softmax(-1)
    )


def _signs(*shape, dtype=np.float32):
    return lambda rng: np.where(rng.standard_normal(shape) > 0, 1, -1).astype(dtype)


def _ins(*makers):
    return lambda rng: tuple(m(rng) for m in makers)


def _ctc_inputs(rng):
    lp = _log_probs(6, 3, 5)(rng)
    targets = rng.integers(1, 5, (3, 3)).astype(np.int64)
    return lp, targets, np.array([6, 5, 6]), np.array([3, 2, 0])


W4 = torch.tensor([0.2, 1.0, 0.5, 2.0])

CASES = [
    LayerCase("MSELoss", inputs=_ins(_normal(3, 4), _normal(3, 4)), checks=NO_INIT),
    LayerCase("L1Loss", kwargs={"reduction": "sum"}, inputs=_ins(_normal(3, 4), _normal(3, 4)),
              checks=NO_INIT),
    LayerCase("SmoothL1Loss", kwargs={"beta": 0.5, "reduction": "none"},
              inputs=_ins(_normal(3, 4), _normal(3, 4)), checks=NO_INIT),
    LayerCase("SmoothL1Loss", kwargs={"beta": 0.0}, inputs=_ins(_normal(5), _normal(5)),
              checks=NO_INIT),
    LayerCase("HuberLoss", kwargs={"delta": 0.7}, inputs=_ins(_normal(3, 4), _normal(3, 4)),
              checks=NO_INIT),
    LayerCase("CrossEntropyLoss", inputs=_ins(_normal(5, 4), _classes((5,), 4)), checks=NO_INIT),
    LayerCase("CrossEntropyLoss", kwargs={"weight": W4, "label_smoothing": 0.2},
              inputs=_ins(_normal(6, 4), _classes((6,), 4, ignore=True)),
              id="CrossEntropyLoss(weight, label_smoothing=0.2)-ignored", checks=NO_INIT),
    LayerCase("CrossEntropyLoss", kwargs={"ignore_index": 2, "reduction": "sum"},
              inputs=_ins(_normal(6, 4), _classes((6,), 4)), checks=NO_GRADS),
    LayerCase("CrossEntropyLoss", kwargs={"weight": W4, "label_smoothing": 0.1},
              inputs=_ins(_normal(5, 4), _probs(5, 4)),
              id="CrossEntropyLoss(weight, label_smoothing=0.1)-probabilities",
              checks=NO_INIT),
    LayerCase("CrossEntropyLoss", kwargs={"reduction": "none"},
              inputs=_ins(_normal(2, 4, 3, 2), _classes((2, 3, 2), 4)),
              id="CrossEntropyLoss-spatial", checks=NO_INIT),
    LayerCase("CrossEntropyLoss", inputs=_ins(_normal(4), _classes((), 4)),
              id="CrossEntropyLoss-unbatched", checks=NO_GRADS),
    LayerCase("NLLLoss", kwargs={"weight": W4},
              inputs=_ins(_log_probs(6, 4), _classes((6,), 4, ignore=True)),
              id="NLLLoss(weight)-ignored", checks=NO_INIT),
    LayerCase("NLLLoss", kwargs={"reduction": "none"},
              inputs=_ins(_normal(2, 4, 3), _classes((2, 3), 4)), id="NLLLoss-spatial",
              checks=NO_INIT),
    LayerCase("BCELoss", kwargs={"weight": torch.tensor([0.5, 1.0, 2.0, 1.5])},
              inputs=_ins(_uniform(3, 4, lo=0.05, hi=0.95), _uniform(3, 4)),
              id="BCELoss(weight)", checks=NO_INIT),
    LayerCase("BCEWithLogitsLoss",
              kwargs={"pos_weight": torch.tensor([0.5, 1.0, 3.0, 2.0]),
                      "weight": torch.tensor([[1.0], [0.5], [2.0]])},
              inputs=_ins(_normal(3, 4), _uniform(3, 4)),
              id="BCEWithLogitsLoss(weight, pos_weight)", checks=NO_INIT),
    LayerCase("BCEWithLogitsLoss", kwargs={"reduction": "none"},
              inputs=_ins(_normal(3, 4), _uniform(3, 4)), checks=NO_GRADS),
    LayerCase("KLDivLoss", kwargs={"reduction": "batchmean"},
              inputs=_ins(_log_probs(3, 4), _probs(3, 4)), checks=NO_INIT),
    LayerCase("KLDivLoss", kwargs={"reduction": "sum", "log_target": True},
              inputs=_ins(_log_probs(3, 4), _log_probs(3, 4)), checks=NO_INIT),
    LayerCase("CosineEmbeddingLoss", kwargs={"margin": 0.2},
              inputs=_ins(_normal(4, 5), _normal(4, 5), _signs(4, dtype=np.int64)),
              checks=NO_INIT),
    LayerCase("MarginRankingLoss", kwargs={"margin": 0.5},
              inputs=_ins(_normal(6), _normal(6), _signs(6)), checks=NO_INIT),
    LayerCase("TripletMarginLoss", inputs=_ins(_normal(4, 5), _normal(4, 5), _normal(4, 5)),
              checks=NO_INIT),
    LayerCase("TripletMarginLoss", kwargs={"p": 1.0, "swap": True, "margin": 3.0},
              inputs=_ins(_normal(4, 5), _normal(4, 5), _normal(4, 5)), checks=NO_INIT),
    # CTC: PyTorch's backward differs from the true gradient with respect to
    # log_probs by design (see F.ctc_loss); gradients are compared through
    # log_softmax in test_ctc_gradients_through_log_softmax_match_torch.
    LayerCase("CTCLoss", inputs=_ctc_inputs, checks=("state_dict", "repr", "forward",
              "compiled", "bfloat16", "float16")),
    LayerCase("CTCLoss", kwargs={"blank": 4, "reduction": "none", "zero_infinity": True},
              inputs=lambda rng: (_log_probs(6, 3, 5)(rng), rng.integers(0, 4, (3, 4)),
                                  np.array([6, 3, 5]), np.array([4, 4, 1])),
              checks=("forward", "compiled", "bfloat16")),
]  # fmt: skip

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_loss_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


# ----------------------------------------------------------------------------- functional


def _arrays(*values):
    return [np.asarray(v) for v in values]


_R = np.random.default_rng(7)
_X, _Y = _R.standard_normal((2, 3, 4)).astype(np.float32)
_LOGP = _log_probs(3, 4)(_R)
_T = np.array([0, 3, 1])
_P = _uniform(3, 4, lo=0.05, hi=0.95)(_R)
_Z = _uniform(3, 4)(_R)
_SIGN = np.array([1.0, -1.0, 1.0], np.float32)

FUNCTIONAL = {
    "mse_loss": (_X, _Y),
    "l1_loss": (_X, _Y),
    "smooth_l1_loss": (_X, _Y),
    "huber_loss": (_X, _Y),
    "nll_loss": (_LOGP, _T),
    "cross_entropy": (_X, _T),
    "binary_cross_entropy": (_P, _Z),
    "binary_cross_entropy_with_logits": (_X, _Z),
    "kl_div": (_LOGP, _Z),
    "cosine_embedding_loss": (_X, _Y, _SIGN),
    "margin_ranking_loss": (_X[:, 0], _Y[:, 0], _SIGN),
    "triplet_margin_loss": (_X, _Y, _Z),
}


@pytest.mark.parametrize("name", list(FUNCTIONAL))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_functional_loss_matches_torch(name, reduction):
    args = FUNCTIONAL[name]
    # kl_div's "mean" warns (in both frameworks): checked in its own test below.
    warns = (name, reduction) == ("kl_div", "mean")
    with pytest.warns(UserWarning, match="batchmean") if warns else contextlib.nullcontext():
        want = getattr(TF, name)(*[torch.from_numpy(a) for a in args], reduction=reduction)
        got = getattr(F, name)(*[jnp.asarray(a) for a in args], reduction=reduction)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


def test_weighted_regression_losses_match_torch():
    w = np.abs(_Y) + 0.1
    for name in ("mse_loss", "l1_loss", "huber_loss"):
        for reduction in ("none", "mean", "sum"):
            want = getattr(TF, name)(
                torch.from_numpy(_X), torch.from_numpy(_Y), reduction=reduction,
                weight=torch.from_numpy(w),
            )  # fmt: skip
            got = getattr(F, name)(_X, _Y, reduction=reduction, weight=w)
            np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, err_msg=name)


def test_legacy_size_average_and_reduce_map_and_warn_like_torch():
    for size_average, reduce in [(False, None), (None, False), (True, True)]:
        with pytest.warns(UserWarning, match="size_average and reduce args will be deprecated"):
            got = F.mse_loss(_X, _Y, size_average=size_average, reduce=reduce)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = TF.mse_loss(
                torch.from_numpy(_X), torch.from_numpy(_Y), size_average=size_average,
                reduce=reduce,
            )  # fmt: skip
            ref_module = torch.nn.L1Loss(size_average=size_average, reduce=reduce)
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)
        with pytest.warns(UserWarning, match="please use reduction='"):
            module = jm.nn.L1Loss(size_average=size_average, reduce=reduce)
        assert module.reduction == ref_module.reduction


def test_kl_div_mean_warns_like_torch_and_matches():
    with pytest.warns(UserWarning, match="'batchmean' divides only by the batch size"):
        got = jm.nn.KLDivLoss()(_LOGP, _Z)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch.nn.KLDivLoss()(torch.from_numpy(_LOGP), torch.from_numpy(_Z))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)


def test_broadcasting_regression_loss_warns_and_broadcasts_like_torch():
    y = _Y[:, :1]
    with pytest.warns(UserWarning, match=r"target size \(\(3, 1\)\) that is different"):
        got = F.mse_loss(_X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = TF.mse_loss(torch.from_numpy(_X), torch.from_numpy(y))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)


def test_cross_entropy_all_ignored_is_nan_like_torch():
    t = np.full(3, -100)
    want = TF.cross_entropy(torch.from_numpy(_X), torch.from_numpy(t))
    got = F.cross_entropy(_X, t)
    assert np.isnan(want.item()) and np.isnan(float(got))


def test_cross_entropy_accepts_int32_targets_and_compiles():
    # JAX's default integer is int32 (PyTorch wants int64): both give the same loss.
    t = jnp.asarray(_T, jnp.int32)
    want = TF.cross_entropy(torch.from_numpy(_X), torch.from_numpy(_T), label_smoothing=0.3)
    loss = jm.nn.CrossEntropyLoss(label_smoothing=0.3)
    eager = loss(_X, t)
    loss.compile()
    np.testing.assert_allclose(np.asarray(eager), want.numpy(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(loss(jnp.asarray(_X), t)), want.numpy(), rtol=1e-5)


def test_loss_weights_are_buffers_in_state_dict_and_follow_dtype():
    ours = jm.nn.BCEWithLogitsLoss(weight=np.ones(4), pos_weight=np.full(4, 2.0))
    ref = torch.nn.BCEWithLogitsLoss(weight=torch.ones(4), pos_weight=torch.full((4,), 2.0))
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight", "pos_weight"]
    ours.to(jnp.bfloat16)
    assert ours.pos_weight.dtype == jnp.bfloat16
    out = ours(jnp.asarray(_X, jnp.bfloat16), jnp.asarray(_Z, jnp.bfloat16))
    assert out.dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- CTC


def _ctc_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(7, 3, 5, generator=g)
    targets = torch.randint(1, 5, (3, 4), generator=g)
    targets[1, 1] = targets[1, 0]  # a repeated label needs a blank between
    return logits, targets, torch.tensor([7, 6, 7]), torch.tensor([4, 2, 1])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_gradients_through_log_softmax_match_torch(reduction):
    logits, targets, in_len, tgt_len = _ctc_case()
    leaf = logits.clone().requires_grad_(True)
    want = TF.ctc_loss(leaf.log_softmax(-1), targets, in_len, tgt_len, reduction=reduction)
    cot = torch.linspace(0.5, 1.5, want.numel()).reshape(want.shape)
    (want * cot).sum().backward()

    def f(x):
        lp = jax.nn.log_softmax(x, axis=-1)
        out = F.ctc_loss(lp, targets.numpy(), in_len.numpy(), tgt_len.numpy(), reduction=reduction)
        return (out * jnp.asarray(cot.numpy())).sum()

    value, grad = jax.value_and_grad(f)(jnp.asarray(logits.numpy()))
    np.testing.assert_allclose(float(value), (want * cot).sum().item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), leaf.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_ctc_concatenated_targets_impossible_alignments_and_zero_infinity_match_torch():
    logits, targets, in_len, _ = _ctc_case(1)
    lp = logits.log_softmax(-1)
    tgt_len = torch.tensor([4, 2, 3])
    flat = torch.cat([targets[0, :4], targets[1, :2], targets[2, :3]])
    short = torch.tensor([7, 1, 7])  # element 1 cannot emit two labels in one step
    for zero_infinity in (False, True):
        for inputs in [(flat, in_len, tgt_len), (targets, short, tgt_len)]:
            want = TF.ctc_loss(lp, *inputs, reduction="none", zero_infinity=zero_infinity)
            got = F.ctc_loss(
                lp.numpy(), *[t.numpy() for t in inputs], reduction="none",
                zero_infinity=zero_infinity,
            )  # fmt: skip
            np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)


def test_ctc_zero_infinity_gradients_are_zero_not_nan():
    logits, targets, _, tgt_len = _ctc_case(2)

    def f(x):
        lp = jax.nn.log_softmax(x, axis=-1)
        return F.ctc_loss(lp, targets.numpy(), (7, 1, 7), tgt_len.numpy(), zero_infinity=True)

    grad = np.asarray(jax.grad(f)(jnp.asarray(logits.numpy())))
    assert np.isfinite(grad).all()
    assert not grad[:, 1].any()  # the impossible element contributes nothing


def test_ctc_unbatched_matches_torch():
    logits, targets, in_len, tgt_len = _ctc_case(3)
    lp = logits[:, 0].log_softmax(-1)
    want = TF.ctc_loss(lp, targets[0], in_len[0], tgt_len[0], reduction="none")
    got = F.ctc_loss(lp.numpy(), targets[0].numpy(), 7, 4, reduction="none")
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5)


# ----------------------------------------------------------------------------- errors


def _torch_error(fn):
    with pytest.raises(Exception) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn()
    return info.value


def test_errors_match_torch():
    x, t = torch.from_numpy(_X), torch.from_numpy(_T)
    cases = [
        (lambda: TF.mse_loss(x, x, reduction="avg"), lambda: F.mse_loss(_X, _X, reduction="avg")),
        (lambda: TF.cross_entropy(x, t[:2]), lambda: F.cross_entropy(_X, _T[:2])),
        (lambda: TF.cross_entropy(x, torch.tensor([0, 1, 7])),
         lambda: F.cross_entropy(_X, np.array([0, 1, 7]))),
        (lambda: TF.cross_entropy(x, torch.from_numpy(_Z), ignore_index=1),
         lambda: F.cross_entropy(_X, _Z, ignore_index=1)),
        (lambda: TF.binary_cross_entropy(torch.from_numpy(_P), torch.from_numpy(_Z[:, :1])),
         lambda: F.binary_cross_entropy(_P, _Z[:, :1])),
        (lambda: TF.binary_cross_entropy_with_logits(x, torch.from_numpy(_Z[:, :1])),
         lambda: F.binary_cross_entropy_with_logits(_X, _Z[:, :1])),
        (lambda: TF.binary_cross_entropy(x, torch.from_numpy(_Z)),
         lambda: F.binary_cross_entropy(_X, _Z)),
        (lambda: TF.triplet_margin_loss(x, x, x, margin=0), lambda: F.triplet_margin_loss(
            _X, _X, _X, margin=0)),
        (lambda: torch.nn.TripletMarginLoss(margin=-1.0), lambda: jm.nn.TripletMarginLoss(
            margin=-1.0)),
        (lambda: TF.margin_ranking_loss(x, x, t), lambda: F.margin_ranking_loss(_X, _X, _T)),
        (lambda: TF.nll_loss(x, t, weight=torch.ones(5)),
         lambda: F.nll_loss(_X, _T, weight=np.ones(5))),
        (lambda: TF.ctc_loss(torch.from_numpy(_LOGP)[:, None], t[None], (3,), (3,), blank=4),
         lambda: F.ctc_loss(_LOGP[:, None], _T[None], (3,), (3,), blank=4)),
        (lambda: TF.ctc_loss(torch.from_numpy(_LOGP)[:, None], t[None], (4,), (3,)),
         lambda: F.ctc_loss(_LOGP[:, None], _T[None], (4,), (3,))),
    ]  # fmt: skip
    for torch_fn, jm_fn in cases:
        expected = _torch_error(torch_fn)
        with pytest.raises(type(expected)) as info:
            jm_fn()
        # The leading words of PyTorch's message (shapes are printed as tuples here).
        head = str(expected).split("(")[0].split("[")[0].split(" at ")[0].strip()
        assert head and str(info.value).startswith(head[:30]), (str(info.value), str(expected))
