"""Convolutions lowered as im2col + matmul (small maps on the CPU) equal lax.conv's.

The reference is ``jax.lax.conv_general_dilated`` on the same operands:
values and gradients (input and weight) for 1-3-D, groups (incl. depthwise),
dilation, stride, asymmetric padding, batched and unbatched, eagerly and
inside ``jm.compile``; the rule picks the matmul form on the CPU for small
output maps only, and never on an accelerator backend.
"""

from __future__ import annotations

import itertools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule.nn import functional as F
from jmodule.nn.functional import _conv_lowering as lowering

_DN = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"), 3: ("NCDHW", "OIDHW", "NCDHW")}

CASES = [
    # nd, n, c, o, spatial, kernel, stride, pads, dilation, groups
    (1, 2, 4, 6, (5,), (3,), (1,), [(1, 1)], (1,), 1),
    (1, 3, 6, 4, (9,), (2,), (3,), [(0, 2)], (2,), 2),
    (2, 2, 8, 8, (2, 2), (3, 3), (1, 1), [(1, 1), (1, 1)], (1, 1), 1),
    (2, 2, 6, 12, (4, 4), (3, 3), (2, 2), [(1, 1), (1, 1)], (1, 1), 3),
    (2, 1, 4, 4, (5, 6), (3, 2), (1, 2), [(2, 0), (1, 1)], (2, 1), 4),  # depthwise
    (2, 2, 5, 3, (4, 4), (1, 1), (2, 2), [(0, 0), (0, 0)], (1, 1), 1),  # 1x1 downsample
    (2, 2, 3, 4, (7, 7), (7, 7), (2, 2), [(3, 3), (3, 3)], (1, 1), 1),  # a 7x7 stem on 7x7
    (3, 1, 4, 2, (3, 4, 3), (2, 3, 2), (1, 1, 2), [(1, 0), (1, 1), (0, 1)], (1, 1, 1), 2),
]


def _operands(case, dtype=jnp.float32, seed=0):
    _, n, c, o, spatial, kernel, *_, groups = case
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, c, *spatial)), dtype)
    w = jnp.asarray(rng.standard_normal((o, c // groups, *kernel)), dtype)
    return x, w


def _lax(case, x, w):
    nd, *_, stride, pads, dilation, groups = case
    return jax.lax.conv_general_dilated(
        x,
        w,
        stride,
        pads,
        rhs_dilation=dilation,
        dimension_numbers=_DN[nd],
        feature_group_count=groups,
    )


def _matmul(case, x, w):
    *_, stride, pads, dilation, groups = case
    return lowering.conv_matmul(x, w, stride, pads, dilation, groups)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}d-{c[4]}-k{c[5]}-s{c[6]}-g{c[9]}")
def test_matmul_form_equals_lax_conv_values_and_gradients(case):
    x, w = _operands(case)
    np.testing.assert_allclose(_matmul(case, x, w), _lax(case, x, w), rtol=1e-5, atol=1e-5)
    cot = jnp.asarray(np.random.default_rng(1).standard_normal(_lax(case, x, w).shape))

    def grads(f):
        return jax.grad(lambda x, w: (f(case, x, w) * cot).sum(), argnums=(0, 1))(x, w)

    for got, want in zip(grads(_matmul), grads(_lax)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_half_precision_accumulates_in_float32_like_lax():
    case = CASES[2]
    x, w = _operands(case, jnp.bfloat16)
    got = lowering.conv_matmul(x, w, (1, 1), [(1, 1)] * 2, (1, 1), 1, jnp.float32)
    want = jax.lax.conv_general_dilated(
        x, w, (1, 1), [(1, 1)] * 2, dimension_numbers=_DN[2], preferred_element_type=jnp.float32
    )
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    y = F.conv2d(x, w, padding=1)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(y.astype(np.float32), want.astype(jnp.bfloat16).astype(np.float32))


def _primitives(fn, *args) -> set[str]:
    jaxpr = jax.make_jaxpr(fn)(*args)
    seen = set()

    def walk(j):
        for eqn in j.eqns:
            seen.add(eqn.primitive.name)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    return seen


def test_the_rule_picks_matmul_for_small_maps_on_the_cpu_only():
    assert jax.default_backend() == "cpu"
    small = jnp.ones((2, 8, 4, 4))
    large = jnp.ones((2, 8, 16, 16))
    w = jnp.ones((8, 8, 3, 3))
    assert "conv_general_dilated" not in _primitives(lambda x: F.conv2d(x, w, padding=1), small)
    assert "conv_general_dilated" in _primitives(lambda x: F.conv2d(x, w, padding=1), large)
    side = int(np.sqrt(lowering.MATMUL_MAX_OUTPUT))
    assert lowering.use_matmul((side, side), "cpu")
    assert not lowering.use_matmul((side, side + 1), "cpu")
    for backend in ("gpu", "cuda", "rocm", "tpu"):  # accelerators keep their own convolution
        assert not lowering.use_matmul((1, 1), backend)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_conv_layers_on_small_maps_match_torch(compiled):
    """nn.Conv1d/2d/3d through the matmul form: outputs and gradients as torch's."""
    torch.manual_seed(0)
    for nd, spatial, kw in [
        (1, (6,), dict(kernel_size=3, stride=2, padding=1, dilation=1, groups=2)),
        (2, (4, 4), dict(kernel_size=3, stride=1, padding=1, dilation=1, groups=1)),
        (2, (6, 5), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))),
        (3, (3, 3, 3), dict(kernel_size=2, stride=1, padding=1, dilation=1, groups=4)),
    ]:
        ref = getattr(torch.nn, f"Conv{nd}d")(4, 8, **kw)
        ours = getattr(jm.nn, f"Conv{nd}d")(4, 8, **kw)
        ours.load_state_dict(ref.state_dict())
        x = np.random.default_rng(nd).standard_normal((2, 4, *spatial)).astype(np.float32)
        want = ref(torch.from_numpy(x))
        want.square().sum().backward()

        def loss(model, x):
            return jm.backward(lambda: (model(x) ** 2).sum())

        got = (jm.compile(loss) if compiled else loss)(ours, jnp.asarray(x))
        np.testing.assert_allclose(float(got), want.square().sum().item(), rtol=1e-5)
        np.testing.assert_allclose(ours.weight.grad, ref.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ours.bias.grad, ref.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_every_small_resnet_shape_agrees_with_lax():
    """The ResNet-18 convolutions the rule sends to the matmul form (batch 2, 64x64 input)."""
    shapes = [  # c_in, c_out, input side, kernel, stride, padding
        (64, 128, 16, 3, 2, 1),
        (64, 128, 16, 1, 2, 0),
        (128, 128, 8, 3, 1, 1),
        (128, 256, 8, 3, 2, 1),
        (256, 256, 4, 3, 1, 1),
        (256, 512, 4, 3, 2, 1),
        (512, 512, 2, 3, 1, 1),
    ]
    for ci, co, side, k, s, p in shapes:
        case = (2, 2, ci, co, (side, side), (k, k), (s, s), [(p, p)] * 2, (1, 1), 1)
        out = lowering.output_size((side, side), (k, k), (s, s), [(p, p)] * 2, (1, 1))
        assert lowering.use_matmul(out, "cpu"), (ci, co, side)
        x, w = _operands(case)
        w = w / np.sqrt(ci * k * k)
        np.testing.assert_allclose(_matmul(case, x, w), _lax(case, x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_output_size_matches_lax_for_many_configurations():
    for spatial, k, s, p, d in itertools.product([3, 5, 8], [1, 2, 3], [1, 2], [0, 1, 2], [1, 2]):
        if spatial + 2 * p < d * (k - 1) + 1:
            continue
        case = (1, 1, 1, 1, (spatial,), (k,), (s,), [(p, p)], (d,), 1)
        x, w = _operands(case)
        assert lowering.output_size((spatial,), (k,), (s,), [(p, p)], (d,)) == tuple(
            _lax(case, x, w).shape[2:]
        )
