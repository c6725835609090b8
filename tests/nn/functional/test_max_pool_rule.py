"""Max pooling follows PyTorch's rule for which element of a window wins.

PyTorch's CPU kernel walks each window in order, starting from ``-inf`` on
the first element inside the input, and moves on a strictly greater value
or on a NaN. So ties go to the first maximum, a NaN beats everything before
it (the last NaN wins), and an all ``-inf`` window picks its first element
inside the input. Values, ``return_indices`` and gradients (reverse and
forward mode, eager and compiled) are checked against torch live on inputs
built to hit each case, for 1-3-D, stride, padding, dilation and ceil_mode.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule.nn import functional as F

TF = torch.nn.functional

CONFIGS = [
    (1, {"kernel_size": 3, "stride": 1}),
    (1, {"kernel_size": 4, "stride": 3, "padding": 2, "ceil_mode": True}),
    (1, {"kernel_size": 3, "stride": 2, "dilation": 2, "padding": 1}),
    (2, {"kernel_size": 3, "stride": 2, "padding": 1}),  # ResNet's stem pool
    (2, {"kernel_size": (2, 3), "stride": (1, 2), "ceil_mode": True}),
    (2, {"kernel_size": 3, "stride": 1, "padding": 1, "dilation": (2, 1)}),
    (3, {"kernel_size": 2, "stride": (1, 2, 2), "padding": 1}),
    # windows that tile the input (stride = kernel, no padding): reshaped, not gathered
    (1, {"kernel_size": 2}),
    (2, {"kernel_size": 2}),  # 9 rows: the last is in no window
    (2, {"kernel_size": (3, 2), "stride": (3, 2), "ceil_mode": True}),  # tiles exactly
    (3, {"kernel_size": (1, 2, 3)}),
]


def _hostile(nd: int, seed: int) -> np.ndarray:
    """Small integers (many ties), zeros as after a ReLU, NaNs and -infs."""
    rng = np.random.default_rng(seed)
    shape = (2, 3, *(9, 8, 7)[:nd])
    x = rng.integers(-2, 3, shape).astype(np.float32)
    x[rng.random(shape) < 0.3] = 0.0
    x[rng.random(shape) < 0.08] = np.nan
    x[rng.random(shape) < 0.15] = -np.inf
    return x


def _torch(nd, x, kwargs):
    xt = torch.from_numpy(x).requires_grad_(True)
    out, idx = getattr(TF, f"max_pool{nd}d")(xt, return_indices=True, **kwargs)
    cot = np.random.default_rng(7).standard_normal(out.shape).astype(np.float32)
    (out * torch.from_numpy(cot)).sum().backward()
    return out.detach().numpy(), idx.numpy(), xt.grad.numpy(), cot


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("nd", "kwargs"), CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_values_indices_and_gradients_match_torch(nd, kwargs, seed):
    x = _hostile(nd, seed)
    want, want_idx, want_grad, cot = _torch(nd, x, kwargs)
    pool = getattr(F, f"max_pool{nd}d")
    out, idx = pool(jnp.asarray(x), return_indices=True, **kwargs)
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(idx), want_idx)

    grad = jax.grad(lambda v: (pool(v, **kwargs) * cot).sum())
    # An input that wins several overlapping windows sums their cotangents, in an
    # order that may differ from torch's: equal to rounding, not to the last bit.
    close = {"rtol": 1e-6, "atol": 1e-6}
    np.testing.assert_allclose(np.asarray(grad(jnp.asarray(x))), want_grad, **close)
    np.testing.assert_allclose(np.asarray(jax.jit(grad)(jnp.asarray(x))), want_grad, **close)


TILING = [
    (nd, kwargs) for nd, kwargs in CONFIGS if kwargs.get("stride", 0) in (0, kwargs["kernel_size"])
]


@pytest.mark.torch
@pytest.mark.parametrize(("nd", "kwargs"), TILING)
@pytest.mark.parametrize("seed", [0, 1])
def test_tiling_windows_values_without_indices_match_torch(nd, kwargs, seed):
    # Without return_indices the value is the maximum of one strided slice per window
    # element (no reduction): NaN wherever a window holds one, -inf for all -inf windows.
    x = _hostile(nd, seed)
    want = getattr(TF, f"max_pool{nd}d")(torch.from_numpy(x), **kwargs).numpy()
    pool = getattr(F, f"max_pool{nd}d")
    np.testing.assert_array_equal(np.asarray(pool(jnp.asarray(x), **kwargs)), want)
    jitted = jax.jit(lambda v: pool(v, **kwargs))
    np.testing.assert_array_equal(np.asarray(jitted(jnp.asarray(x))), want)
    ints = np.nan_to_num(x, nan=7, neginf=-9).astype(np.int32)
    np.testing.assert_array_equal(
        np.asarray(pool(jnp.asarray(ints), **kwargs)),
        getattr(TF, f"max_pool{nd}d")(torch.from_numpy(ints).double(), **kwargs).numpy(),
    )


@pytest.mark.torch
def test_tiling_windows_forward_is_elementwise_and_its_gradient_the_walks():
    x = jnp.asarray(_hostile(2, 0))

    def primitives(fn):  # the printed jaxpr, nested ones included: "reduce[" is lax.reduce
        return str(jax.make_jaxpr(fn)(x))

    assert "reduce[" not in primitives(lambda v: F.max_pool2d(v, 2))  # slices and max
    assert "reduce[" in primitives(lambda v: F.max_pool2d(v, 2, return_indices=True)[1])
    # the gradient of the elementwise value reaches the winner of the walk: the first
    # maximum of each window (a tie's other elements get nothing), the last NaN
    v = np.zeros((1, 1, 2, 4), np.float32)
    v[0, 0, :, 2:] = [[1.0, np.nan], [np.nan, 2.0]]
    (g,) = jax.vjp(lambda u: F.max_pool2d(u, 2), jnp.asarray(v))[1](jnp.ones((1, 1, 1, 2)))
    xt = torch.from_numpy(v).requires_grad_(True)
    TF.max_pool2d(xt, 2).backward(torch.ones(1, 1, 1, 2))
    np.testing.assert_array_equal(np.asarray(g), xt.grad.numpy())
    assert np.asarray(g)[0, 0, 1, 2] == 1.0 and np.asarray(g)[0, 0, 0, 0] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize(("nd", "kwargs"), CONFIGS)
def test_forward_mode_agrees_with_reverse_mode(nd, kwargs):
    # The pool is a gather of the winners; jax.jvp,
    # jax.jacfwd and second derivatives work through it as through any op.
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((1, 2, *(6, 5, 4)[:nd])).astype(np.float32))
    t = jnp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    pool = getattr(F, f"max_pool{nd}d")
    out, tout = jax.jvp(lambda v: pool(v, **kwargs), (x,), (t,))
    cot = jnp.asarray(rng.standard_normal(out.shape).astype(np.float32))
    (back,) = jax.vjp(lambda v: pool(v, **kwargs), x)[1](cot)
    np.testing.assert_allclose(float((tout * cot).sum()), float((back * t).sum()), rtol=1e-5)

    # second derivatives: forward-over-reverse equals reverse-over-reverse
    def g(v):
        return jax.grad(lambda u: (pool(u, **kwargs) ** 3).sum())(v)

    fwd_rev = jax.jvp(g, (x,), (t,))[1]
    rev_rev = jax.grad(lambda v: (g(v) * t).sum())(x)
    np.testing.assert_allclose(np.asarray(fwd_rev), np.asarray(rev_rev), rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(fwd_rev).sum()) > 0


@pytest.mark.torch
def test_module_in_a_compiled_training_step_matches_torch():
    # MaxPool2d as ResNet uses it (after a ReLU: ties at zero in every window).
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)
    )
    net = jm.nn.Sequential(jm.nn.Conv2d(2, 4, 3, padding=1), jm.nn.ReLU(), jm.nn.MaxPool2d(3, 2, 1))
    net.load_state_dict(tnet.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 2, 8, 8)).astype(np.float32)
    (tnet(torch.from_numpy(x)) ** 2).sum().backward()

    @jm.compile
    def step(net, x):
        return jm.backward(lambda: (net(x) ** 2).sum())

    step(net, jnp.asarray(x))
    for (name, p), tp in zip(net.named_parameters(), tnet.parameters()):
        np.testing.assert_allclose(np.asarray(p.grad), tp.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.torch
def test_integer_inputs_pool_by_the_same_rule():
    x = np.random.default_rng(0).integers(-3, 3, (2, 3, 7, 7)).astype(np.int32)
    out, idx = F.max_pool2d(jnp.asarray(x), 3, 2, 1, return_indices=True)
    t_out, t_idx = TF.max_pool2d(torch.from_numpy(x).float(), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(np.asarray(out), t_out.numpy().astype(np.int32))
    np.testing.assert_array_equal(np.asarray(idx), t_idx.numpy())


def _big(nd: int, seed: int) -> np.ndarray:
    """A hostile input with maps large enough for windows past ``TAP_LIMIT``."""
    x = _hostile(nd, seed)
    return np.tile(x, (1, 1, *(2,) * nd)) if nd < 3 else x


#: Every other path of the rule: adaptive windows (uneven and overlapping), windows
#: past the slice limit (reduce_window), and large dilated windows (a gather).
OTHER_PATHS = [
    ("adaptive_max_pool1d", 1, {"output_size": 4}),
    ("adaptive_max_pool1d", 1, {"output_size": 7}),  # 9 -> 7: windows overlap
    ("adaptive_max_pool2d", 2, {"output_size": 2}),
    ("adaptive_max_pool2d", 2, {"output_size": (3, 5)}),
    ("adaptive_max_pool2d", 2, {"output_size": 1}),  # one window of everything
    ("adaptive_max_pool3d", 3, {"output_size": (2, 3, 2)}),
    ("max_pool2d", 2, {"kernel_size": 9, "stride": 3, "padding": 2}),
    ("max_pool1d", 1, {"kernel_size": 66, "stride": 5, "padding": 20, "ceil_mode": True}),
    ("max_pool2d", 2, {"kernel_size": 9, "stride": 2, "padding": 1, "dilation": 2}),
    ("max_pool1d", 1, {"kernel_size": 65, "stride": 3, "padding": 4, "dilation": 2}),
]


def _other_path_input(fn: str, nd: int, seed: int) -> np.ndarray:
    x = _big(nd, seed)
    if fn == "max_pool1d":
        x = np.tile(x, (1, 1, 8))  # 144 long: room for windows 129 wide
    return x


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("fn", "nd", "kwargs"), OTHER_PATHS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("compiled", [False, True])
def test_adaptive_and_large_windows_follow_the_rule(fn, nd, kwargs, seed, compiled):
    """Values, indices and gradients as torch's, NaN (the last wins), all -inf windows
    and ties included, eagerly and inside ``jm.compile``."""
    from jmodule.nn.functional import _pooling

    x = _other_path_input(fn, nd, seed)
    if "kernel_size" in kwargs:
        k = kwargs["kernel_size"]
        assert k**nd > _pooling.TAP_LIMIT  # not the slice path
    xt = torch.from_numpy(x).requires_grad_(True)
    want, want_idx = getattr(TF, fn)(xt, return_indices=True, **kwargs)
    cot = np.random.default_rng(seed).standard_normal(want.shape).astype(np.float32)
    (want * torch.from_numpy(cot)).sum().backward()
    pool = getattr(F, fn)
    run = jm.compile(lambda v: pool(v, return_indices=True, **kwargs)) if compiled else None
    out, idx = (
        run(jnp.asarray(x)) if compiled else pool(jnp.asarray(x), return_indices=True, **kwargs)
    )
    np.testing.assert_array_equal(np.asarray(out), want.detach().numpy())
    np.testing.assert_array_equal(np.asarray(idx), want_idx.numpy())
    grad = jax.grad(lambda v: (pool(v, **kwargs) * cot).sum())
    grad = jax.jit(grad) if compiled else grad
    np.testing.assert_allclose(
        np.asarray(grad(jnp.asarray(x))), xt.grad.numpy(), rtol=1e-6, atol=1e-6
    )


@pytest.mark.torch
@pytest.mark.parametrize("fn", ["adaptive_max_pool2d", "max_pool2d"])
def test_the_last_nan_of_a_window_wins_on_every_path(fn):
    """Two NaNs in one window: torch picks the later one, on every path."""
    x = np.arange(16.0, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = np.nan
    kwargs = {"output_size": 2} if fn.startswith("adaptive") else {"kernel_size": 2}
    want = getattr(TF, fn)(torch.from_numpy(x), return_indices=True, **kwargs)[1]
    got = getattr(F, fn)(jnp.asarray(x), return_indices=True, **kwargs)[1]
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
    assert int(np.asarray(got)[0, 0, 0, 0]) == 4  # (1, 0): the later NaN in torch's order


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_tiling_windows_pool_without_gather_or_scatter(nd):
    # MaxPool2d(2) in a small convnet: the windows are a reshape of the input, so the
    # forward gathers nothing and the gradient scatters nothing (a gather's gradient
    # is a scatter-add, slow on the CPU); overlapping windows still gather.
    pool = getattr(F, f"max_pool{nd}d")
    x = jnp.ones((2, 3, *(8, 6, 4)[:nd]))

    def hlo(**kwargs):
        step = jax.jit(jax.grad(lambda v: pool(v, **kwargs).sum()))
        return step.lower(x).as_text()

    tiled = hlo(kernel_size=2)
    assert "gather" not in tiled and "scatter" not in tiled
    assert "scatter" in hlo(kernel_size=2, stride=1)
