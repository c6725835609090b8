"""``jm.nn.Rearrange`` and ``jm.nn.Reduce``: einops' layers as jmodule modules (issue 27).

Compared with ``einops.layers.torch`` run by torch on the same values, eagerly, with
``model.compile()`` and in a ``jm.compile``'d training step; einops' layers of other
frameworks given to a jmodule container raise a ``TypeError`` naming these.
"""

import builtins
import pickle

import einops
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import einops_torch, torch

import jmodule as jm
from jmodule import nn

X = np.linspace(-2, 2, 2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)

# (pattern, reduction or None for Rearrange, axes lengths)
LAYERS = [
    ("b c h w -> b (c h w)", None, {}),
    ("b c (h h2) (w w2) -> b (h w) (c h2 w2)", None, {"h2": 2, "w2": 3}),
    ("b c h w -> b w h c", None, {}),
    ("b c (h h2) (w w2) -> b c h w", "max", {"h2": 2, "w2": 2}),
    ("b c h w -> b c", "mean", {}),
    ("b c h (w w2) -> b h w", "sum", {"w2": 3}),
    ("b c h w -> b c w", "min", {}),
    ("b c h w -> b c h w", "prod", {}),
]


def _make(lib, pattern, reduction, lengths):
    if reduction is None:
        return lib.Rearrange(pattern, **lengths)
    return lib.Reduce(pattern, reduction, **lengths)


def _id(case):
    return f"{case[1] or 'rearrange'}: {case[0]}"


@pytest.mark.torch
@pytest.mark.parametrize("case", LAYERS, ids=_id)
def test_layer_matches_einops_torch_eagerly_and_compiled(case):
    t_layer, j_layer = _make(einops_torch, *case), _make(nn, *case)
    assert repr(j_layer) == repr(t_layer)
    want = t_layer(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(np.asarray(j_layer(jnp.asarray(X))), want, rtol=1e-6)
    j_layer.compile()
    np.testing.assert_allclose(np.asarray(j_layer(jnp.asarray(X))), want, rtol=1e-6)
    assert jm.compile_stats(j_layer).num_traces == 1


def _cnn(lib_nn, lib_layers):
    return lib_nn.Sequential(
        lib_nn.Conv2d(3, 4, 3, padding=1),
        lib_layers.Reduce("b c (h h2) (w w2) -> b c h w", "max", h2=2, w2=2),
        lib_layers.Rearrange("b c h w -> b (c h w)"),
        lib_nn.Linear(4 * 2 * 3, 5),
    )


def _load_torch_weights(j_model, t_model):
    j_model.load_state_dict({k: v.detach().numpy() for k, v in t_model.state_dict().items()})


@pytest.mark.torch
def test_in_sequential_eager_and_compiled_as_torch():
    torch.manual_seed(0)
    t_model = _cnn(torch.nn, einops_torch)
    j_model = _cnn(nn, nn)
    _load_torch_weights(j_model, t_model)
    assert repr(j_model) == repr(t_model)
    want = t_model(torch.from_numpy(X)).detach().numpy()
    np.testing.assert_allclose(np.asarray(j_model(jnp.asarray(X))), want, rtol=1e-5, atol=1e-6)
    j_model.compile()
    np.testing.assert_allclose(np.asarray(j_model(jnp.asarray(X))), want, rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_training_step_in_jm_compile_as_torch():
    torch.manual_seed(1)
    t_model = _cnn(torch.nn, einops_torch)
    j_model = _cnn(nn, nn)
    _load_torch_weights(j_model, t_model)
    t_opt = torch.optim.SGD(t_model.parameters(), lr=0.1)
    j_opt = jm.optim.SGD(j_model.parameters(), lr=0.1)
    y = np.arange(2) % 5

    @jm.compile
    def step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: nn.functional.cross_entropy(model(x), y))
        opt.step()
        return loss

    for _ in range(3):
        t_opt.zero_grad()
        t_loss = torch.nn.functional.cross_entropy(
            t_model(torch.from_numpy(X)), torch.from_numpy(y)
        )
        t_loss.backward()
        t_opt.step()
        j_loss = step(j_model, j_opt, jnp.asarray(X), jnp.asarray(y))
        np.testing.assert_allclose(float(j_loss), t_loss.item(), rtol=1e-5)
    for k, v in t_model.state_dict().items():
        np.testing.assert_allclose(
            np.asarray(j_model.state_dict()[k]), v.numpy(), rtol=1e-4, atol=1e-6
        )
    assert step.num_traces == 1


@pytest.mark.torch
def test_layers_compute_on_parameters():
    w = nn.Parameter(jnp.asarray(X[0]))
    t_w = torch.from_numpy(X[0])
    np.testing.assert_array_equal(
        np.asarray(nn.Rearrange("c h w -> (h w) c")(w)),
        einops_torch.Rearrange("c h w -> (h w) c")(t_w).numpy(),
    )


@pytest.mark.torch
def test_invalid_patterns_fail_at_construction_as_einops_layers_do():
    for bad in [("b c -> b d", None, {}), ("b c -> b", "median", {}), ("b (c k) -> b c", None, {})]:
        with pytest.raises(einops.EinopsError) as t_error:
            _make(einops_torch, *bad)
        with pytest.raises(einops.EinopsError) as j_error:
            _make(nn, *bad)
        t_text = str(t_error.value).replace("einops.layers.torch.", "")
        assert str(j_error.value) == t_text


@pytest.mark.torch
def test_wrong_input_rank_is_einops_error():
    # einops.rearrange's error (einops' torch layer raises a bare KeyError instead)
    with pytest.raises(einops.EinopsError) as t_error:
        einops.rearrange(torch.ones(2, 3, 4), "b c -> c b")
    with pytest.raises(einops.EinopsError) as j_error:
        nn.Rearrange("b c -> c b")(jnp.ones((2, 3, 4)))
    assert str(j_error.value).splitlines()[-1] == str(t_error.value).splitlines()[-1]


def test_layers_pickle_and_deepcopy():
    layer = nn.Reduce("b c (h h2) w -> b c h w", "mean", h2=2)
    again = pickle.loads(pickle.dumps(layer))
    np.testing.assert_array_equal(np.asarray(again(jnp.asarray(X))), np.asarray(layer(X)))
    assert repr(again) == repr(layer)


@pytest.mark.torch
@pytest.mark.parametrize(
    "make",
    [
        lambda: einops_torch.Rearrange("b c h w -> b (c h w)"),
        lambda: einops_torch.Reduce("b c (h h2) w -> b c h w", "max", h2=2),
    ],
    ids=["Rearrange", "Reduce"],
)
def test_einops_torch_layers_in_jm_containers_name_the_jm_layer(make):
    layer = make()
    name = type(layer).__name__
    for build in (
        lambda: nn.Sequential(nn.Identity(), layer),
        lambda: nn.ModuleList([layer]),
        lambda: nn.ModuleDict({"x": layer}),
        lambda: nn.Module().add_module("x", layer),
    ):
        with pytest.raises(TypeError, match=rf"is not a Module subclass.*jm\.nn\.{name}\(") as e:
            build()
        assert repr(layer)[len(name) :] in str(e.value)  # the same arguments


def test_einops_flax_layers_name_the_jm_layer():
    einops_flax = pytest.importorskip("einops.layers.flax")
    with pytest.raises(TypeError, match=r"for Flax.*jm\.nn\.Rearrange\('b \(c k\) -> c b', k=2\)"):
        nn.Sequential(einops_flax.Rearrange("b (c k) -> c b", sizes={"k": 2}))
    with pytest.raises(TypeError, match=r"jm\.nn\.Reduce\('b c -> b', 'mean'\)"):
        nn.Sequential(einops_flax.Reduce("b c -> b", "mean"))


@pytest.mark.torch
def test_einmix_has_no_jm_layer_and_says_so():
    mix = einops_torch.EinMix("b c -> b d", weight_shape="c d", c=2, d=3)
    with pytest.raises(TypeError, match=r"jm\.nn\.Rearrange and jm\.nn\.Reduce"):
        nn.Sequential(mix)


@pytest.mark.torch
def test_other_non_modules_keep_the_plain_message():
    with pytest.raises(TypeError) as t_error:
        torch.nn.Sequential().add_module("x", 3)
    with pytest.raises(TypeError) as j_error:
        nn.Sequential().add_module("x", 3)
    assert str(j_error.value) == str(t_error.value)


def test_without_einops_the_layers_say_pip_install(monkeypatch):
    real_import = builtins.__import__

    def no_einops(name, *args, **kwargs):
        if name == "einops" or name.startswith("einops."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_einops)
    for make in (lambda: nn.Rearrange("b c -> c b"), lambda: nn.Reduce("b c -> b", "max")):
        with pytest.raises(ImportError, match="pip install einops"):
            make()
