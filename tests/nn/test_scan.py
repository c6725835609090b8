"""jm.nn.scan: structurally identical blocks run as one jax.lax.scan.

Every scanned run is compared with the unrolled loop over the same blocks
(outputs, .grad of each block, BatchNorm statistics, the dropout stream), and a
small GPT-style stack with torch live (weights loaded through state_dict,
outputs, gradients, ten float64 training steps). Eagerly the blocks run one by
one (nothing is compiled, so there is nothing to save); inside a compiled
program (jm.compile, jax.jit through functional_call) they run as one scan.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm

F = jm.nn.functional
D, HEADS, CTX, BATCH, DEPTH = 8, 2, 4, 2, 3


def _close(a, b, rtol=1e-5, atol=1e-6, msg=""):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, err_msg=msg)


# ----------------------------------------------------------------------------- models


def gpt_block(nn):
    """A pre-norm GPT block (causal self-attention and a GELU MLP) in ``nn`` (torch's or ours)."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(D)
            self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
            self.ln_2 = nn.LayerNorm(D)
            self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

        def forward(self, x, mask):
            h = self.ln_1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))

    return Block


def gpt(nn, scanned: bool | None, depth: int = DEPTH):
    """Embedding, ``depth`` blocks, final norm and head. ``scanned=None``: torch's loop."""
    Block = gpt_block(nn)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(16, D)
            blocks = nn.ModuleList([Block() for _ in range(depth)])
            self.h = jm.nn.scan(blocks) if scanned else blocks
            self.ln_f = nn.LayerNorm(D)
            self.head = nn.Linear(D, 16, bias=False)

        def forward(self, idx, mask):
            x = self.wte(idx)
            if scanned:
                x = self.h(x, mask)
            else:
                for block in self.h:
                    x = block(x, mask)
            return self.head(self.ln_f(x))

    return GPT()


def _mask(torch_side: bool):
    m = torch.nn.Transformer.generate_square_subsequent_mask(CTX)
    return m if torch_side else jnp.asarray(m.numpy())


def _tokens(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 16, (BATCH, CTX)), rng.integers(0, 16, (BATCH, CTX))


class NormDropBlock(jm.nn.Module):
    """A block with buffers (BatchNorm) and dropout (no bias before the norm: its
    gradient would be float noise around zero, which Adam amplifies)."""

    def __init__(self):
        super().__init__()
        self.fc = jm.nn.Linear(D, D, bias=False)
        self.bn = jm.nn.BatchNorm1d(D)
        self.drop = jm.nn.Dropout(0.5)

    def forward(self, x):
        return x + self.drop(F.gelu(self.bn(self.fc(x))))


def _norm_drop_stack(seed: int = 0, depth: int = DEPTH):
    jm.manual_seed(seed)
    return jm.nn.ModuleList([NormDropBlock() for _ in range(depth)])


X = jnp.asarray(np.random.default_rng(1).standard_normal((6, D)), jnp.float32)


def _unrolled(blocks, x):
    for b in blocks:
        x = b(x)
    return x


def _snapshot(blocks):
    return (
        {n: None if p.grad is None else jnp.asarray(p.grad) for n, p in blocks.named_parameters()},
        {n: jnp.asarray(v) for n, v in blocks.state_dict().items()},
        np.asarray(jm.random.default_generator.get_state()),
    )


def _assert_same_snapshot(a, b, rtol=1e-5, atol=1e-6):
    assert a[0].keys() == b[0].keys()
    for n in a[0]:
        assert (a[0][n] is None) == (b[0][n] is None), n
        if a[0][n] is not None:
            _close(a[0][n], b[0][n], rtol, atol, msg=n)
    assert a[1].keys() == b[1].keys()
    for n in a[1]:
        _close(a[1][n], b[1][n], rtol, atol, msg=n)
    np.testing.assert_array_equal(a[2], b[2])


# ----------------------------------------------------------------------------- state


def test_state_dict_named_modules_and_parameters_are_the_blocks():
    """Keys and values are the unstacked blocks'; named_modules sees h.0, h.1, ...;
    model.parameters() lists every block's Parameters (what optimizers get)."""
    ours, plain = gpt(jm.nn, True), gpt(jm.nn, False)
    assert list(ours.state_dict()) == list(plain.state_dict())
    assert "h.2.attn.in_proj_weight" in ours.state_dict()
    names = [n for n, _ in ours.named_modules()]
    assert [n for n in names if n.count(".") == 1 and n.startswith("h.")] == ["h.0", "h.1", "h.2"]
    assert len(list(ours.parameters())) == len(list(plain.parameters()))
    assert ours.h[1] is ours.get_submodule("h.1")
    assert len(ours.h) == DEPTH and list(ours.h) == [ours.h[i] for i in range(DEPTH)]
    assert repr(ours.h).startswith("Scan(\n  (0-2): 3 x Block(")


@pytest.mark.slow
@pytest.mark.torch
def test_torch_weights_load_unchanged_and_outputs_match_torch():
    """torch's state_dict loads with no missing/unexpected key; same logits, eager and
    compiled (model.compile() and jm.compile)."""
    torch.manual_seed(0)
    ref = gpt(torch.nn, None)
    ours = gpt(jm.nn, True)
    result = ours.load_state_dict(ref.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    for k, v in ref.state_dict().items():
        _close(ours.state_dict()[k], v.numpy(), msg=k)
    idx, _ = _tokens()
    want = ref(torch.from_numpy(idx), _mask(True)).detach().numpy()
    _close(ours(jnp.asarray(idx), _mask(False)), want, rtol=1e-4, atol=1e-5)
    step = jm.compile(lambda m, i, mask: m(i, mask))
    _close(step(ours, jnp.asarray(idx), _mask(False)), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gradients_match_torch(compiled):
    """Each block's .grad (and the embedding's) equals torch's after one backward."""
    torch.manual_seed(1)
    ref = gpt(torch.nn, None)
    ours = gpt(jm.nn, True)
    ours.load_state_dict(ref.state_dict())
    idx, tgt = _tokens(2)
    loss_t = torch.nn.functional.cross_entropy(
        ref(torch.from_numpy(idx), _mask(True)).reshape(-1, 16), torch.from_numpy(tgt).reshape(-1)
    )
    loss_t.backward()

    def step(m, i, t, mask):
        return jm.backward(lambda: F.cross_entropy(m(i, mask).reshape(-1, 16), t.reshape(-1)))

    run = jm.compile(step) if compiled else step
    loss = run(ours, jnp.asarray(idx), jnp.asarray(tgt), _mask(False))
    _close(loss, loss_t.item(), rtol=1e-5)
    for (n, pt), (m, pj) in zip(ref.named_parameters(), ours.named_parameters()):
        assert n == m
        _close(pj.grad, pt.grad.numpy(), rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.slow
@pytest.mark.torch
def test_ten_float64_training_steps_compiled_match_torch():
    """Ten compiled SGD-with-momentum steps in float64 follow torch's trajectory at 1e-10."""
    with jax.enable_x64(True):
        torch.manual_seed(2)
        ref = gpt(torch.nn, None).double()
        ours = gpt(jm.nn, True).double()
        ours.load_state_dict(ref.state_dict())
        # lr and momentum exact in float32: jm.optim holds its hyper-parameters as float32
        # even for float64 parameters (Adam's betas would differ from torch's by ~1e-8)
        t_opt = torch.optim.SGD(ref.parameters(), lr=0.125, momentum=0.875)
        j_opt = jm.optim.SGD(ours.parameters(), lr=0.125, momentum=0.875)
        mask_t = _mask(True).double()
        mask_j = jnp.asarray(mask_t.numpy())

        @jm.compile
        def step(m, opt, i, t, mask):
            opt.zero_grad()
            loss = jm.backward(lambda: F.cross_entropy(m(i, mask).reshape(-1, 16), t.reshape(-1)))
            opt.step()
            return loss

        for s in range(10):
            idx, tgt = _tokens(10 + s)
            t_opt.zero_grad()
            loss_t = torch.nn.functional.cross_entropy(
                ref(torch.from_numpy(idx), mask_t).reshape(-1, 16),
                torch.from_numpy(tgt).reshape(-1),
            )
            loss_t.backward()
            t_opt.step()
            loss = step(ours, j_opt, jnp.asarray(idx), jnp.asarray(tgt), mask_j)
            assert loss.dtype == jnp.float64
            np.testing.assert_allclose(float(loss), loss_t.item(), rtol=1e-10, err_msg=f"{s}")
        assert jm.compile_stats(step).num_traces == 1
        for (name, tv), jv in zip(ref.state_dict().items(), ours.state_dict().values()):
            np.testing.assert_allclose(
                np.asarray(jv), tv.numpy(), rtol=1e-10, atol=1e-12, err_msg=name
            )


@pytest.mark.torch
def test_batchnorm_statistics_match_torch():
    """Running statistics of every block after training-mode calls equal torch's."""

    def stack(nn):
        return nn.ModuleList(
            [nn.Sequential(nn.Linear(D, D), nn.BatchNorm1d(D), nn.Tanh()) for _ in range(DEPTH)]
        )

    torch.manual_seed(3)
    ref = stack(torch.nn)
    blocks = stack(jm.nn)
    blocks.load_state_dict(ref.state_dict())
    scanned = jm.nn.scan(blocks)
    step = jm.compile(lambda m, x: m(x))
    xn = np.random.default_rng(4).standard_normal((5, D)).astype(np.float32)
    for _ in range(2):
        want = _unrolled(ref, torch.from_numpy(xn))
        got = step(scanned, jnp.asarray(xn))
    _close(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for k, v in ref.state_dict().items():
        _close(scanned.state_dict()[k], v.numpy(), rtol=1e-5, atol=1e-6, msg=k)
    assert int(scanned[2][1].num_batches_tracked) == 2


# ----------------------------------------------------------------------------- unrolled


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_backward_equals_unrolled_loop(compiled):
    """Loss, every block's .grad, BatchNorm statistics and the dropout stream (the key
    after the step) equal the unrolled loop's: dropout draws differ per block exactly
    as they do there."""

    def run(scan: bool):
        blocks = _norm_drop_stack()
        model = jm.nn.scan(blocks) if scan else blocks
        jm.manual_seed(7)

        def step(m, x):
            return jm.backward(lambda: ((m(x) if scan else _unrolled(m, x)) ** 2).sum())

        loss = (jm.compile(step) if compiled else step)(model, X)
        return loss, _snapshot(blocks)

    (la, a), (lb, b) = run(True), run(False)
    _close(la, lb, rtol=1e-5)
    _assert_same_snapshot(a, b, rtol=1e-4, atol=1e-5)


def test_dropout_masks_differ_per_block():
    """Two dropout-only blocks: the second block's mask is not the first's (each block
    draws its own key, as in the unrolled loop), and both equal the unrolled loop's."""

    class Drop(jm.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = jm.nn.Dropout(0.5)

        def forward(self, x):
            return jnp.concatenate([x[1:], self.drop(jnp.ones_like(x[:1]))])

    blocks = jm.nn.ModuleList([Drop(), Drop()])
    scanned = jm.nn.scan(blocks)
    ones = jnp.ones((2, 64))
    jm.manual_seed(5)
    got = jm.compile(lambda m, x: m(x))(scanned, ones)  # rows: block 0's, block 1's mask
    jm.manual_seed(5)
    want = jm.compile(_unrolled)(blocks, ones)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.array_equal(np.asarray(got[0]), np.asarray(got[1]))


def test_eval_mode_outputs_equal_unrolled_exactly_enough():
    blocks = _norm_drop_stack()
    blocks.eval()
    scanned = jm.nn.scan(blocks)
    assert not scanned.training
    want = _unrolled(blocks, X)
    _close(scanned(X), want, rtol=1e-6, atol=1e-6)
    _close(jm.compile(lambda m, x: m(x))(scanned, X), want, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_training_steps_equal_unrolled(compiled):
    """Three Adam steps (forward, backward, step) with BatchNorm and dropout: weights,
    buffers and the key equal the unrolled loop's."""

    def run(scan: bool):
        blocks = _norm_drop_stack()
        model = jm.nn.scan(blocks) if scan else blocks
        opt = jm.optim.Adam(model.parameters(), lr=1e-2)
        jm.manual_seed(9)

        def step(m, opt, x):
            opt.zero_grad()
            loss = jm.backward(lambda: ((m(x) if scan else _unrolled(m, x)) ** 2).mean())
            opt.step()
            return loss

        run_step = jm.compile(step) if compiled else step
        losses = [run_step(model, opt, X) for _ in range(3)]
        return losses, _snapshot(blocks)

    (la, a), (lb, b) = run(True), run(False)
    for x, y in zip(la, lb):
        _close(x, y, rtol=1e-5)
    _assert_same_snapshot(a, b, rtol=1e-4, atol=1e-5)


def test_frozen_block_gets_no_grad():
    blocks = _norm_drop_stack()
    blocks.eval()
    blocks[1].requires_grad_(False)
    scanned = jm.nn.scan(blocks)
    jm.compile(lambda m, x: jm.backward(lambda: m(x).sum()))(scanned, X)
    assert blocks[1].fc.weight.grad is None
    assert blocks[0].fc.weight.grad is not None and blocks[2].fc.weight.grad is not None


@pytest.mark.slow
def test_jax_jit_through_functional_call():
    """Inside a bare jax.jit/jax.grad via jm.func.functional_call (the scan path)."""
    blocks = _norm_drop_stack()
    blocks.eval()
    scanned, loop = jm.nn.scan(blocks), _Loop(blocks)
    params = {k: jnp.asarray(v) for k, v in scanned.named_parameters()}
    ga = jax.jit(jax.grad(lambda p: jm.func.functional_call(scanned, p, (X,)).sum()))(params)
    gb = jax.grad(
        lambda p: jm.func.functional_call(loop, {f"b.{k}": v for k, v in p.items()}, (X,)).sum()
    )(params)
    for k in gb:
        _close(ga[k], gb[k], msg=k)


class _Loop(jm.nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.b = blocks

    def forward(self, x):
        return _unrolled(self.b, x)


def test_compiled_program_holds_one_block_whatever_the_depth():
    """The lowered training step has as many matmuls for 6 blocks as for 2: one body."""

    def lowered(depth):
        jm.manual_seed(0)
        model = jm.nn.scan(_norm_drop_stack(depth=depth))
        opt = jm.optim.SGD(model.parameters(), lr=0.1)

        @jm.compile
        def step(m, opt, x):
            opt.zero_grad()
            loss = jm.backward(lambda: (m(x) ** 2).mean())
            opt.step()
            return loss

        return step.lower(model, opt, X).as_text()

    two, six = lowered(2), lowered(6)
    assert two.count("dot_general") == six.count("dot_general") > 0
    assert "stablehlo.while" in six


def test_modulelist_scan_method():
    blocks = _norm_drop_stack()
    scanned = blocks.scan()
    assert isinstance(scanned, jm.nn.Scan) and list(scanned) == list(blocks)


def test_sequential_names_are_kept():
    from collections import OrderedDict

    seq = jm.nn.Sequential(OrderedDict(a=jm.nn.Linear(2, 2), b=jm.nn.Linear(2, 2)))
    scanned = jm.nn.scan(seq)
    assert list(scanned.state_dict()) == ["a.weight", "a.bias", "b.weight", "b.bias"]
    x = jnp.ones((3, 2))
    _close(jm.compile(lambda m, x: m(x))(scanned, x), seq(x))


# ----------------------------------------------------------------------------- errors


def test_structurally_different_blocks_name_the_first_difference():
    blocks = jm.nn.ModuleList([jm.nn.Linear(4, 4), jm.nn.Linear(4, 4), jm.nn.Linear(4, 3)])
    with pytest.raises(ValueError, match=r"'2\.weight' is parameter \(3, 4\) float32 where "):
        jm.nn.scan(blocks)(jnp.ones((2, 4)))
    drops = jm.nn.ModuleList([jm.nn.Dropout(0.1), jm.nn.Dropout(0.2)])
    with pytest.raises(ValueError, match=r"attribute 'p' of block '1' is 0\.2 where block '0'"):
        jm.nn.scan(drops)(jnp.ones(3))
    mixed = jm.nn.ModuleList([jm.nn.Sequential(jm.nn.Tanh()), jm.nn.Sequential(jm.nn.ReLU())])
    with pytest.raises(ValueError, match=r"'1\.0' is a ReLU where '0\.0' is a Tanh"):
        jm.nn.scan(mixed)(jnp.ones(3))


@pytest.mark.parametrize("kind", ["forward", "pre", "backward", "global"])
def test_hooks_on_a_block_raise_at_call_time(kind):
    """A hook on one block could not see that block inside the scan body: raise."""
    blocks = _norm_drop_stack()
    scanned = jm.nn.scan(blocks)
    target = blocks[1].fc
    if kind == "forward":
        handle = target.register_forward_hook(lambda m, a, o: None)
    elif kind == "pre":
        handle = target.register_forward_pre_hook(lambda m, a: None)
    elif kind == "backward":
        handle = target.register_full_backward_hook(lambda m, gi, go: None)
    else:
        handle = jm.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        with pytest.raises(RuntimeError, match=r"hook.*register it on the Scan module itself"):
            scanned(X)
        with pytest.raises(RuntimeError, match="hook"):
            jm.compile(lambda m, x: m(x))(scanned, X)
    finally:
        handle.remove()
    scanned.register_forward_hook(lambda m, a, o: o * 2)  # on the Scan itself: fine
    blocks.eval()
    _close(scanned(X), 2 * _unrolled(blocks, X))


def test_block_output_must_match_its_input():
    widen = jm.nn.ModuleList([jm.nn.Linear(4, 5), jm.nn.Linear(4, 5)])
    with pytest.raises(TypeError, match="shape of its input"):
        jm.nn.scan(widen)(jnp.ones((2, 4)))
    with pytest.raises(TypeError, match="shape of its input"):
        jm.compile(lambda m, x: m(x))(jm.nn.scan(widen), jnp.ones((2, 4)))
    lin = jm.nn.ModuleList([jm.nn.Linear(4, 4), jm.nn.Linear(4, 4)])
    with pytest.raises(TypeError, match=r"dtype bfloat16 into float32.*Cast the input"):
        jm.compile(lambda m, x: m(x))(jm.nn.scan(lin), jnp.ones((2, 4), jnp.bfloat16))


def test_shared_module_with_buffers_raises():
    bn = jm.nn.BatchNorm1d(4)
    blocks = jm.nn.ModuleList([jm.nn.Sequential(bn), jm.nn.Sequential(bn)])
    with pytest.raises(RuntimeError, match="share a module with buffers"):
        jm.nn.scan(blocks)(jnp.ones((3, 4)))


def test_hooks_of_the_container_raise_at_construction():
    blocks = jm.nn.ModuleList([jm.nn.Linear(2, 2), jm.nn.Linear(2, 2)])
    blocks.register_forward_hook(lambda m, a, o: None)
    with pytest.raises(ValueError, match="register them on the Scan module instead"):
        jm.nn.scan(blocks)
