"""model.compile() and jm.compile: lowering, state threading, recompilation."""

import copy
import functools
import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule as jm
from jmodule import nn
from jmodule._lowering.structure import stateful


def _mlp(p=0.5):
    return nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 3)
    )


def _x(n=8, d=6, seed=1):
    return jax.random.normal(jax.random.key(seed), (n, d))


def traces(model):
    return jm.compile_stats(model).num_traces


def test_compiled_calls_match_eager_calls_state_and_outputs():
    eager = _mlp()
    compiled = copy.deepcopy(eager)
    compiled.compile()
    x = _x()
    jm.manual_seed(7)
    eager_out = [eager(x) for _ in range(4)]
    jm.manual_seed(7)
    compiled_out = [compiled(x) for _ in range(4)]
    for a, b in zip(eager_out, compiled_out):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for (k, a), (_, b) in zip(eager.state_dict().items(), compiled.state_dict().items()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=k)
    assert int(compiled[1].num_batches_tracked) == 4
    assert traces(compiled) == 1


def test_fresh_dropout_masks_each_call_and_reseeded_run_repeats():
    model = nn.Dropout(0.5)
    model.compile()
    x = jnp.ones((64,))
    jm.manual_seed(3)
    first = [model(x) for _ in range(3)]
    assert not np.array_equal(first[0], first[1])
    assert not np.array_equal(first[1], first[2])
    jm.manual_seed(3)
    again = [model(x) for _ in range(3)]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert set(np.unique(first[0]).tolist()) <= {0.0, 2.0}


@pytest.mark.parametrize("how", ["model.compile()", "jm.compile", "jm.compile step"])
def test_each_manual_seed_gives_a_compiled_dropout_the_masks_eager_gets(how):
    # jm.manual_seed leaves the key to be made from the seed on first use: a compiled call
    # must make it from the seed set now, not from the seed its program was traced under.
    x = jnp.linspace(0.5, 1.5, 64).reshape(8, 8)
    eager, compiled = nn.Dropout(0.5), nn.Dropout(0.5)
    if how == "model.compile()":
        compiled.compile()
        run = compiled
    elif how == "jm.compile":
        run = functools.partial(jm.compile(lambda m, v: m(v)), compiled)
    else:
        net = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
        twin = copy.deepcopy(net)
        opt = jm.optim.SGD(net.parameters(), lr=0.1)
        topt = jm.optim.SGD(twin.parameters(), lr=0.1)

        @jm.compile
        def step(m, o, v):
            o.zero_grad()
            loss = jm.backward(lambda: m(v).sum())
            o.step()
            return loss

        for seed in (1, 2, 1, 3, 3, 4):
            jm.manual_seed(seed)
            got = step(net, opt, x)
            jm.manual_seed(seed)
            topt.zero_grad()
            want = jm.backward(lambda: twin(x).sum())
            topt.step()
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"seed {seed}")
        return
    for seed in (1, 2, 1, 3, 3, 4):
        jm.manual_seed(seed)
        want = eager(x)
        jm.manual_seed(seed)
        np.testing.assert_array_equal(run(x), want, err_msg=f"seed {seed}")


def test_eval_mode_compiled_uses_running_stats_and_does_not_update():
    model = _mlp()
    x = _x()
    for _ in range(3):
        model(x)
    model.eval()
    reference = model(x)
    before = {k: np.asarray(v) for k, v in model.state_dict().items()}
    model.compile()
    np.testing.assert_allclose(model(x), reference, rtol=1e-6, atol=1e-6)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_no_recompile_on_repeated_calls_and_reuse_after_mode_toggle():
    model = _mlp()
    model.compile()
    x = _x()
    for _ in range(5):
        model(x)
    assert traces(model) == 1
    model.eval()
    model(x)
    assert traces(model) == 2
    model.train()
    model(x)
    model.eval()
    model(x)
    assert traces(model) == 2  # both programs are cached
    model(_x(n=4))
    assert traces(model) == 3
    assert "input shape changed: input (8, 6) -> (4, 6)" in jm.compile_stats(model).reasons[-1]


def test_setting_training_attribute_directly_switches_the_compiled_program():
    model = _mlp(p=0.0)
    model.compile()
    x = _x()
    model(x)
    model.training = False
    for m in model.modules():
        m.training = False
    before = int(model[1].num_batches_tracked)
    model(x)
    assert int(model[1].num_batches_tracked) == before  # eval mode: statistics untouched
    assert "training mode changed" in jm.compile_stats(model).reasons[-1]


@pytest.mark.slow
def test_recompile_reasons_for_each_structural_change(caplog):
    model = _mlp()
    model.compile()
    x = _x()
    model(x)
    caplog.set_level("INFO", logger="jmodule.compile")

    handle = model[0].register_forward_hook(lambda m, a, out: out * 2)
    doubled = model(x)
    assert traces(model) == 2
    assert "forward hook added on '0'" in jm.compile_stats(model).reasons[-1]
    handle.remove()
    model(x)
    assert traces(model) == 2  # back to the first program, no retrace

    model[4].weight.requires_grad_(False)
    model(x)
    assert traces(model) == 3
    assert "requires_grad of parameter '4.weight' changed" in jm.compile_stats(model).reasons[-1]

    model[3].p = 0.0
    out = model(x)
    assert traces(model) == 4
    assert "attribute '3.p' changed (0.5 -> 0.0)" in jm.compile_stats(model).reasons[-1]
    eager = copy.deepcopy(model)
    eager.__dict__["_compiled"] = None
    # p=0 means no dropout: the compiled output no longer depends on the key.
    np.testing.assert_allclose(out, eager(x), rtol=1e-5, atol=1e-6)
    assert not np.allclose(doubled, out)

    model.append(nn.ReLU())
    model(x)
    assert traces(model) == 5
    assert "module '5' added" in jm.compile_stats(model).reasons[-1]

    model.to(jnp.bfloat16)
    model(x.astype(jnp.bfloat16))
    assert traces(model) == 6
    assert any("compiling forward of Sequential" in r.message for r in caplog.records)


def test_hook_side_effects_happen_at_trace_time_and_debug_callback_per_call():
    model = nn.Linear(3, 2)
    python_calls, device_calls = [], []

    def hook(module, args, out):
        python_calls.append(1)
        jax.debug.callback(lambda: device_calls.append(1))
        return out + 1

    model.register_forward_hook(hook)
    model.compile()
    x = jnp.ones((2, 3))
    outs = [model(x) for _ in range(4)]
    jax.effects_barrier()
    assert len(python_calls) == 1  # traced once
    assert len(device_calls) == 4  # jax.debug.callback runs on every call
    eager = copy.deepcopy(model)
    eager.__dict__["_compiled"] = None
    np.testing.assert_allclose(outs[-1], eager(x), rtol=1e-6)


class _Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.history = []

    def forward(self, x):
        y = self.fc(x)
        self.last = y
        return y


class _ListLeak(_Cache):
    def forward(self, x):
        y = self.fc(x)
        self.history.append(y)
        return y


@pytest.mark.parametrize("cls", [_Cache, _ListLeak])
def test_tracer_leak_raises_and_leaves_module_unchanged(cls):
    model = cls()
    before = {k: np.asarray(v) for k, v in model.state_dict().items()}
    model.compile()
    with pytest.raises(jm.TracerLeakError, match="register_buffer"):
        model(jnp.ones((1, 2)))
    assert not hasattr(model, "last")
    assert model.history == []
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    assert isinstance(model.fc.weight.data, jax.Array)
    # The module still works eagerly afterwards.
    model.__dict__["_compiled"] = None
    assert model.fc(jnp.ones((1, 2))).shape == (1, 2)


def test_a_value_held_before_the_trace_is_no_leak_and_a_new_one_is():
    """The leak check allows what the modules held when the trace began (an enclosing
    trace's values) and names a traced value stored during it, in attributes and lists."""
    from jmodule._lowering import binding

    m = nn.Linear(2, 2)
    m.history = []

    def outer(t):
        m.__dict__["scale"] = t  # an enclosing trace's value, there before the inner trace
        snap = binding.Snapshot(m)
        binding.check_and_restore([snap], [("", m)], True, set())
        for store, what in (
            (lambda: m.__dict__.__setitem__("other", t * 2), "attribute 'other'"),
            (lambda: m.history.append(t * 3), "attribute 'history'"),
        ):
            store()
            with pytest.raises(binding.TracerLeakError, match=what):
                binding.check_and_restore([snap], [("", m)], True, set())
            assert not hasattr(m, "other") and m.history == []  # restored
        del m.__dict__["scale"]
        return t

    jax.jit(outer)(jnp.ones(2))
    assert not hasattr(m, "scale")


def test_bare_jax_jit_around_stateful_module_is_refused_clearly():
    bn = nn.BatchNorm1d(3)
    with pytest.raises(jm.TracerLeakError, match=r"model\.compile"):
        jax.jit(lambda x: bn(x))(jnp.ones((4, 3)))
    assert isinstance(bn.running_mean, jax.Array)
    drop = nn.Dropout(0.5)
    with pytest.raises(RuntimeError, match=r"jm\.compile"):
        jax.jit(lambda x: drop(x))(jnp.ones((4, 3)))
    # The default generator was not corrupted.
    assert not isinstance(jm.random.default_generator._key, jax.core.Tracer)


def test_explicit_generator_inside_compiled_code_is_refused():
    gen = jm.Generator().manual_seed(1)

    @jm.compile
    def f(x):
        return x + jax.random.normal(gen.next_key(), x.shape)

    with pytest.raises(RuntimeError, match=r"explicit jm\.Generator"):
        f(jnp.ones(3))


def test_thread_safety_no_lost_buffer_updates():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    reference = copy.deepcopy(model)
    model.compile()
    x = _x(n=16, d=4)
    expected_out = copy.deepcopy(model)(x)  # train-mode output uses batch stats only
    results, errors = [], []

    def worker():
        try:
            for _ in range(200):
                results.append(model(x))
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert int(model[1].num_batches_tracked) == 1600
    for out in results[::97]:
        np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-6)
    reference.compile()
    for _ in range(1600):
        reference(x)
    np.testing.assert_allclose(
        model[1].running_mean, reference[1].running_mean, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(model[1].running_var, reference[1].running_var, rtol=1e-5)


def test_jm_compile_makes_in_place_changes_visible():
    model = _mlp(p=0.0)
    eager = copy.deepcopy(model)

    def step(m, x, shift):
        out = m(x)
        m[4].bias.data = m[4].bias.data + shift  # an in-place parameter change
        m[1].running_mean = m[1].running_mean * 0.5  # a buffer write outside forward
        return {"out": out, "sum": out.sum()}

    compiled = jm.compile(step)
    x = _x()
    for _ in range(3):
        got = compiled(model, x, 1.0)
        want = step(eager, x, 1.0)
        np.testing.assert_allclose(got["out"], want["out"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["sum"], want["sum"], rtol=1e-5, atol=1e-5)
    for (k, a), (_, b) in zip(model.state_dict().items(), eager.state_dict().items()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=k)
    del a, b  # holding the model's last array would make the next donating call copy it
    assert compiled.num_traces == 1
    compiled(model, x, 2.0)  # a new static value compiles once more
    assert compiled.num_traces == 2


def test_jm_compile_with_two_modules_and_a_stateful_protocol_object():
    class Counter:
        """A non-module stateful object taking part through ``_jm_describe``."""

        def __init__(self):
            self.state = {"count": jnp.zeros((), jnp.int32)}

        def _jm_describe(self):
            return stateful(("Counter", id(self)), [(self.state, "count")], ["count"])

    encoder, head, counter = nn.Linear(3, 4), nn.Linear(4, 2), Counter()

    @jm.compile
    def run(enc, hd, ctr, x):
        ctr.state["count"] = ctr.state["count"] + 1
        return hd(jax.nn.relu(enc(x)))

    x = jnp.ones((2, 3))
    for _ in range(3):
        out = run(encoder, head, counter, x)
    assert int(counter.state["count"]) == 3
    np.testing.assert_allclose(out, head(jax.nn.relu(encoder(x))), rtol=1e-6)
    assert run.num_traces == 1


def test_jm_compile_per_call_path_follows_which_objects_are_passed_where():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)

    @jm.compile
    def bump_first(m1, m2, x):
        m1.bias.data = m1.bias.data + 1.0  # state written goes to whichever came first
        return m2(m1(x))

    x = jnp.ones((2, 3))
    ea, eb = copy.deepcopy(a), copy.deepcopy(b)
    eager = {id(a): ea, id(b): eb}
    for first, second in [(a, b), (a, b), (b, a), (a, a), (a, b), (b, a), (b, b)]:
        got = bump_first(first, second, x)
        e1, e2 = eager[id(first)], eager[id(second)]
        e1.bias.data = e1.bias.data + 1.0
        np.testing.assert_allclose(got, e2(e1(x)), rtol=1e-6)
    for m, e in ((a, ea), (b, eb)):
        np.testing.assert_allclose(m.bias.data, e.bias.data, rtol=1e-6)


def test_jm_compile_sees_a_stateful_object_whose_description_changed():
    class Bag:
        def __init__(self):
            self.state = {"n": jnp.zeros(())}
            self.version = 0
            self._desc = None

        def _jm_describe(self):
            if self._desc is None or self._desc[0] != self.version:
                slots = [(self.state, k) for k in self.state]
                self._desc = (self.version, stateful(("Bag", len(slots)), slots, list(self.state)))
            return self._desc[1]

    bag, lin = Bag(), nn.Linear(2, 2)

    @jm.compile
    def run(m, bg, x):
        for k in bg.state:
            bg.state[k] = bg.state[k] + 1.0
        return m(x)

    x = jnp.ones((1, 2))
    run(lin, bag, x)
    run(lin, bag, x)
    bag.state["m"] = jnp.zeros(())  # a new entry: the next call must see it
    bag.version += 1
    run(lin, bag, x)
    assert float(bag.state["n"]) == 3.0 and float(bag.state["m"]) == 1.0


def test_module_used_by_closure_in_jm_compile_with_buffer_write_is_refused():
    bn = nn.BatchNorm1d(3)

    @jm.compile
    def f(x):
        return bn(x)

    with pytest.raises(jm.TracerLeakError, match="passed as an argument"):
        f(jnp.ones((4, 3)))
    assert isinstance(bn.running_mean, jax.Array)


def test_pytree_inputs_and_outputs_and_static_arguments():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, inputs, scale=1.0, mode="sum"):
            a = self.fc(inputs["a"]) * scale
            b = [v * 2 for v in inputs["b"]]
            return (a, {"b": b, "total": a.sum() if mode == "sum" else a.mean()})

    net = Net()
    eager = copy.deepcopy(net)
    net.compile()
    inputs = {"a": jnp.ones((2, 3)), "b": [jnp.ones(2), jnp.zeros(1)]}
    got = net(inputs, scale=3.0, mode="sum")
    want = eager(inputs, scale=3.0, mode="sum")
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6), got, want)
    net(inputs, scale=3.0, mode="sum")
    assert traces(net) == 1
    got = net(inputs, scale=3.0, mode="mean")
    assert traces(net) == 2
    assert "mode changed: 'sum' -> 'mean'" in jm.compile_stats(net).reasons[-1]
    np.testing.assert_allclose(got[1]["total"], eager(inputs, 3.0, "mean")[1]["total"], rtol=1e-6)


def test_unhashable_static_argument_error():
    model = nn.Identity()
    model.compile()

    class Unhashable:
        __hash__ = None

    with pytest.raises(TypeError, match="unhashable Unhashable"):
        model(Unhashable())


def test_compiled_submodule_inside_compiled_parent():
    inner = _mlp(p=0.0)
    inner.compile()
    outer = nn.Sequential(inner, nn.ReLU())
    reference = copy.deepcopy(outer)
    reference[0].__dict__["_compiled"] = None
    outer.compile()
    x = _x()
    for _ in range(2):
        np.testing.assert_allclose(outer(x), reference(x), rtol=1e-5, atol=1e-6)
    assert int(inner[1].num_batches_tracked) == 2


def test_compile_options():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="unsupported option"):
        model.compile(static_argnums=0)
    with pytest.raises(TypeError, match="dynamic=True"):
        model.compile(dynamic=True)
    with pytest.raises(TypeError, match="XLA"):
        model.compile(backend="eager")
    model.compile(fullgraph=True, mode="max-autotune", backend="inductor")
    assert model._compiled is not None
    model.compile(disable=True)
    assert model._compiled is None


def test_compiled_module_survives_deepcopy_and_pickle():
    model = _mlp(p=0.0)
    model.compile()
    x = _x()
    model(x)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone._compiled is not None and clone._compiled.module is clone
        out = clone(x)
        np.testing.assert_allclose(out, model(x), rtol=1e-5, atol=1e-6)
        assert int(clone[1].num_batches_tracked) == 2


def test_compiled_meta_module_raises_clear_error():
    with jm.device("meta"):
        model = nn.Linear(3, 2)
    model.compile()
    with pytest.raises(RuntimeError, match="to_empty"):
        model(jnp.ones((1, 3)))
