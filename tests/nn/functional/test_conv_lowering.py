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


# Few input channels per group (a first layer, depthwise): the sum of shifted products.
DIRECT = [case for case in CASES if lowering.use_direct(case[2] // case[9], case[5], "cpu")]
DIRECT += [(2, 2, 1, 8, (7, 6), (3, 3), (1, 1), [(1, 1), (1, 1)], (1, 1), 1)]  # MNIST's conv1


def _direct(case, x, w):
    *_, stride, pads, dilation, groups = case
    return lowering.conv_direct(x, w, stride, pads, dilation, groups)


def test_the_direct_cases_cover_every_dimension_groups_stride_and_dilation():
    assert {case[0] for case in DIRECT} == {1, 2, 3}
    assert any(case[9] > 1 for case in DIRECT) and any(case[9] == 1 for case in DIRECT)
    assert any(max(case[6]) > 1 for case in DIRECT) and any(max(case[8]) > 1 for case in DIRECT)


@pytest.mark.parametrize("case", DIRECT, ids=lambda c: f"{c[0]}d-c{c[2]}-k{c[5]}-g{c[9]}")
def test_direct_form_equals_lax_conv_values_and_derivatives(case):
    x, w = _operands(case)
    np.testing.assert_allclose(_direct(case, x, w), _lax(case, x, w), rtol=1e-5, atol=1e-5)
    rng = np.random.default_rng(1)
    cot = jnp.asarray(rng.standard_normal(_lax(case, x, w).shape), jnp.float32)
    tx, tw = (jnp.asarray(rng.standard_normal(a.shape), jnp.float32) for a in (x, w))

    def grads(f):
        return jax.grad(lambda x, w: (f(case, x, w) * cot).sum(), argnums=(0, 1))(x, w)

    for got, want in zip(grads(_direct), grads(_lax)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    for f in (_direct, _lax):  # forward mode, and a second derivative (forward over reverse)
        out, tangent = jax.jvp(lambda x, w, f=f: f(case, x, w), (x, w), (tx, tw))
        second = jax.jvp(jax.grad(lambda w, f=f: (f(case, x, w) ** 2 * cot).sum()), (w,), (tw,))[1]
        if f is _direct:
            got = (out, tangent, second)
        else:
            for a, b in zip(got, (out, tangent, second)):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)


def test_the_rule_picks_the_direct_form_for_few_input_channels_on_the_cpu_only():
    x, w = jnp.ones((2, 1, 16, 16)), jnp.ones((8, 1, 3, 3))
    assert "conv_general_dilated" not in _primitives(lambda x: F.conv2d(x, w, padding=1), x)
    x3, w3 = jnp.ones((2, 3, 16, 16)), jnp.ones((8, 3, 3, 3))  # RGB 3x3: 27 terms
    assert "conv_general_dilated" not in _primitives(lambda x: F.conv2d(x, w3), x3)
    x4, w4 = jnp.ones((2, 4, 16, 16)), jnp.ones((8, 4, 3, 3))  # 36 terms: XLA's convolution
    assert "conv_general_dilated" in _primitives(lambda x: F.conv2d(x, w4), x4)
    # the derivatives are lax's convolutions
    grad = jax.grad(lambda w: F.conv2d(x, w, padding=1).sum())
    assert "conv_general_dilated" in _primitives(grad, w)
    assert lowering.use_direct(3, (3, 3), "cpu") and not lowering.use_direct(4, (3, 3), "cpu")
    for backend in ("gpu", "cuda", "rocm", "tpu"):
        assert not lowering.use_direct(1, (3, 3), backend)


def test_direct_form_in_half_precision_accumulates_in_float32():
    x, w = _operands(DIRECT[-1], jnp.bfloat16)
    got = lowering.conv_direct(x, w, (1, 1), [(1, 1)] * 2, (1, 1), 1, jnp.float32)
    want = jax.lax.conv_general_dilated(
        x, w, (1, 1), [(1, 1)] * 2, dimension_numbers=_DN[2], preferred_element_type=jnp.float32
    )
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    y = F.conv2d(x, w, padding=1)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(y.astype(np.float32), want.astype(jnp.bfloat16).astype(np.float32))


@pytest.mark.torch
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_conv_layers_with_few_input_channels_match_torch(compiled):
    """nn.Conv1d/2d/3d through the direct form: outputs and every gradient as torch's."""
    torch.manual_seed(0)
    for nd, cin, cout, spatial, kw in [
        (2, 1, 8, (12, 10), dict(kernel_size=3, padding=1)),  # MNIST's first layer
        (2, 3, 4, (9, 9), dict(kernel_size=3, stride=2, padding=1)),  # RGB
        (2, 4, 4, (7, 8), dict(kernel_size=3, padding=1, groups=4)),  # depthwise
        (1, 2, 4, (11,), dict(kernel_size=5, stride=2, dilation=2, padding=3)),
        (3, 1, 2, (4, 5, 4), dict(kernel_size=2, padding=(1, 0, 1))),
    ]:
        ref = getattr(torch.nn, f"Conv{nd}d")(cin, cout, **kw)
        ours = getattr(jm.nn, f"Conv{nd}d")(cin, cout, **kw)
        ours.load_state_dict(ref.state_dict())
        xn = np.random.default_rng(nd + cin).standard_normal((2, cin, *spatial)).astype(np.float32)
        xt = torch.from_numpy(xn).requires_grad_(True)
        want = ref(xt)
        want.square().sum().backward()
        x = jnp.asarray(xn)

        def loss(model, x):
            return jm.backward(lambda: (model(x) ** 2).sum())

        got = (jm.compile(loss) if compiled else loss)(ours, x)
        np.testing.assert_allclose(float(got), want.square().sum().item(), rtol=1e-5)
        np.testing.assert_allclose(ours.weight.grad, ref.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ours.bias.grad, ref.bias.grad.numpy(), rtol=1e-4, atol=1e-4)
        x_grad = jax.grad(lambda v: (ours(v) ** 2).sum())
        x_grad = jax.jit(x_grad) if compiled else x_grad
        np.testing.assert_allclose(x_grad(x), xt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_max_after_the_direct_form_differentiates_as_after_lax():
    # Under a derivative the value is lax's convolution: a max over it (as max-pooling
    # by jnp.max or einops' Reduce does) compares its operand with its result to route
    # the gradient, which two differently rounded copies of a fused sum would break.
    case = DIRECT[-1]
    x, w = _operands(case)

    def loss(f):
        return lambda w: jnp.max(f(case, x, w).reshape(2, 8, 7, 3, 2), axis=(2, 4)).sum()

    for grad in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        got, want = grad(loss(_direct))(w), grad(loss(_lax))(w)
        assert np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
