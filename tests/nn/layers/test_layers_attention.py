"""MultiheadAttention and the attention functions against PyTorch live."""

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
L, S, N, E = 4, 5, 2, 8
NO_INIT = tuple(k for k in ALL_CHECKS if k != "init")


def _x(*shape):
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def _ins(*makers):
    return lambda rng: tuple(m(rng) for m in makers)


_PAD = np.zeros((N, S), bool)
_PAD[0, -2:] = True  # the first sequence has two padding keys
_BOOL_MASK = np.triu(np.ones((L, S), bool), 1)
_FLOAT_MASK = np.random.default_rng(3).standard_normal((L, S)).astype(np.float32)
_CAUSAL = np.triu(np.full((L, L), -np.inf, np.float32), 1)
_PER_HEAD = np.random.default_rng(4).standard_normal((N * 2, L, S)).astype(np.float32)

CASES = [
    LayerCase("MultiheadAttention", (E, 2), inputs=_ins(_x(L, N, E), _x(S, N, E), _x(S, N, E)),
              checks=NO_INIT),
    LayerCase("MultiheadAttention", (E, 2), {"batch_first": True},
              inputs=_ins(_x(N, L, E), _x(N, S, E), _x(N, S, E)),
              call_kwargs={"key_padding_mask": _PAD, "attn_mask": _BOOL_MASK,
                           "average_attn_weights": False},
              id="MultiheadAttention(batch_first)-bool-masks-per-head-weights", checks=NO_INIT),
    LayerCase("MultiheadAttention", (E, 2),
              {"kdim": 3, "vdim": 6, "add_bias_kv": True, "add_zero_attn": True},
              inputs=_ins(_x(L, N, E), _x(S, N, 3), _x(S, N, 6)),
              call_kwargs={"attn_mask": _FLOAT_MASK, "key_padding_mask": _PAD},
              id="MultiheadAttention(kdim, vdim, add_bias_kv, add_zero_attn)-float-mask",
              checks=NO_INIT),
    LayerCase("MultiheadAttention", (E, 2), {"bias": False},
              inputs=_ins(_x(L, N, E), _x(S, N, E), _x(S, N, E)),
              call_kwargs={"need_weights": False, "key_padding_mask": _PAD,
                           "attn_mask": _PER_HEAD},
              id="MultiheadAttention(bias=False)-no-weights-3d-mask", checks=NO_INIT),
    LayerCase("MultiheadAttention", (E, 2), {"dropout": 0.5},
              inputs=_ins(_x(L, E), _x(S, E), _x(S, E)), random=True,
              id="MultiheadAttention(dropout=0.5)-unbatched",
              checks=tuple(k for k in NO_INIT if k != "grads")),  # grads: batched cases
    LayerCase("MultiheadAttention", (E, 2), inputs=_ins(_x(L, N, E), _x(L, N, E), _x(L, N, E)),
              call_kwargs={"attn_mask": _CAUSAL, "is_causal": True, "need_weights": False},
              id="MultiheadAttention-is_causal", checks=NO_INIT),
    LayerCase("MultiheadAttention", (64, 4), checks=("init",)),
    LayerCase("MultiheadAttention", (64, 4), {"kdim": 32, "vdim": 48, "add_bias_kv": True},
              checks=("init",)),
]  # fmt: skip

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_attention_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


def _torch_raises(fn):
    with pytest.raises(Exception) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn()
    return info.value


def _pair(seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, 2)
    ours = jm.nn.MultiheadAttention(E, 2)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.torch
def test_self_attention_with_one_array_uses_the_packed_projection_and_matches():
    ref, ours = _pair()
    x = np.random.default_rng(0).standard_normal((L, N, E)).astype(np.float32)
    xt = torch.from_numpy(x)
    want = ref(xt, xt, xt, need_weights=False)[0].detach().numpy()
    xj = jnp.asarray(x)
    np.testing.assert_allclose(np.asarray(ours(xj, xj, xj, need_weights=False)[0]), want,
                               rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.torch
def test_fully_masked_rows_nan_with_weights_zero_without_like_torch():
    ref, ours = _pair(1)
    x = np.random.default_rng(1).standard_normal((L, N, E)).astype(np.float32)
    pad = np.ones((N, L), bool)
    pad[1] = False
    for need_weights in (True, False):
        want = ref(*[torch.from_numpy(x)] * 3, key_padding_mask=torch.from_numpy(pad),
                   need_weights=need_weights)[0].detach().numpy()  # fmt: skip
        got = np.asarray(ours(x, x, x, key_padding_mask=pad, need_weights=need_weights)[0])
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-5,
                                   atol=1e-6)  # fmt: skip


def test_attention_dropout_draws_from_the_default_generator():
    ours = jm.nn.MultiheadAttention(E, 2, dropout=0.5)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((L, N, E)), jnp.float32)
    jm.manual_seed(3)
    a = ours(x, x, x)
    b = ours(x, x, x)
    assert not np.allclose(a[0], b[0])
    jm.manual_seed(3)
    np.testing.assert_array_equal(np.asarray(ours(x, x, x)[1]), np.asarray(a[1]))
    ours.eval()
    np.testing.assert_array_equal(np.asarray(ours(x, x, x)[0]), np.asarray(ours(x, x, x)[0]))


# ----------------------------------------------------------------------------- functional

_Q = np.random.default_rng(5).standard_normal((2, 3, L, 4)).astype(np.float32)
_K = np.random.default_rng(6).standard_normal((2, 3, S, 4)).astype(np.float32)
_V = np.random.default_rng(7).standard_normal((2, 3, S, 6)).astype(np.float32)
_ROWS = np.random.default_rng(8).random((L, S)) > 0.4
_ROWS[1] = False  # a row that may attend nowhere

SDPA_CASES = {
    "plain": {},
    "bool-mask": {"attn_mask": _ROWS},
    "float-mask": {"attn_mask": _FLOAT_MASK},
    "causal-rectangular": {"is_causal": True},
    "scale": {"scale": 0.3, "attn_mask": _BOOL_MASK[None, None]},
    "dropout-1": {"dropout_p": 1.0},
}


@pytest.mark.torch
def test_sdpa_causal_with_a_mask_raises_like_torch():
    expected = _torch_raises(
        lambda: TF.scaled_dot_product_attention(
            *[torch.from_numpy(a) for a in (_Q, _K, _V)],
            attn_mask=torch.from_numpy(_ROWS),
            is_causal=True,
        )
    )
    with pytest.raises(RuntimeError) as info:
        F.scaled_dot_product_attention(_Q, _K, _V, attn_mask=_ROWS, is_causal=True)
    assert str(info.value).startswith(str(expected))


@pytest.mark.torch
@pytest.mark.parametrize("name", list(SDPA_CASES))
def test_scaled_dot_product_attention_matches_torch(name):
    kwargs = SDPA_CASES[name]
    t_kwargs = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                for k, v in kwargs.items()}  # fmt: skip
    leaves = [torch.from_numpy(a).requires_grad_(True) for a in (_Q, _K, _V)]
    want = TF.scaled_dot_product_attention(*leaves, **t_kwargs)
    cot = np.random.default_rng(9).standard_normal(want.shape).astype(np.float32)
    (want * torch.from_numpy(cot)).sum().backward()

    def f(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, **kwargs) * cot).sum()

    got = F.scaled_dot_product_attention(_Q, _K, _V, **kwargs)
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads = jax.grad(f, argnums=(0, 1, 2))(*map(jnp.asarray, (_Q, _K, _V)))
    for g, leaf in zip(grads, leaves):
        np.testing.assert_allclose(np.asarray(g), leaf.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.torch
def test_sdpa_grouped_query_and_unbatched_match_torch():
    q = np.random.default_rng(10).standard_normal((1, 4, L, 4)).astype(np.float32)
    want = TF.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(_K[:1, :2]), torch.from_numpy(_V[:1, :2]),
        enable_gqa=True,
    )  # fmt: skip
    got = F.scaled_dot_product_attention(q, _K[:1, :2], _V[:1, :2], enable_gqa=True)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)
    want = TF.scaled_dot_product_attention(*[torch.from_numpy(a[0, 0]) for a in (_Q, _K, _V)])
    got = F.scaled_dot_product_attention(_Q[0, 0], _K[0, 0], _V[0, 0])
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


def test_sdpa_dropout_is_seeded_and_compiles_like_eager():
    @jm.compile
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)

    jm.manual_seed(11)
    eager = F.scaled_dot_product_attention(_Q, _K, _V, dropout_p=0.4)
    jm.manual_seed(11)
    compiled = attend(jnp.asarray(_Q), jnp.asarray(_K), jnp.asarray(_V))
    np.testing.assert_allclose(np.asarray(compiled), np.asarray(eager), rtol=1e-5, atol=1e-6)
    assert not np.allclose(eager, F.scaled_dot_product_attention(_Q, _K, _V))


@pytest.mark.torch
def test_multi_head_attention_forward_separate_weights_and_static_kv_match_torch():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((L, N, E)).astype(np.float32)
    k = rng.standard_normal((S, N, 3)).astype(np.float32)
    v = rng.standard_normal((S, N, 5)).astype(np.float32)
    w = {
        "q_proj_weight": rng.standard_normal((E, E)),
        "k_proj_weight": rng.standard_normal((E, 3)),
        "v_proj_weight": rng.standard_normal((E, 5)),
        "static_k": rng.standard_normal((N * 2, 6, E // 2)),
        "static_v": rng.standard_normal((N * 2, 6, E // 2)),
    }
    w = {name: a.astype(np.float32) * 0.3 for name, a in w.items()}
    bias, out_w = rng.standard_normal(3 * E).astype(np.float32), np.eye(E, dtype=np.float32)
    common = (E, 2)
    for static in (False, True):
        extra = w if static else {k_: v_ for k_, v_ in w.items() if not k_.startswith("static")}
        t_args = [torch.from_numpy(a) for a in (q, k, v)]
        want = TF.multi_head_attention_forward(
            *t_args, *common, None, torch.from_numpy(bias), None, None, False, 0.0,
            torch.from_numpy(out_w), None, use_separate_proj_weight=True,
            average_attn_weights=False, **{n: torch.from_numpy(a) for n, a in extra.items()},
        )  # fmt: skip
        got = F.multi_head_attention_forward(
            q, k, v, *common, None, bias, None, None, False, 0.0, out_w, None,
            use_separate_proj_weight=True, average_attn_weights=False, **extra,
        )  # fmt: skip
        for g, t in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), t.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.torch
def test_errors_name_expected_and_given_shapes():
    _, ours = _pair()
    x = np.zeros((L, N, E), np.float32)
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        jm.nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match=r"greater than 0, got embed_dim=0"):
        jm.nn.MultiheadAttention(0, 1)
    with pytest.raises(ValueError, match=r"2D attn_mask is \(4, 4\), but should be \(4, 5\)"):
        ours(x, x[:1].repeat(S, 0), x[:1].repeat(S, 0), attn_mask=np.zeros((L, L), bool))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 4\) \(N, S\), but got \(2, 5\)"):
        ours(x, x, x, key_padding_mask=np.zeros((N, L + 1), bool))
    with pytest.raises(ValueError, match=r"received a 4-D query of shape \(1, 4, 2, 8\)"):
        ours(x[None], x, x)
    with pytest.raises(ValueError, match=r"expecting embedding dimension of 8, but got 6"):
        ours(x[..., :6], x[..., :6], x[..., :6])
    expected = _torch_raises(lambda: torch.nn.MultiheadAttention(E, 2)(
        *[torch.zeros(L, N, E)] * 3, is_causal=True))  # fmt: skip
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        ours(x, x, x, is_causal=True)
    assert isinstance(expected, RuntimeError)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 5\) does not broadcast"):
        F.scaled_dot_product_attention(_Q, _K, _V, attn_mask=np.zeros((3, S), bool))
    with pytest.raises(ValueError, match=r"axes must broadcast; got shapes \(1, 4, 4, 4\)"):
        F.scaled_dot_product_attention(np.zeros((1, 4, L, 4)), _K[:1, :2], _V[:1, :2])
    with pytest.raises(ValueError, match=r"enable_gqa: the query's 3 heads must be a multiple"):
        F.scaled_dot_product_attention(_Q[:, :3], _K[:, :2], _V[:, :2], enable_gqa=True)
    with pytest.raises(TypeError, match="only bool and floating types of attn_mask"):
        ours(x, x, x, attn_mask=np.zeros((L, L), np.int32))
