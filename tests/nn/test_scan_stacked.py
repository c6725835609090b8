"""Scanned blocks' parameters read and written stacked by a compiled training step.

A ``jm.compile`` step over ``jm.nn.scan`` blocks takes each parameter kind of
the blocks as one stacked array and writes it back as one (``program.Group``),
the optimizer updating the stack as a whole; between calls each block's
``Parameter`` holds a lazy block of it (``state.StackedValue``). Everything
users see stays per block: these tests compare trajectories with torch and with
the unrolled loop in float64, and check the program's outputs do not grow with
depth.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from shared_models import ResidualBlock
from test_scan import _mask, _tokens, gpt

import jmodule as jm
from jmodule._lowering import state

F = jm.nn.functional
STEPS = 10


def _groups(params_named, torch_side: bool):
    """nanoGPT's grouping: weight decay for tensors of two or more dimensions."""
    params_named = list(params_named)
    decay = [p for _, p in params_named if p.dim() >= 2]
    other = [p for _, p in params_named if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.125}, {"params": other, "weight_decay": 0.0}]


# Hyper-parameters exact in binary, so both sides compute with the same numbers.
OPTIMIZERS = {
    "AdamW": lambda mod, groups: mod.AdamW(
        groups, lr=2.0**-7, betas=(0.875, 0.984375), eps=2.0**-20
    ),
    "Adam": lambda mod, groups: mod.Adam(groups, lr=2.0**-7, betas=(0.875, 0.984375)),
    "SGD": lambda mod, groups: mod.SGD(groups, lr=0.125, momentum=0.875),
}


def _step_fn():
    @jm.compile
    def step(m, opt, i, t, mask):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(m(i, mask).reshape(-1, 16), t.reshape(-1)))
        opt.step()
        return loss

    return step


def _eager_step(m, opt, i, t, mask):
    opt.zero_grad()
    loss = jm.backward(lambda: F.cross_entropy(m(i, mask).reshape(-1, 16), t.reshape(-1)))
    opt.step()
    return loss


def _torch_step(ref, t_opt, idx, tgt, mask_t):
    t_opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(
        ref(torch.from_numpy(idx), mask_t).reshape(-1, 16), torch.from_numpy(tgt).reshape(-1)
    )
    loss.backward()
    t_opt.step()
    return loss.item()


def _models(name):
    torch.manual_seed(3)
    ref = gpt(torch.nn, None).double()
    scanned = gpt(jm.nn, True).double()
    unrolled = gpt(jm.nn, False).double()
    scanned.load_state_dict(ref.state_dict())
    unrolled.load_state_dict(ref.state_dict())
    make = OPTIMIZERS[name]
    t_opt = make(torch.optim, _groups(ref.named_parameters(), True))
    s_opt = make(jm.optim, _groups(scanned.named_parameters(), False))
    u_opt = make(jm.optim, _groups(unrolled.named_parameters(), False))
    return (ref, t_opt), (scanned, s_opt), (unrolled, u_opt)


# Absolute tolerances of 1e-10 (the weights are ~0.1): the attention's key bias gets a
# gradient of float noise (softmax ignores it), which Adam's normalisation scales up.
def _assert_weights(ref, model, rtol=1e-10, atol=1e-10):
    sd = model.state_dict()
    assert list(sd) == list(ref.state_dict())
    for name, tv in ref.state_dict().items():
        np.testing.assert_allclose(
            np.asarray(sd[name]), tv.numpy(), rtol=rtol, atol=atol, err_msg=name
        )


def _assert_opt_state(t_opt, j_opt, rtol=1e-10, atol=1e-10):
    ts, js = t_opt.state_dict(), j_opt.state_dict()
    assert ts["state"].keys() == js["state"].keys()
    for k in ts["state"]:
        assert ts["state"][k].keys() == js["state"][k].keys(), k
        for n, tv in ts["state"][k].items():
            np.testing.assert_allclose(
                np.asarray(js["state"][k][n]),
                tv.numpy() if isinstance(tv, torch.Tensor) else tv,
                rtol=rtol,
                atol=atol,
                err_msg=f"state[{k}][{n}]",
            )
    for tg, jg in zip(ts["param_groups"], js["param_groups"]):
        assert tg["params"] == jg["params"]


def _stacked(model) -> bool:
    """Whether the scanned blocks' parameters hold blocks of one stacked array."""
    return all(type(state.raw(p)) is state.StackedValue for p in model.h[1].parameters())


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_ten_float64_steps_compiled_equal_unrolled_and_torch(name):
    """Losses, per-block gradients, weights and optimizer state follow torch at 1e-10."""
    with jax.enable_x64(True):
        (ref, t_opt), (scanned, s_opt), (unrolled, u_opt) = _models(name)
        # the contract of per-block parameters: torch's grouping and counts
        assert sum(p.numel() for p in scanned.parameters()) == sum(
            p.numel() for p in ref.parameters()
        )
        assert [tuple(p.shape) for p in scanned.parameters()] == [
            tuple(p.shape) for p in ref.parameters()
        ]
        mask_t = _mask(True).double()
        mask_j = jnp.asarray(mask_t.numpy())
        s_step, u_step = _step_fn(), _step_fn()
        for s in range(STEPS):
            idx, tgt = _tokens(20 + s)
            lt = _torch_step(ref, t_opt, idx, tgt, mask_t)
            ls = s_step(scanned, s_opt, jnp.asarray(idx), jnp.asarray(tgt), mask_j)
            lu = u_step(unrolled, u_opt, jnp.asarray(idx), jnp.asarray(tgt), mask_j)
            assert _stacked(scanned)
            np.testing.assert_allclose(float(ls), lt, rtol=1e-10, err_msg=f"step {s}")
            np.testing.assert_allclose(float(ls), float(lu), rtol=1e-10, err_msg=f"step {s}")
        assert jm.compile_stats(s_step).num_traces == 1
        for (n, pt), ps, pu in zip(
            ref.named_parameters(), scanned.parameters(), unrolled.parameters()
        ):
            np.testing.assert_allclose(
                np.asarray(ps.grad), pt.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=n
            )
            np.testing.assert_allclose(
                np.asarray(ps.grad), np.asarray(pu.grad), rtol=1e-9, atol=1e-12, err_msg=n
            )
        _assert_weights(ref, scanned)
        _assert_weights(ref, unrolled)
        _assert_opt_state(t_opt, s_opt)
        # PyTorch's layout: the state dict loads into torch.optim
        t_copy = OPTIMIZERS[name](torch.optim, _groups(ref.named_parameters(), True))
        t_copy.load_state_dict(
            {
                "state": {
                    k: {n: torch.from_numpy(np.array(v)) for n, v in e.items()}
                    for k, e in s_opt.state_dict()["state"].items()
                },
                "param_groups": s_opt.state_dict()["param_groups"],
            }
        )
        _assert_opt_state(t_opt, t_copy)


@pytest.mark.slow
@pytest.mark.torch
def test_ten_float64_steps_eager_and_mixed_equal_torch():
    """Eagerly, and alternating compiled and eager steps (the eager optimizer then finds
    the blocks' parameters stacked), the trajectory is torch's."""
    with jax.enable_x64(True):
        (ref, t_opt), (scanned, s_opt), _ = _models("AdamW")
        eager_scan = gpt(jm.nn, True).double()
        eager_scan.load_state_dict(ref.state_dict())
        es_opt = OPTIMIZERS["AdamW"](jm.optim, _groups(eager_scan.named_parameters(), False))
        mask_t = _mask(True).double()
        mask_j = jnp.asarray(mask_t.numpy())
        step = _step_fn()

        @jm.compile
        def grads_only(m, i, t, mask):
            return jm.backward(lambda: F.cross_entropy(m(i, mask).reshape(-1, 16), t.reshape(-1)))

        for s in range(STEPS):
            idx, tgt = _tokens(40 + s)
            i, t = jnp.asarray(idx), jnp.asarray(tgt)
            lt = _torch_step(ref, t_opt, idx, tgt, mask_t)
            le = _eager_step(eager_scan, es_opt, i, t, mask_j)
            np.testing.assert_allclose(float(le), lt, rtol=1e-10, err_msg=f"eager {s}")
            if s % 2 == 0:
                lm = step(scanned, s_opt, i, t, mask_j)
            else:  # compiled gradients, then an eager optimizer step on stacked blocks
                s_opt.zero_grad()
                lm = grads_only(scanned, i, t, mask_j)
                s_opt.step()
            np.testing.assert_allclose(float(lm), lt, rtol=1e-10, err_msg=f"mixed {s}")
        _assert_weights(ref, eager_scan)
        _assert_weights(ref, scanned)
        _assert_opt_state(t_opt, s_opt)
        _assert_opt_state(t_opt, es_opt)


@pytest.mark.slow
@pytest.mark.torch
def test_in_place_edits_data_and_load_state_dict_between_steps_are_seen():
    """Changes made to blocks' parameters between compiled steps reach the next step."""
    with jax.enable_x64(True):
        (ref, t_opt), (scanned, s_opt), _ = _models("AdamW")
        mask_t = _mask(True).double()
        mask_j = jnp.asarray(mask_t.numpy())
        step = _step_fn()

        def both(s):
            idx, tgt = _tokens(60 + s)
            lt = _torch_step(ref, t_opt, idx, tgt, mask_t)
            ls = step(scanned, s_opt, jnp.asarray(idx), jnp.asarray(tgt), mask_j)
            np.testing.assert_allclose(float(ls), lt, rtol=1e-10, err_msg=f"step {s}")

        both(0)
        both(1)
        assert _stacked(scanned)
        with torch.no_grad():
            ref.h[1].mlp[0].weight.mul_(2)
        with jm.no_grad():
            w = scanned.h[1].mlp[0].weight
            w.copy_(w * 2)
        both(2)
        new = np.random.default_rng(5).standard_normal(tuple(ref.h[2].ln_1.bias.shape))
        with torch.no_grad():
            ref.h[2].ln_1.bias.copy_(torch.from_numpy(new))
        scanned.h[2].ln_1.bias.data = jnp.asarray(new)
        both(3)
        # a read between steps slices one block out; the next step stacks it again
        np.testing.assert_allclose(
            np.asarray(scanned.h[0].attn.out_proj.weight),
            ref.h[0].attn.out_proj.weight.detach().numpy(),
            rtol=1e-10,
            atol=1e-12,
        )
        both(4)
        torch.manual_seed(11)
        fresh = gpt(torch.nn, None).double()
        ref.load_state_dict(fresh.state_dict())
        scanned.load_state_dict(fresh.state_dict())
        both(5)
        both(6)
        assert jm.compile_stats(step).num_traces == 1
        _assert_weights(ref, scanned)
        _assert_opt_state(t_opt, s_opt)


@pytest.mark.slow
@pytest.mark.torch
def test_non_elementwise_optimizer_equals_unrolled_and_torch():
    """Adafactor factors each matrix's second moment: per-block updates, equal results."""
    with jax.enable_x64(True):
        torch.manual_seed(4)
        ref = gpt(torch.nn, None).double()
        scanned = gpt(jm.nn, True).double()
        unrolled = gpt(jm.nn, False).double()
        scanned.load_state_dict(ref.state_dict())
        unrolled.load_state_dict(ref.state_dict())
        # The attention's key bias has a zero gradient up to rounding, which Adafactor's
        # relative step turns into updates of pure noise: frozen (in every block) here.
        for model in (ref, scanned, unrolled):
            for block in model.h:
                block.attn.in_proj_bias.requires_grad_(False)
        t_opt = torch.optim.Adafactor(ref.parameters(), lr=2.0**-5)
        s_opt = jm.optim.Adafactor(scanned.parameters(), lr=2.0**-5)
        u_opt = jm.optim.Adafactor(unrolled.parameters(), lr=2.0**-5)
        mask_t = _mask(True).double()
        mask_j = jnp.asarray(mask_t.numpy())
        s_step, u_step = _step_fn(), _step_fn()
        for s in range(6):
            idx, tgt = _tokens(80 + s)
            lt = _torch_step(ref, t_opt, idx, tgt, mask_t)
            ls = s_step(scanned, s_opt, jnp.asarray(idx), jnp.asarray(tgt), mask_j)
            lu = u_step(unrolled, u_opt, jnp.asarray(idx), jnp.asarray(tgt), mask_j)
            np.testing.assert_allclose(float(ls), float(lu), rtol=1e-10, err_msg=f"step {s}")
            np.testing.assert_allclose(float(ls), lt, rtol=1e-9, err_msg=f"step {s}")
        assert _stacked(scanned)
        for a, b in zip(scanned.state_dict().values(), unrolled.state_dict().values()):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-10)
        _assert_weights(ref, scanned)
        _assert_opt_state(t_opt, s_opt)
        assert all(b.attn.in_proj_bias.grad is None for b in scanned.h)


def _compiled_step(depth):
    jm.manual_seed(0)
    model = jm.nn.Sequential(jm.nn.scan(jm.nn.ModuleList([ResidualBlock(8) for _ in range(depth)])))
    opt = jm.optim.AdamW(model.parameters(), lr=1e-3)

    @jm.compile
    def step(m, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: (m(x) ** 2).mean())
        opt.step()
        return loss

    x = jnp.ones((2, 8))
    lowered = step.lower(model, opt, x)
    entry = lowered.compile().as_text().split("ENTRY", 1)[1]
    return len(jax.tree_util.tree_leaves(lowered.out_info)), _kernels(entry)


def _kernels(entry):
    """XLA kernels (fusions) of a compiled program's entry computation. Newer XLA:CPU (JAX
    0.12) splits one large concatenate into pieces by size, to run them in parallel: the
    pieces of one concatenate (the same source op and frame) count once."""
    kernels = set()
    for i, line in enumerate(entry.splitlines()):
        if " fusion(" not in line:
            continue
        if "concatenate_fusion" in line:
            op = re.search(r'op_name="([^"]*)"', line)
            frame = re.search(r"stack_frame_id=(\d+)", line)
            kernels.add((op and op.group(1), frame and frame.group(1)))
        else:
            kernels.add(i)
    return len(kernels)


@pytest.mark.slow
def test_compiled_step_outputs_and_kernels_do_not_grow_with_depth():
    """4 parameters a block, 3 or 9 blocks: the same program outputs (one stacked array
    per kind, not one per block) and the same number of XLA kernels."""
    outs3, kernels3 = _compiled_step(3)
    outs9, kernels9 = _compiled_step(9)
    assert outs3 == outs9
    assert kernels9 <= kernels3 + 2  # a chunk more where 9 pieces exceed a fused concat


@pytest.mark.slow
def test_block_parameter_reads_between_steps():
    """After a compiled step each block's parameter reads as its own array, shapes without
    slicing, and a read does not stop the next step reading the blocks stacked."""
    jm.manual_seed(0)
    blocks = jm.nn.ModuleList([ResidualBlock(4) for _ in range(3)])
    model = jm.nn.scan(blocks)
    opt = jm.optim.SGD(model.parameters(), lr=0.5)

    @jm.compile
    def step(m, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: (m(x) ** 2).mean())
        opt.step()
        return loss

    x = jnp.ones((2, 4))
    step(model, opt, x)
    w = model[2].fc.weight
    assert type(state.raw(w)) is state.StackedValue
    assert w.shape == (4, 4) and w.dim() == 2 and w.numel() == 16 and len(w) == 4
    assert type(state.raw(w)) is state.StackedValue  # metadata did not slice
    before = np.asarray(w)
    assert type(state.raw(w)) is not state.StackedValue  # read: its own array now
    step(model, opt, x)
    assert type(state.raw(w)) is state.StackedValue
    np.testing.assert_allclose(np.asarray(w), before - 0.5 * np.asarray(w.grad), rtol=1e-6)
    assert jm.compile_stats(step).num_traces == 1
    # other programs over the blocks (a compiled forward, a function of one block) read
    # them as arrays
    step(model, opt, x)
    on_block = jm.compile(lambda block, x: block(x))
    y1 = on_block(model[1], x)
    model.compile()
    y = model(x)
    step(model, opt, x)
    np.testing.assert_allclose(np.asarray(on_block(model[1], x)), np.asarray(model[1](x)))
    assert not np.allclose(np.asarray(y1), np.asarray(model[1](x)))
    expected = x
    for block in blocks:
        expected = block(expected)
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(expected), rtol=1e-6)
    assert not np.allclose(np.asarray(y), np.asarray(expected))
