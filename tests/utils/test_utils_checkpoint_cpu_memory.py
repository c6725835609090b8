"""jm.utils.checkpoint saves memory in a compiled training step on the CPU too.

XLA:CPU expands JAX's optimization barriers before it schedules, so a plain
``jax.checkpoint`` recomputation could run early, in the forward pass, and
save nothing there. jmodule makes each region's recomputation depend on the
cotangent arriving at it (``jmodule/utils/checkpoint.py``). Checked here: the
temporary memory (``memory_analysis()``) of a compiled 24-block transformer
step, checkpointed / plain, against the issue's 1/3; values and gradients in
float64 against no checkpointing and against ``torch.utils.checkpoint``; that
policies are honoured; and that forward mode and second derivatives still work.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule.utils import checkpoint as ckpt_module
from jmodule.utils.checkpoint import checkpoint

tcp = torch.utils.checkpoint


class _Encoder(jm.nn.Module):
    """Transformer encoder blocks, each called directly or under checkpoint."""

    def __init__(self, blocks: int, d: int, ck: bool, dropout: float = 0.1):
        super().__init__()
        self.blocks = jm.nn.ModuleList(
            [
                jm.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=dropout, batch_first=True)
                for _ in range(blocks)
            ]
        )
        self.head = jm.nn.Linear(d, d)
        self.ck = ck

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.ck else block(x)
        return self.head(x)


def _temp_bytes(ck: bool, blocks: int = 24, policy=None) -> int:
    jm.manual_seed(0)
    model = _Encoder(blocks, 32, ck, dropout=0.0)  # dropout: covered in test_utils_checkpoint
    if policy is not None:
        model.forward = lambda x: _forward_with_policy(model, x, policy)
    opt = jm.optim.Adam(model.parameters(), lr=1e-3)

    @jm.compile
    def step(m, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: jm.nn.functional.mse_loss(m(x), y))
        opt.step()
        return loss

    # 256 tokens: Adam's update holds a parameter-sized temporary, which at fewer
    # tokens is as large as the activations of the whole model
    x = jnp.linspace(-1, 1, 4 * 64 * 32).reshape(4, 64, 32)
    compiled = step.lower(model, opt, x, jnp.cos(x)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def _forward_with_policy(model, x, policy):
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False, policy=policy)
    return model.head(x)


@pytest.mark.slow
def test_24_block_training_step_temp_memory_at_most_a_third():
    """The issue's figure: every block checkpointed, XLA's temporary memory of the
    compiled step (zero_grad, jm.backward, Adam) <= 1/3 of the step without."""
    plain = _temp_bytes(False)
    checkpointed = _temp_bytes(True)
    assert checkpointed <= plain / 3, (checkpointed, plain, checkpointed / plain)


@pytest.mark.slow
def test_policy_saving_everything_is_honoured():
    """The policy still decides what is saved: everything_saveable keeps the
    activations (several times the memory of the default, which saves nothing)."""
    plain = _temp_bytes(False, blocks=6)
    saved = _temp_bytes(True, blocks=6, policy=jax.checkpoint_policies.everything_saveable)
    nothing = _temp_bytes(True, blocks=6)
    assert nothing <= plain / 3, (nothing, plain)
    assert saved > 2 * nothing, (saved, nothing, plain)


def test_cpu_uses_the_cotangent_dependency():
    """On XLA:CPU the region goes through the cotangent-dependent path; elsewhere,
    and under forward-mode differentiation, through jax.checkpoint."""
    on_cpu = jax.default_backend() == "cpu"
    assert ckpt_module._recompute_after_cotangent() is on_cpu
    seen = []

    def f(x):
        seen.append(ckpt_module._recompute_after_cotangent())
        return x

    jax.jvp(f, (1.0,), (1.0,))
    jax.linearize(f, 1.0)
    jax.grad(f)(1.0)
    assert seen == [False, False, on_cpu]


# ------------------------------------------------------------------- float64 values


def _torch_blocks(n: int):
    torch.manual_seed(0)
    return torch.nn.ModuleList(
        [
            torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
            for _ in range(n)
        ]
    ).double()


def _jm_blocks(t):
    blocks = jm.nn.ModuleList(
        [
            jm.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
            for _ in range(len(t))
        ]
    ).to(jm.float64)
    blocks.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    return blocks


def _x():
    return np.sin(np.arange(2 * 5 * 8, dtype=np.float64)).reshape(2, 5, 8)


def _torch_run(ck: bool):
    t = _torch_blocks(3)
    x = torch.tensor(_x(), requires_grad=True)
    h = x
    for b in t:
        h = tcp.checkpoint(b, h, use_reentrant=False) if ck else b(h)
    loss = (h.tanh() ** 2).sum()
    loss.backward()
    return (
        loss.item(),
        {n: p.grad.numpy() for n, p in t.named_parameters()},
        x.grad.numpy(),
    )


def _jm_run(ck: bool, compiled: bool):
    model = jm.nn.Module()
    model.blocks = _jm_blocks(_torch_blocks(3))
    model.x = jm.nn.Parameter(jnp.asarray(_x()))  # the input, for its gradient

    def step(m):
        def loss():
            h = m.x
            for b in m.blocks:
                h = checkpoint(b, h, use_reentrant=False) if ck else b(h)
            return (jnp.tanh(h) ** 2).sum()

        return jm.backward(loss)

    loss = (jm.compile(step) if compiled else step)(model)
    return (
        float(loss),
        {n: np.asarray(p.grad) for n, p in model.blocks.named_parameters()},
        np.asarray(model.x.grad),
    )


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_float64_values_and_gradients_equal_plain_and_torch(compiled):
    """Three encoder blocks in float64: loss, every parameter's and the input's gradient
    with checkpointing equal those without (to 1e-12) and torch.utils.checkpoint's."""
    with jax.enable_x64(True):
        ck = _jm_run(True, compiled)
        plain = _jm_run(False, compiled)
    ref = _torch_run(True)
    np.testing.assert_allclose(_torch_run(False)[0], ref[0], rtol=1e-12)
    for other in (plain, ref):
        np.testing.assert_allclose(ck[0], other[0], rtol=1e-12)
        for n in ck[1]:
            np.testing.assert_allclose(ck[1][n], other[1][n], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ck[2], other[2], rtol=1e-12, atol=1e-12)


# ------------------------------------------- other differentiation that worked before


def _functional_loss(ck: bool):
    lin = jm.nn.Linear(4, 3)
    params = {k: jnp.asarray(v) for k, v in lin.named_parameters()}

    def f(x):
        call = lambda y: jnp.tanh(jm.func.functional_call(lin, params, (y,)))
        return ((checkpoint(call, x, use_reentrant=False) if ck else call(x)) ** 2).sum()

    return f


@pytest.mark.slow
@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1],
        lambda f, x: jax.linearize(f, x)[1](jnp.ones_like(x)),
        lambda f, x: jax.jacfwd(f)(x),
        lambda f, x: jax.hessian(f)(x),
        lambda f, x: jax.grad(lambda y: jax.grad(f)(y).sum())(x),
        lambda f, x: jax.vmap(jax.grad(f))(jnp.stack([x, 2 * x])),
    ],
    ids=["jvp", "linearize", "jacfwd", "hessian", "grad_of_grad", "vmap_grad"],
)
def test_other_derivatives_equal_without_checkpoint(transform):
    """Forward mode (through jax.checkpoint) and second derivatives (through the
    cotangent-dependent path) give what they give without checkpointing."""
    x = jnp.arange(8.0).reshape(2, 4) / 10
    with jax.enable_x64(True):
        x = x.astype(jnp.float64)
        jm.manual_seed(0)
        a = transform(_functional_loss(True), x)
        jm.manual_seed(0)
        b = transform(_functional_loss(False), x)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


def test_a_region_with_jax_effects_takes_jax_checkpoint_and_still_prints(capfd, monkeypatch):
    """A custom_vjp cannot carry effects (``jax.debug.print``): such a region is checkpointed
    by ``jax.checkpoint`` as on other backends, with the same values and gradients."""

    def no_custom_vjp(*args):
        raise AssertionError("a region with effects went through the custom_vjp")

    monkeypatch.setattr(ckpt_module, "_recompute_call", no_custom_vjp)

    def block(x):
        jax.debug.print("inside the region: {s}", s=x.sum())
        return jnp.sin(x) * x

    x = jnp.arange(4.0)
    loss, grad = jax.jit(
        jax.value_and_grad(lambda x: checkpoint(block, x, use_reentrant=False).sum())
    )(x)
    want_loss, want_grad = jax.value_and_grad(lambda x: block(x).sum())(x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6)
    jax.effects_barrier()
    assert "inside the region: 6" in capfd.readouterr().out
