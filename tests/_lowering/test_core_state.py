"""The core around owned state: frozen parameters, scoped invalidation, threads, reads.

Issue 13: fine-tuning (frozen parameters) under compile, against torch live;
a compiled model re-describes itself only when its own tree changed; gradient
tracking is per thread and compiled calls lock only what they touch; and
``jm.backward`` differentiates what its closure read, however it got there.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import backward as bw
from jmodule import nn, optim
from jmodule._lowering import state

RTOL, ATOL = 1e-4, 1e-5
STEPS = 10


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


# ---------------------------------------------------------------------------- frozen parameters


def _torch_net(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    # tanh, not ReLU: float32 trajectories stay comparable over ten steps
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
        torch.nn.Linear(8, 3),
    )  # fmt: skip


def _pair(seed: int = 0):
    tm = _torch_net(seed)
    jmod = nn.Sequential(
        nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)
    )  # fmt: skip
    jmod.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    return tm, jmod


def _batches(seed: int = 1):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return [
        (rng.standard_normal((6, 4)).astype(f32), rng.standard_normal((6, 3)).astype(f32))
        for _ in range(STEPS)
    ]


def _freeze(model, how: str) -> None:
    """Freeze the backbone (the first two Linear layers)."""
    if how == "module":
        model[0].requires_grad_(False)
        model[2].requires_grad_(False)
    else:
        for layer in (model[0], model[2]):
            for p in layer.parameters():
                p.requires_grad_(False)


OPTIMIZERS = {
    "SGD": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
    "Adam": {"lr": 0.02},
    "AdamW": {"lr": 0.02, "weight_decay": 0.05},
}


def _jm_step():
    @jm.compile
    def step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.mse_loss(model(x), y))
        opt.step()
        return loss

    return step


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("given", ["all", "trainable"])
@pytest.mark.parametrize("how", ["module", "parameter"])
def test_frozen_backbone_trains_its_head_like_torch(opt_name, compiled, given, how):
    tm, jmod = _pair()
    for layer in (tm[0], tm[2]):
        layer.requires_grad_(False)
    _freeze(jmod, how)
    kwargs = OPTIMIZERS[opt_name]
    pick = (lambda m: m.parameters()) if given == "all" else (
        lambda m: [p for p in m.parameters() if p.requires_grad]
    )  # fmt: skip
    topt = getattr(torch.optim, opt_name)(pick(tm), **kwargs)
    jopt = getattr(optim, opt_name)(pick(jmod), **kwargs)
    step = _jm_step()
    frozen_before = [
        np.asarray(p.data).copy() for p in (*jmod[0].parameters(), *jmod[2].parameters())
    ]
    for x, y in _batches():
        topt.zero_grad()
        tloss = torch.nn.functional.mse_loss(tm(torch.from_numpy(x)), torch.from_numpy(y))
        tloss.backward()
        topt.step()
        if compiled:
            jloss = step(jmod, jopt, jnp.asarray(x), jnp.asarray(y))
        else:
            jopt.zero_grad()
            jloss = jm.backward(lambda: F.mse_loss(jmod(jnp.asarray(x)), jnp.asarray(y)))
            jopt.step()
        np.testing.assert_allclose(float(jloss), float(tloss.detach()), rtol=RTOL)
    for (name, t), j in zip(tm.named_parameters(), jmod.parameters()):
        np.testing.assert_allclose(np.asarray(j.data), _np(t), rtol=RTOL, atol=ATOL, err_msg=name)
        assert (j.grad is None) == (t.grad is None), name
    frozen_after = [np.asarray(p.data) for p in (*jmod[0].parameters(), *jmod[2].parameters())]
    for a, b in zip(frozen_before, frozen_after):
        assert np.array_equal(a, b)
    if compiled:
        assert step.num_traces == 1


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_freezing_and_unfreezing_between_compiled_steps_recompiles_once_each(opt_name, caplog):
    tm, jmod = _pair(seed=3)
    kwargs = OPTIMIZERS[opt_name]
    topt = getattr(torch.optim, opt_name)(tm.parameters(), **kwargs)
    jopt = getattr(optim, opt_name)(jmod.parameters(), **kwargs)
    step = _jm_step()
    caplog.set_level(logging.INFO, logger="jmodule.compile")
    for i, (x, y) in enumerate(_batches(seed=4)):
        if i == 3:  # freeze the backbone after the first compiled calls
            for layer in (tm[0], tm[2]):
                layer.requires_grad_(False)
            _freeze(jmod, "module")
        if i == 7:  # and thaw it again
            for layer in (tm[0], tm[2]):
                layer.requires_grad_(True)
            jmod.requires_grad_(True)
        topt.zero_grad()
        torch.nn.functional.mse_loss(tm(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        topt.step()
        step(jmod, jopt, jnp.asarray(x), jnp.asarray(y))
    for (name, t), j in zip(tm.named_parameters(), jmod.parameters()):
        np.testing.assert_allclose(np.asarray(j.data), _np(t), rtol=RTOL, atol=ATOL, err_msg=name)
    # One compile per toggle at most, each for that reason (thawing may find the first
    # program again: SGD's state layout does not depend on which parameters train).
    reasons = jm.compile_stats(step).reasons
    assert reasons[0] == "first call" and 2 <= len(reasons) <= 3, reasons
    assert all(
        r == "requires_grad of parameter '0.weight' of argument 0 changed" for r in reasons[1:]
    )
    assert any(
        "requires_grad of parameter '0.weight' of argument 0 changed" in r.message
        for r in caplog.records
    )


def test_the_issue_examples_of_frozen_layers_under_compile():
    m = nn.Linear(4, 2)
    m.weight.requires_grad_(False)

    @jm.compile
    def fb(m, x):
        return jm.backward(lambda: m(x).sum())

    x = jnp.ones((3, 4))
    loss = fb(m, x)
    np.testing.assert_allclose(float(loss), float(m(x).sum()), rtol=1e-6)
    assert m.weight.grad is None
    np.testing.assert_allclose(np.asarray(m.bias.grad), np.full(2, 3.0))

    seq = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    seq[0].requires_grad_(False)
    eager = copy.deepcopy(seq)
    fb(seq, x)
    jm.backward(lambda: eager(x).sum())
    for (name, p), q in zip(seq.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            np.testing.assert_allclose(np.asarray(p.grad), np.asarray(q.grad), rtol=1e-6)


# ---------------------------------------------------------------------------- invalidation


def _deep():
    layers = []
    for _ in range(4):
        layers += [nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()]
    return nn.Sequential(*layers)


def test_unrelated_modules_do_not_make_a_compiled_model_describe_itself_again():
    model = _deep()
    model.compile()
    x = jnp.ones((4, 8))
    model(x)
    compiled = model._compiled
    plan = compiled._plan
    other = nn.Linear(3, 3)
    for _ in range(3):
        nn.MSELoss()  # built before each call, as PyTorch loops do
        other.weight.requires_grad_(False)
        other.scale = 2.0
        other.train(False)
        del other.scale
        model(x)
    assert compiled._plan is plan  # the same plan: nothing was described again
    assert jm.compile_stats(model).num_traces == 1
    # A change inside its own tree is seen: a child's plain attribute.
    model[0].extra = 1
    model(x)
    assert compiled._plan is not plan
    assert jm.compile_stats(model).reasons[-1] == "attribute '0.extra' was added"


def test_a_change_deep_inside_a_tree_reaches_every_compiled_root_holding_it():
    shared = nn.Linear(2, 2)
    a = nn.Sequential(nn.Sequential(shared))
    b = nn.Sequential(shared, nn.Tanh())
    for m in (a, b):
        m.compile()
    x = jnp.ones((1, 2))
    a(x), b(x)
    shared.register_forward_hook(lambda mod, args, out: out * 0)
    assert np.all(np.asarray(a(x)) == 0) and np.all(np.asarray(b(x)) == 0)
    assert jm.compile_stats(a).reasons[-1] == "forward hook added on '0.0'"
    assert jm.compile_stats(b).reasons[-1] == "forward hook added on '0'"


def test_jm_compile_reuses_its_plan_across_unrelated_changes():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    opt = optim.Adam(model.parameters(), lr=0.01)
    step = _jm_step()
    x, y = jnp.ones((4, 4)), jnp.zeros((4, 4))
    step(model, opt, x, y)
    plan = step._last.plan
    for _ in range(3):
        nn.Linear(4, 4)
        step(model, opt, x, y)
    assert step._last.plan is plan
    model[1].eval()  # its own tree: a new program
    step(model, opt, x, y)
    assert step._last.plan is not plan
    assert step.num_traces == 2


# ---------------------------------------------------------------------------- threads


def _loss(model, x):
    return (model(x) ** 2).mean()


@pytest.mark.slow
def test_backward_in_one_thread_is_unaffected_by_module_calls_in_another():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 4)), jnp.float32)
    a = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    reference = copy.deepcopy(a)
    other, compiled_other = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    compiled_other.compile()
    calls = 100
    for _ in range(calls):  # single-threaded reference: the same accumulation
        jm.backward(lambda: _loss(reference, x))
    errors: list[BaseException] = []
    done = threading.Event()

    def thread_a():
        try:
            for _ in range(calls):
                jm.backward(lambda: _loss(a, x))
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def thread_b():
        try:
            while not done.is_set():
                other(x)
                compiled_other(x)
                jm.backward(lambda: other(x).sum())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    for p, q in zip(a.parameters(), reference.parameters()):
        assert np.array_equal(np.asarray(p.grad), np.asarray(q.grad))


def test_a_compiled_call_does_not_wait_for_another_models_lock():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    for m in (a, b):
        m.compile()
    x = jnp.ones((1, 2))
    a(x), b(x)
    out = []
    with state.lock(a):  # as if a long call of ``a`` were running in another thread
        t = threading.Thread(target=lambda: out.append(b(x)))
        t.start()
        t.join(timeout=120)
        finished = not t.is_alive()
    t.join()
    assert finished and len(out) == 1
    np.testing.assert_allclose(np.asarray(out[0]), np.asarray(b(x)))


def test_threads_sharing_one_compiled_model_lose_no_update():
    model = nn.BatchNorm1d(3)
    model.compile()
    eager = copy.deepcopy(model)
    eager.__dict__["_compiled"] = None
    x = jnp.ones((4, 3))
    model(x), eager(x)
    n, per = 8, 10
    threads = [
        threading.Thread(target=lambda: [model(x) for _ in range(per)]) for _ in range(n)
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(n * per):
        eager(x)
    assert int(model.num_batches_tracked) == int(eager.num_batches_tracked) == n * per + 1
    np.testing.assert_allclose(np.asarray(model.running_var), np.asarray(eager.running_var))


# ---------------------------------------------------------------------------- what backward reads


@dataclasses.dataclass
class _Parts:
    encoder: nn.Module
    scale: nn.Parameter


class _Box:
    def __init__(self, inner):
        self.inner = inner


GLOBAL_NET = nn.Linear(3, 1)


@pytest.mark.slow
def test_backward_differentiates_whatever_the_closure_read():
    x = jnp.ones((2, 3))
    deep = nn.Linear(3, 1)
    nested = {"a": [{"b": ({"c": [_Box(_Box(deep))]},)}]}  # deeper than any scan would look
    parts = _Parts(nn.Linear(3, 3), nn.Parameter(jnp.full((), 2.0)))
    loose = nn.Parameter(jnp.ones((1,)))

    def loss():
        y = nested["a"][0]["b"][0]["c"][0].inner.inner(x)
        z = GLOBAL_NET(parts.encoder(x)) * parts.scale
        return (y * loose).sum() + z.sum()

    bw(loss)  # the renamed import
    for p in (deep.weight, deep.bias, GLOBAL_NET.weight, parts.encoder.weight, parts.scale, loose):
        assert p.grad is not None

    # the same gradients as plain JAX over the values
    def pure(vals):
        dw, db, gw, gb, ew, eb, s, lo = vals
        y = x @ dw.T + db
        z = ((x @ ew.T + eb) @ gw.T + gb) * s
        return (y * lo).sum() + z.sum()

    params = [deep.weight, deep.bias, GLOBAL_NET.weight, GLOBAL_NET.bias,
              parts.encoder.weight, parts.encoder.bias, parts.scale, loose]  # fmt: skip
    want = jax.grad(pure)([p.data for p in params])
    for p, g in zip(params, want):
        np.testing.assert_allclose(np.asarray(p.grad), np.asarray(g), rtol=1e-6)


def test_backward_inputs_limits_what_gets_gradients():
    a, b = nn.Linear(2, 1), nn.Linear(2, 1)
    x = jnp.ones((3, 2))
    jm.backward(lambda: (a(x) + b(x)).sum(), inputs=[a])
    assert a.weight.grad is not None and b.weight.grad is None
    jm.backward(lambda: (a(x) + b(x)).sum(), inputs=b.bias)
    assert b.bias.grad is not None and b.weight.grad is None
    with pytest.raises(TypeError, match="inputs"):
        jm.backward(lambda: a(x).sum(), inputs=[3])


def test_a_parameter_first_read_inside_a_scan_is_differentiated():
    lin = nn.Linear(3, 3)
    x = jnp.ones((4, 3))

    def loss():
        h, _ = jax.lax.scan(lambda c, xi: (jnp.tanh(lin(c) + xi), None), jnp.zeros(3), x)
        return h.sum()

    jm.backward(loss)

    def pure(w, b):
        h, _ = jax.lax.scan(lambda c, xi: (jnp.tanh(c @ w.T + b + xi), None), jnp.zeros(3), x)
        return h.sum()

    gw, gb = jax.grad(pure, argnums=(0, 1))(lin.weight.data, lin.bias.data)
    np.testing.assert_allclose(np.asarray(lin.weight.grad), np.asarray(gw), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(lin.bias.grad), np.asarray(gb), rtol=1e-5)
    assert not isinstance(lin.weight.data, jax.core.Tracer)


@pytest.mark.torch
def test_step_closure_kind_is_seen_while_it_runs_whatever_the_names():
    torch.manual_seed(0)
    tm = torch.nn.Linear(4, 2)
    jmod = nn.Linear(4, 2)
    jmod.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    jopt = optim.SGD(jmod.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x, y = (
        rng.standard_normal((6, 4)).astype(np.float32),
        rng.standard_normal((6, 2)).astype(np.float32),
    )
    calls = []

    def helper():  # PyTorch style, its backward hidden in a helper under another name
        calls.append(1)
        jopt.zero_grad()
        return bw(lambda: jnp.mean((jmod(jnp.asarray(x)) - jnp.asarray(y)) ** 2))

    def torch_closure():
        topt.zero_grad()
        loss = torch.nn.functional.mse_loss(tm(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        return loss

    for _ in range(3):
        tloss, jloss = topt.step(torch_closure), jopt.step(lambda: helper())
        np.testing.assert_allclose(float(jloss), float(tloss.detach()), rtol=1e-5)
    assert len(calls) == 3  # run once per step
    for t, j in zip(tm.parameters(), jmod.parameters()):
        np.testing.assert_allclose(np.asarray(j.data), _np(t), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(j.grad), _np(t.grad), rtol=1e-5, atol=1e-6)


def test_step_closure_computing_before_its_backward_gets_a_clear_error():
    model = nn.Linear(2, 2)
    opt = optim.SGD(model.parameters(), lr=0.1)
    x = jnp.ones((1, 2))

    def closure():
        h = model(x)  # read outside the differentiated function...
        return jm.backward(lambda: (model(x) * h).sum())  # ...and used inside it

    with pytest.raises(RuntimeError, match=r"before it called jm\.backward"):
        opt.step(closure)
    assert all(not isinstance(p.grad, jax.core.Tracer) for p in model.parameters())


# ---------------------------------------------------------------------------- packed gradients


def test_a_large_step_writes_its_small_gradients_unpacked(monkeypatch):
    # Packing saves per-output host time, which only a small step notices; in a
    # large one the gather costs more (ResNet-18: 1.10x plain JAX packed, 1.03x not).
    from jmodule._lowering import flat

    def run(total):
        monkeypatch.setattr(flat, "PACK_MAX_TOTAL", total)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        eager = copy.deepcopy(model)
        opt = optim.SGD(model.parameters(), lr=0.1)
        (x, y) = _batches()[0]
        _jm_step()(model, opt, jnp.asarray(x), jnp.asarray(y))
        jm.backward(lambda: F.mse_loss(eager(jnp.asarray(x)), jnp.asarray(y)))
        kinds = [type(p.__dict__["grad"]) for p in model.parameters()]  # before reading .grad
        for p, q in zip(model.parameters(), eager.parameters()):
            np.testing.assert_allclose(np.asarray(p.grad), np.asarray(q.grad), rtol=1e-6)
        return kinds

    total = sum(p.size for p in nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)).parameters())
    assert run(total) == [state.PackedGrad] * 4
    assert state.PackedGrad not in run(total - 1)


@pytest.mark.slow
def test_a_compiled_step_writes_small_gradients_packed_and_reads_give_them_back():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    eager = copy.deepcopy(model)
    opt, eager_opt = optim.SGD(model.parameters(), lr=0.1), optim.SGD(eager.parameters(), lr=0.1)
    step = _jm_step()
    (x, y), (x2, y2) = _batches()[:2]
    step(model, opt, jnp.asarray(x), jnp.asarray(y))
    eager_opt.zero_grad()
    jm.backward(lambda: F.mse_loss(eager(jnp.asarray(x)), jnp.asarray(y)))
    eager_opt.step()
    # one output array for all four gradients, sliced out when read
    held = [p.__dict__["grad"] for p in model.parameters()]
    assert all(type(g) is state.PackedGrad for g in held)
    assert len({id(g.flat) for g in held}) == 1
    for p, q in zip(model.parameters(), eager.parameters()):
        assert p.grad is p.grad  # read once, kept
        np.testing.assert_allclose(np.asarray(p.grad), np.asarray(q.grad), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(p.data), np.asarray(q.data), rtol=1e-6)

    # a compiled function that reads the packed gradients (accumulation) gets their values
    @jm.compile
    def accumulate(model, x, y):
        return jm.backward(lambda: F.mse_loss(model(x), y))

    step(model, opt, jnp.asarray(x2), jnp.asarray(y2))
    held = [p.__dict__["grad"] for p in model.parameters()]
    assert all(type(g) is state.PackedGrad for g in held)
    left = [np.asarray(g.materialize()) for g in held]  # the values, leaving them packed
    accumulate(model, jnp.asarray(x), jnp.asarray(y))

    def loss(ps):
        return F.mse_loss(jm.func.functional_call(model, ps, (jnp.asarray(x),)), jnp.asarray(y))

    new = jax.grad(loss)({n: p.data for n, p in model.named_parameters()})
    for (n, p), g in zip(model.named_parameters(), left):
        np.testing.assert_allclose(np.asarray(p.grad), g + np.asarray(new[n]), rtol=1e-5, atol=1e-7)
    model.zero_grad(set_to_none=False)
    assert all(np.all(np.asarray(p.grad) == 0) for p in model.parameters())


@pytest.mark.torch
def test_functional_call_inside_backward_differentiates_through_the_values_given():
    # MAML-style: the loss reads fast weights computed from the parameters, through
    # functional_call; the gradient reaches the parameters through them, as in torch.
    from torch.func import functional_call as torch_functional_call

    m, tm = nn.Linear(3, 1), torch.nn.Linear(3, 1)
    tm.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in m.state_dict().items()})
    x = jnp.ones((4, 3))

    def loss():
        fast = {n: p * 0.9 for n, p in m.named_parameters()}
        return (jm.func.functional_call(m, fast, (x,)) ** 2).sum()

    jm.backward(loss)
    fast = {n: p * 0.9 for n, p in tm.named_parameters()}
    (torch_functional_call(tm, fast, (torch.ones(4, 3),)) ** 2).sum().backward()
    for (n, p), q in zip(m.named_parameters(), tm.parameters()):
        np.testing.assert_allclose(np.asarray(p.grad), _np(q.grad), rtol=1e-5, err_msg=n)


def test_functional_call_inside_backward_does_not_differentiate_the_replaced_parameters():
    m = nn.Linear(3, 1)
    values = {n: jnp.ones_like(p.data) for n, p in m.named_parameters()}  # not the parameters
    jm.backward(lambda: jm.func.functional_call(m, values, (jnp.ones((2, 3)),)).sum())
    assert m.weight.grad is None and m.bias.grad is None  # torch: they took no part


def test_tree_slots_enumerates_once_and_names_every_alias_in_one_walk():
    """Each slot once (a shared block, a tied weight), every dotted name of
    ``named_parameters``/``named_buffers(remove_duplicate=False)`` in the aliases, and
    the buffers registered as None listed only when asked for, after the gradients."""
    block = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    root = nn.Module()
    root.a, root.b = block, block  # one block under two names
    root.head = nn.Linear(3, 3)
    root.tail = nn.Linear(3, 3)
    root.tail.weight = root.head.weight  # tied
    root.register_buffer("mask", None)
    tree = state.tree_slots(root, grads=True, nones=True, aliases=True)
    ids = [(id(c), k) for c, k in tree.slots]
    assert len(ids) == len(set(ids))
    assert [n for n, _ in root.named_parameters()] == [
        n for n, k in zip(tree.names, tree.kinds) if k == "param"
    ]
    every = dict(root.named_parameters(remove_duplicate=False))
    every.update(root.named_buffers(remove_duplicate=False))
    assert set(tree.aliases) == set(every)
    for name, (c, k) in tree.aliases.items():
        assert c[k] is (every[name].__dict__["_value"] if k == "_value" else every[name])
    assert tree.kinds[-1] == "none" and tree.names[-1] == "mask"
    assert tree.kinds.count("grad") == len(tree.params)
    assert "none" not in state.tree_slots(root).kinds


class _Masked(nn.Module):
    """No parameters; a buffer registered as None, used when given a value."""

    def __init__(self, fill: bool):
        super().__init__()
        self.register_buffer("mask", None)
        self.fill = fill

    def forward(self, x):
        if self.mask is None and self.fill:
            self.mask = jnp.tril(jnp.ones((x.shape[-1], x.shape[-1])))
        return x * 2 if self.mask is None else x @ self.mask


def test_a_tree_without_parameters_keeps_its_none_buffers_out_of_its_state():
    """A None buffer is a slot of a compiled plan only: not state to export or place,
    also when the tree has no parameters (so no gradient slots come between)."""
    import jmodule.jit  # noqa: F401  (jm.jit)
    from jmodule._lowering import structure

    x = jnp.arange(6.0).reshape(2, 3)
    desc = structure.describe(_Masked(fill=True))
    assert desc.slots == () and desc.grad_slots == () and desc.none_names == ("mask",)
    traced = jm.jit.trace(_Masked(fill=False), x)  # exports the state that has values
    np.testing.assert_allclose(np.asarray(traced(x)), 2 * np.asarray(x))
    assert dict(traced.state_dict()) == {}
    m = _Masked(fill=True)
    m.compile()
    expected = np.asarray(x) @ np.tril(np.ones((3, 3)))
    np.testing.assert_allclose(np.asarray(m(x)), expected)
    assert m.mask is not None  # the compiled call's write came back
    np.testing.assert_allclose(np.asarray(m(x)), expected)  # now ordinary state
    assert [n for n, _ in m.named_buffers()] == ["mask"]
