"""Compiled programs never go stale: the Python a trace ran is guarded (issue 15, items 1-2).

Notebook users change globals, redefine helpers and reassign ``forward``
between calls. Each test writes its code into a fresh namespace with
``exec`` (as a notebook cell does, from a file that is not a library's), runs
it compiled, changes the Python, and compares the next compiled call with the
same computation run eagerly; ``jm.compile_stats`` gives the logged reason.
"""

import logging
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _monitoring import counting

import jmodule as jm
from jmodule import nn

NET = """
import jax.numpy as jnp
import jmodule as jm
from jmodule import nn

SCALE = 2.0

def helper(x):
    return x * SCALE

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return helper(self.fc(x)).sum()
"""


def cell(source: str, ns: dict | None = None) -> dict:
    """Run ``source`` as a notebook cell would (its own file name, one namespace)."""
    ns = {"__name__": "__main__"} if ns is None else ns
    exec(compile(textwrap.dedent(source), "<ipython-input-1>", "exec"), ns)
    return ns


def compiled_net(ns: dict) -> tuple:
    m = ns["Net"]()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 4)), jnp.float32)
    m.compile()
    m(x)
    return m, x


def eager(m, x):
    """The forward as eager Python computes it now (the module's own code, uncompiled)."""
    return type(m).forward(m, x) if "forward" not in m.__dict__ else m.__dict__["forward"](x)


def assert_follows(m, x, reason_part: str) -> None:
    before = jm.compile_stats(m).num_traces
    got = m(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(eager(m, x)), rtol=1e-6)
    stats = jm.compile_stats(m)
    assert stats.num_traces == before + 1
    assert reason_part in stats.reasons[-1], stats.reasons
    m(x)  # settled: no further trace
    assert jm.compile_stats(m).num_traces == before + 1


def test_a_changed_global_value_retraces_with_its_reason(caplog):
    ns = cell(NET)
    m, x = compiled_net(ns)
    old = float(m(x))
    ns["SCALE"] = 3.0
    with caplog.at_level(logging.INFO, logger="jmodule.compile"):
        assert_follows(m, x, "global 'SCALE' changed (2.0 -> 3.0)")
    assert float(m(x)) != pytest.approx(old)
    assert any("SCALE" in r.getMessage() for r in caplog.records)


def test_an_equal_value_or_an_untouched_global_does_not_retrace():
    ns = cell(NET)
    m, x = compiled_net(ns)
    ns["SCALE"] = float("2.0")  # a new float object, the same value
    ns["UNRELATED"] = 5
    for _ in range(3):
        m(x)
    assert jm.compile_stats(m).num_traces == 1


def test_a_redefined_helper_retraces():
    ns = cell(NET)
    m, x = compiled_net(ns)
    cell("def helper(x):\n    return x * SCALE + 1.0\n", ns)
    assert_follows(m, x, "global 'helper' was redefined")


def test_a_global_read_by_a_helper_of_a_helper_is_guarded():
    ns = cell(NET)
    cell(
        "OFFSET = 0.5\ndef inner(x):\n    return x + OFFSET\ndef helper(x):\n    return inner(x)\n",
        ns,
    )
    m, x = compiled_net(ns)
    ns["OFFSET"] = -4.0
    assert_follows(m, x, "global 'OFFSET' changed")


def test_reassigning_forward_on_the_class_or_the_instance_retraces():
    ns = cell(NET)
    m, x = compiled_net(ns)
    ns["Net"].forward = lambda self, x: self.fc(x).mean()
    assert_follows(m, x, "Net.forward was redefined")
    m.forward = lambda x: m.fc(x).max()
    assert_follows(m, x, "attribute 'forward' was added")


def test_a_method_forward_calls_is_guarded():
    ns = cell(
        """
        from jmodule import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)
            def act(self, h):
                return h * 2
            def forward(self, x):
                return self.act(self.fc(x)).sum()
        """
    )
    m, x = compiled_net(ns)
    ns["Net"].act = lambda self, h: h - 1.0
    assert_follows(m, x, "Net.act")


def test_code_replaced_in_place_as_autoreload_does_retraces():
    ns = cell(NET)
    m, x = compiled_net(ns)
    ns["helper"].__code__ = cell("def h(x):\n    return x * SCALE * SCALE\n", {})["h"].__code__
    assert_follows(m, x, "the code of")


def test_a_closure_variable_of_a_compiled_step_is_guarded():
    ns = cell(
        """
        import jmodule as jm
        def make(scale):
            @jm.compile
            def step(m, x):
                return m(x).sum() * scale
            def rescale(s):
                nonlocal scale
                scale = s
            return step, rescale
        """
    )
    step, rescale = ns["make"](2.0)
    m = nn.Linear(4, 3)
    x = jnp.ones((2, 4))
    a = float(step(m, x))
    rescale(5.0)
    b = float(step(m, x))
    assert b == pytest.approx(a * 2.5, rel=1e-5)
    assert "closure variable 'scale'" in jm.compile_stats(step).reasons[-1]


def test_a_compiled_training_step_follows_a_changed_global():
    ns = cell(
        """
        import jax.numpy as jnp
        import jmodule as jm
        CLIP = 10.0
        def loss_fn(m, x):
            return jnp.minimum(m(x), CLIP).sum()

        @jm.compile
        def step(m, opt, x):
            opt.zero_grad()
            loss = jm.backward(lambda: loss_fn(m, x))
            opt.step()
            return loss
        """
    )
    m = nn.Linear(4, 3)
    opt = jm.optim.SGD(m.parameters(), lr=0.0)  # lr 0: the loss depends on CLIP alone
    x = jnp.ones((2, 4)) * 3
    step = ns["step"]
    full = float(step(m, opt, x))
    assert full == pytest.approx(float(ns["loss_fn"](m, x)), rel=1e-5)
    ns["CLIP"] = -1.0
    clipped = float(ns["loss_fn"](m, x))  # eager, with the new global
    assert clipped != pytest.approx(full)
    assert float(step(m, opt, x)) == pytest.approx(clipped, rel=1e-5)
    assert "global 'CLIP' changed" in jm.compile_stats(step).reasons[-1]


def test_library_code_and_modules_are_not_guarded():
    from jmodule._lowering import guards

    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert guards.collect(None, list(m.named_modules())) is None
    assert not guards.is_user_code(textwrap.dedent.__code__)
    assert guards.is_user_code(cell("def f():\n    return 1\n")["f"].__code__)


# ----------------------------------------------------------------------------- one compile


def test_the_first_calls_of_a_training_step_compile_it_once():
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = jm.optim.Adam(m.parameters(), lr=1e-2)

    @jm.compile
    def step(m, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: ((m(x) - y) ** 2).mean())
        opt.step()
        return loss

    x, y = jnp.ones((3, 4)), jnp.zeros((3, 2))
    with counting() as names:
        for _ in range(4):
            step(m, opt, x, y).block_until_ready()
    programs = [n for n in names if "_pure" in n]
    assert len(programs) == 1, names
    stats = jm.compile_stats(step)
    assert stats.num_traces == 1 and stats.num_compiles == 1


@pytest.mark.parametrize(
    "replace",
    ["load_state_dict", "data", "copy_", "fill_"],
)
def test_state_replaced_between_steps_from_host_values_compiles_nothing_new(replace):
    """Fresh host values (numpy, as a torch state_dict gives) put into the state between
    compiled steps keep the compiled program: they are committed as the values they
    replace, and jax.jit keys its executables on committedness."""
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = jm.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)
    host = {k: np.asarray(v) + 1.0 for k, v in m.state_dict().items()}

    @jm.compile
    def step(m, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: ((m(x) - y) ** 2).mean())
        opt.step()
        return loss

    x, y = jnp.ones((3, 4)), jnp.zeros((3, 2))
    step(m, opt, x, y).block_until_ready()
    with counting() as names:
        for _ in range(3):
            if replace == "load_state_dict":
                m.load_state_dict(host)
            elif replace == "data":
                m[0].weight.data = jnp.asarray(host["0.weight"])
            elif replace == "copy_":
                m[0].weight.copy_(jnp.asarray(host["0.weight"]))
            else:
                m[0].bias.fill_(0.5)
            loss = step(m, opt, x, y)
    assert [n for n in names if "_pure" in n] == []
    assert jm.compile_stats(step).num_compiles == 1
    if replace == "load_state_dict":  # the step computed its loss from the loaded values
        ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        ref.load_state_dict(host)
        np.testing.assert_allclose(float(loss), float(((ref(x) - y) ** 2).mean()), rtol=1e-6)


def test_a_compiled_forward_that_writes_buffers_compiles_once():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU())
    m.compile()
    x = jnp.ones((5, 4))
    with counting() as names:
        for _ in range(3):
            jax.block_until_ready(m(x))
    assert len([n for n in names if "_pure" in n]) == 1, names
    assert jm.compile_stats(m).num_compiles == 1


def test_num_compiles_counts_what_xla_compiled():
    m = nn.Linear(4, 2)
    m.compile()
    m(jnp.ones((1, 4)))
    m(jnp.ones((3, 4)))  # a new shape: a second trace and compile
    cpu = jax.devices("cpu")[0]
    m(jax.device_put(jnp.ones((3, 4)), cpu))  # committed input: XLA compiles again, no trace
    stats = jm.compile_stats(m)
    assert stats.num_traces == 2
    assert stats.num_compiles == 3
