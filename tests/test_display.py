"""Jupyter display: treescope tree for modules, PyTorch's text for repr."""

import jax.numpy as jnp
import torch
import treescope

import jmodule as jm
from jmodule import nn


def test_repr_html_is_an_expandable_treescope_tree():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    html = model._repr_html_()
    assert html.startswith("<") and "treescope" in html
    text = treescope.render_to_text(model)
    for expected in (
        "Sequential(",
        "n_params='56'",
        "n_params='40'",
        "weight=",
        "float32(8, 4)",
        "running_mean=",
        "placement='cpu:0'",
        "config='in_features=4",
    ):
        assert expected in text, expected
    torch_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    assert repr(model) == repr(torch_model)


def test_meta_modules_render_without_data():
    with jm.device("meta"):
        model = nn.Linear(3, 2)
    text = treescope.render_to_text(model)
    assert "n_params='8'" in text and "placement='meta'" in text
    assert model._repr_html_()
    model.to_empty(device="cpu")
    assert model(jnp.ones((1, 3))).shape == (1, 2)
