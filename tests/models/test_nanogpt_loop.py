"""nanoGPT's training loop, compiled whole by ``jm.compile``, against the same loop in torch.

The loop has the shape of karpathy/nanoGPT's ``train.py``: AdamW with two
param groups (weight decay on the matrices only), a linear warmup then cosine
learning-rate schedule (here a ``LambdaLR``), gradient accumulation over two
micro-batches, ``scaler.unscale_`` + ``clip_grad_norm_(1.0)``, ``scaler.step``
/ ``scaler.update`` and bfloat16 autocast, on nanoGPT's model (pre-norm
blocks, ``scaled_dot_product_attention(is_causal=True)``, tied head), written
once for both frameworks with the same weights.

The tolerance is torch's own: how far bfloat16 autocast moves torch's losses
and final weights from its float32 run, times a small factor. jmodule's
autocast run must be that close to torch's autocast run.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jmodule as jm

pytestmark = pytest.mark.torch

VOCAB, BLOCK, LAYERS, HEADS, EMBD = 32, 8, 2, 2, 16
BATCH, ACCUM, STEPS = 4, 2, 6
LR, MIN_LR, WARMUP, DECAY_ITERS, WEIGHT_DECAY = 6e-3, 6e-4, 2, STEPS, 0.1
#: How many times torch's own autocast-vs-float32 distance jmodule may be from torch.
FACTOR = 2.0


def gpt(nn, F):
    """nanoGPT's ``model.py`` (dropout 0, biases on), over a framework's ``nn`` and ``F``."""

    class LayerNorm(nn.Module):
        def __init__(self, ndim):
            super().__init__()
            self.weight = nn.Parameter(_ones(nn, ndim))
            self.bias = nn.Parameter(_zeros(nn, ndim))

        def forward(self, x):
            return F.layer_norm(x, tuple(self.weight.shape), self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(EMBD, 3 * EMBD)
            self.c_proj = nn.Linear(EMBD, EMBD)

        def forward(self, x):
            b, t, c = x.shape
            qkv = self.c_attn(x)
            q, k, v = qkv[..., :c], qkv[..., c : 2 * c], qkv[..., 2 * c :]
            q, k, v = (z.reshape(b, t, HEADS, c // HEADS).swapaxes(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True)
            return self.c_proj(y.swapaxes(1, 2).reshape(b, t, c))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(EMBD, 4 * EMBD)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * EMBD, EMBD)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = LayerNorm(EMBD)
            self.attn = CausalSelfAttention()
            self.ln_2 = LayerNorm(EMBD)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(
                dict(
                    wte=nn.Embedding(VOCAB, EMBD),
                    wpe=nn.Embedding(BLOCK, EMBD),
                    h=nn.ModuleList([Block() for _ in range(LAYERS)]),
                    ln_f=LayerNorm(EMBD),
                )
            )
            self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying

        def forward(self, idx, pos, targets):
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1
            )
            return logits, loss

    return GPT()


def _ones(nn, n):
    return torch.ones(n) if nn is torch.nn else jnp.ones(n)


def _zeros(nn, n):
    return torch.zeros(n) if nn is torch.nn else jnp.zeros(n)


def _init_like_nanogpt(model):
    for name, p in model.named_parameters():
        if p.ndim == 2:
            std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith("c_proj.weight") else 0.02
            torch.nn.init.normal_(p, mean=0.0, std=std)
        elif name.endswith("bias"):
            torch.nn.init.normal_(p, mean=0.0, std=0.02)  # nonzero, so they are compared too


def get_lr(it):
    """nanoGPT's schedule: linear warmup, then cosine decay to ``MIN_LR``."""
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > DECAY_ITERS:
        return MIN_LR
    ratio = (it - WARMUP) / (DECAY_ITERS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def configure_optimizers(model, optim):
    """nanoGPT's AdamW: weight decay on the 2-D parameters only."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))


def _data():
    """Counting sequences from random starts (learnable): the target is the next number."""
    rng = np.random.default_rng(0)
    xs = (rng.integers(0, VOCAB, (STEPS, ACCUM, BATCH, 1)) + np.arange(BLOCK)) % VOCAB
    return xs, (xs + 1) % VOCAB


def torch_loop(amp, scaled):
    torch.manual_seed(0)
    model = gpt(torch.nn, torch.nn.functional)
    _init_like_nanogpt(model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = configure_optimizers(model, torch.optim)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: get_lr(it) / LR)
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    pos = torch.arange(BLOCK)
    xs, ys = _data()
    losses = []
    for step in range(STEPS):
        total = 0.0
        for micro in range(ACCUM):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                _, loss = model(
                    torch.from_numpy(xs[step, micro]), pos, torch.from_numpy(ys[step, micro])
                )
                loss = loss / ACCUM
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(total)
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    return start, np.array(losses), weights


def jm_loop(start, scaled):
    model = gpt(jm.nn, jm.nn.functional)
    model.load_state_dict(start)
    opt = configure_optimizers(model, jm.optim)
    sched = jm.optim.lr_scheduler.LambdaLR(opt, lambda it: get_lr(it) / LR)
    scaler = jm.amp.GradScaler("cpu", enabled=scaled)
    pos = jnp.arange(BLOCK)
    traced_dtypes = []  # the logits' dtype, seen when the step is traced

    @jm.compile
    def train_step(model, opt, scaler, xs, ys):
        total = jnp.zeros(())
        for micro in range(ACCUM):
            with jm.autocast("cpu", dtype=jm.bfloat16):

                def closure(micro=micro):
                    logits, loss = model(xs[micro], pos, ys[micro])
                    traced_dtypes.append(logits.dtype)
                    return loss / ACCUM

                total = total + jm.backward(lambda: scaler.scale(closure()))
        scaler.unscale_(opt)
        jm.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return total

    xs, ys = _data()
    losses = []
    for step in range(STEPS):
        scale = scaler.get_scale()
        total = train_step(
            model, opt, scaler, jnp.asarray(xs[step], jnp.int32), jnp.asarray(ys[step], jnp.int32)
        )
        sched.step()
        losses.append(float(total) / scale)  # the scaled loss, as the loop sees it
    assert traced_dtypes == [jnp.bfloat16] * ACCUM  # the program ran under autocast
    assert jm.compile_stats(train_step).num_traces == 1  # the schedule never recompiles
    weights = {k: np.asarray(v, np.float32) for k, v in model.state_dict().items()}
    return np.array(losses), weights


def _flat(weights):
    return np.concatenate([weights[k].ravel() for k in sorted(weights)])


@pytest.mark.slow
@pytest.mark.parametrize("scaled", [False, True], ids=["nanogpt_bf16_scaler_off", "scaler_on"])
def test_nanogpt_loop_compiled_matches_torch_autocast(scaled):
    start, t_amp, w_amp = torch_loop(amp=True, scaled=scaled)
    _, t_f32, w_f32 = torch_loop(amp=False, scaled=scaled)
    loss_gap = np.max(np.abs(t_amp - t_f32))  # torch's own autocast error, per step
    weight_gap = np.linalg.norm(_flat(w_amp) - _flat(w_f32))
    assert loss_gap > 0 and weight_gap > 0
    assert t_amp[-1] < t_amp[0]  # it trains

    losses, weights = jm_loop(start, scaled)
    assert sorted(weights) == sorted(w_amp)
    np.testing.assert_array_less(np.abs(losses - t_amp), FACTOR * loss_gap)
    assert np.linalg.norm(_flat(weights) - _flat(w_amp)) <= FACTOR * weight_gap
