"""A small GPT-style decoder written once for both frameworks: same weights, logits, gradients.

Token and position embeddings, causal self-attention blocks (one written with
``MultiheadAttention``, one ``TransformerEncoderLayer``), a final LayerNorm and
a head tied to the token embedding. The PyTorch ``state_dict`` loads into the
jmodule model unchanged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_ref import JM, TORCH

import jmodule as jm

pytestmark = pytest.mark.torch

VOCAB, CTX, D, HEADS, BATCH = 32, 8, 16, 2, 2


def gpt(side):
    nn = side.nn

    class Block(nn.Module):
        """Pre-norm block: causal self-attention and an MLP, with residuals."""

        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D)
            self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
            self.ln2 = nn.LayerNorm(D)
            self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

        def forward(self, x, src_mask, is_causal):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=src_mask, need_weights=False,
                              is_causal=is_causal)[0]  # fmt: skip
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, D)
            self.pos = nn.Embedding(CTX, D)
            self.blocks = nn.ModuleList([
                Block(),
                nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True),
            ])  # fmt: skip
            self.ln_f = nn.LayerNorm(D)
            self.head = nn.Linear(D, VOCAB, bias=False)
            self.head.weight = self.tok.weight  # weight tying

        def forward(self, idx, positions, mask):
            x = self.tok(idx) + self.pos(positions)
            for block in self.blocks:
                x = block(x, src_mask=mask, is_causal=True)
            return self.head(self.ln_f(x))

    return GPT()


def _inputs(side, seed=0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, VOCAB, (BATCH, CTX))
    targets = rng.integers(0, VOCAB, (BATCH, CTX))
    mask = side.nn.Transformer.generate_square_subsequent_mask(CTX)
    positions = np.arange(CTX)
    if side.is_torch:
        return torch.from_numpy(idx), torch.from_numpy(positions), mask, torch.from_numpy(targets)
    return jnp.asarray(idx), jnp.asarray(positions), mask, jnp.asarray(targets)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    ref = gpt(TORCH)
    ours = gpt(JM)
    result = ours.load_state_dict(ref.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    return ref, ours


def test_state_dict_keys_and_shapes_match(models):
    ref, ours = models
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == [
        (k, tuple(v.shape)) for k, v in ref.state_dict().items()
    ]
    assert ours.head.weight is ours.tok.weight


@pytest.mark.slow
def test_logits_and_gradients_match_torch(models):
    ref, ours = models
    idx, pos, mask, targets = _inputs(TORCH)
    logits = ref(idx, pos, mask)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    want = {k: p.grad.numpy() for k, p in ref.named_parameters()}

    j_idx, j_pos, j_mask, j_targets = _inputs(JM)
    got_logits = ours(j_idx, j_pos, j_mask)
    # Tolerance: two blocks and a 32-way softmax of float32 sums (~1e-6 each).
    np.testing.assert_allclose(np.asarray(got_logits), logits.detach().numpy(), rtol=1e-5,
                               atol=2e-5)  # fmt: skip
    params = {k: p.data for k, p in ours.named_parameters()}

    def loss_fn(params):
        out = jm.func.functional_call(ours, params, (j_idx, j_pos, j_mask))
        return jm.nn.functional.cross_entropy(out.reshape(-1, VOCAB), j_targets.reshape(-1))

    # Compiled (one program); test_jm_backward_accumulates_torch_gradients differentiates eagerly.
    value, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    np.testing.assert_allclose(float(value), loss.item(), rtol=1e-5)
    assert sorted(grads) == sorted(want)  # the tied head shares tok.weight's gradient
    for k, g in want.items():
        np.testing.assert_allclose(np.asarray(grads[k]), g, rtol=1e-4, atol=1e-5, err_msg=k)


def test_compiled_training_step_matches_eager(models):
    _, ours = models
    idx, pos, mask, targets = _inputs(JM, seed=1)

    def step(model, idx, pos, mask, targets):
        logits = model(idx, pos, mask)
        return jm.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    eager = step(ours, idx, pos, mask, targets)
    compiled = jm.compile(step)(ours, idx, pos, mask, targets)
    np.testing.assert_allclose(float(compiled), float(eager), rtol=1e-6)


@pytest.mark.slow
def test_jm_backward_accumulates_torch_gradients(models):
    ref, ours = models
    idx, pos, mask, targets = _inputs(TORCH, seed=2)
    ref.zero_grad()
    logits = ref(idx, pos, mask)
    torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)).backward()
    j_idx, j_pos, j_mask, j_targets = _inputs(JM, seed=2)
    ours.zero_grad()

    def closure():
        out = ours(j_idx, j_pos, j_mask)
        return jm.nn.functional.cross_entropy(out.reshape(-1, VOCAB), j_targets.reshape(-1))

    jm.backward(closure)
    for (k, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
        np.testing.assert_allclose(np.asarray(q.grad), p.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=k)  # fmt: skip
