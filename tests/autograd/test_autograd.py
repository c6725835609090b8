"""jm.backward, jm.grad, jm.value_and_grad and backward hooks, against PyTorch live."""

import copy
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import nn


def _pair(seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Sequential(
        torch.nn.Linear(3, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 2)
    )
    ours = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _data(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3)).astype(np.float32)


def _assert_grads_equal(ref, ours, rtol=1e-5, atol=1e-6):
    for (name, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
        if p.grad is None:
            assert q.grad is None, name
        else:
            np.testing.assert_allclose(np.asarray(q.grad), p.grad.numpy(), rtol, atol, err_msg=name)


@pytest.mark.torch
def test_backward_matches_pytorch_and_accumulates():
    ref, ours = _pair()
    x = _data()
    for _ in range(2):  # a second backward without zero_grad adds, as in PyTorch
        t_loss = (ref(torch.from_numpy(x)) ** 2).mean()
        t_loss.backward()
        loss = jm.backward(lambda: (ours(jnp.asarray(x)) ** 2).mean())
        np.testing.assert_allclose(float(loss), t_loss.item(), rtol=1e-6)
        _assert_grads_equal(ref, ours)
    np.testing.assert_allclose(
        np.asarray(ours[1].running_mean), ref[1].running_mean.numpy(), rtol=1e-5, atol=1e-7
    )
    assert int(ours[1].num_batches_tracked) == int(ref[1].num_batches_tracked) == 2


@pytest.mark.torch
@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_then_backward(set_to_none):
    ref, ours = _pair()
    x = _data()
    for model, run in (
        (ref, lambda: ref(torch.from_numpy(x)).sum().backward()),
        (ours, lambda: jm.backward(lambda: ours(jnp.asarray(x)).sum())),
    ):
        run()
        model.zero_grad(set_to_none=set_to_none)
    for (_, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
        if set_to_none:
            assert p.grad is None and q.grad is None
        else:
            np.testing.assert_array_equal(np.asarray(q.grad), p.grad.numpy())


@pytest.mark.torch
def test_frozen_and_unused_parameters_get_no_grad_like_pytorch():
    torch.manual_seed(0)
    t_body, t_used, t_unused = (torch.nn.Linear(3, 4), torch.nn.Linear(4, 1), torch.nn.Linear(4, 1))
    j_body, j_used, j_unused = nn.Linear(3, 4), nn.Linear(4, 1), nn.Linear(4, 1)
    for t, j in ((t_body, j_body), (t_used, j_used), (t_unused, j_unused)):
        j.load_state_dict(t.state_dict())
    t_body.bias.requires_grad = False
    j_body.bias.requires_grad = False
    x = _data()
    t_model = torch.nn.ModuleDict({"body": t_body, "used": t_used, "unused": t_unused})
    j_model = nn.ModuleDict({"body": j_body, "used": j_used, "unused": j_unused})
    t_model["used"](t_model["body"](torch.from_numpy(x))).sum().backward()
    jm.backward(lambda: j_model["used"](j_model["body"](jnp.asarray(x))).sum())
    _assert_grads_equal(t_model, j_model)
    assert j_body.bias.grad is None and j_unused.weight.grad is None
    assert j_used.weight.grad is not None


@pytest.mark.torch
def test_non_scalar_loss_raises_pytorch_error():
    model = nn.Linear(3, 2)
    with pytest.raises(RuntimeError) as theirs:
        torch.nn.Linear(3, 2)(torch.ones(4, 3)).backward()
    message = str(theirs.value)
    with pytest.raises(RuntimeError, match=message):
        jm.backward(lambda: model(jnp.ones((4, 3))))
    assert model.weight.grad is None


def test_create_graph_is_refused():
    model = nn.Linear(2, 1)
    with pytest.raises(RuntimeError, match="create_graph"):
        jm.backward(lambda: model(jnp.ones((1, 2))).sum(), create_graph=True)


class _Holder:
    model = nn.Linear(2, 2)


class _Trainer:
    def __init__(self):
        self.nets = {"main": nn.Linear(2, 1)}

    def loss(self, x):
        return self.nets["main"](x).sum()


GLOBAL_MODEL = nn.Linear(2, 1)


def _global_loss(x):
    return GLOBAL_MODEL(x).sum()


def test_modules_are_found_through_closures_globals_methods_and_partials():
    x = jnp.ones((3, 2))
    trainer = _Trainer()
    jm.backward(lambda: trainer.loss(x))
    assert trainer.nets["main"].weight.grad is not None
    jm.backward(lambda: _global_loss(x))
    assert GLOBAL_MODEL.weight.grad is not None
    model = nn.Linear(2, 1)
    jm.backward(functools.partial(lambda m, v: m(v).sum(), model, x))
    assert model.bias.grad is not None


def test_a_module_reached_through_a_class_attribute_is_differentiated():
    # What the closure reads is what gets gradients: no scan of its variables
    # could have found this one, reading it is enough.
    x = jnp.ones((3, 2))
    other = nn.Linear(2, 2)
    jm.backward(lambda: (_Holder.model(x) + other(x)).sum(), inputs=[_Holder.model])
    assert _Holder.model.weight.grad is not None and other.weight.grad is None
    np.testing.assert_allclose(np.asarray(_Holder.model.bias.grad), np.full(2, 3.0))
    jm.backward(lambda: _Holder.model(x).sum())
    np.testing.assert_allclose(np.asarray(_Holder.model.bias.grad), np.full(2, 6.0))


@pytest.mark.torch
def test_grad_and_value_and_grad_keyed_like_state_dict():
    ref, ours = _pair()
    ref.eval()
    ours.eval()
    x = _data()
    t_x = torch.from_numpy(x).requires_grad_(True)
    (ref(t_x) ** 2).sum().backward()
    fn = lambda m, inp: (m(inp) ** 2).sum()
    value, grads = jm.value_and_grad(fn)(ours, jnp.asarray(x))
    assert list(grads) == [k for k, _ in ours.named_parameters()]
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(np.asarray(grads[name]), p.grad.numpy(), rtol=1e-5, atol=1e-6)
    _, g_x = jm.grad(fn, argnums=(0, 1))(ours, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(g_x), t_x.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in ours.parameters())  # .grad untouched
    (val, aux), _ = jm.value_and_grad(lambda m, i: (fn(m, i), "aux"), has_aux=True)(ours, x)
    np.testing.assert_allclose(float(val), float(value), rtol=1e-6)
    assert aux == "aux"


def _hooked_pair():
    ref, ours = _pair()
    logs = {"torch": [], "jm": []}
    for model, key in ((ref, "torch"), (ours, "jm")):
        log = logs[key]

        def pre(m, grad_output, log=log):
            log.append(("pre", [None if g is None else _np(g) for g in grad_output]))
            return tuple(g * 3 for g in grad_output)

        def first(m, grad_input, grad_output, log=log):
            log.append(("first", [None if g is None else _np(g) for g in grad_input]))
            return tuple(None if g is None else g * 0.5 for g in grad_input)

        def prepended(m, grad_input, grad_output, log=log):
            log.append(("prepended", [None if g is None else _np(g) for g in grad_input]))

        model[3].register_full_backward_pre_hook(pre)
        model[3].register_full_backward_hook(first)
        model[3].register_full_backward_hook(prepended, prepend=True)
        model[0].register_full_backward_hook(first)
    return ref, ours, logs


def _np(g):
    """Keep what a hook saw: torch tensors as numpy, jax values as they are."""
    return g.detach().numpy() if isinstance(g, torch.Tensor) else g


@pytest.mark.torch
def test_backward_hooks_order_values_and_replacement_match_pytorch():
    ref, ours, logs = _hooked_pair()
    x = _data()
    for run in (
        lambda: ref(torch.from_numpy(x)).sum().backward(),
        lambda: jm.backward(lambda: ours(jnp.asarray(x)).sum()),
    ):  # the first Linear's input needs no gradient: both warn and still call its hook
        with pytest.warns(UserWarning, match="Full backward hook is firing"):
            run()
    t_log = logs["torch"]
    assert [n for n, _ in logs["jm"]] == [n for n, _ in t_log]
    for (_, ours_g), (_, theirs_g) in zip(logs["jm"], t_log):
        for a, b in zip(ours_g, theirs_g):
            assert (a is None) == (b is None)
            if a is not None:
                assert isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
                # Behind the BatchNorm the input gradient nearly cancels (~1e-7 of terms
                # of order 1): float32 rounding, not the hooks, sets the last digits.
                np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)
    _assert_grads_equal(ref, ours, atol=1e-5)  # replacements flowed on to upstream parameters


@pytest.mark.torch
def test_backward_hooks_in_compiled_step_fire_at_trace_time_with_effect_every_call():
    _, ours, logs = _hooked_pair()
    eager = copy.deepcopy(ours)
    x = jnp.asarray(_data())

    @jm.compile
    def step(model, inp):
        model.zero_grad()
        return jm.backward(lambda: model(inp).sum())

    compiled_warnings = 0
    for _ in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step(ours, x)  # the hook's warning, like its other side effects, comes at trace time
        compiled_warnings += len(caught)
        eager.zero_grad()
        with pytest.warns(UserWarning, match="Full backward hook is firing"):
            jm.backward(lambda: eager(x).sum())
        for p, q in zip(ours.parameters(), eager.parameters()):
            np.testing.assert_allclose(np.asarray(p.grad), np.asarray(q.grad), rtol=1e-5, atol=1e-5)
    traces = jm.compile_stats(step).num_traces
    assert compiled_warnings == traces
    # Python side effects of hooks happen once per trace, not per call.
    assert len(logs["jm"]) == 4 * traces + 4 * 3


def test_deprecated_backward_hook_warns_and_cannot_mix_with_full_hooks():
    model = nn.Linear(2, 2)
    seen = []
    with pytest.warns(FutureWarning, match="register_full_backward_hook"):
        model.register_backward_hook(lambda m, gi, go: seen.append(len(gi)))
    with pytest.raises(RuntimeError, match="Cannot use both regular backward hooks"):
        model.register_full_backward_hook(lambda m, gi, go: None)
    x = jnp.ones((1, 2))
    scale = nn.Linear(2, 2)
    jm.backward(lambda: model(scale(x)).sum())
    assert seen == [1]


@pytest.mark.slow
@pytest.mark.torch
def test_compiled_training_step_matches_eager_and_donates_old_weights():
    _, model = _pair()
    model.append(nn.Dropout(0.3))
    eager = copy.deepcopy(model)
    x = jnp.asarray(_data())

    def step(m, inp, lr):
        m.zero_grad()
        loss = jm.backward(lambda: (m(inp) ** 2).mean())
        for p in m.parameters():
            p.data = p.data - lr * p.grad
        return loss

    compiled = jm.compile(step)
    jm.manual_seed(5)
    want = [float(step(eager, x, 0.1)) for _ in range(3)]
    jm.manual_seed(5)
    old_weight = model[0].weight.data
    with pytest.warns(jm.DonatedHeldWarning, match="'0.weight'"):  # said before deleting
        got = [float(compiled(model, x, 0.1)) for _ in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for (k, a), (_, b) in zip(model.state_dict().items(), eager.state_dict().items()):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=k)
    assert old_weight.is_deleted()  # donated to the compiled step, as documented
    # zero_grad() overwrites the grads unread, so the first call (grads None)
    # and later calls (grads set) run one program.
    assert jm.compile_stats(compiled).num_traces == 1

    kept = jm.compile(step, donate=False)
    before = model[0].weight.data
    kept(model, x, 0.1)
    assert not before.is_deleted()


@pytest.mark.torch
def test_compiled_gradient_accumulation_reads_the_old_grads():
    _, model = _pair()
    eager = copy.deepcopy(model)
    x = jnp.asarray(_data())

    def accumulate(m, inp):  # no zero_grad: gradients add up across calls, as in PyTorch
        return jm.backward(lambda: (m(inp) ** 2).mean())

    compiled = jm.compile(accumulate)
    for _ in range(3):
        compiled(model, x)
        accumulate(eager, x)
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_allclose(np.asarray(p.grad), np.asarray(q.grad), rtol=1e-5, atol=1e-6)
    stats = jm.compile_stats(compiled)
    assert stats.num_traces == 2 and "grad changed: None ->" in stats.reasons[1]


def test_jax_transform_of_a_module_with_grad_is_pure():
    model = nn.Linear(2, 1)
    params = {k: v for k, v in model.state_dict().items()}
    g = jax.grad(lambda p: jm.func.functional_call(model, p, (jnp.ones((4, 2)),)).sum())(params)
    np.testing.assert_allclose(np.asarray(g["bias"]), [4.0])
    assert model.weight.grad is None


def test_backward_in_a_compiled_function_over_a_global_parameter_raises_and_leaks_nothing():
    w = jm.nn.Parameter(jnp.ones(3))

    def f():
        return jm.backward(lambda: (w * w).sum())

    for wrap in (jm.compile, jax.jit):
        with pytest.raises(jm.TracerLeakError, match="outside its arguments"):
            wrap(f)()
        assert w.grad is None  # no tracer left behind
    f()  # eagerly it is fine
    np.testing.assert_allclose(w.grad, 2 * np.ones(3))
