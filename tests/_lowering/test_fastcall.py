"""The generated per-call path of a settled jm.compile'd step (``_lowering/fastcall.py``).

From a step's third call with the same objects, calls run a function written for
that plan. Each test runs it past that point and checks it against a step that
never takes it (``donate=False``: no donating fast path), or against what the
general path says and does.
"""

import threading
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import nn
from jmodule._lowering import compiled as _compiled

X = jnp.linspace(-1.0, 1.0, 24).reshape(6, 4)
Y = jnp.linspace(0.5, -0.5, 12).reshape(6, 2)


def _model(seed: int = 0) -> nn.Module:
    jm.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = jm.backward(lambda: F.mse_loss(model(x), y))
    opt.step()
    return loss


def _generated(step) -> bool:
    """Whether ``step``'s last match has its generated per-call function."""
    gen = step._gen
    return gen is not None and callable(gen[3]) and gen[3] is not _compiled._NO_FAST_CALL


def _pair():
    """A step that takes the generated path and a reference that never does, on equal models."""
    a, b = _model(), _model()
    b.load_state_dict({k: v.copy() for k, v in a.state_dict().items()})
    oa = jm.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    ob = jm.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    return (jm.compile(_step), a, oa), (jm.compile(_step, donate=False), b, ob)


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    for (k, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_allclose(va, vb, rtol=1e-6, atol=1e-7, err_msg=k)
    for (k, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_allclose(pa.grad, pb.grad, rtol=1e-6, atol=1e-7, err_msg=k)


def test_the_generated_path_trains_as_the_general_path_through_changes_between_steps():
    (fast, a, oa), (ref, b, ob) = _pair()
    for i in range(12):
        if i == 4:  # an option a scheduler changes
            for opt in (oa, ob):
                opt.param_groups[0]["lr"] = 0.02
        if i == 6:  # a weight assigned between steps (a new array in the slot)
            w = jnp.full((2, 8), 0.05)
            a[2].weight.data, b[2].weight.data = w, w.copy()
        if i == 8:  # a frozen parameter: a new structure, settled again
            a[0].bias.requires_grad_(False)
            b[0].bias.requires_grad_(False)
        la, lb = fast(a, oa, X, Y), ref(b, ob, X, Y)
        np.testing.assert_allclose(la, lb, rtol=1e-6, err_msg=f"step {i}")
        _assert_same(a, b)
        if i in (3, 5, 7, 11):
            assert _generated(fast), i
    assert not _generated(ref)


def test_a_hook_registered_after_steps_runs_on_the_next():
    (fast, a, oa), _ = _pair()
    for _ in range(4):
        fast(a, oa, X, Y)
    assert _generated(fast)
    seen = []
    handle = a[0].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    fast(a, oa, X, Y)
    assert seen == [(6, 8)]  # traced again with the hook; it ran
    handle.remove()
    fast(a, oa, X, Y)
    assert seen == [(6, 8)]


def test_holding_a_parameter_array_after_steps_still_warns_before_it_is_deleted():
    (fast, a, oa), _ = _pair()
    for _ in range(4):
        fast(a, oa, X, Y)
    assert _generated(fast)
    held = a[0].weight.data
    with pytest.warns(jm.DonatedHeldWarning, match="'0.weight'"):
        fast(a, oa, X, Y)
    with pytest.raises(RuntimeError, match="deleted"):
        held + 1


def test_alternating_two_models_makes_no_generated_path_and_trains_both():
    (fast, a, oa), (ref, b, ob) = _pair()
    c, d = _model(1), _model(1)
    oc = jm.optim.SGD(c.parameters(), lr=0.1, momentum=0.9)
    od = jm.optim.SGD(d.parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        fast(a, oa, X, Y)
        fast(c, oc, X, Y)
        assert not _generated(fast)
        ref(b, ob, X, Y)
        ref(d, od, X, Y)
    _assert_same(a, b)
    _assert_same(c, d)


def test_arguments_that_differ_from_the_match_take_the_general_path():
    (fast, a, oa), (ref, b, ob) = _pair()
    for _ in range(3):
        fast(a, oa, X, Y)
        ref(b, ob, X, Y)
    assert _generated(fast)
    x2, y2 = X[:3] * 2.0, Y[:3]  # another shape: another program
    np.testing.assert_allclose(fast(a, oa, x2, y2), ref(b, ob, x2, y2), rtol=1e-6)
    xn, yn = np.asarray(X), np.asarray(Y)  # NumPy arrays: not the match's jax arrays
    np.testing.assert_allclose(fast(a, oa, xn, yn), ref(b, ob, xn, yn), rtol=1e-6)
    np.testing.assert_allclose(fast(a, oa, X, Y), ref(b, ob, X, Y), rtol=1e-6)
    _assert_same(a, b)


def test_threads_sharing_a_generated_step_each_train_their_model():
    step = jm.compile(_step)
    pairs = [(_model(i), None) for i in range(3)]
    pairs = [(m, jm.optim.SGD(m.parameters(), lr=0.05)) for m, _ in pairs]
    refs = [(_model(i), None) for i in range(3)]
    refs = [(m, jm.optim.SGD(m.parameters(), lr=0.05)) for m, _ in refs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                step(*pairs[i], X * (i + 1), Y)
        except BaseException as e:  # reported below
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error", jm.DonatedHeldWarning)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    ref = jm.compile(_step, donate=False)
    for i, (m, opt) in enumerate(refs):
        for _ in range(20):
            ref(m, opt, X * (i + 1), Y)
        _assert_same(pairs[i][0], m)
