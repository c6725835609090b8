"""``loss.backward()`` on jm.Tensors: the eager graph, against PyTorch live.

Eagerly with grad mode on, a module called on a jm.Tensor and the Tensor
operations on what it returns record a graph (``recorder.in_graph``) that
``Tensor.backward`` walks; grad mode is thread-local and ``jm.no_grad`` turns it
off. Long trajectories are compared in float64.
"""

import gc
import threading
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
import jmodule.torch as jtorch
from jmodule._lowering import state
from jmodule._lowering.tape import TapeTracer


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _mlp(nn, bn=False):
    layers = [nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)]
    if bn:
        layers.insert(1, nn.BatchNorm1d(16))
    return nn.Sequential(*layers)


def _pair(bn=False, dtype="float64"):
    torch.manual_seed(0)
    ref = _mlp(torch.nn, bn).to(getattr(torch, dtype))
    ours = _mlp(jtorch.nn, bn).to(getattr(jtorch, dtype))
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    return ref, ours


def _batch(seed=0, n=8, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 5)).astype(dtype), rng.integers(0, 3, n)


def _grads_match(ref, ours, rtol=1e-12):
    """Every gradient, to ``rtol`` of the largest one (a bias before a batch norm has a
    gradient of zero, computed as rounding noise by both)."""
    named = list(zip(ref.named_parameters(), ours.named_parameters()))
    scale = max(float(p.grad.abs().max()) for (_, p), _ in named if p.grad is not None)
    for (name, p), (_, q) in named:
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            np.testing.assert_allclose(
                np.asarray(q.grad), p.grad.numpy(), rtol=rtol, atol=rtol * scale, err_msg=name
            )


def _loss(side, model, x, y):
    return side.nn.functional.cross_entropy(model(side.from_numpy(x)), side.from_numpy(y))


@pytest.mark.torch
def test_loss_backward_gradients_match_torch_float64(x64):
    ref, ours = _pair(bn=True)
    x, y = _batch()
    _loss(torch, ref, x, y).backward()
    loss = _loss(jtorch, ours, x, y)
    assert type(loss) is jm.Tensor and loss.requires_grad
    loss.backward()
    _grads_match(ref, ours)
    # the batch norm's running statistics moved as torch's did, and are arrays
    for k, v in ref.state_dict().items():
        got = ours.state_dict()[k]
        assert not isinstance(got, jax.core.Tracer), k
        np.testing.assert_allclose(np.asarray(got), v.numpy(), rtol=1e-12, err_msg=k)


@pytest.mark.torch
def test_gradients_accumulate_over_backward_calls_as_torch(x64):
    ref, ours = _pair()
    for seed in (1, 2):
        x, y = _batch(seed)
        _loss(torch, ref, x, y).backward()
        _loss(jtorch, ours, x, y).backward()
    _grads_match(ref, ours)
    ref.zero_grad()
    ours.zero_grad()
    assert all(p.grad is None for p in ours.parameters())


@pytest.mark.slow
@pytest.mark.torch
def test_tensor_operations_and_parameters_outside_modules_are_on_the_graph(x64):
    """What ported code does between the model and ``backward``: Tensor methods, jm
    functions, in-place updates, and a parameter used with a Tensor."""
    ref, ours = _pair()
    x, _ = _batch()

    def loss_of(side, model):
        out = model(side.from_numpy(x))
        out = out.view(2, 4, 3).transpose(1, 2).softmax(dim=-1)
        out = out.masked_fill(out > 0.5, 0.0)
        loss = (out * 2).sum() + side.sum(side.tanh(out))
        loss += (out.sum(dim=(0, 2)) * model[2].bias).sum()
        loss = loss + side.sum(side.ones(3, 5, dtype=side.float64) @ model[0].weight.t())
        return loss

    want, got = loss_of(torch, ref), loss_of(jtorch, ours)
    np.testing.assert_allclose(float(got), want.item(), rtol=1e-12)
    want.backward()
    got.backward()
    _grads_match(ref, ours)


@pytest.mark.torch
def test_sgd_training_loop_trajectory_matches_torch_float64(x64):
    """A tutorial's loop, line for line: zero_grad, forward, loss, backward, step."""
    ref, ours = _pair(bn=True)
    topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    jopt = jtorch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    for step in range(12):
        x, y = _batch(step)
        for side, model, opt in ((torch, ref, topt), (jtorch, ours, jopt)):
            opt.zero_grad()
            loss = _loss(side, model, x, y)
            loss.backward()
            opt.step()
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(
            np.asarray(ours.state_dict()[k]), v.numpy(), rtol=1e-10, atol=1e-12, err_msg=k
        )


@pytest.mark.torch
def test_second_backward_raises_as_torch_unless_retain_graph(x64):
    ref, ours = _pair()
    x, y = _batch()
    tloss, jloss = _loss(torch, ref, x, y), _loss(jtorch, ours, x, y)
    tloss.backward(retain_graph=True)
    jloss.backward(retain_graph=True)
    tloss.backward()
    jloss.backward()
    _grads_match(ref, ours)  # twice the gradient, both sides
    with pytest.raises(RuntimeError, match="backward through the graph a second time") as t:
        tloss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        jloss.backward()
    assert "retain_graph=True" in str(t.value)


@pytest.mark.torch
def test_backward_after_a_step_updated_a_saved_weight_raises_as_torch(x64):
    """A graph saves the weights its backward needs by reference (the last layer's, for the
    gradient of its input), as PyTorch's does. A donating compiled step that updates them
    is not warned about on the graph's account (nothing the user reads is deleted), and a
    backward through the graph afterwards raises, as PyTorch's does after its in-place
    optimizer step."""
    ref, ours = _pair()
    x, y = _batch()
    tloss, jloss = _loss(torch, ref, x, y), _loss(jtorch, ours, x, y)
    torch.optim.SGD(ref.parameters(), lr=0.1).step()  # no gradients yet: nothing moves
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(0.5)

    def step(m, inp, target):
        m.zero_grad()
        loss = jm.backward(lambda: jm.nn.functional.cross_entropy(m(inp), target))
        for p in m.parameters():
            p.data = p.data - 0.1 * p.grad
        return loss

    before = weakref.ref(ours[2].weight.data)  # not a reference the check counts
    with warnings.catch_warnings():
        warnings.simplefilter("error", jm.DonatedHeldWarning)
        for _ in range(2):
            jm.compile(step)(ours, jnp.asarray(x), jnp.asarray(y))
    assert before().is_deleted()  # donated: the weight the graph saved is gone
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tloss.backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as err:
        jloss.backward()
    assert "backward before the step" in str(err.value)


@pytest.mark.torch
def test_rnn_hidden_state_carried_needs_detach_as_in_torch(x64):
    """Truncated BPTT: carrying ``hidden`` on without ``detach`` raises in both on the
    second step; detached, the steps' gradients match torch's."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 4).double()
    ours = jtorch.nn.LSTM(3, 4).double()
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal((5, 2, 3)) for _ in range(3)]
    for detach in (False, True):
        for side, model in ((torch, ref), (jtorch, ours)):
            model.zero_grad()
            hidden = None
            for i, chunk in enumerate(chunks):
                if detach and hidden is not None:
                    hidden = tuple(h.detach() for h in hidden)
                out, hidden = model(side.from_numpy(chunk), hidden)
                if not detach and i == 1:
                    with pytest.raises(RuntimeError, match="a second time"):
                        out.sum().backward()
                    break
                out.sum().backward()
    _grads_match(ref, ours)


@pytest.mark.torch
def test_backward_with_gradient_and_inputs_as_torch(x64):
    ref, ours = _pair()
    x, _ = _batch()
    cot = np.random.default_rng(3).standard_normal((8, 3))
    tout, jout = ref(torch.from_numpy(x)), ours(jtorch.from_numpy(x))
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        jout.backward()
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        jout.backward(jtorch.ones(3))
    tout.backward(torch.from_numpy(cot), inputs=list(ref[2].parameters()))
    jout.backward(jtorch.from_numpy(cot), inputs=list(ours[2].parameters()))
    _grads_match(ref, ours)
    assert ours[0].weight.grad is None  # not among the inputs


def test_no_grad_records_nothing_and_grad_mode_is_per_thread():
    model = jtorch.nn.Linear(3, 2)
    x = jtorch.ones(4, 3)
    with jm.no_grad():
        out = model(x)
        assert not jm.is_grad_enabled()
        with jm.enable_grad():
            assert jm.is_grad_enabled() and model(x).requires_grad
        seen = []
        t = threading.Thread(target=lambda: seen.append(jm.is_grad_enabled()))
        t.start()
        t.join()
        assert seen == [True]  # another thread's mode is its own
    assert jm.is_grad_enabled()
    assert not out.requires_grad and type(out.array) is not TapeTracer
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()

    @jm.no_grad
    def bare():
        return model(x).requires_grad

    @jm.inference_mode()
    def called():
        return model(x).requires_grad

    assert not bare() and not called() and jm.is_grad_enabled()
    jm.set_grad_enabled(False)  # a plain call sets the mode, as torch's
    try:
        assert not model(x).requires_grad
    finally:
        jm.set_grad_enabled(True)
    with jm.set_grad_enabled(False):
        assert not jm.is_grad_enabled()
    assert jm.is_grad_enabled() and model(x).requires_grad


def test_values_of_the_graph_read_as_arrays_everywhere_else():
    model = jtorch.nn.Linear(3, 2)
    out = model(jtorch.ones(4, 3))
    assert out.requires_grad
    plain = jnp.tanh(out)  # jnp sees the values
    assert type(plain) is type(jnp.ones(1)) and plain.shape == (4, 2)
    assert np.asarray(out).shape == (4, 2) and out.numpy().shape == (4, 2)
    assert isinstance(float(out.sum()), float) and out.sum().item() == float(out.sum())
    assert "Tensor(" in repr(out) and out.device.type == "cpu"
    detached = out.detach()
    assert not detached.requires_grad and not out.data.requires_grad
    assert jax.jit(lambda t: t * 2)(out).shape == (4, 2)  # a compiled call gets the values
    np.testing.assert_allclose(np.asarray(jnp.arctanh(plain)), np.asarray(out.array), rtol=1e-5)


def test_plain_arrays_record_nothing():
    """A JAX user's arrays stay plain: only jm.Tensors record a graph."""
    model = jm.nn.Linear(3, 2)
    out = model(jnp.ones((4, 3)))
    assert type(out) is type(jnp.ones(1))
    assert not isinstance(out, jax.core.Tracer)


def test_loss_backward_inside_compiled_code_says_use_jm_backward():
    model = jtorch.nn.Linear(3, 1)

    @jm.compile
    def step(model, x):
        loss = model(x).sum()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match=r"jm\.backward"):
        step(model, jtorch.ones(2, 3))


@pytest.mark.slow
def test_graphs_nobody_holds_are_freed():
    """An eval loop without ``no_grad`` keeps nothing alive: the graph belongs to the
    values, not to the thread."""
    model = jtorch.nn.Sequential(jtorch.nn.Linear(8, 32), jtorch.nn.ReLU(), jtorch.nn.Linear(32, 2))
    x = jtorch.ones(16, 8)
    float(model(x).sum())
    gc.collect()
    before = len(jax.live_arrays())
    for _ in range(30):
        float(model(x).sum())
    gc.collect()
    assert len(jax.live_arrays()) <= before + 2
    assert not hasattr(state.local.graph, "nodes")


@pytest.mark.torch
def test_threads_train_their_own_models_with_loss_backward():
    ref, _ = _pair(dtype="float32")
    x, y = _batch(dtype=np.float32)
    _loss(torch, ref, x, y).backward()
    # the models are built here: torch's random generator is process-wide, so pairs
    # built in the threads would interleave its draws and start from other weights
    models = [_pair(dtype="float32")[1] for _ in range(3)]
    results, errors = {}, []

    def work(i):
        try:
            ours = models[i]
            for _ in range(3):
                ours.zero_grad()
                _loss(jtorch, ours, x, y).backward()
            results[i] = ours
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3
    for ours in results.values():
        _grads_match(ref, ours, rtol=1e-5)


@pytest.mark.torch
def test_hooks_fire_in_torch_order_during_loss_backward():
    def run(side):
        torch.manual_seed(0)
        m = side.nn.Sequential(side.nn.Linear(3, 4), side.nn.ReLU(), side.nn.Linear(4, 2))
        seen = []
        for i in (0, 2):
            m[i].register_full_backward_hook(
                lambda mod, gi, go, i=i: seen.append((i, [tuple(g.shape) for g in go]))
            )
            m[i].register_forward_hook(lambda mod, args, out, i=i: seen.append(("forward", i)))
        loss = m(side.ones(5, 3)).pow(2).sum()
        seen.append("loss")
        loss.backward()
        return seen

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both warn: no input requires grad
        assert run(jtorch) == run(torch)


@pytest.mark.slow
@pytest.mark.torch
def test_parameter_torch_methods_join_the_graph_and_operators_give_plain_arrays(x64):
    """A parameter joins the graph when a module called on a jm.Tensor reads it, when it
    meets a jm.Tensor, or through its torch methods (``p.pow(2).sum()``: torch's result
    has a grad_fn). Its operators alone give a plain jax.Array, as for JAX code, with no
    graph (the documented difference); under no_grad every result is a plain array."""
    ref, ours = _pair()
    penalty = sum(p.pow(2).sum() for p in ref.parameters())
    got = sum(p.pow(2).sum() for p in ours.parameters())
    assert type(got) is jm.Tensor and got.requires_grad
    np.testing.assert_allclose(float(got), penalty.item(), rtol=1e-12)
    penalty.backward()
    got.backward()
    _grads_match(ref, ours)
    w = ours[0].weight
    assert type((w * w).sum()) is type(jnp.ones(1))
    with jm.no_grad():
        assert type(w.pow(2)) is type(jnp.ones(1)) and type(w.t()) is type(jnp.ones(1))
    frozen = jtorch.nn.Parameter(jtorch.ones(2), requires_grad=False)
    assert type(frozen.pow(2)) is type(jnp.ones(1))
