"""A ScriptModule's own structure is fixed, as TorchScript's.

Each change is tried on ``torch.jit.script(m)`` and on ``jm.jit.script(m)`` /
``jm.jit.ScriptModule(m)``: the exception type must be torch's, and jm changes
nothing when it raises. The wrapped ``.module`` stays an ordinary module.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
import jmodule.jit
from jmodule import nn


def _torch_script():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))


def _jm_model():
    return nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))


def _tree(m):
    """Names of children, parameters and buffers of the wrapped tree, and their values."""
    return (
        [n for n, _ in m.named_children()],
        {n: np.asarray(p) for n, p in m.named_parameters()},
        {n: np.asarray(b) for n, b in m.named_buffers()},
    )


# (name, change on a torch side, change on a jm side); ``T``/``J`` are each side's nn/array.
T, J = torch.nn, nn
CHANGES = [
    ("add_module", lambda s, nn_: s.add_module("x", nn_.ReLU())),
    ("add_module over a child", lambda s, nn_: s.add_module("0", nn_.ReLU())),
    ("register_module", lambda s, nn_: s.register_module("x", nn_.ReLU())),
    ("assign a module", lambda s, nn_: setattr(s, "x", nn_.ReLU())),
    ("assign over a child", lambda s, nn_: setattr(s, "0", nn_.ReLU())),
    ("new parameter", lambda s, nn_: s.register_parameter("p", nn_.Parameter(_ones(nn_)))),
    ("new parameter None", lambda s, nn_: s.register_parameter("p", None)),
    ("new buffer", lambda s, nn_: s.register_buffer("b", _ones(nn_))),
    ("new buffer None", lambda s, nn_: s.register_buffer("b", None)),
    ("assign a parameter", lambda s, nn_: setattr(s, "p", nn_.Parameter(_ones(nn_)))),
    ("delete a child", lambda s, nn_: delattr(s, "0")),
]


def _ones(nn_):
    return torch.ones(1) if nn_ is torch.nn else jnp.ones(1)


def _outcome(fn):
    try:
        fn()
    except Exception as e:
        return type(e)
    return None


@pytest.mark.torch
@pytest.mark.parametrize("how", ["script", "ScriptModule"])
@pytest.mark.parametrize("name,change", CHANGES, ids=[c[0] for c in CHANGES])
def test_structure_changes_raise_as_torchscript_and_change_nothing(how, name, change):
    ts = _torch_script()
    want = _outcome(lambda: change(ts, torch.nn))
    assert want is RuntimeError, f"torch now allows {name!r}: {want}"
    model = _jm_model()
    sm = jm.jit.script(model) if how == "script" else jm.jit.ScriptModule(model)
    x = jnp.ones((4, 2))
    before = np.asarray(sm(x))
    tree = _tree(model)
    with pytest.raises(want, match=r"ScriptModule|script module") as info:
        change(sm, nn)
    assert "module" in str(info.value)  # says where the change belongs
    after = _tree(model)
    assert after[0] == tree[0] and after[1].keys() == tree[1].keys()
    assert after[2].keys() == tree[2].keys()
    np.testing.assert_allclose(np.asarray(sm(x)), before, rtol=1e-6)


def test_the_message_says_to_change_the_wrapped_module():
    sm = jm.jit.ScriptModule(_jm_model())
    with pytest.raises(RuntimeError, match=r"re-assign modules.*change the wrapped module"):
        sm.add_module("x", nn.ReLU())


@pytest.mark.torch
def test_existing_parameters_and_buffers_can_be_replaced_as_in_torch():
    ts = _torch_script()
    ts[0].weight = torch.nn.Parameter(torch.zeros(2, 2))
    model = _jm_model()
    sm = jm.jit.script(model)
    x = jnp.ones((4, 2))
    sm(x)
    bn = sm.module[1]
    jm.jit.ScriptModule(bn).register_buffer("running_mean", jnp.full((2,), 3.0))
    assert np.allclose(np.asarray(model[1].running_mean), 3.0)
    sbn = jm.jit.ScriptModule(bn)
    sbn.weight = nn.Parameter(jnp.zeros(2))  # an existing parameter: replaced, as in torch
    sbn.register_parameter("bias", nn.Parameter(jnp.ones(2)))
    assert np.allclose(np.asarray(model[1].weight), 0.0)
    assert np.allclose(np.asarray(model[1].bias), 1.0)


def test_plain_attributes_and_the_wrapped_module_stay_changeable():
    model = _jm_model()
    sm = jm.jit.script(model)
    x = jnp.ones((4, 2))
    sm(x)
    sm.note = "kept"  # a plain attribute writes through (torch allows it too)
    assert model.note == "kept"
    sm.module.add_module("act", nn.ReLU())  # the wrapped module is ordinary: recompiles
    assert "act" in dict(model.named_children())
    out = np.asarray(sm(x))
    np.testing.assert_allclose(out, np.maximum(np.asarray(model(x)), 0.0), rtol=1e-6)
    assert (out >= 0).all()
