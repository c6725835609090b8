"""The mistakes PyTorch users make first get errors that name the fix (issue 15, item 4)."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import nn


def test_loss_backward_names_jm_backward():
    m = nn.Linear(4, 3)
    loss = m(jnp.ones((2, 4))).sum()
    with pytest.raises(AttributeError, match=r"jm\.backward\(lambda: loss_fn"):
        loss.backward()
    with pytest.raises(AttributeError, match=r"jm\.backward"):
        m.weight.backward()
    assert not hasattr(loss, "backward")  # duck-typing code still sees no backward


def test_view_with_a_shape_names_reshape_and_view_with_a_dtype_is_jaxs():
    h = nn.Linear(4, 6)(jnp.ones((2, 4)))
    for call, shown in ((lambda: h.view(3, -1), "3, -1"), (lambda: h.view((4, 3)), "4, 3")):
        with pytest.raises(TypeError, match=re.escape(f"x.reshape({shown})")):
            call()
    with pytest.raises(TypeError, match=r"reshape"):
        jax.jit(lambda x: x.view(3, -1))(h)  # tracers too
    np.testing.assert_array_equal(
        np.asarray(h.view(jnp.int32)), np.asarray(jax.lax.bitcast_convert_type(h, jnp.int32))
    )


def _donating_step():
    m = nn.Linear(4, 3)
    opt = jm.optim.SGD(m.parameters(), lr=0.1)

    @jm.compile
    def step(m, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: m(x).sum())
        opt.step()
        return loss

    return m, opt, step


@pytest.mark.slow
def test_an_array_deleted_by_donation_names_donation_copy_and_donate_false():
    m, opt, step = _donating_step()
    w = m.weight.data  # taken before the step: the step donates its buffer
    kept = m.weight.data.copy()
    with pytest.warns(jm.DonatedHeldWarning, match="'weight'.*donate=False"):  # said first
        step(m, opt, jnp.ones((2, 4)))
    assert w.is_deleted() and not kept.is_deleted()
    for call, where in ((lambda: m(w), "Argument 0"), (lambda: step(m, opt, w), "Argument 2")):
        with pytest.raises(jm.DeletedArrayError) as info:
            call()
        text = str(info.value)
        assert isinstance(info.value, RuntimeError)
        assert where in text and "(3, 4)" in text
        for fix in ("donat", "w.copy()", "donate=False"):
            assert fix in text


@pytest.mark.torch
def test_linear_on_the_wrong_input_size_names_the_layer_and_shapes_as_torch():
    x = np.ones((2, 6, 5), np.float32)
    with pytest.raises(RuntimeError) as theirs:
        torch.nn.Linear(4, 3)(torch.from_numpy(x))
    m = nn.Linear(4, 3)
    for run in (m, m.compile() or m):
        with pytest.raises(RuntimeError) as ours:
            run(jnp.asarray(x))
        text = str(ours.value)
        assert (
            str(theirs.value) in text
        )  # "mat1 and mat2 shapes cannot be multiplied (12x5 and 4x3)"
        assert "Linear(in_features=4, out_features=3" in text
        assert "(2, 6, 5)" in text and "in_features=4" in text
    with pytest.raises(RuntimeError, match=re.escape(str(theirs.value))):
        jm.nn.functional.linear(jnp.asarray(x), m.weight)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


def test_python_if_on_an_array_in_a_compiled_forward_names_module_line_and_options():
    outer = nn.Sequential(nn.Identity(), Branchy())
    outer.compile()
    with pytest.raises(jm.jit.TracingError) as info:
        outer(jnp.ones((2, 4)))
    text = str(info.value)
    assert "'1' (Branchy)" in text
    assert "if x.sum() > 0:" in text and "test_teaching_errors.py" in text
    for option in ("jnp.where", "jax.lax.cond", "without model.compile()", "static"):
        assert option in text
    assert isinstance(info.value.jax_error, jax.errors.TracerBoolConversionError)
    assert isinstance(info.value, RuntimeError)


def test_python_if_on_an_array_in_a_jm_compile_function_names_the_function():
    m = nn.Linear(4, 3)

    @jm.compile
    def f(m, x):
        if x.sum() > 0:
            return m(x)
        return x

    with pytest.raises(jm.jit.TracingError) as info:
        f(m, jnp.ones((2, 4)))
    text = str(info.value)
    assert "function" in text and "f'" in text
    assert "if x.sum() > 0:" in text and "without jm.compile" in text


@pytest.mark.torch
def test_torch_optim_over_jmodule_parameters_points_to_jm_optim():
    m = nn.Linear(4, 3)
    with pytest.raises(TypeError, match=r"jm\.optim\.X\(model\.parameters\(\)\)"):
        torch.optim.Adam(m.parameters())


def test_jm_save_of_a_module_suggests_its_state_dict(tmp_path):
    with pytest.raises(TypeError, match=r"jm\.save\(model\.state_dict\(\), path\)"):
        jm.save(nn.Linear(2, 2), tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_optimizer_step_without_backward_in_a_compiled_step_is_logged_once(caplog):
    m = nn.Linear(4, 3)
    opt = jm.optim.SGD(m.parameters(), lr=0.1)
    before = np.asarray(m.weight.data).copy()

    @jm.compile
    def step(m, opt, x):
        opt.zero_grad()
        loss = m(x).sum()  # forgot jm.backward
        opt.step()
        return loss

    with caplog.at_level(logging.INFO, logger="jmodule.optim"):
        step(m, opt, jnp.ones((2, 4)))
        step(m, opt, jnp.ones((3, 4)))  # a second trace: still said once
    told = [r for r in caplog.records if "no parameter with a .grad" in r.getMessage()]
    assert len(told) == 1 and "jm.backward" in told[0].getMessage()
    np.testing.assert_array_equal(np.asarray(m.weight.data), before)  # a no-op, as in PyTorch
