"""``jm.Tensor``: torch's tensor methods on activations, Tensor in / Tensor out, against torch.

Each method is called on a torch tensor and on a ``jm.Tensor`` of the same
values and the results compared; layers, torch functions and operators keep
Tensors; in-place operations change the Tensor (and raise where PyTorch would
change another tensor through a view); traced code sees the same program as
with plain arrays.
"""

from __future__ import annotations

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
import jmodule.nn.functional as F
import jmodule.torch as jtorch
from jmodule import nn

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def _pair(a=X):
    return torch.tensor(a), jm.Tensor(jnp.asarray(a))


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.numpy()
    if isinstance(x, (tuple, list)):
        return [_np(e) for e in x]
    return np.asarray(x)


def _same(got, want, tol=1e-5):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w, tol)
        return
    if isinstance(want, torch.Size):
        assert tuple(got) == tuple(want)
        return
    if isinstance(want, (int, float, bool)):
        assert got == pytest.approx(want, rel=tol)
        return
    assert type(got) is jm.Tensor, type(got)
    w = want.numpy()
    g = np.asarray(got)
    assert g.shape == w.shape
    if w.dtype == np.int64:
        w = w.astype(g.dtype)
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


MASK = X > 0
W45 = RNG.standard_normal((4, 5)).astype(np.float32)
METHOD_CASES = [
    ("size", ()),
    ("size", (1,)),
    ("size", (-1,)),
    ("dim", ()),
    ("numel", ()),
    ("view", (6, -1)),
    ("view", ((4, 6),)),
    ("view", (-1,)),
    ("reshape", (3, 8)),
    ("transpose", (1, 2)),
    ("transpose", (0, -1)),
    ("permute", (2, 0, 1)),
    ("permute", ((1, 2, 0),)),
    ("contiguous", ()),
    ("unsqueeze", (1,)),
    ("squeeze", ()),
    ("flatten", (1,)),
    ("flatten", ()),
    ("split", (2, -1)),
    ("chunk", (3, 1)),
    ("unbind", (1,)),
    ("sum", ()),
    ("sum", (1,)),
    ("sum", (-1, True)),
    ("mean", (0,)),
    ("std", ()),
    ("var", (1,)),
    ("max", ()),
    ("max", (1,)),
    ("min", (-1, True)),
    ("argmax", (2,)),
    ("softmax", (-1,)),
    ("log_softmax", (1,)),
    ("exp", ()),
    ("tanh", ()),
    ("sigmoid", ()),
    ("relu", ()),
    ("abs", ()),
    ("sqrt", ()),
    ("pow", (2,)),
    ("clamp", (-0.5, 0.5)),
    ("repeat", (2, 1, 1)),
    ("expand", (2, 2, 3, 4)),
    ("flip", (0,)),
    ("flip", (0, 2)),
    ("roll", (1, 2)),
    ("cumsum", (1,)),
    ("topk", (2,)),
    ("sort", (1,)),
    ("masked_fill", (MASK, 0.0)),
    ("float", ()),
    ("long", ()),
    ("int", ()),
    ("bool", ()),
    ("half", ()),
    ("t", None),  # 2-d below
    ("norm", ()),
    ("mul", (2.0,)),
    ("add", (1.0,)),
    ("matmul", None),
    ("new_zeros", ((2, 5),)),
    ("new_ones", (3,)),
    ("new_full", ((2,), 7.0)),
    ("type_as", None),
    ("tril", ()),
    ("diagonal", (0, 1, 2)),
    ("narrow", (2, 1, 2)),
    ("index_select", None),
    ("gather", None),
    ("where", None),
    ("tolist", ()),
    ("item", None),
]


def _args(name, side):
    """Arguments that need a tensor of the side's framework."""

    def t(a):
        return torch.tensor(a) if side == "torch" else jm.Tensor(jnp.asarray(a))

    if name == "matmul":
        return (t(W45),)
    if name == "type_as":
        return (t(np.ones(2, np.int32)),)
    if name == "index_select":
        return (1, t(np.array([2, 0])).long() if side == "torch" else t(np.array([2, 0])))
    if name == "gather":
        idx = np.zeros((2, 3, 2), np.int64)
        return (2, torch.tensor(idx) if side == "torch" else jm.Tensor(jnp.asarray(idx, jnp.int32)))
    if name == "where":
        return (t(MASK), 0.0)
    raise AssertionError(name)


@pytest.mark.torch
@pytest.mark.parametrize(("name", "args"), METHOD_CASES, ids=lambda v: str(v)[:30])
def test_a_method_on_a_tensor_is_torch_s(name, args):
    t, j = _pair()
    if name == "t":
        t, j = _pair(X[0])
        args = ()
    if name == "item":
        t, j = _pair(X[0, 0, :1])
        args = ()
    if name == "mul" or name == "add":
        pass
    if args is None:
        targs, jargs = _args(name, "torch"), _args(name, "jm")
    else:
        targs = tuple(torch.tensor(a) if isinstance(a, np.ndarray) else a for a in args)
        jargs = tuple(jm.Tensor(jnp.asarray(a)) if isinstance(a, np.ndarray) else a for a in args)
    want = getattr(t, name)(*targs)
    got = getattr(j, name)(*jargs)
    if name in ("tolist", "item"):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
        return
    if name == "half":
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-3)
        assert got.dtype == jnp.float16
        return
    _same(got, want)


@pytest.mark.slow
@pytest.mark.torch
def test_size_shape_and_the_attributes_ported_code_reads():
    t, j = _pair()
    assert j.size() == t.size() and type(j.size()) is jm.Size
    assert j.size(-1) == 4 and j.shape == (2, 3, 4) and type(j.shape) is jm.Size
    assert j.size == 24  # jnp-style code: the element count, as jax.Array.size
    B, T, C = j.size()
    assert (B, T, C) == tuple(t.size())
    assert j.ndim == 3 and j.dim() == 3 and j.dtype == jm.float32 and j.is_floating_point()
    assert j.device == jm.device(jax.devices()[0]) and not j.is_cuda
    _same(j.T, t.permute(2, 1, 0))
    _same(j.mT, t.mT)
    _same(j[0, 1:], t[0, 1:])
    _same(j[:, None, ..., 2], t[:, None, ..., 2])
    _same(j[jm.Tensor(jnp.array([1, 0]))], t[torch.tensor([1, 0])])
    assert len(j) == 2 and [type(r) for r in j] == [jm.Tensor, jm.Tensor]
    assert float(j[0, 0, 0]) == float(t[0, 0, 0]) and int(j.long()[0, 0, 0]) == 0
    assert f"{j.sum():.3f}" == f"{t.sum().item():.3f}"
    with pytest.raises(IndexError, match="Dimension out of range"):
        j.size(3)
    with pytest.raises(jm.DtypeError, match="64-bit mode is off"):
        j.double()  # as every jm float64 request without x64
    assert repr(jm.Tensor(jnp.array([1.0, 2.0]))).startswith("Tensor([1., 2.]")


@pytest.mark.torch
def test_in_place_operations_change_the_tensor_and_its_other_names_as_torch():
    t, j = _pair()
    ta, ja = t, j  # another name for the same tensor
    steps = [
        ("add_", (1.0,), {}),
        ("sub_", (0.5,), {"alpha": 2.0}),
        ("mul_", (3.0,), {}),
        ("div_", (2.0,), {}),
        ("clamp_", (-1.0, 2.0), {}),
        ("exp_", (), {}),
        ("masked_fill_", (MASK, 0.0), {}),
        ("fill_", (2.0,), {}),
        ("zero_", (), {}),
        ("copy_", (X,), {}),
    ]
    for name, args, kwargs in steps:
        targs = tuple(torch.tensor(a) if isinstance(a, np.ndarray) else a for a in args)
        jargs = tuple(jm.Tensor(jnp.asarray(a)) if isinstance(a, np.ndarray) else a for a in args)
        assert getattr(t, name)(*targs, **kwargs) is t
        assert getattr(j, name)(*jargs, **kwargs) is j, name
        _same(ja, ta)
    t += 1
    j += 1
    t *= t
    j *= j
    _same(ja, ta)
    t[0, 1] = 5.0
    j[0, 1] = 5.0
    t[:, :, 0] = torch.tensor([1.0, 2.0, 3.0])
    j[:, :, 0] = jm.Tensor(jnp.array([1.0, 2.0, 3.0]))
    t[torch.tensor(MASK)] = -1.0
    j[jm.Tensor(jnp.asarray(MASK))] = -1.0
    _same(ja, ta)
    losses = jm.Tensor(jnp.zeros(3))  # an eval loop's `losses[k] = loss.item()`
    for k in range(3):
        losses[k] = float(k) * 2
    assert losses.mean().item() == pytest.approx(2.0)
    i = jm.Tensor(jnp.arange(4))
    with pytest.raises(RuntimeError, match=r"can't be cast to the desired output type (Long|Int)"):
        i.add_(0.5)


@pytest.mark.torch
def test_in_place_on_a_view_raises_where_torch_would_change_the_base_too():
    j = jm.Tensor(jnp.asarray(X))
    for view in (
        j[0],
        j.view(-1),
        j.transpose(0, 1),
        j.split(1)[0],
        j.detach(),
        jm.permute(j, 2, 0, 1),
    ):
        with pytest.raises(RuntimeError, match=r"view of another jm\.Tensor"):
            view.add_(1)
    z = jm.Tensor(jnp.asarray(X)).view(2, -1)  # the base is gone: nothing else can change
    z += 1
    t = torch.tensor(X).view(2, -1)
    t += 1
    _same(z, t)
    y = j.transpose(1, 2).contiguous()  # a copy in torch too: its own values
    y += 1
    np.testing.assert_allclose(np.asarray(y), np.swapaxes(X, 1, 2) + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(j), X)  # unchanged, as torch's base


@pytest.mark.slow
def test_layers_torch_functions_and_operators_keep_tensors():
    x = jm.Tensor(jnp.asarray(X))
    w = nn.Parameter(jnp.ones(4))
    lin = nn.Linear(4, 5)
    assert type(lin(x)) is jm.Tensor
    out, (h, c) = nn.LSTM(4, 6, batch_first=True)(x)
    assert {type(out), type(h), type(c)} == {jm.Tensor}
    attn_out, weights = nn.MultiheadAttention(4, 2, batch_first=True)(x, x, x)
    assert type(attn_out) is jm.Tensor and type(weights) is jm.Tensor
    for value in (
        F.relu(x),
        F.softmax(x, dim=-1),
        F.cross_entropy(x.reshape(-1, 4), jm.Tensor(jnp.zeros(6, jnp.int32))),
        jm.cat([x, x], dim=1),
        jm.stack((x, x)),
        jm.max(x, dim=1).values,
        jm.zeros_like(x),
        x + 1,
        1 + x,
        x * w,
        w * x,
        x @ jnp.ones((4, 2)),
        np.ones(4, np.float32) + x,
        x > 0,
        -x,
    ):
        assert type(value) is jm.Tensor
    # jnp accepts Tensors and answers with arrays, as jnp always does
    assert type(jnp.sin(x)) is not jm.Tensor and isinstance(jnp.sin(x), jax.Array)
    np.testing.assert_allclose(np.asarray(jnp.sin(x)), np.sin(X), rtol=1e-6)
    # plain arrays stay plain everywhere
    assert type(lin(jnp.asarray(X))) is not jm.Tensor and type(jm.cat([X, X])) is not jm.Tensor
    assert isinstance(jnp.ones(2), jm.Tensor) and isinstance(w, jm.Tensor)
    assert isinstance(x, jm.Tensor) and not isinstance(X, jm.Tensor)
    assert jm.is_tensor(x)


def test_a_user_forward_gets_tensors_even_inside_a_sequential():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(type(x))
            return x.view(x.size(0), -1)

    model = nn.Sequential(nn.Linear(4, 4), Probe(), nn.ReLU())
    out = model(jm.Tensor(jnp.asarray(X)))
    assert seen == [jm.Tensor] and type(out) is jm.Tensor and out.shape == (2, 12)
    hooked = []
    model[0].register_forward_hook(lambda m, i, o: hooked.append((type(i[0]), type(o))))
    model(jm.Tensor(jnp.asarray(X)))
    assert hooked == [(jm.Tensor, jm.Tensor)]  # hooks see what the caller passed


class _TorchishBlock:
    """A forward written as torch code is: view, transpose, size, masked_fill, softmax."""

    @staticmethod
    def forward(nn_, x, qkv):
        B, T, C = x.size()
        q, k, v = qkv(x).split(C, dim=2)
        q = q.view(B, T, 2, C // 2).transpose(1, 2)
        k = k.view(B, T, 2, C // 2).transpose(1, 2)
        v = v.view(B, T, 2, C // 2).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        mask = jtorch.tril(jtorch.ones(T, T)).view(1, 1, T, T)
        att = att.masked_fill(mask == 0, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


@pytest.mark.slow
def test_tensor_code_traces_to_the_same_program_as_plain_array_code():
    qkv = nn.Linear(4, 12)

    def with_tensors(x):
        return _TorchishBlock.forward(nn, jm.Tensor(x), qkv).array

    def plain(x):
        B, T, C = x.shape
        q, k, v = jnp.split(qkv(x), 3, axis=2)
        q = jnp.swapaxes(q.reshape(B, T, 2, C // 2), 1, 2)
        k = jnp.swapaxes(k.reshape(B, T, 2, C // 2), 1, 2)
        v = jnp.swapaxes(v.reshape(B, T, 2, C // 2), 1, 2)
        att = (q @ jnp.swapaxes(k, -2, -1)) * (1.0 / (k.shape[-1] ** 0.5))
        mask = jm.tril(jm.ones(T, T)).reshape(1, 1, T, T)
        att = jax.nn.softmax(jnp.where(mask == 0, float("-inf"), att), axis=-1)
        return jnp.swapaxes(att @ v, 1, 2).reshape(B, T, C)

    x = jnp.asarray(X)
    np.testing.assert_allclose(np.asarray(with_tensors(x)), np.asarray(plain(x)), rtol=1e-5)
    a = jax.make_jaxpr(with_tensors)(x).jaxpr
    b = jax.make_jaxpr(plain)(x).jaxpr
    prims = lambda j: [e.primitive.name for e in j.eqns]
    assert prims(a) == prims(b)  # no extra operation: the wrapper is Python only
    # through jax.jit, a Tensor is a one-leaf pytree: in and out
    out = jax.jit(lambda t: t.transpose(0, 1) * 2)(jm.Tensor(x))
    assert type(out) is jm.Tensor and out.shape == (3, 2, 4)
    assert jax.tree_util.tree_leaves(jm.Tensor(x))[0] is x


def test_compiled_code_with_tensors_device_and_in_place():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, idx):
            device = idx.device
            pos = jm.arange(idx.size(1), device=device)
            h = self.fc(idx)
            h += pos.reshape(1, -1, 1).astype(h.dtype)  # a local Tensor: in place is fine
            return h.masked_fill(h < 0, 0.0)

    torch_like = Model()
    x = jm.Tensor(jnp.asarray(X))
    eager = torch_like(x)
    torch_like.compile()
    compiled = torch_like(x)
    assert type(compiled) is jm.Tensor
    np.testing.assert_allclose(np.asarray(compiled), np.asarray(eager), rtol=1e-6)

    @jm.compile
    def bump(t):
        t.add_(1)  # the caller's Tensor cannot change: a clear error
        return t

    with pytest.raises(RuntimeError, match="argument of a traced function"):
        bump(x)

    @jm.compile
    def device_of(m, t):
        return jm.zeros(2, device=next(m.parameters()).device) + t.sum()

    np.testing.assert_allclose(np.asarray(device_of(torch_like, x)), [X.sum()] * 2, rtol=1e-5)


def test_gradients_with_tensor_inputs_equal_the_plain_ones_eager_and_compiled():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = jnp.asarray(X)
    model.zero_grad()
    plain = jm.backward(lambda: model(x).sum())
    g_plain = [np.asarray(p.grad) for p in model.parameters()]
    model.zero_grad()
    loss = jm.backward(lambda: model(jm.Tensor(x)).sum())
    assert type(loss) is jm.Tensor and float(loss) == pytest.approx(float(plain), rel=1e-6)
    for p, g in zip(model.parameters(), g_plain):
        np.testing.assert_allclose(np.asarray(p.grad), g, rtol=1e-6)

    @jm.compile
    def step(m, t):
        m.zero_grad()
        return jm.backward(lambda: m(t).sum())

    assert type(step(model, jm.Tensor(x))) is jm.Tensor
    for p, g in zip(model.parameters(), g_plain):
        np.testing.assert_allclose(np.asarray(p.grad), g, rtol=1e-6)


@pytest.mark.torch
def test_copies_pickles_and_the_constructor():
    j = jm.Tensor(jnp.asarray(X))
    for other in (copy.deepcopy(j), copy.copy(j), pickle.loads(pickle.dumps(j))):
        assert type(other) is jm.Tensor
        np.testing.assert_allclose(np.asarray(other), X)
    assert jm.Tensor(2, 3).shape == torch.Tensor(2, 3).shape
    assert jm.Tensor([1, 2]).dtype == jm.float32  # torch.Tensor([1, 2]) is float too
    assert jm.Tensor(np.arange(3, dtype=np.int32)).dtype == jnp.int32
    assert jm.Tensor(nn.Parameter(jnp.ones(2))).shape == (2,)
    with pytest.raises(RuntimeError, match="differentiates parameters"):
        j.requires_grad_()
    assert j.data is j and j.numpy().shape == (2, 3, 4) and j.to(jm.float16).dtype == jnp.float16


@pytest.mark.torch
def test_the_torch_namespace_returns_tensors_from_the_start():
    import jmodule.torch.nn as jtnn
    import jmodule.torch.nn.functional as JF

    import jmodule.torch as jtorch

    assert jtnn is nn and JF is F and jtorch.optim is jm.optim
    for value in (
        jtorch.zeros(2, 3),
        jtorch.arange(4),
        jtorch.tensor([1.0, 2.0]),
        jtorch.from_numpy(X),
        jtorch.randn(2),
        jtorch.sum(jtorch.ones(2)),
        jtorch.tril(jtorch.ones(3, 3)).view(1, 1, 3, 3),
    ):
        assert type(value) is jm.Tensor
    assert jtorch.no_grad is jm.no_grad and jtorch.float32 is jm.float32
    assert jtorch.cuda.is_available() == any(d.platform == "gpu" for d in jax.devices())
    bias = jtorch.tril(jtorch.ones(3, 3)).view(1, 1, 3, 3)
    want = torch.tril(torch.ones(3, 3)).view(1, 1, 3, 3)
    _same(bias, want)
    assert type(jm.zeros(2)) is not jm.Tensor  # jmodule itself stays plain


# ----------------------------------------------------------------------------- has_aux


def test_backward_has_aux_returns_what_the_closure_hands_back_eager_and_compiled():
    lin = nn.Linear(4, 2)
    x = jnp.asarray(X[0])

    def closure():
        out = lin(x)
        return out.sum(), {"out": out}

    loss, aux = jm.backward(closure, has_aux=True)
    np.testing.assert_allclose(np.asarray(aux["out"]), np.asarray(lin(x)), rtol=1e-6)
    assert float(loss) == pytest.approx(float(lin(x).sum()), rel=1e-6)
    g = np.asarray(lin.weight.grad)

    @jm.compile
    def step(m, x):
        m.zero_grad()
        return jm.backward(lambda: (m(x).sum(), m(x) * 2), has_aux=True)

    loss2, doubled = step(lin, x)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)
    np.testing.assert_allclose(np.asarray(doubled), 2 * np.asarray(lin(x)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lin.weight.grad), g, rtol=1e-6)
    with pytest.raises(RuntimeError, match="has_aux=True"):
        jm.backward(lambda: (lin(x).sum(), 1))
    with pytest.raises(TypeError, match=r"pair \(loss, aux\)"):
        jm.backward(lambda: lin(x).sum(), has_aux=True)


def test_a_value_assigned_out_of_a_compiled_backward_says_has_aux():
    lin = nn.Linear(4, 2)
    kept = {}

    @jm.compile
    def step(m, x):
        def closure():
            kept["out"] = m(x)
            return kept["out"].sum()

        jm.backward(closure)
        return kept["out"]  # a value of the finished gradient's trace

    with pytest.raises(jm.jit.TracingError, match=r"has_aux=True"):
        step(lin, jnp.asarray(X[0]))


@pytest.mark.slow
@pytest.mark.torch
def test_an_rnn_loop_carrying_hidden_matches_torch_float64():
    """word_language_model's loop: hidden carried (detached) across steps, manual SGD."""
    with jax.enable_x64(True):
        torch.manual_seed(0)
        t_rnn, t_head = torch.nn.LSTM(3, 5).double(), torch.nn.Linear(5, 4).double()
        j_rnn, j_head = nn.LSTM(3, 5).double(), nn.Linear(5, 4).double()
        for src, dst in ((t_rnn, j_rnn), (t_head, j_head)):
            dst.load_state_dict({k: v.numpy() for k, v in src.state_dict().items()})
        data = np.random.default_rng(1).standard_normal((4, 6, 2, 3))
        target = np.random.default_rng(2).integers(0, 4, (4, 6, 2))
        t_hidden = (torch.zeros(1, 2, 5, dtype=torch.float64),) * 2
        j_hidden = (jnp.zeros((1, 2, 5)),) * 2
        j_params = [*j_rnn.parameters(), *j_head.parameters()]
        for step in range(4):
            t_hidden = tuple(h.detach() for h in t_hidden)
            for p in [*t_rnn.parameters(), *t_head.parameters()]:
                p.grad = None
            out, t_hidden = t_rnn(torch.tensor(data[step]), t_hidden)
            t_loss = torch.nn.functional.cross_entropy(
                t_head(out).view(-1, 4), torch.tensor(target[step]).view(-1)
            )
            t_loss.backward()
            with torch.no_grad():
                for p in [*t_rnn.parameters(), *t_head.parameters()]:
                    p.add_(p.grad, alpha=-0.5)

            for p in j_params:
                p.grad = None

            def closure(hidden=j_hidden, step=step):
                out, hidden = j_rnn(jnp.asarray(data[step]), hidden)
                loss = F.cross_entropy(
                    j_head(out).reshape(-1, 4), jnp.asarray(target[step]).reshape(-1)
                )
                return loss, hidden

            j_loss, j_hidden = jm.backward(closure, has_aux=True)
            with jm.no_grad():
                for p in j_params:
                    p.add_(p.grad, alpha=-0.5)
            assert float(j_loss) == pytest.approx(t_loss.item(), rel=1e-10)
            np.testing.assert_allclose(
                np.asarray(j_hidden[0]), t_hidden[0].detach().numpy(), rtol=1e-10
            )
        np.testing.assert_allclose(
            np.asarray(j_head.weight), t_head.weight.detach().numpy(), rtol=1e-10
        )


def test_the_torch_namespace_switches_scripts_set():
    import jmodule.torch as jtorch

    before = jax.config.jax_default_matmul_precision
    try:
        jtorch.backends.cuda.matmul.allow_tf32 = False
        assert jax.config.jax_default_matmul_precision == "highest"
        assert not jtorch.backends.cudnn.allow_tf32
        jtorch.backends.cudnn.allow_tf32 = True
        assert jax.config.jax_default_matmul_precision == "tensorfloat32"
        assert jtorch.backends.cuda.matmul.allow_tf32
    finally:
        jax.config.update("jax_default_matmul_precision", before)
    jtorch.backends.cudnn.benchmark = True  # accepted (XLA picks kernels when compiling)
    scaler = jtorch.cuda.amp.GradScaler(enabled=False)
    assert not scaler.is_enabled()
    assert jtorch.cuda.is_bf16_supported() == jtorch.cuda.is_available()
    assert jtorch.cuda.device_count() == len([d for d in jax.devices() if d.platform == "gpu"])


def test_a_tensor_argument_traces_once_with_a_reason_that_says_so():
    model = nn.Sequential(nn.Linear(4, 4))
    model.compile()
    x = jnp.asarray(X)
    model(x)
    out = model(jm.Tensor(x))
    model(jm.Tensor(x))
    model(x)
    assert type(out) is jm.Tensor
    stats = jm.compile_stats(model)
    assert stats.num_traces == 2
    assert stats.reasons[1].endswith("changed: a jax.Array -> a jm.Tensor")


@pytest.mark.slow
def test_a_torch_style_model_traced_with_tensors_saves_and_loads(tmp_path):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 2)

        def forward(self, x):
            return self.fc(x.view(x.size(0), -1)).transpose(0, 1)

    model = Model()
    x = jm.Tensor(jnp.asarray(X))
    want = np.asarray(model(x))
    traced = jm.jit.trace(model, x)
    jm.jit.save(traced, tmp_path / "m.jmod")
    loaded = jm.jit.load(tmp_path / "m.jmod")
    out = loaded(x)
    assert type(out) is jm.Tensor  # Tensor in, Tensor out
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    plain = loaded(jnp.asarray(X))  # the saved program itself computes with arrays
    assert type(plain) is not jm.Tensor and isinstance(plain, jax.Array)
    np.testing.assert_allclose(np.asarray(plain), want, rtol=1e-6)
