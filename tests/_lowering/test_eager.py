"""Eager mode on cached programs: the tape (``_lowering/tape.py``) and fused library modules.

What an eager step must keep (issue 25): gradients equal to PyTorch's and to
``jax.grad`` of the same function (float64), user Python run on every call,
hooks firing in PyTorch's order, edits between steps seen at once, frozen
parameters, accumulation, teaching errors; and from the third step of a
shape on, nothing compiles.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _monitoring import LOWER, TRACE, counting
from _torch import torch

import jmodule as jm
from jmodule import nn
from jmodule._lowering import tape as _tape

F = jm.nn.functional


def _mlp(lib):
    return lib.Sequential(lib.Linear(12, 16), lib.ReLU(), lib.Linear(16, 3))


def _cnn(lib):
    return lib.Sequential(
        lib.Conv2d(1, 4, 3, padding=1),
        lib.ReLU(),
        lib.MaxPool2d(2),
        lib.Conv2d(4, 6, 3, padding=1),
        lib.ReLU(),
        lib.MaxPool2d(2),
        lib.Flatten(),
        lib.Linear(6 * 2 * 2, 3),
    )


def _bn(lib, dropout=0.0):
    layers = [lib.Linear(12, 16), lib.BatchNorm1d(16), lib.ReLU()]
    if dropout:
        layers.append(lib.Dropout(dropout))
    return lib.Sequential(*layers, lib.Linear(16, 3))


class _UserNet:
    """A user model: its forward is Python, its layers library modules."""

    @staticmethod
    def build(lib, branch=True):
        class Net(lib.Module):
            def __init__(self):
                super().__init__()
                self.body = _bn(lib)
                self.skip = lib.Linear(12, 3)

            def forward(self, x):
                h = self.body(x)
                if not branch or h.sum() > -1e9:  # Python control flow on a value, every call
                    h = h + 0.5 * (torch.tanh if lib is torch.nn else jnp.tanh)(self.skip(x))
                return h

        return Net()


_MODELS = {
    "mlp": (_mlp, (6, 12)),
    "cnn": (_cnn, (6, 1, 8, 8)),
    "bn": (_bn, (6, 12)),
    "user": (_UserNet.build, (6, 12)),
}


def _data(shape, dtype=np.float32):
    rng = np.random.default_rng(0)
    return rng.standard_normal(shape).astype(dtype), rng.integers(0, 3, shape[0])


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("which", sorted(_MODELS))
def test_sgd_steps_match_torch_float64(which):
    """Five eager SGD-momentum steps: parameters, gradients and buffers equal torch's."""
    make, shape = _MODELS[which]
    with jax.enable_x64(True):
        torch.manual_seed(0)
        ref = make(torch.nn).double()
        ours = make(jm.nn).double()
        ours.load_state_dict(ref.state_dict())
        xn, yn = _data(shape, np.float64)
        x, y = jnp.asarray(xn), jnp.asarray(yn)
        tx, ty = torch.from_numpy(xn), torch.from_numpy(yn)
        opt = jm.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for _ in range(5):
            opt.zero_grad()
            loss = jm.backward(lambda: F.cross_entropy(ours(x), y))
            opt.step()
            topt.zero_grad()
            tloss = torch.nn.functional.cross_entropy(ref(tx), ty)
            tloss.backward()
            topt.step()
            np.testing.assert_allclose(float(loss), tloss.item(), rtol=1e-12)
        for (name, p), (_, tp) in zip(ours.named_parameters(), ref.named_parameters()):
            np.testing.assert_allclose(
                np.asarray(p.grad), tp.grad.numpy(), atol=1e-12, err_msg=name
            )
            np.testing.assert_allclose(np.asarray(p.data), tp.detach().numpy(), atol=1e-12)
        for (name, b), (_, tb) in zip(ours.named_buffers(), ref.named_buffers()):
            np.testing.assert_allclose(np.asarray(b), tb.numpy(), atol=1e-12, err_msg=name)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("which", sorted(_MODELS))
def test_nothing_compiles_from_the_third_step(which):
    make, shape = _MODELS[which]
    model = make(jm.nn)
    if which == "bn":
        model = _bn(jm.nn, dropout=0.2)
    opt = jm.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xn, yn = _data(shape)
    x, y = jnp.asarray(xn), jnp.asarray(yn)
    counts = []
    for _ in range(5):
        with counting() as seen:
            opt.zero_grad()
            loss = jm.backward(lambda: F.cross_entropy(model(x), y))
            opt.step()
            float(loss)
        counts.append(len(seen))
    assert counts[0] > 0, counts  # the counter sees compiles (the first step has some)
    assert counts[2:] == [0, 0, 0], counts


def test_a_first_step_makes_only_the_nodes_programs_and_the_update():
    """A fused model and its loss are one tape node each (a forward and a backward
    program apiece) and SGD's update one more: the backward's seed and the optimizer's
    initial state (momentum buffers, packed) make no program of their own."""
    model = nn.Sequential(nn.Linear(9, 6), nn.ReLU(), nn.Linear(6, 4))  # shapes of this test
    opt = jm.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 9)), jnp.float32)
    y = jnp.asarray([0, 1, 2, 3, 0])
    with counting(LOWER) as seen:
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        float(loss)
    assert len(seen) == 5, seen
    assert opt.state[model[0].weight]["momentum_buffer"].shape == (6, 9)


def _functional_loss(model, x, y):
    """The model's loss as a pure function of its parameters (plain jax.grad's reference)."""
    names = [n for n, _ in model.named_parameters()]

    def loss(params):
        out = jm.func.functional_call(model, dict(zip(names, params)), (x,))
        return F.cross_entropy(out, y)

    return loss, [jnp.asarray(p.data) for _, p in model.named_parameters()]


# Closures over a Linear's weight ``w`` and an input ``x``: what user code does between
# library calls, each differentiated by the tape and by jax.grad.
def _scan(w, x):
    def body(c, xi):
        c = jnp.tanh(w @ jnp.tanh(c @ w) + xi)
        return c, c.sum()

    c, ys = jax.lax.scan(body, jnp.zeros(w.shape[0]), x)
    return c.sum() + ys.sum()


CLOSURES = {
    "jnp arithmetic": lambda w, x: ((x @ w) ** 2).mean() + jnp.sin(w).sum(),
    "custom_jvp (jax.nn)": lambda w, x: jax.nn.gelu(x @ w).sum() + jax.nn.relu(x @ w).sum(),
    "softmax, logsumexp": lambda w, x: jax.nn.logsumexp(jax.nn.softmax(x @ w, axis=-1)),
    "split, concatenate": lambda w, x: sum(
        p.sum() * (i + 1) for i, p in enumerate(jnp.split(x @ w, 2, axis=1))
    ),
    "integer outputs": lambda w, x: (x @ w)[jnp.arange(x.shape[0]), jnp.argmax(x @ w, 1)].sum(),
    "max with indices": lambda w, x: jm.max(x @ w, dim=1).values.sum(),
    "stop_gradient": lambda w, x: ((x @ w) * jax.lax.stop_gradient(x @ w)).sum(),
    "lax.scan": _scan,
    "vmap": lambda w, x: jax.vmap(lambda r: jnp.tanh(r @ w).sum())(x).sum(),
    "jax.checkpoint": lambda w, x: jax.checkpoint(lambda v: jnp.sin(x @ v).sum())(w),
    "cond": lambda w, x: jax.lax.cond(True, lambda v: (x @ v).sum(), lambda v: -(x @ v).sum(), w),
    "user jax.jit": lambda w, x: jax.jit(lambda a, b: jnp.cos(a @ b).sum())(x, w),
    "custom_vjp": lambda w, x: _doubled_grad(x @ w).sum(),
}


@jax.custom_vjp
def _doubled_grad(v):
    return v


_doubled_grad.defvjp(lambda v: (v, None), lambda _, g: (2 * g,))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CLOSURES))
def test_user_code_in_the_closure_is_differentiated_as_jax_grad(name):
    fn = CLOSURES[name]
    with jax.enable_x64(True):
        w = nn.Parameter(jnp.asarray(np.random.default_rng(1).standard_normal((5, 4))))
        x = jnp.asarray(np.random.default_rng(2).standard_normal((6, 5)))
        for _ in range(3):  # the cached programs of later calls give the same gradients
            w.grad = None
            loss = jm.backward(lambda: fn(w, x))
            want_loss, want = jax.value_and_grad(lambda v: fn(v, x))(jnp.asarray(w.data))
            np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-12)
            np.testing.assert_allclose(np.asarray(w.grad), np.asarray(want), atol=1e-12)


@pytest.mark.slow
@pytest.mark.torch
def test_models_match_jax_grad_of_the_functional_model():
    with jax.enable_x64(True):
        for which, (make, shape) in sorted(_MODELS.items()):
            model = make(jm.nn).double()
            xn, yn = _data(shape, np.float64)
            x, y = jnp.asarray(xn), jnp.asarray(yn)
            fn, params = _functional_loss(model, x, y)
            want = jax.grad(fn)(params)  # first: the buffers are the same for both
            jm.backward(lambda: F.cross_entropy(model(x), y))
            for (name, p), g in zip(model.named_parameters(), want):
                np.testing.assert_allclose(
                    np.asarray(p.grad), np.asarray(g), atol=1e-12, err_msg=f"{which}.{name}"
                )


def _kept_by_the_tape(value):
    """Every array the tape keeps for ``value``'s backward (its nodes' residuals)."""
    seen, stack, kept = set(), [value.node], []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op is not None and isinstance(node.kept, tuple):
            kept += node.kept[0]
        stack += [src for src, _ in node.inputs]
    return kept


def _backward_keeping(model, x, y):
    """``jm.backward`` of ``model``'s cross-entropy, and every array its tape kept."""
    kept = []

    def closure():
        loss = F.cross_entropy(model(x), y)
        kept.extend(_kept_by_the_tape(loss))
        return loss

    return jm.backward(closure), kept


def _unfused(sequential):
    """``sequential``'s layers under a user class: each layer its own node on the tape."""
    layers = list(sequential)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(layers)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    return Net()


@pytest.mark.parametrize("fused", [True, False])
def test_the_tape_keeps_no_arrays_of_zeros(fused):
    """ReLU's and max-pooling's derivatives select between the cotangent and zeros: the
    backward programs make those zeros; the tape keeps only what the forward computed."""
    model = _cnn(jm.nn) if fused else _unfused(_cnn(jm.nn))
    xn, yn = _data((4, 1, 8, 8), np.float32)
    x, y = jnp.asarray(xn), jnp.asarray(yn)
    _, kept = _backward_keeping(model, x, y)
    activations = [a for a in kept if jnp.issubdtype(a.dtype, jnp.floating) and a.size >= 4 * 4 * 4]
    assert activations  # the pooled activations the last layers' derivatives need
    zeros = [a.shape for a in activations if not np.any(np.asarray(a))]
    assert not zeros, f"arrays of zeros kept for the backward: {zeros}"
    fn, params = _functional_loss(model, x, y)
    for (name, p), g in zip(model.named_parameters(), jax.grad(fn)(params)):
        np.testing.assert_allclose(np.asarray(p.grad), np.asarray(g), atol=1e-5, err_msg=name)


def _convnet(lib):
    return lib.Sequential(
        lib.Conv2d(2, 3, 3),
        lib.ReLU(),
        lib.Flatten(),
        lib.Linear(48, 5),
        lib.Tanh(),
        lib.Linear(5, 7),
    )


@pytest.mark.torch
@pytest.mark.parametrize("fused", [True, False])
def test_the_tape_keeps_no_rearranged_copy_of_a_weight(fused):
    """The derivative of ``x @ w.T`` with respect to ``x`` needs ``w.T``: the node keeps
    the weight itself (as PyTorch saves it) and the backward transposes it again, instead
    of the forward writing a copy of every weight for the tape to hold (nor is a
    convolution's kernel copied). Gradients equal PyTorch's (float64)."""
    with jax.enable_x64(True):
        torch.manual_seed(0)
        ref = _convnet(torch.nn).double()
        model = _convnet(jm.nn).double()
        model.load_state_dict(ref.state_dict())
        if not fused:
            model = _unfused(model)
        xn, yn = _data((2, 2, 6, 6), np.float64)
        x, y = jnp.asarray(xn), jnp.asarray(yn)
        loss, kept = _backward_keeping(model, x, y)
        sizes = {p.size for p in model.parameters() if p.ndim > 1}  # 54, 240, 35
        assert not sizes & {2 * 3 * 4 * 4, 2 * 5, 2 * 7}  # no activation is as large
        copies = [a.shape for a in kept if a.size in sizes]
        assert not copies, f"copies of weights kept for the backward: {copies}"
        tloss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(xn)), torch.from_numpy(yn))
        tloss.backward()
        np.testing.assert_allclose(float(loss), tloss.item(), rtol=1e-12)
        for (name, p), (_, tp) in zip(model.named_parameters(), ref.named_parameters()):
            np.testing.assert_allclose(
                np.asarray(p.grad), tp.grad.numpy(), atol=1e-12, err_msg=name
            )


_LOSS_CASES = {
    "cross_entropy": (lambda F, x, t, w: F.cross_entropy(x, t), (5, 4)),
    "cross_entropy_weighted_ignored": (
        lambda F, x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=2),
        (5, 4),
    ),
    "cross_entropy_smoothed_sum": (
        lambda F, x, t, w: F.cross_entropy(x, t, label_smoothing=0.2, reduction="sum"),
        (5, 4),
    ),
    "cross_entropy_spatial": (lambda F, x, t, w: F.cross_entropy(x, t, ignore_index=0), (3, 4, 2)),
    "nll_loss_weighted": (lambda F, x, t, w: F.nll_loss(x, t, weight=w), (5, 4)),
    "nll_loss_single": (lambda F, x, t, w: F.nll_loss(x[0], t[0]), (5, 4)),
}


@pytest.mark.torch
@pytest.mark.parametrize("case", sorted(_LOSS_CASES))
def test_a_loss_keeps_nothing_made_from_its_labels(case):
    """The tape keeps no one-hot mask, index or count of a loss's labels for the backward:
    the backward program makes them again from the labels (which it holds anyway), and the
    gradients equal PyTorch's (float64)."""
    loss_of, shape = _LOSS_CASES[case]
    rng = np.random.default_rng(1)
    xn = rng.standard_normal(shape)
    tn = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    wn = rng.uniform(0.5, 2.0, shape[1])
    with jax.enable_x64(True):
        x = jm.nn.Parameter(jnp.asarray(xn))
        t, w = jnp.asarray(tn), jnp.asarray(wn)
        kept = []

        def closure():
            loss = loss_of(F, x, t, w)
            kept.extend(_kept_by_the_tape(loss))
            return loss

        loss = jm.backward(closure)
        made_from_labels = [
            (a.dtype, a.shape)
            for a in kept
            if not jnp.issubdtype(a.dtype, jnp.floating) or a.shape in (t.shape, ())
        ]
        assert not made_from_labels, f"kept for the backward: {made_from_labels}"
        tx = torch.tensor(xn, requires_grad=True)
        tloss = loss_of(torch.nn.functional, tx, torch.tensor(tn), torch.tensor(wn))
        tloss.backward()
        np.testing.assert_allclose(float(loss), tloss.item(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(x.grad), tx.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_values_inside_the_closure_are_concrete():
    """print(), float() and Python control flow see values, as in PyTorch eager."""
    m = nn.Linear(3, 1)
    seen = []

    class Printing(nn.Module):
        def forward(self, x):
            out = m(x)
            seen.append(repr(out))
            if float(out.sum()) > -1e9:
                out = out * 2
            return out

    net = Printing()
    x = jnp.ones((2, 3))
    for _ in range(2):
        jm.backward(lambda: net(x).sum())
    assert len(seen) == 2 and all(s.startswith("Array(") for s in seen), seen
    assert seen[0] == repr(m(x))


def test_a_library_sequential_runs_as_one_program_and_sees_edits():
    model = _mlp(jm.nn)
    x = jnp.asarray(_data((6, 12))[0])
    out = model(x)
    assert model.__dict__.get("_jm_fused") is not None  # fused
    # An edit between calls is seen at once (the parameters are read on every call).
    model[0].weight.data = jnp.zeros_like(model[0].weight.data)
    model[0].bias.data = jnp.zeros_like(model[0].bias.data)
    want = np.broadcast_to(np.asarray(model[-1].bias.data), (6, 3))
    np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-6)
    assert not np.allclose(np.asarray(out), want)
    # So is a mode change: in eval mode BatchNorm normalises with its running statistics.
    bn = _bn(jm.nn)
    bn(x)
    bn.eval()
    m, v = np.asarray(bn[1].running_mean), np.asarray(bn[1].running_var)
    h = np.asarray(bn[0](x))
    norm = (h - m) / np.sqrt(v + 1e-5) * np.asarray(bn[1].weight.data) + np.asarray(bn[1].bias.data)
    np.testing.assert_allclose(np.asarray(bn[1](bn[0](x))), norm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(bn(x)), np.asarray(bn[3](bn[2](jnp.asarray(norm)))), rtol=1e-5, atol=1e-5
    )


def test_fused_sequential_matches_layer_by_layer_and_draws_the_same_masks():
    model = _bn(jm.nn, dropout=0.5)
    x = jnp.asarray(_data((6, 12))[0])
    jm.manual_seed(3)
    fused = [np.asarray(model(x)) for _ in range(3)]
    stats = np.asarray(model[1].running_mean)
    model[1].reset_running_stats()
    jm.manual_seed(3)
    unfused = []
    for _ in range(3):
        h = x
        for layer in model:  # each layer called on its own: the eager path
            h = layer(h)
        unfused.append(np.asarray(h))
    for a, b in zip(fused, unfused):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats, np.asarray(model[1].running_mean), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_hooks_stop_fusion_and_fire_on_every_call_in_order():
    model = _mlp(jm.nn)
    x = jnp.ones((2, 12))
    model(x)
    order = []
    h1 = model[0].register_forward_pre_hook(lambda m, a: order.append("pre 0"))
    h2 = model[2].register_forward_hook(lambda m, a, o: order.append("post 2"))
    h3 = model.register_forward_hook(lambda m, a, o: order.append("post seq"))
    h4 = model[2].register_full_backward_hook(lambda m, gi, go: order.append("backward 2"))
    for _ in range(2):
        jm.backward(lambda: model(x).sum())
    assert order == ["pre 0", "post 2", "post seq", "backward 2"] * 2
    for h in (h1, h2, h3, h4):
        h.remove()
    order.clear()
    model(x)
    assert order == []
    glob = jm.nn.modules.module.register_module_forward_hook(lambda m, a, o: order.append(m))
    try:
        model(x)
    finally:
        glob.remove()
    assert len(order) == 4  # the Sequential and its three layers


def test_a_backward_hook_replacing_gradients_still_does():
    model = _mlp(jm.nn)
    x = jnp.ones((2, 12))
    model[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * 0,))
    jm.backward(lambda: model(x).sum())
    assert np.all(np.asarray(model[0].weight.grad) == 0)
    assert np.any(np.asarray(model[2].weight.grad) != 0)


_KEYWORD_CALLS = {
    "relu": (lambda F_, h: F_.relu(h, inplace=True), lambda h: torch.relu(h)),
    "gelu": (
        lambda F_, h: F_.gelu(h, approximate="tanh"),
        lambda h: torch.nn.functional.gelu(h, approximate="tanh"),
    ),
    "leaky_relu": (
        lambda F_, h: F_.leaky_relu(h, negative_slope=0.2),
        lambda h: torch.nn.functional.leaky_relu(h, negative_slope=0.2),
    ),
    "elu_all_keywords": (
        lambda F_, h: F_.elu(input=h, alpha=0.5),
        lambda h: torch.nn.functional.elu(h, alpha=0.5),
    ),
}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(_KEYWORD_CALLS))
def test_functional_layers_called_with_keywords_bind_no_signature(name, monkeypatch):
    """``F.relu(x, inplace=self.inplace)`` (as ``nn.ReLU`` calls it) takes the positional
    path: no ``inspect`` binding per call, eagerly or on the tape; values and gradients
    as torch's."""
    import inspect

    f, tf = _KEYWORD_CALLS[name]
    xn = _data((4, 5))[0]
    m = nn.Linear(5, 3)
    tm = torch.nn.Linear(5, 3)
    m.load_state_dict(tm.state_dict())
    x = jnp.asarray(xn)
    f(F, m(x))  # the first calls trace (JAX binds signatures then)
    jm.backward(lambda: f(F, m(x)).sum())
    m.zero_grad()
    bound = []
    original = inspect.Signature.bind
    monkeypatch.setattr(
        inspect.Signature, "bind", lambda self, *a, **k: bound.append(1) or original(self, *a, **k)
    )
    out = f(F, m(x))
    loss = jm.backward(lambda: f(F, m(x)).sum())
    assert bound == []
    tout = tf(tm(torch.from_numpy(xn)))
    tout.sum().backward()
    np.testing.assert_allclose(np.asarray(out), tout.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss), float(tout.detach().sum()), rtol=1e-5)
    grad, tgrad = np.asarray(m.weight.grad), tm.weight.grad.numpy()
    np.testing.assert_allclose(grad, tgrad, rtol=1e-5, atol=1e-6)  # float32: sums differ in order


def test_functional_layers_keep_pythons_errors_for_bad_keywords():
    x = jnp.ones(3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        F.relu(x, bogus=True)
    with pytest.raises(TypeError, match="multiple values for argument 'input'"):
        F.relu(x, input=x)
    with pytest.raises(TypeError, match="missing a required argument: 'input'"):
        F.leaky_relu(negative_slope=0.2)
    np.testing.assert_array_equal(np.asarray(F.relu(input=-x, inplace=False)), np.zeros(3))


def test_frozen_parameters_accumulation_and_graph_options():
    model = _mlp(jm.nn)
    x = jnp.asarray(_data((6, 12))[0])
    model[0].weight.requires_grad_(False)
    jm.backward(lambda: model(x).sum())
    first = np.asarray(model[2].weight.grad)
    assert model[0].weight.grad is None and model[0].bias.grad is not None
    jm.backward(lambda: model(x).sum(), retain_graph=True)
    np.testing.assert_allclose(np.asarray(model[2].weight.grad), 2 * first, rtol=1e-6)
    with pytest.raises(RuntimeError, match="create_graph"):
        jm.backward(lambda: model(x).sum(), create_graph=True)


def test_a_wrong_input_size_names_the_layer_in_a_fused_sequential():
    model = _mlp(jm.nn)
    model(jnp.ones((2, 12)))
    for run in (
        lambda: model(jnp.ones((2, 11))),
        lambda: jm.backward(lambda: model(jnp.ones((2, 11))).sum()),
    ):
        with pytest.raises(RuntimeError, match=r"Linear\(in_features=12, out_features=16"):
            run()


@pytest.mark.torch
def test_a_library_module_that_reads_values_runs_eagerly():
    """nn.Embedding's max_norm renormalises on the host: it falls back to eager calls."""
    emb = nn.Sequential(nn.Embedding(10, 4, max_norm=1.0))
    idx = jnp.array([1, 2, 3])
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Embedding(10, 4, max_norm=1.0))
    emb.load_state_dict(ref.state_dict())
    for _ in range(2):
        out = emb(idx)
        tout = ref(torch.tensor(np.asarray(idx)))
        np.testing.assert_allclose(np.asarray(out), tout.detach().numpy(), rtol=1e-6)


def test_tape_values_kept_after_the_step_lower_to_arrays():
    m = nn.Linear(3, 2)
    kept = []
    jm.backward(lambda: kept.append(m(jnp.ones((1, 3)))) or kept[-1].sum())
    v = kept[0]
    assert isinstance(v, _tape.TapeTracer)
    np.testing.assert_allclose(np.asarray(v + 0), np.asarray(m(jnp.ones((1, 3)))), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.torch
def test_a_model_made_again_reuses_the_compiled_step():
    """Re-running the notebook cell that makes the model: no new trace, nothing compiled."""

    def body(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    step = jm.compile(body)
    xn, yn = _data((6, 12))
    x, y = jnp.asarray(xn), jnp.asarray(yn)
    net = type(_UserNet.build(jm.nn, branch=False))  # the cell defining the class, run once
    compiles = []
    for _ in range(3):  # the cell making the model, run three times
        model = net()
        twin = copy.deepcopy(model)
        opt = jm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with counting() as seen:
            for _ in range(2):
                float(step(model, opt, x, y))
        compiles.append(len(seen))
        # The reused program's optimizer has its state, as the eager twin's (visible
        # state is Python the trace ran once; the call replays it).
        twin_opt = jm.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            body(twin, twin_opt, x, y)
        got, want = opt.state_dict()["state"], twin_opt.state_dict()["state"]
        assert sorted(got) == sorted(want) == list(range(len(list(model.parameters()))))
        for i in want:
            np.testing.assert_allclose(
                np.asarray(got[i]["momentum_buffer"]),
                np.asarray(want[i]["momentum_buffer"]),
                rtol=1e-5,
                atol=1e-6,
            )
    assert compiles[0] > 0 and compiles[1:] == [0, 0], compiles
    assert jm.compile_stats(step).num_traces == 1, jm.compile_stats(step).reasons


@pytest.mark.slow
def test_a_new_optimizer_on_a_reused_program_gets_its_state():
    """Two optimizers of one structure in turn on the same model: each shows its state."""
    model = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.Tanh(), jm.nn.Linear(8, 3))
    twin = copy.deepcopy(model)
    step = jm.compile(_rprop_step)
    x, y = jnp.ones((6, 4)), jnp.zeros((6, 3))
    for kwargs in ({}, {"lr": 0.05, "etas": (0.3, 1.5)}):
        opt = jm.optim.Rprop(model.parameters(), **kwargs)
        twin_opt = jm.optim.Rprop(twin.parameters(), **kwargs)
        for _ in range(2):
            step(model, opt, x, y)
            _rprop_step(twin, twin_opt, x, y)
        got, want = opt.state_dict()["state"], twin_opt.state_dict()["state"]
        assert sorted(got) == sorted(want) == [0, 1, 2, 3]
        for i in want:
            for k in want[i]:
                np.testing.assert_allclose(np.asarray(got[i][k]), np.asarray(want[i][k]), 1e-5)


def _rprop_step(model, opt, x, y):
    opt.zero_grad()
    loss = jm.backward(lambda: ((model(x) - y) ** 2).mean())
    opt.step()
    return loss


@pytest.mark.torch
def test_a_changed_attribute_retraces_with_its_path_in_the_reason():
    model = _UserNet.build(jm.nn, branch=False)
    step = jm.compile(lambda m, x: m(x).sum())
    x = jnp.ones((6, 12))
    step(model, x)
    model.body[1].eps = 1e-3
    step(model, x)
    assert jm.compile_stats(step).reasons[-1] == "attribute 'body.1.eps' changed (1e-05 -> 0.001)"
    opt = jm.optim.SGD(model.parameters(), lr=0.1)
    both = jm.compile(lambda m, o, x: m(x).sum())
    both(model, opt, x)
    model.skip.scale = 2
    both(model, opt, x)
    assert jm.compile_stats(both).reasons[-1] == "attribute 'skip.scale' of argument 0 was added"


def test_a_class_defined_again_with_another_forward_is_traced_again():
    step = jm.compile(lambda m, x: m(x))
    x = jnp.ones((2, 3))
    outs = []
    for scale in (1.0, 3.0):  # the cell defining the class, edited and run again
        ns = {"nn": nn}
        exec(
            f"class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.fc = nn.Linear(3, 2)\n    def forward(self, x):\n"
            f"        return self.fc(x) * {scale}\n",
            ns,
        )
        jm.manual_seed(0)
        outs.append(np.asarray(step(ns["Net"](), x)))
    np.testing.assert_allclose(outs[1], 3 * outs[0], rtol=1e-6)
    assert jm.compile_stats(step).num_traces == 2


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_a_new_model_and_optimizer_like_earlier_ones_trace_and_compile_nothing_eagerly(
    optimizer,
):
    """The notebook cell making model and optimizer, run again, then trained eagerly:
    the library's programs are keyed by structure, shapes and dtypes, not by object."""
    xn, yn = _data((6, 12))
    x, y = jnp.asarray(xn), jnp.asarray(yn)
    kwargs = {"momentum": 0.9} if optimizer == "SGD" else {}
    for run in range(2):
        model = _bn(jm.nn, dropout=0.2)
        opt = getattr(jm.optim, optimizer)(model.parameters(), lr=0.1, **kwargs)
        with counting(TRACE) as traced, counting() as compiled:
            for _ in range(3):
                opt.zero_grad()
                float(jm.backward(lambda: F.cross_entropy(model(x), y)))
                opt.step()
            model.eval()
            model(x).block_until_ready()
        if run == 0:
            assert traced and compiled
        else:
            assert (traced, compiled) == ([], []), (traced, compiled)


def test_shared_eager_programs_keep_no_model_or_optimizer_alive():
    import gc
    import weakref

    xn, yn = _data((6, 12))
    x, y = jnp.asarray(xn), jnp.asarray(yn)

    def train():
        model = _bn(jm.nn, dropout=0.2)
        opt = jm.optim.Adam(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            jm.backward(lambda: F.cross_entropy(model(x), y))
            opt.step()
        return [weakref.ref(model), weakref.ref(opt), weakref.ref(model[0].weight)]

    refs = train()
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
