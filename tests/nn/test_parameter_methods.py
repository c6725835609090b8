"""``nn.Parameter``'s torch.Tensor methods, against torch live.

Each reading method is compared with torch's on the same values, eagerly, in
``jm.compile`` and under ``jm.backward`` (where gradients must flow through it);
in-place ones must change the parameter as ``p.data = ...`` does and return it.
einops accepts Parameters (``jmodule/_einops.py`` says how).
"""

import einops
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import nn
from jmodule.nn.parameter import Size

VALUES = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 10


def _pair(values=VALUES, dtype="float32"):
    a = np.asarray(values, dtype=dtype)
    return torch.nn.Parameter(torch.from_numpy(a.copy()), requires_grad=a.dtype.kind == "f"), (
        nn.Parameter(jnp.asarray(a), requires_grad=a.dtype.kind == "f")
    )


def _outcome(fn):
    try:
        out = fn()
    except Exception as e:
        return (type(e), str(e).splitlines()[0])
    if isinstance(out, torch.Tensor):
        return ("array", out.detach().numpy().tolist(), str(out.dtype).split(".")[-1])
    if isinstance(out, (jax.Array, nn.Parameter, jm.Tensor)):  # a Tensor in grad mode
        return ("array", np.asarray(out).tolist(), str(np.asarray(out).dtype))
    if isinstance(out, torch.Size):
        return ("size", tuple(out))
    if isinstance(out, Size):
        return ("size", tuple(out))
    return ("value", out)


# (label, call on a parameter): each compared as _outcome(torch) == _outcome(jm).
READING = [
    ("numel()", lambda p: p.numel()),
    ("nelement()", lambda p: p.nelement()),
    ("dim()", lambda p: p.dim()),
    ("ndimension()", lambda p: p.ndimension()),
    ("element_size()", lambda p: p.element_size()),
    ("is_floating_point()", lambda p: p.is_floating_point()),
    ("size()", lambda p: p.size()),
    ("size(1)", lambda p: p.size(1)),
    ("size(-1)", lambda p: p.size(-1)),
    ("size(dim=0)", lambda p: p.size(dim=0)),
    ("size(3)", lambda p: p.size(3)),
    ("size(-4)", lambda p: p.size(-4)),
    ("size().numel()", lambda p: p.size().numel()),
    ("transpose(0, 1)", lambda p: p.transpose(0, 1)),
    ("transpose(-1, 0)", lambda p: p.transpose(-1, 0)),
    ("transpose(0, 3)", lambda p: p.transpose(0, 3)),
    ("view(-1)", lambda p: p.view(-1)),
    ("view(4, 6)", lambda p: p.view(4, 6)),
    ("view((6, -1))", lambda p: p.view((6, -1))),
    ("view([2, 12])", lambda p: p.view([2, 12])),
    ("view(5)", lambda p: p.view(5)),
    ("view(-1, -1)", lambda p: p.view(-1, -1)),
    ("view(-1, 5)", lambda p: p.view(-1, 5)),
    ("view(-2, 12)", lambda p: p.view(-2, 12)),
    ("permute(2, 0, 1)", lambda p: p.permute(2, 0, 1)),
    ("detach()", lambda p: p.detach()),
    ("clone()", lambda p: p.clone()),
    ("pow(2)", lambda p: p.pow(2)),
    ("add(1, alpha=2)", lambda p: p.add(1.0, alpha=2)),
    ("sub(p)", lambda p: p.sub(p)),
    ("mul(3)", lambda p: p.mul(3.0)),
    ("div(2, floor)", lambda p: p.div(0.3, rounding_mode="floor")),
    ("div(2, trunc)", lambda p: p.div(-0.3, rounding_mode="trunc")),
    ("neg()", lambda p: p.neg()),
    ("abs()", lambda p: p.abs()),
    ("log()", lambda p: p.log()),
    ("t() of 3-d", lambda p: p.t()),
    ("exp()", lambda p: p.exp()),
    ("sqrt()", lambda p: p.sqrt()),
    ("square()", lambda p: p.square()),
    ("norm()", lambda p: p.norm()),
    ("norm(1, dim=1)", lambda p: p.norm(1, dim=1)),
]


def _close(want, got):
    assert want[0] == got[0], (want, got)
    if want[0] == "array":
        np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-6, atol=1e-6)
        assert want[2] == got[2]
    else:
        assert want == got


@pytest.mark.torch
@pytest.mark.parametrize("label,call", READING, ids=[r[0] for r in READING])
def test_reading_methods_match_torch(label, call):
    tp, jp = _pair()
    _close(_outcome(lambda: call(tp)), _outcome(lambda: call(jp)))


@pytest.mark.torch
@pytest.mark.parametrize(
    "label,call",
    [
        ("size(0)", lambda p: p.size(0)),
        ("size(-1)", lambda p: p.size(-1)),
        ("size()", lambda p: p.size()),
        ("dim()", lambda p: p.dim()),
        ("transpose(0, 0)", lambda p: p.transpose(0, 0)),
        ("transpose(0, -1)", lambda p: p.transpose(0, -1)),
        ("transpose(0, 1)", lambda p: p.transpose(0, 1)),
        ("view(-1)", lambda p: p.view(-1)),
        ("numel()", lambda p: p.numel()),
    ],
)
def test_zero_dimensional_parameters_match_torch(label, call):
    tp, jp = _pair(np.float32(1.5))
    _close(_outcome(lambda: call(tp)), _outcome(lambda: call(jp)))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32", "int64", "bool", "uint8"])
def test_dtype_queries_match_torch(dtype):
    t = torch.zeros(3, dtype=getattr(torch, dtype))
    j = nn.Parameter(jnp.asarray(t.numpy() if dtype != "bfloat16" else t.float().numpy()), False)
    if dtype == "bfloat16":
        j = nn.Parameter(jnp.zeros(3, jnp.bfloat16), requires_grad=False)
    if dtype == "int64" and not jax.config.read("jax_enable_x64"):
        assert j.element_size() == 4  # int64 is int32 with x64 off (README: 64-bit types)
    else:
        assert j.element_size() == t.element_size()
    assert j.is_floating_point() == t.is_floating_point()


def test_size_is_still_the_element_count_for_jax_style_code():
    p = nn.Parameter(jnp.ones((2, 3)))
    assert p.size == 6 and p.size + 1 == 7 and f"{p.size:,}" == "6"
    assert p.size() == (2, 3) and isinstance(p.size(), tuple)
    assert repr(p.size()) == "Size([2, 3])" and p.size()[1:] == Size((3,))
    with pytest.raises(TypeError, match="must be int"):
        p.size(1.0)


@pytest.mark.torch
def test_transpose_is_torchs_never_numpys():
    tp, jp = _pair()
    with pytest.raises(TypeError):
        tp.transpose()
    with pytest.raises(TypeError):
        jp.transpose()  # numpy's "reverse all axes" does not exist on a Parameter
    with pytest.raises(TypeError):
        tp.transpose(2, 0, 1)
    with pytest.raises(TypeError):
        jp.transpose(2, 0, 1)  # numpy's permutation neither: that is permute
    np.testing.assert_array_equal(np.asarray(jp.T), tp.detach().numpy().T)


@pytest.mark.torch
def test_view_with_a_dtype_reinterprets_as_torch():
    tp, jp = _pair()
    want = tp.detach().view(torch.int32).numpy()
    np.testing.assert_array_equal(np.asarray(jp.view(jnp.int32)), want)


def test_an_unknown_attribute_names_jmodules_parameter():
    p = nn.Parameter(jnp.ones(2))
    with pytest.raises(AttributeError, match=r"'Parameter' object has no attribute 'nope'") as e:
        p.nope
    assert "ArrayImpl" not in str(e.value)
    assert not hasattr(p, "nope")

    def loss():
        p.block_until_ready  # a concrete array's attribute, asked of a traced value
        return p.sum()

    with pytest.raises(AttributeError, match=r"'Parameter' object .*traced value"):
        jm.compile(lambda p: jm.backward(loss))(p)
    jm.backward(loss)  # eagerly the value is concrete: it has the attribute
    assert p.grad is not None


# ------------------------------------------------------------------ gradients


GRADIENT = [
    ("pow(2)", lambda p, w: p.pow(2).sum()),
    ("transpose", lambda p, w: (p.transpose(0, 2) * w((4, 3, 2))).sum()),
    ("view", lambda p, w: (p.view(6, 4) * w((6, 4))).sum()),
    ("permute", lambda p, w: (p.permute(1, 2, 0) * w((3, 4, 2))).sum()),
    ("clone", lambda p, w: (p.clone() ** 3).sum()),
    ("detach", lambda p, w: (p * p.detach()).sum()),
    (
        "mul/add/sub/div",
        lambda p, w: (p.mul(2.0) * p.add(p, alpha=3) - p.sub(1.0) / p.div(2.0)).sum(),
    ),
    ("exp/sqrt/neg", lambda p, w: (p.exp() + p.sqrt() * p.neg()).sum()),
    ("norm", lambda p, w: p.norm()),
    ("square/matmul", lambda p, w: (p.matmul(p.transpose(1, 2)) * p.square().sum()).sum()),
]


def _weights(shape):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("label,loss", GRADIENT, ids=[g[0] for g in GRADIENT])
def test_gradients_flow_through_the_methods_under_jm_backward(label, loss):
    tp, jp = _pair()
    t_loss = loss(tp, lambda shape: torch.from_numpy(_weights(shape)))
    t_loss.backward()
    j_loss = jm.backward(lambda: loss(jp, lambda shape: jnp.asarray(_weights(shape))))
    np.testing.assert_allclose(float(j_loss), t_loss.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jp.grad), tp.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_the_methods_work_inside_jm_compile():
    _, jp = _pair()
    model = nn.Module()
    model.w = jp

    @jm.compile
    def step(m):
        w = m.w
        return w.transpose(0, 1)[0, 0, : w.size(2)] * w.numel() + w.view(-1).sum() * w.dim()

    eager = np.swapaxes(VALUES, 0, 1)[0, 0, :4] * 24 + VALUES.sum() * 3
    np.testing.assert_allclose(np.asarray(step(model)), eager, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(step(model)), eager, rtol=1e-5)


# ------------------------------------------------------------------ in place


INPLACE = [
    ("zero_()", lambda p, ar: p.zero_()),
    ("fill_(2.5)", lambda p, ar: p.fill_(2.5)),
    ("fill_(0-d)", lambda p, ar: p.fill_(ar(np.float32(-1.0)))),
    ("fill_(1-d)", lambda p, ar: p.fill_(ar(np.ones(2, np.float32)))),
    ("copy_ same", lambda p, ar: p.copy_(ar(np.full((2, 3, 4), 7, np.float32)))),
    ("copy_ broadcast", lambda p, ar: p.copy_(ar(np.arange(4, dtype=np.float32)))),
    ("copy_ int into float", lambda p, ar: p.copy_(ar(np.arange(4, dtype=np.int32)))),
    ("copy_ bad", lambda p, ar: p.copy_(ar(np.ones((3,), np.float32)))),
    ("copy_ too many dims", lambda p, ar: p.copy_(ar(np.ones((5, 2, 3, 4), np.float32)))),
    ("add_", lambda p, ar: p.add_(ar(np.arange(4, dtype=np.float32)))),
    ("add_ alpha", lambda p, ar: p.add_(ar(np.full((2, 3, 4), 2, np.float32)), alpha=-0.5)),
    ("sub_", lambda p, ar: p.sub_(1.5)),
    ("sub_ alpha", lambda p, ar: p.sub_(ar(np.ones((3, 4), np.float32)), alpha=3)),
    ("mul_", lambda p, ar: p.mul_(ar(np.float32(-2.0)))),
    ("div_", lambda p, ar: p.div_(4.0)),
    ("div_ trunc", lambda p, ar: p.div_(0.3, rounding_mode="trunc")),
    ("div_ floor", lambda p, ar: p.div_(0.3, rounding_mode="floor")),
    ("div_ bad mode", lambda p, ar: p.div_(0.3, rounding_mode="round")),
    ("clamp_", lambda p, ar: p.clamp_(-0.2, 0.3)),
    ("clamp_ min", lambda p, ar: p.clamp_(min=0.0)),
    ("clamp_ neither", lambda p, ar: p.clamp_()),
    ("add_ wider", lambda p, ar: p.add_(ar(np.ones((5, 2, 3, 4), np.float32)))),
    ("-= (manual SGD)", lambda p, ar: _augmented(p, "-=", ar(np.full((2, 3, 4), 0.1, np.float32)))),
    ("+=", lambda p, ar: _augmented(p, "+=", 2.0)),
    ("*=", lambda p, ar: _augmented(p, "*=", ar(np.arange(4, dtype=np.float32)))),
    ("/=", lambda p, ar: _augmented(p, "/=", 8.0)),
]


def _augmented(p, op, other):
    if op == "-=":
        p -= other
    elif op == "+=":
        p += other
    elif op == "*=":
        p *= other
    else:
        p /= other
    return p


def _torch_ar(x):
    return torch.from_numpy(np.asarray(x))


@pytest.mark.torch
@pytest.mark.parametrize("label,change", INPLACE, ids=[c[0] for c in INPLACE])
def test_in_place_methods_match_torch_and_return_the_parameter(label, change):
    tp, jp = _pair()
    with torch.no_grad():  # where torch code changes parameters in place
        want = _outcome(lambda: change(tp, _torch_ar))
    got = _outcome(lambda: change(jp, jnp.asarray))
    _close(want, got)
    np.testing.assert_allclose(np.asarray(jp), tp.detach().numpy(), rtol=1e-6)
    if want[0] == "array":
        assert change(jp, jnp.asarray) is jp
        assert jp.dtype == jnp.float32 and jp.shape == (2, 3, 4)


def test_in_place_changes_are_seen_by_modules_and_compiled_calls():
    lin = nn.Linear(3, 2)
    lin.compile()
    x = jnp.ones((1, 3))
    lin(x)
    lin.weight.zero_()
    lin.bias.fill_(0.5)
    np.testing.assert_allclose(np.asarray(lin(x)), 0.5)
    lin.weight.copy_(jnp.ones((2, 3)))
    np.testing.assert_allclose(np.asarray(lin(x)), 3.5)


def test_in_place_methods_inside_jm_compile_are_written_back():
    lin = nn.Linear(3, 2)

    @jm.compile
    def reset(m):
        m.weight.fill_(2.0)
        m.bias.zero_()
        return m.weight.sum()

    assert float(reset(lin)) == pytest.approx(12.0)
    np.testing.assert_allclose(np.asarray(lin.weight), 2.0)
    np.testing.assert_allclose(np.asarray(lin.bias), 0.0)


@pytest.mark.slow
@pytest.mark.torch
def test_manual_sgd_with_augmented_assignment_matches_torch_eager_and_compiled():
    # The tutorial loop: p -= lr * p.grad under no_grad, eagerly and inside jm.compile.
    torch.manual_seed(0)
    tm = torch.nn.Linear(3, 2).double()
    with jax.enable_x64(True):
        for compiled in (False, True):
            m = nn.Linear(3, 2).double()
            m.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
            tmc = torch.nn.Linear(3, 2).double()
            tmc.load_state_dict(tm.state_dict())
            xs = np.linspace(-1, 1, 12).reshape(4, 3)

            def step(model, x):
                model.zero_grad()
                jm.backward(lambda: (model(x) ** 2).sum())
                with jm.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad

            run = jm.compile(step) if compiled else step
            for _ in range(5):
                run(m, jnp.asarray(xs))
                tmc.zero_grad()
                (tmc(torch.from_numpy(xs)) ** 2).sum().backward()
                with torch.no_grad():
                    for p in tmc.parameters():
                        p -= 0.1 * p.grad
            for k, v in tmc.state_dict().items():
                np.testing.assert_allclose(
                    np.asarray(m.state_dict()[k]), v.numpy(), rtol=1e-12, err_msg=k
                )


@pytest.mark.torch
def test_in_place_arithmetic_inside_jm_backward_raises_as_torch_grad_mode():
    tp, jp = _pair()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        tp.sub_(1.0)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        jm.backward(lambda: jp.sub_(1.0).sum())
    np.testing.assert_allclose(np.asarray(jp), VALUES)  # unchanged


@pytest.mark.torch
def test_in_place_float_arithmetic_on_an_integer_buffer_raises_as_torch():
    t = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(RuntimeError) as t_err:
        t.add_(0.5)
    b = nn.Buffer(jnp.zeros(3, jnp.int32))
    with pytest.raises(RuntimeError) as j_err:
        b.add_(0.5)
    assert str(j_err.value) == str(t_err.value)
    b.add_(2)
    np.testing.assert_array_equal(np.asarray(b), [2, 2, 2])
    assert b.dtype == jnp.int32


@pytest.mark.torch
def test_in_place_inside_jm_backward_raises_as_torch_grad_mode():
    tp, jp = _pair()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad") as t_err:
        tp.zero_()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad") as j_err:
        jm.backward(lambda: jp.zero_().sum())
    assert str(t_err.value) in str(j_err.value)
    np.testing.assert_allclose(np.asarray(jp), VALUES)  # unchanged


def test_normal_and_uniform_draw_from_the_jm_generator():
    p = nn.Parameter(jnp.zeros((64, 64)))
    jm.manual_seed(0)
    assert p.normal_(1.0, 2.0) is p
    first = np.asarray(p)
    jm.manual_seed(0)
    same = np.asarray(nn.init.normal_(nn.Parameter(jnp.zeros((64, 64))), 1.0, 2.0))
    np.testing.assert_array_equal(first, same)
    assert abs(first.mean() - 1.0) < 0.1 and abs(first.std() - 2.0) < 0.1
    assert p.uniform_(-0.5, 0.5) is p and -0.5 <= float(p.min()) and float(p.max()) < 0.5
    p.uniform_(**{"from": 2.0, "to": 3.0})  # torch's keyword names
    assert 2.0 <= float(p.min()) and float(p.max()) < 3.0
    g = jm.Generator().manual_seed(3)
    a = np.asarray(p.normal_(generator=g))
    g.manual_seed(3)
    np.testing.assert_array_equal(np.asarray(p.normal_(generator=g)), a)


def test_normal_inside_jm_compile_threads_the_generator():
    lin = nn.Linear(8, 8)

    @jm.compile
    def redraw(m):
        m.weight.normal_(0.0, 1.0)
        return m.weight.sum()

    redraw(lin)
    first = np.asarray(lin.weight)
    redraw(lin)
    assert not np.allclose(np.asarray(lin.weight), first)  # a new key each call


def test_buffers_have_the_methods_too():
    b = nn.Buffer(jnp.arange(6.0).reshape(2, 3))
    assert b.size() == (2, 3) and b.numel() == 6 and b.dim() == 2
    np.testing.assert_array_equal(np.asarray(b.transpose(0, 1)), np.arange(6.0).reshape(2, 3).T)
    assert b.zero_() is b and float(np.asarray(b).sum()) == 0.0


# ------------------------------------------------------------------ einops


@pytest.mark.torch
def test_einops_accepts_parameters_eagerly():
    tp, jp = _pair()
    for pattern, fn, kw in [
        ("a b c -> c (a b)", einops.rearrange, {}),
        ("a b c -> a b c r", einops.repeat, {"r": 2}),
        ("a b c -> a c", einops.reduce, {"reduction": "mean"}),
        ("a b c -> b", einops.reduce, {"reduction": "max"}),
    ]:
        want = fn(tp.detach(), pattern, **kw).numpy()
        got = fn(jp, pattern, **kw)
        assert isinstance(got, jax.Array)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert einops.parse_shape(jp, "a b c") == {"a": 2, "b": 3, "c": 4}


@pytest.mark.torch
def test_einops_on_parameters_under_jit_and_jm_backward():
    tp, jp = _pair()
    f = jax.jit(lambda p: einops.rearrange(p, "a b c -> (c b) a"))
    np.testing.assert_allclose(
        np.asarray(f(jp)), einops.rearrange(tp.detach(), "a b c -> (c b) a").numpy()
    )
    w = np.linspace(0, 1, 24, dtype=np.float32).reshape(4, 3, 2)

    def loss(p, wt):
        x = einops.rearrange(p, "a b c -> c b a") * wt
        return (
            einops.reduce(x**2, "c b a -> ", "sum")
            + einops.repeat(p, "a b c -> r a b c", r=2).sum()
        )

    t_loss = loss(tp, torch.from_numpy(w))
    t_loss.backward()
    j_loss = jm.backward(lambda: loss(jp, jnp.asarray(w)))
    np.testing.assert_allclose(float(j_loss), t_loss.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jp.grad), tp.grad.numpy(), rtol=1e-5)


@pytest.mark.torch
def test_einops_inside_jm_compile_and_other_types_keep_their_backends():
    model = nn.Linear(4, 6)

    @jm.compile
    def f(m, x):
        return einops.rearrange(m.weight, "(h d) i -> h d i", h=2) @ x

    x = jnp.ones(4)
    np.testing.assert_allclose(
        np.asarray(f(model, x)), np.asarray(model.weight).reshape(2, 3, 4) @ np.ones(4), rtol=1e-6
    )
    assert isinstance(einops.rearrange(np.ones((2, 3)), "a b -> b a"), np.ndarray)
    t = einops.rearrange(torch.ones(2, 3), "a b -> b a")
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == (3, 2)
    assert isinstance(einops.rearrange(jnp.ones((2, 3)), "a b -> b a"), jax.Array)


@pytest.mark.torch
def test_counting_parameters_of_a_meta_model_matches_torch():
    # sum(p.numel() ...) is how model code reports its size, before any memory exists.
    with torch.device("meta"):
        ref = torch.nn.Transformer(16, 2, 1, 1, 32)
    with jm.device("meta"):
        ours = nn.Transformer(16, 2, 1, 1, 32)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    assert [p.size() for p in ours.parameters()] == [tuple(p.size()) for p in ref.parameters()]
    assert [p.dim() for p in ours.parameters()] == [p.dim() for p in ref.parameters()]
    w = next(ours.parameters())
    assert w.zero_() is w and w.normal_() is w  # in place on meta: nothing to fill
    with pytest.raises(RuntimeError, match="meta device"):
        w.view(-1)


# Methods whose NumPy namesake on jax.Array means something else: on a Parameter
# they are PyTorch's. Each call runs on a torch tensor and a Parameter alike.
TORCH_MEANING_CALLS = [
    ("std", (), {}),
    ("std", (1,), {"keepdim": True}),
    ("var", (0,), {"correction": 0}),
    ("max", (), {}),
    ("max", (1,), {}),
    ("min", (0,), {"keepdim": True}),
    ("sum", (), {"axis": 0}),
    ("sum", (1,), {"keepdim": True}),
    ("mean", (), {"dim": (0, 1)}),
    ("prod", (1,), {}),
    ("argmax", (1,), {"keepdim": True}),
    ("argmin", (), {}),
    ("amax", (0,), {}),
    ("amin", ((0, 1),), {}),
    ("split", (2,), {"dim": 1}),
    ("split", ([1, 3],), {"dim": 1}),
    ("chunk", (2, 1), {}),
    ("repeat", (2, 1, 3), {}),
    ("expand", (2, -1, -1), {}),
    ("flatten", (), {}),
    ("squeeze", (), {}),
    ("unsqueeze", (1,), {}),
    ("flip", (0,), {}),
    ("roll", (1, 1), {}),
    ("cumsum", (1,), {}),
    ("cumprod", (0,), {}),
    ("softmax", (1,), {}),
    ("log_softmax", (0,), {}),
    ("sort", (1,), {"descending": True}),
    ("argsort", (0,), {}),
    ("topk", (2,), {}),
    ("clamp", (-0.5, 0.5), {}),
    ("clip", (), {"min": 0.0}),
    ("logsumexp", (1,), {}),
    ("narrow", (1, 1, 2), {}),
    ("unbind", (0,), {}),
    ("movedim", (0, 1), {}),
    ("round", (), {"decimals": 1}),
    ("all", (), {}),
    ("any", (1,), {}),
]


def _as_np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(
    "name, args, kwargs",
    TORCH_MEANING_CALLS,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(TORCH_MEANING_CALLS)],
)
def test_numpy_namesakes_have_torch_meaning_on_a_parameter(name, args, kwargs):
    a = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    t, p = torch.tensor(a), jm.nn.Parameter(jnp.asarray(a))
    want, got = getattr(t, name)(*args, **kwargs), getattr(p, name)(*args, **kwargs)
    if isinstance(want, tuple):  # split/chunk/unbind, or (values, indices)
        assert len(got) == len(want)
        if hasattr(want, "_fields") or type(want).__name__ in {"max", "min", "sort", "topk"}:
            assert got.values.shape == tuple(want.values.shape)
        for g, w in zip(got, want):
            np.testing.assert_allclose(_as_np(g), _as_np(w), rtol=1e-5, atol=1e-6)
    else:
        assert tuple(np.shape(got)) == tuple(want.shape)
        np.testing.assert_allclose(_as_np(got), _as_np(want), rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_torch_meaning_methods_are_seen_by_gradients():
    a = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    t = torch.tensor(a, requires_grad=True)
    (t.std(1).sum() + t.max(1).values.sum() + t.split(2, dim=1)[1].sum()).backward()
    p = jm.nn.Parameter(jnp.asarray(a))
    jm.backward(lambda: p.std(1).sum() + p.max(1).values.sum() + p.split(2, dim=1)[1].sum())
    np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-5, atol=1e-6)
