"""Transformer layers, stacks and the full model against PyTorch live."""

import copy
import warnings

import _torch
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm

TF = torch.nn.functional

L, S, N, E, FF = 4, 5, 2, 8, 16
NO_INIT = tuple(k for k in ALL_CHECKS if k != "init")
# Gradients compile the slowest programs here (eager and jit of grad): they are
# checked once per configuration of each layer's code (every layer class, pre-
# and post-norm, each mask kind), not again for every variant.
NO_GRADS = tuple(k for k in NO_INIT if k != "grads")


def _x(*shape):
    return lambda rng: rng.standard_normal(shape).astype(np.float32)


def _ins(*makers):
    return lambda rng: tuple(m(rng) for m in makers)


_PAD = np.zeros((N, S), bool)
_PAD[0, -2:] = True
_TGT_PAD = np.zeros((N, L), bool)
_TGT_PAD[1, -1] = True
_CAUSAL = np.triu(np.full((L, L), -np.inf, np.float32), 1)
_CAUSAL_BOOL = np.triu(np.ones((L, L), bool), 1)

# dropout=0.0 everywhere: dropout draws random masks, compared separately below.
CASES = [
    LayerCase("TransformerEncoderLayer", (E, 2, FF, 0.0), inputs=_ins(_x(L, N, E)),
              checks=NO_INIT),
    LayerCase("TransformerEncoderLayer", (E, 2, FF, 0.0),
              {"activation": "gelu", "norm_first": True, "batch_first": True},
              inputs=_ins(_x(N, S, E)), call_kwargs={"src_key_padding_mask": _PAD},
              checks=NO_INIT),
    LayerCase("TransformerEncoderLayer", (E, 2, FF, 0.0),
              {"activation": torch.nn.GELU() if _torch.INSTALLED else None, "bias": False,
               "layer_norm_eps": 1e-3},
              inputs=_ins(_x(L, E)), call_kwargs={"src_mask": _CAUSAL, "is_causal": True},
              id="TransformerEncoderLayer(activation=GELU(), bias=False)-unbatched-causal",
              checks=NO_INIT),
    LayerCase("TransformerDecoderLayer", (E, 2, FF, 0.0), inputs=_ins(_x(L, N, E), _x(S, N, E)),
              call_kwargs={"tgt_mask": _CAUSAL_BOOL, "memory_key_padding_mask": _PAD,
                           "tgt_key_padding_mask": _TGT_PAD},
              checks=NO_INIT),
    LayerCase("TransformerDecoderLayer", (E, 2, FF, 0.0),
              {"norm_first": True, "batch_first": True, "activation": "gelu"},
              inputs=_ins(_x(N, L, E), _x(N, S, E)),
              call_kwargs={"tgt_mask": _CAUSAL, "tgt_is_causal": True,
                           "memory_mask": np.zeros((L, S), np.float32)},
              checks=NO_GRADS),
    LayerCase("TransformerEncoder",
              make=lambda nn: nn.TransformerEncoder(
                  nn.TransformerEncoderLayer(E, 2, FF, 0.0), 2, norm=nn.LayerNorm(E),
                  enable_nested_tensor=False),
              inputs=_ins(_x(L, N, E)), call_kwargs={"mask": _CAUSAL},
              id="TransformerEncoder(2 layers, norm)-causal-mask", checks=NO_INIT),
    LayerCase("TransformerDecoder",
              make=lambda nn: nn.TransformerDecoder(
                  nn.TransformerDecoderLayer(E, 2, FF, 0.0, batch_first=True), 2),
              inputs=_ins(_x(N, L, E), _x(N, S, E)),
              call_kwargs={"tgt_mask": _CAUSAL, "memory_key_padding_mask": _PAD},
              id="TransformerDecoder(2 layers, batch_first)", checks=NO_GRADS),
    LayerCase("Transformer", (E, 2, 1, 1, FF, 0.0), inputs=_ins(_x(S, N, E), _x(L, N, E)),
              call_kwargs={"tgt_mask": _CAUSAL, "src_key_padding_mask": _PAD,
                           "memory_key_padding_mask": _PAD},
              checks=NO_INIT),
    LayerCase("Transformer", (E, 2, 1, 2, FF, 0.0),
              {"batch_first": True, "norm_first": True, "activation": TF.gelu},
              inputs=_ins(_x(N, S, E), _x(N, L, E)),
              call_kwargs={"tgt_is_causal": True, "tgt_mask": _CAUSAL},
              id="Transformer(2 decoder layers, batch_first, norm_first, F.gelu)",
              checks=NO_GRADS),
    # Initialisation: sizes where every parameter has enough numbers for statistics.
    LayerCase("TransformerEncoderLayer", (64, 4, 128), checks=("init",)),
    LayerCase("TransformerDecoderLayer", (64, 4, 128), {"norm_first": True}, checks=("init",)),
    LayerCase("Transformer", (64, 4, 1, 1, 128), checks=("init",)),
]  # fmt: skip

VALUES, IDS = parametrize(CASES)


@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_transformer_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


@pytest.mark.torch
def test_generate_square_subsequent_mask_matches_torch():
    want = torch.nn.Transformer.generate_square_subsequent_mask(5).numpy()
    got = jm.nn.Transformer.generate_square_subsequent_mask(5)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert jm.nn.Transformer.generate_square_subsequent_mask(3, dtype=jnp.bfloat16).dtype == (
        jnp.bfloat16
    )


@pytest.mark.torch
def test_causal_detection_is_not_needed_for_the_same_result():
    # PyTorch inspects the mask (is_causal=None) to pick a kernel; the result is
    # the mask's either way, which jmodule computes directly.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(E, 2, FF, 0.0)
    ref = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    ours = jm.nn.TransformerEncoder(jm.nn.TransformerEncoderLayer(E, 2, FF, 0.0), 2)
    ours.load_state_dict(ref.state_dict())
    x = np.random.default_rng(0).standard_normal((L, N, E)).astype(np.float32)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L)
    for is_causal in (None, True, False):
        want = ref(torch.from_numpy(x), mask=mask, is_causal=is_causal).detach().numpy()
        got = ours(x, mask=mask.numpy(), is_causal=is_causal)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.torch
def test_padded_positions_hold_the_regular_result_not_nested_tensor_zeros():
    # PyTorch's nested-tensor inference path (eval, no_grad, batch_first, a
    # padding mask) returns zeros at padded positions; with autograd on it
    # returns the regular computation, which is what jmodule always returns.
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(E, 2, FF, 0.0, batch_first=True), 1
    ).eval()
    ours = jm.nn.TransformerEncoder(
        jm.nn.TransformerEncoderLayer(E, 2, FF, 0.0, batch_first=True), 1
    ).eval()
    ours.load_state_dict(ref.state_dict())
    x = np.random.default_rng(1).standard_normal((N, S, E)).astype(np.float32)
    xt, pad = torch.from_numpy(x), torch.from_numpy(_PAD)
    with torch.no_grad():
        fast = ref(xt, src_key_padding_mask=pad).numpy()
    regular = ref(xt, src_key_padding_mask=pad).detach().numpy()
    got = np.asarray(ours(x, src_key_padding_mask=_PAD))
    np.testing.assert_allclose(got, regular, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[~_PAD], fast[~_PAD], rtol=1e-5, atol=1e-5)
    assert not fast[_PAD].any()


def test_dropout_in_training_is_seeded_and_compiles_like_eager():
    ours = jm.nn.TransformerDecoderLayer(E, 2, FF, dropout=0.3)
    tgt = jnp.asarray(np.random.default_rng(3).standard_normal((L, N, E)), jnp.float32)
    memory = jnp.asarray(np.random.default_rng(2).standard_normal((S, N, E)), jnp.float32)
    jm.manual_seed(4)
    first = ours(tgt, memory)
    assert not np.allclose(first, ours(tgt, memory))
    compiled = copy.deepcopy(ours)
    compiled.compile()
    jm.manual_seed(4)
    np.testing.assert_allclose(np.asarray(compiled(tgt, memory)), np.asarray(first), rtol=1e-5,
                               atol=1e-6)  # fmt: skip


@pytest.mark.torch
def test_errors_match_torch():
    def torch_error(fn):
        with pytest.raises(Exception) as info, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
        return info.value

    expected = torch_error(lambda: torch.nn.TransformerEncoderLayer(E, 2, activation="tanh"))
    with pytest.raises(RuntimeError, match=str(expected)):
        jm.nn.TransformerEncoderLayer(E, 2, activation="tanh")
    model = jm.nn.Transformer(E, 2, 1, 1, FF)
    with pytest.raises(RuntimeError, match=r"batch number of src and tgt must be equal; got src"):
        model(np.zeros((S, N, E), np.float32), np.zeros((L, N + 1, E), np.float32))
    with pytest.raises(RuntimeError, match=r"feature number of src and tgt must be equal to d_mo"):
        model(np.zeros((S, N, E), np.float32), np.zeros((L, N, E + 1), np.float32))
    layer = jm.nn.TransformerEncoderLayer(E, 2, FF, batch_first=True)
    with pytest.raises(ValueError, match=r"src should be \(N, L, E\) .* got shape \(2, 5, 6\)"):
        layer(np.zeros((N, S, 6), np.float32))
