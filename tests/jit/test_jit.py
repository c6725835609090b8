"""jm.jit.ScriptModule: shared state, compiled calls, views, errors and debug options."""

import ast
import copy
import logging
import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule as jm
import jmodule.jit
from jmodule import nn
from jmodule._lowering.compiled import CompiledForward


def _mlp():
    return nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)
    )


def _x(n=8, d=6, seed=1):
    return jax.random.normal(jax.random.key(seed), (n, d))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x, scale=1.0):
        return self.fc2(jax.nn.relu(self.bn(self.fc1(x)))) * scale


# --------------------------------------------------------------------- sharing state


def test_script_module_is_a_module_sharing_the_originals_state():
    model = Net()
    sm = jm.jit.script(model)
    assert isinstance(sm, nn.Module) and isinstance(sm, jm.jit.ScriptModule)
    assert sm.module is model
    assert list(sm.state_dict()) == list(model.state_dict())
    assert [id(p) for p in sm.parameters()] == [id(p) for p in model.parameters()]
    assert [n for n, _ in sm.named_buffers()] == [n for n, _ in model.named_buffers()]
    assert sm.fc1 is model.fc1
    assert sm.original_name == "Net"
    assert "original_name=Net" in repr(sm) and "(fc1): Linear" in repr(sm)


def test_direct_construction_is_what_script_returns():
    model = Net()
    sm = jm.jit.ScriptModule(model)
    assert type(sm) is type(jm.jit.script(model)) is jm.jit.ScriptModule
    assert jm.jit.ScriptModule(sm).module is model  # wrapping twice wraps the original


def test_call_matches_eager_and_updates_shared_buffers():
    eager = _mlp()
    model = copy.deepcopy(eager)
    sm = jm.jit.script(model)
    x = _x()
    jm.manual_seed(4)
    want = [eager(x) for _ in range(3)]
    jm.manual_seed(4)
    got = [sm(x) for _ in range(3)]
    for a, b in zip(want, got):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert int(model[1].num_batches_tracked) == 3
    for k, v in eager.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    assert jm.compile_stats(sm).num_traces == 1


def test_call_uses_the_compiled_forward_fast_path():
    sm = jm.jit.script(_mlp())
    # The per-call object is model.compile()'s, not a wrapper around it.
    assert type(sm.__dict__["_compiled"]) is CompiledForward
    assert sm.__dict__["_compiled"].module is sm.module


def test_load_state_dict_to_and_mode_act_on_the_original():
    model = Net()
    sm = jm.jit.script(model)
    other = Net()
    result = sm.load_state_dict(other.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    np.testing.assert_array_equal(model.fc1.weight, other.fc1.weight)
    assert sm.to(jnp.bfloat16) is sm
    assert model.fc1.weight.dtype == jnp.bfloat16
    sm.float()
    sm.eval()
    assert not model.training and not model.bn.training and not sm.training
    sm.train()
    assert model.training and sm.training
    sm.training = False
    assert not model.training


def test_apply_visits_the_original_tree():
    model = Net()
    seen = []
    assert jm.jit.script(model).apply(lambda m: seen.append(m)) is not None
    assert seen == [model.fc1, model.bn, model.fc2, model]


def test_attributes_read_and_write_through_to_the_original():
    model = Net()
    sm = jm.jit.script(model)
    sm.module.extra = nn.Linear(2, 2)  # structure changes go to the wrapped module
    assert model.extra is sm.extra
    sm.note = "hello"
    assert model.note == "hello" and sm.note == "hello"
    del sm.note
    assert not hasattr(model, "note")


def test_structural_changes_recompile_on_next_call_with_reasons():
    model = Net()
    sm = jm.jit.script(model)
    x = _x()
    sm(x)
    sm(x)
    sm.eval()
    sm(x)
    handle = sm.fc1.register_forward_hook(lambda mod, args, out: out * 0)
    zeroed = sm(x)
    handle.remove()
    sm(x[:4])
    stats = jm.compile_stats(sm)
    assert stats.reasons[0] == "first call"
    assert stats.reasons[1].startswith("training mode changed")
    assert stats.reasons[2] == "forward hook added on 'fc1'"
    assert stats.reasons[-1] == "input shape changed: x (8, 6) -> (4, 6)"
    # With fc1's output zeroed, every row gives the same output.
    np.testing.assert_allclose(zeroed, jnp.broadcast_to(zeroed[0], zeroed.shape), atol=1e-6)


def test_hooks_registered_on_the_script_module_act_on_the_original():
    model = Net()
    sm = jm.jit.script(model)
    calls = []
    sm.register_forward_pre_hook(lambda mod, args: calls.append(type(mod).__name__))
    model(_x())
    sm(_x())
    assert calls == ["Net", "Net"]  # one eager call, one trace


def test_static_python_arguments_recompile_per_value():
    sm = jm.jit.script(Net().eval())
    x = _x()
    a = sm(x, 1.0)
    b = sm(x, 2.0)
    np.testing.assert_allclose(b, 2 * a, rtol=1e-6)
    assert jm.compile_stats(sm).reasons[1] == "input scale changed: 1.0 -> 2.0"


def test_pytree_inputs_and_outputs():
    class Tree(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, batch):
            a, b = batch["pair"]
            return {"sum": self.fc(a) + b, "parts": [a, (b,)]}

    model = Tree()
    sm = jm.jit.script(model)
    batch = {"pair": (jnp.ones((2, 3)), jnp.full((2, 3), 2.0))}
    got = sm(batch)
    want = model(batch)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_deepcopy_gives_an_independent_script_module_and_pickle_is_refused():
    sm = jm.jit.trace(Net(), _x())
    clone = copy.deepcopy(sm)
    assert isinstance(clone, jm.jit.ScriptModule) and clone.module is not sm.module
    np.testing.assert_allclose(clone(_x()), sm(_x()), rtol=1e-6)
    with pytest.raises(pickle.PickleError, match=r"jm\.jit\.save"):
        pickle.dumps(sm)


def test_trace_does_not_change_state():
    model = _mlp()
    before = {k: np.asarray(v) for k, v in model.state_dict().items()}
    key = np.asarray(jm.random.default_generator.get_state())
    jm.jit.trace(model, _x())
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    np.testing.assert_array_equal(jm.random.default_generator.get_state(), key)


def test_options_are_checked():
    with pytest.raises(TypeError, match="fallback must be None or 'eager'"):
        jm.jit.script(Net(), fallback="python")
    with pytest.raises(TypeError, match=r"unsupported option\(s\) \['donate'\]"):
        jm.jit.script(Net(), donate=True)
    with pytest.raises(TypeError, match=r"wraps a jm\.nn\.Module"):
        jm.jit.ScriptModule(lambda x: x)
    with pytest.raises(TypeError, match="DebugOptions"):
        jm.jit.ScriptModule(Net(), debug_options={"log_level": 10})


def test_jit_options_reach_jax_jit():
    sm = jm.jit.script(Net(), keep_unused=True)
    assert sm.__dict__["_compiled"].program.jit_options == {"keep_unused": True}
    assert sm(_x()).shape == (8, 2)


# --------------------------------------------------------------------- views


@pytest.mark.parametrize("view", ["graph", "inlined_graph", "code", "code_with_constants"])
def test_views_before_first_call_raise_a_clear_error(view):
    sm = jm.jit.script(Net())
    with pytest.raises(
        jm.jit.NotTracedError, match=rf"Net has not been traced yet, so it has no {view}\. Call"
    ):
        getattr(sm, view)


def test_views_exist_after_first_call_and_at_once_with_example_inputs():
    called = jm.jit.script(Net())
    called(_x())
    traced = jm.jit.trace(Net(), _x())
    scripted = jm.jit.script(Net(), example_inputs=(_x(),))
    for sm in (called, traced, scripted):
        assert sm.graph.count("fc1.weight") >= 2
        assert "x:f32[8,6]" in sm.graph


def test_graph_names_state_by_state_dict_keys_and_marks_buffer_updates():
    graph = jm.jit.trace(_mlp(), _x()).graph
    for key in ("0.weight", "0.bias", "1.running_mean", "1.num_batches_tracked", "4.bias"):
        assert f"{key}:" in graph, key
    for key in ("1.running_mean", "1.running_var", "1.num_batches_tracked", "rng_key"):
        assert f"{key}.new:" in graph, key
    assert "input:f32[8,6]" in graph
    assert graph.startswith("# graph of the forward of Sequential (training mode)")


def test_inlined_graph_has_no_nested_calls():
    sm = jm.jit.trace(_mlp(), _x())
    assert "custom_jvp_call" in sm.graph and "jit[" in sm.graph
    inlined = sm.inlined_graph
    for call in ("custom_jvp_call", "jit[", "pjit", "closed_call"):
        assert call not in inlined
    assert "max" in inlined and "random_bits" in inlined


def test_inlined_graph_inlines_inside_control_flow_bodies():
    class Loop(nn.Module):
        def forward(self, x):
            return jax.lax.fori_loop(0, 3, lambda i, v: jax.nn.relu(v) - 1.0, x)

    sm = jm.jit.trace(Loop(), jnp.ones(4))
    assert "custom_jvp_call" in sm.graph
    assert "custom_jvp_call" not in sm.inlined_graph
    assert "scan" in sm.inlined_graph or "while" in sm.inlined_graph


def test_views_follow_mode_and_shape_changes():
    sm = jm.jit.script(_mlp())
    sm(_x())
    assert "1.running_mean.new" in sm.graph
    sm.eval()
    assert "1.running_mean.new" not in sm.graph  # re-traced: eval mode writes no buffers
    sm(_x(4))
    assert "input:f32[4,6]" in sm.graph


@pytest.mark.slow
def test_code_is_python_that_reproduces_forward_and_buffer_updates():
    model = _mlp()
    sm = jm.jit.trace(model, _x())
    code, constants = sm.code_with_constants
    assert code == sm.code
    ast.parse(code)
    assert 'ops.get(self, "0.weight")' in code or "ops.get(self, '0.weight')" in code
    namespace = {"CONSTANTS": constants}
    exec(code, namespace)
    eager, rerun = copy.deepcopy(model), copy.deepcopy(model)
    jm.manual_seed(9)
    want = eager(_x())
    jm.manual_seed(9)
    got = namespace["forward"](rerun, _x())
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for k, v in eager.state_dict().items():
        np.testing.assert_allclose(rerun.state_dict()[k], v, rtol=1e-6, atol=1e-7, err_msg=k)


def test_code_with_constants_holds_large_constants():
    table = np.linspace(0.0, 1.0, 100).astype(np.float32)

    class Lookup(nn.Module):
        def forward(self, x):
            return x * jnp.asarray(table) + jnp.asarray(np.arange(3.0, dtype=np.float32)).sum()

    sm = jm.jit.trace(Lookup(), jnp.ones(100))
    code, constants = sm.code_with_constants
    assert "CONSTANTS.c0" in code and len(constants) == 1
    np.testing.assert_array_equal(constants.c0, table)
    assert isinstance(constants, jm.jit.ConstMap) and list(constants) == ["c0"]
    assert "np.array([0.0, 1.0, 2.0], dtype=ops.float32)" in code  # small ones inline
    namespace = {"CONSTANTS": constants}
    exec(code, namespace)
    np.testing.assert_allclose(namespace["forward"](Lookup(), jnp.ones(100)), table + 3.0)


def test_code_writes_nested_programs_as_functions():
    class Ctrl(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, *, shift):
            h = self.fc(x)
            h = jax.lax.cond(h.sum() > 0, lambda a: a * 2, lambda a: a - 1, h)
            _, ys = jax.lax.scan(lambda c, r: (c + r, (c + r) * shift), jnp.zeros(4), h)
            n = jax.lax.while_loop(lambda v: v[0] < 10.0, lambda v: v * 2.0 + 1.0, ys[0])
            return {"ys": ys, "n": n}

    model = Ctrl()
    x, shift = _x(3, 4), jnp.float32(0.5)
    sm = jm.jit.trace(model, x, example_kwarg_inputs={"shift": shift})
    code, constants = sm.code_with_constants
    assert "def forward(self, x, *, shift):" in code
    assert code.count("def program") >= 4  # two branches, a scan body, a cond and a body
    namespace = {"CONSTANTS": constants}
    exec(code, namespace)
    got = namespace["forward"](model, x, shift=shift)
    want = model(x, shift=shift)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, err_msg=k)


# --------------------------------------------------------------------- untraceable forwards


class _IfOnValue(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


class _Item(nn.Module):
    def forward(self, x):
        return x * x.max().item()


class _Mask(nn.Module):
    def forward(self, x):
        return x[x > 0]


class _Numpy(nn.Module):
    def forward(self, x):
        return jnp.asarray(np.tanh(x))


class _ReturnsString(nn.Module):
    def forward(self, x):
        return x, "label"


class _Outer(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.block = nn.Sequential(nn.Identity(), inner)

    def forward(self, x):
        return self.block(x)


@pytest.mark.parametrize(
    ("inner", "line", "why", "fix"),
    [
        (_IfOnValue(), "if x.sum() > 0:", "Python control flow", "jax.lax.cond"),
        (_Item(), "return x * x.max().item()", r"concrete Python value", "static"),
        (_Mask(), "return x[x > 0]", "shape depends on array values", r"jnp.where\(mask"),
        (_Numpy(), "return jnp.asarray(np.tanh(x))", "converted an array to numpy", "jax.numpy"),
    ],
    ids=["if", "item", "mask", "numpy"],
)
def test_untraceable_forward_names_module_line_and_fix(inner, line, why, fix):
    sm = jm.jit.script(_Outer(inner))
    with pytest.raises(jm.jit.TracingError) as info:
        sm(_x())
    message = str(info.value)
    assert f"forward of 'block.1' ({type(inner).__name__})" in message
    assert "test_jit.py" in message and f"    {line}\n" in message
    assert re.search(why, message)
    assert re.search(f"Fix: .*{fix}", message)
    assert 'fallback="eager"' in message
    assert isinstance(info.value, RuntimeError)
    assert type(info.value.jax_error).__module__.startswith("jax")


def test_untraceable_errors_at_trace_time_and_state_is_left_alone():
    model = _Outer(_IfOnValue())
    with pytest.raises(jm.jit.TracingError, match=r"'block\.1' \(_IfOnValue\)"):
        jm.jit.trace(model, _x())
    assert model(jnp.ones(3)).shape == (3,)  # still usable eagerly


def test_non_array_output_is_explained():
    with pytest.raises(jm.jit.TracingError, match=r"returned a str \('label'\) at output\[1\]"):
        jm.jit.script(_ReturnsString())(_x())


def test_fallback_eager_warns_once_and_runs_eagerly():
    sm = jm.jit.script(_IfOnValue(), fallback="eager")
    x = _x()
    with pytest.warns(UserWarning, match="(?s)runs eagerly.*Python control flow"):
        first = sm(x)
    second = sm(-x)
    np.testing.assert_allclose(first, jnp.where(x.sum() > 0, x, -x))
    np.testing.assert_allclose(second, jnp.where(-x.sum() > 0, -x, x))


def test_fallback_eager_with_example_inputs_warns_at_creation():
    with pytest.warns(UserWarning, match="runs eagerly"):
        sm = jm.jit.trace(_Item(), _x(), fallback="eager")
    np.testing.assert_allclose(sm(jnp.ones(2)), jnp.ones(2))


# --------------------------------------------------------------------- debug options


def test_debug_options_log_every_recompilation_with_its_reason(caplog):
    sm = jm.jit.script(Net(), debug_options=jm.jit.DebugOptions(log_level="INFO"))
    with caplog.at_level(logging.INFO, logger="jmodule.jit"):
        sm(_x())
        sm(_x())
        sm(_x(4))
        sm.eval()
        sm(_x(4))
    messages = [r.getMessage() for r in caplog.records if r.name == "jmodule.jit"]
    assert len(messages) == 3
    assert messages[0] == "Net: compiling (trace 1) for x: f32[8,6]: first call"
    assert messages[1].endswith("input shape changed: x (8, 6) -> (4, 6)")
    assert messages[2].endswith("training mode changed on the root module (True -> False)")
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "jmodule.jit")


def test_debug_options_dump_each_traced_jaxpr_and_stablehlo(tmp_path):
    options = jm.jit.DebugOptions(log_level=logging.DEBUG, save_dir=tmp_path / "dumps")
    sm = jm.jit.script(Net(), debug_options=options)
    sm(_x())
    sm(_x())
    sm(_x(4))
    files = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert files == [
        "Net_001.jaxpr.txt",
        "Net_001.stablehlo.mlir",
        "Net_002.jaxpr.txt",
        "Net_002.stablehlo.mlir",
    ]
    jaxpr = (tmp_path / "dumps" / "Net_002.jaxpr.txt").read_text()
    assert "input shape changed: x (8, 6) -> (4, 6)" in jaxpr
    assert "fc1.weight:f32[8,6]" in jaxpr and "x:f32[4,6]" in jaxpr
    hlo = (tmp_path / "dumps" / "Net_001.stablehlo.mlir").read_text()
    assert "stablehlo.dot_general" in hlo and "func.func public @main" in hlo


def test_debug_options_prefix_and_level_names():
    assert jm.jit.DebugOptions(log_level="warning").level == logging.WARNING
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        _ = jm.jit.DebugOptions(log_level="LOUD").level


# --------------------------------------------------------------------- dynamic batch


def test_dynamic_batch_graph_is_symbolic():
    sm = jm.jit.trace(Net().eval(), _x(), dynamic_batch=True)
    assert "x:f32[batch,6]" in sm.graph
    assert "symbolic 'batch'" in sm.graph
    assert "x: f32[8,6]" in sm.code  # the code is written for the traced shapes


def test_dynamic_batch_training_batch_norm_gets_a_batch_constraint():
    sm = jm.jit.trace(Net(), _x(), dynamic_batch=True)
    assert "(batch >= 2)" in sm.graph


def test_dynamic_batch_python_decision_on_batch_size_is_explained():
    class Reshape(nn.Module):
        def forward(self, x):
            if x.shape[0] > 4:
                return x
            return x.reshape(2, -1)

    with pytest.raises(jm.jit.TracingError, match="dimension 0 of the inputs is symbolic"):
        jm.jit.trace(Reshape(), _x(), dynamic_batch=True)


def test_public_names_are_exported():
    for name in (
        "ScriptModule",
        "script",
        "trace",
        "save",
        "load",
        "DebugOptions",
        "ConstMap",
        "JitError",
        "TracingError",
        "NotTracedError",
        "ProgramFileError",
        "IncompatibleVersionError",
    ):
        assert hasattr(jm.jit, name), name
    assert issubclass(jm.jit.TracingError, RuntimeError)
    assert issubclass(jm.jit.IncompatibleVersionError, jm.jit.ProgramFileError)
