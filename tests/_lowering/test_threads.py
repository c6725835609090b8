"""Threads training their own models at once: no errors, and the results of a sequential run.

What is guaranteed (README, "Threads"): a compiled call, and an eager layer's
call, holds the locks of the objects it reads and writes; a call that draws
random numbers also holds the default generator's lock for the whole call, so
its draws are one contiguous piece of the generator's stream. So

- models that do not draw are bit-for-bit what a sequential run gives,
  whatever the interleaving (shared or separate ``jm.compile`` steps,
  compiled forwards, eager steps);
- models that draw from the shared default generator (dropout) each get
  a contiguous piece of the stream per call, the pieces in the order the calls
  took the lock: replaying the calls sequentially in that order gives the same
  models bit for bit, and the generator ends where a sequential run of the
  same calls ends.

Each variant runs 8 threads, 3 times.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule as jm
from jmodule import nn

THREADS, REPEATS, STEPS = 8, 3, 25


def _net(seed: int, dropout: bool = False) -> nn.Module:
    jm.manual_seed(seed)
    layers = [nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(0.3))
    return nn.Sequential(*layers, nn.Linear(16, 3))


def _step_fn(model, x, y):
    model.zero_grad()
    loss = jm.backward(lambda: ((model(x) - y) ** 2).mean())
    for p in model.parameters():
        p.data = p.data - 0.05 * p.grad
    return loss


def _keyed_step_fn(model, x, y):
    # The call's first draw: which piece of the generator's stream the call took.
    first = jm.random.next_key()
    return _step_fn(model, x, y), first


def _in_threads(work: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _state(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in model.state_dict().items()}


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


X, Y = jnp.ones((16, 6)), jnp.zeros((16, 3))


def _inputs(i: int) -> tuple[jax.Array, jax.Array]:
    return X * (i + 1) * 0.1, Y + i * 0.01


@pytest.mark.parametrize("shared", [True, False], ids=["one step", "a step each"])
def test_compiled_steps_in_threads_equal_a_sequential_run(shared):
    shared_step = jm.compile(_step_fn)
    for _ in range(REPEATS):
        models = [_net(i) for i in range(THREADS)]
        steps = [shared_step if shared else jm.compile(_step_fn) for _ in range(THREADS)]

        def work(i: int, models=models, steps=steps) -> None:
            for _ in range(STEPS):
                steps[i](models[i], *_inputs(i))

        assert _in_threads(work) == []
        reference = jm.compile(_step_fn)
        for i in range(THREADS):
            alone = _net(i)
            for _ in range(STEPS):
                reference(alone, *_inputs(i))
            _assert_same(models[i], alone)


@pytest.mark.slow
def test_compiled_dropout_steps_sharing_the_generator_replay_in_the_order_they_drew():
    step = jm.compile(_keyed_step_fn)
    for repeat in range(REPEATS):
        models = [_net(i, dropout=True) for i in range(THREADS)]
        jm.manual_seed(1000 + repeat)
        taken: list[list[np.ndarray]] = [[] for _ in range(THREADS)]

        def work(i: int, models=models, taken=taken) -> None:
            for _ in range(STEPS):
                _, first = step(models[i], *_inputs(i))
                taken[i].append(np.asarray(first))

        assert _in_threads(work) == []
        end = np.asarray(jm.random.default_generator.get_state())
        # The order the calls drew in, read off the keys they took.
        calls = [(first.tobytes(), i) for i in range(THREADS) for first in taken[i]]
        assert len({k for k, _ in calls}) == THREADS * STEPS  # no piece of the stream twice
        replay = [_net(i, dropout=True) for i in range(THREADS)]
        jm.manual_seed(1000 + repeat)
        by_key = dict(calls)
        sequential = jm.compile(_keyed_step_fn)
        for _ in range(THREADS * STEPS):
            probe = np.asarray(jm.random.default_generator.get_state())
            following = np.asarray(jax.random.split(probe)[1])
            i = by_key[following.tobytes()]
            sequential(replay[i], *_inputs(i))
        np.testing.assert_array_equal(np.asarray(jm.random.default_generator.get_state()), end)
        for i in range(THREADS):
            _assert_same(models[i], replay[i])


@pytest.mark.slow
@pytest.mark.parametrize("dropout", [False, True], ids=["batch norm", "dropout"])
def test_one_compiled_forward_shared_by_threads_equals_a_sequential_run(dropout):
    for repeat in range(REPEATS):
        model = _net(0, dropout=dropout)
        reference = _net(0, dropout=dropout)
        model.compile()
        reference.compile()
        jm.manual_seed(repeat)

        def work(i: int, model=model) -> None:
            for _ in range(STEPS):
                model(X)

        assert _in_threads(work) == []
        end = np.asarray(jm.random.default_generator.get_state())
        jm.manual_seed(repeat)
        for _ in range(THREADS * STEPS):
            reference(X)
        # The same input each call: the running statistics do not depend on the order.
        _assert_same(model, reference)
        np.testing.assert_array_equal(np.asarray(jm.random.default_generator.get_state()), end)
        assert int(model[1].num_batches_tracked) == THREADS * STEPS


@pytest.mark.slow
def test_compiled_forwards_of_separate_models_in_threads_equal_a_sequential_run():
    for _ in range(REPEATS):
        models = [_net(i) for i in range(THREADS)]
        for m in models:
            m.compile()
        outs: list[list[np.ndarray]] = [[] for _ in range(THREADS)]

        def work(i: int, models=models, outs=outs) -> None:
            for _ in range(STEPS):
                outs[i].append(np.asarray(models[i](_inputs(i)[0])))

        assert _in_threads(work) == []
        for i in range(THREADS):
            alone = _net(i)
            alone.compile()
            for out in outs[i]:
                np.testing.assert_array_equal(out, np.asarray(alone(_inputs(i)[0])))
            _assert_same(models[i], alone)


@pytest.mark.slow
@pytest.mark.parametrize("dropout", [False, True], ids=["batch norm", "dropout"])
def test_eager_training_in_threads(dropout):
    def train(model: nn.Module, i: int) -> None:
        opt = jm.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = _inputs(i)
        for _ in range(STEPS):
            opt.zero_grad()
            jm.backward(lambda: ((model(x) - y) ** 2).mean())
            opt.step()

    for repeat in range(REPEATS):
        models = [_net(i, dropout=dropout) for i in range(THREADS)]
        jm.manual_seed(repeat)
        assert _in_threads(lambda i, models=models: train(models[i], i)) == []
        for m in models:
            assert all(np.isfinite(v).all() for v in _state(m).values())
        if dropout:
            # Draws interleave; the stream advanced by exactly the calls' draws, as if
            # the models had trained one after the other.
            end = np.asarray(jm.random.default_generator.get_state())
            alone = [_net(i, dropout=True) for i in range(THREADS)]
            jm.manual_seed(repeat)
            for i in range(THREADS):
                train(alone[i], i)
            sequential_end = np.asarray(jm.random.default_generator.get_state())
            np.testing.assert_array_equal(end, sequential_end)
            continue
        for i in range(THREADS):
            alone = _net(i)
            train(alone, i)
            _assert_same(models[i], alone)


# ------------------------------------------------- a program that did not draw starts drawing
# A program known not to draw runs without the generator's lock and leaves the generator
# out; when a new trace of it draws, the call puts the generator back and draws from the
# stream, as an eager run does.


def _drop_model() -> nn.Module:
    jm.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))


@pytest.mark.slow
@pytest.mark.parametrize("inner", ["eager", "compiled"])
def test_a_retrace_that_starts_drawing_draws_from_the_stream(inner):
    model = _drop_model()
    if inner == "compiled":
        model.compile()

    @jm.compile
    def f(m, x):
        if x.shape[0] > 2:  # draws for this shape only
            return m(x)
        return m[0](x)

    small, large = jnp.ones((2, 4)), jnp.ones((3, 4))
    for _ in range(2):
        f(model, small)  # settled: a program that does not draw
    jm.manual_seed(5)
    out = f(model, large)
    after = np.asarray(jm.random.default_generator.get_state())
    reference = _drop_model()
    jm.manual_seed(5)
    expected = reference(large)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6)
    np.testing.assert_array_equal(after, np.asarray(jm.random.default_generator.get_state()))
    # And the next call draws fresh numbers again.
    again = f(model, large)
    assert not np.array_equal(np.asarray(again), np.asarray(out))


_DRAW = False


def test_a_changed_global_that_makes_a_step_draw_draws_from_the_stream():
    model = _drop_model()

    @jm.compile
    def f(m, x):
        return m(x) if _DRAW else m[0](x)

    x = jnp.ones((3, 4))
    f(model, x)
    f(model, x)
    global _DRAW
    _DRAW = True
    try:
        jm.manual_seed(7)
        out = f(model, x)
    finally:
        _DRAW = False
    reference = _drop_model()
    jm.manual_seed(7)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference(x)), rtol=1e-6)


def test_a_step_reading_the_generator_state_is_not_left_out():
    @jm.compile
    def state_of(m, x):
        return m(x), jm.random.default_generator.get_state()

    model = nn.Linear(4, 4)
    x = jnp.ones((2, 4))
    for seed in (1, 2, 3):
        jm.manual_seed(seed)
        _, key = state_of(model, x)
        np.testing.assert_array_equal(np.asarray(key), np.asarray(jax.random.PRNGKey(seed)))


def test_eager_draws_in_threads_take_distinct_keys():
    # Unfused eager draws (a user's own forward): each takes its own piece of the stream.
    jm.manual_seed(11)
    drawn: list[list[bytes]] = [[] for _ in range(THREADS)]

    def work(i: int) -> None:
        for _ in range(50):
            drawn[i].append(np.asarray(jm.random.next_key()).tobytes())

    assert _in_threads(work) == []
    keys = [k for d in drawn for k in d]
    assert len(set(keys)) == len(keys) == THREADS * 50
    jm.manual_seed(11)
    assert set(keys) == {np.asarray(jm.random.next_key()).tobytes() for _ in range(THREADS * 50)}
