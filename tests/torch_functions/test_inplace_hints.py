"""In-place ``torch.Tensor`` methods on jax arrays explain themselves (issue 27).

Hugging Face-style ``from_pretrained`` does ``model.state_dict()[k].copy_(w)``; here
``state_dict()`` values are ``jax.Array`` s, which are immutable. ``jmodule/_array_patches.py``
gives JAX's array and tracer classes properties for the common in-place names that
raise ``AttributeError`` (so ``hasattr`` stays False) saying what to do instead; the
ways it names (``load_state_dict``, ``state_dict(keep_vars=True)``, whose values are
the Parameters) must work as in PyTorch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import nn
from jmodule._array_patches import INPLACE


def _model(nn_):
    return nn_.Sequential(nn_.Linear(3, 4), nn_.BatchNorm1d(4), nn_.Linear(4, 2))


def _torch_weights(seed=0):
    torch.manual_seed(seed)
    return {k: v.detach().numpy().copy() for k, v in _model(torch.nn).state_dict().items()}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(INPLACE))
def test_every_hinted_name_raises_attribute_error_with_the_hint(name):
    x = jnp.ones(3)
    assert not hasattr(x, name)
    with pytest.raises(AttributeError, match="jax arrays are immutable") as caught:
        getattr(x, name)
    assert f"x.{name}(" in str(caught.value)
    assert "load_state_dict" in str(caught.value)
    assert hasattr(torch.ones(1), name)  # each is a torch.Tensor method


def test_the_state_dict_copy_hint_names_keep_vars():
    sd = nn.Linear(2, 2).state_dict()
    with pytest.raises(AttributeError) as caught:
        sd["weight"].copy_(jnp.ones((2, 2)))
    message = str(caught.value)
    assert "state_dict(keep_vars=True)[k].copy_" in message
    assert "load_state_dict" in message


def test_hints_on_traced_values_too():
    seen = {}

    def f(x):
        for name in ("copy_", "add_", "backward"):
            try:
                getattr(x, name)
            except AttributeError as e:
                seen[name] = str(e)
        seen["has"] = hasattr(x, "zero_")
        return x.sum() + x.reshape(-1)[0]  # JAX's own attributes on tracers still work

    jax.jit(f)(jnp.ones(3))
    assert "jax arrays are immutable" in seen["copy_"]
    assert "jm.add(x, ...)" in seen["add_"]
    assert "jm.backward" in seen["backward"]
    assert seen["has"] is False


def test_jax_array_methods_are_unaffected():
    x = jnp.arange(6.0).reshape(2, 3)
    assert float(x.sum()) == 15.0
    assert x.copy() is not x and np.array_equal(x.copy(), x)
    assert x.at[0, 0].set(7.0)[0, 0] == 7.0
    assert x.view(jnp.int32).dtype == jnp.int32
    with pytest.raises(AttributeError, match="has no attribute"):
        x.no_such_method

    def traced(y):
        with pytest.raises(AttributeError, match="has no attribute"):
            y.no_such_method
        return y.mean(axis=0)

    np.testing.assert_array_equal(jax.jit(traced)(x), x.mean(axis=0))


@pytest.mark.torch
def test_state_dict_keep_vars_gives_the_parameters_and_copy_updates_the_module():
    weights = _torch_weights()
    want = _model(torch.nn)
    want.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})

    model = _model(nn)
    sd = model.state_dict(keep_vars=True)
    t_sd = want.state_dict(keep_vars=True)
    assert [k for k, v in sd.items() if isinstance(v, nn.Parameter)] == [
        k for k, v in t_sd.items() if isinstance(v, torch.nn.Parameter)
    ]
    for k, p in sd.items():  # Hugging Face's loop, parameters through keep_vars
        if isinstance(p, nn.Parameter):
            assert p.copy_(jnp.asarray(weights[k])) is p
    buffers = {k: jnp.asarray(v) for k, v in weights.items() if not isinstance(sd[k], nn.Parameter)}
    model.load_state_dict(buffers, strict=False)  # buffers: arrays in both state_dicts here

    x = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    want.eval()
    model.eval()
    np.testing.assert_allclose(
        np.asarray(model(jnp.asarray(x))),
        want(torch.from_numpy(x)).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), weights[k])


@pytest.mark.torch
def test_copy_under_no_grad_updates_the_module_and_compiled_calls_see_it():
    weights = _torch_weights(seed=1)
    model = _model(nn)
    model.eval()
    x = jnp.ones((2, 3))
    model.compile()
    before = model(x)
    with jm.no_grad():
        for k, p in model.state_dict(keep_vars=True).items():
            if isinstance(p, nn.Parameter):
                p.copy_(jnp.asarray(weights[k]))
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(np.asarray(p), weights[name])

    want = _model(torch.nn)
    with torch.no_grad():
        for k, p in want.state_dict(keep_vars=True).items():
            if isinstance(p, torch.nn.Parameter):
                p.copy_(torch.from_numpy(weights[k]))
    want.eval()
    out = model(x)
    assert not np.allclose(np.asarray(out), np.asarray(before))
    np.testing.assert_allclose(
        np.asarray(out),
        want(torch.ones(2, 3)).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.torch
def test_load_state_dict_is_the_other_way():
    weights = _torch_weights(seed=2)
    model = _model(nn)
    model.load_state_dict({k: jnp.asarray(v) for k, v in weights.items()})
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), weights[k])
