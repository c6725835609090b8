"""Jupyter display of modules: a treescope tree at least as informative as Flax NNX's.

Every number the tests look for is computed from the model's own arrays (or
from the same model built with Flax NNX), never typed in.
"""

import re

import jax.numpy as jnp
import numpy as np
import pytest
import treescope
from _paths import ROOT
from _torch import torch
from flax import nnx
from IPython.core.formatters import DisplayFormatter
from treescope import layout_algorithms

import jmodule as jm
from jmodule import nn
from jmodule._display import format_bytes


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = nn.functional.relu(self.bn(self.conv1(x)))
        return self.fc(self.conv2(x).reshape(x.shape[0], -1))


class NnxCNN(nnx.Module):
    """The same layers in Flax NNX (its kernels are HWIO, same sizes)."""

    def __init__(self, rngs):
        self.conv1 = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, (3, 3), strides=2, rngs=rngs)
        self.fc = nnx.Linear(16 * 7 * 7, 10, rngs=rngs)


def expanded_text(value):
    """Treescope's text with every fold open (what clicking everything open shows)."""
    with treescope.active_expansion_strategy.set_scoped(
        lambda tree: layout_algorithms.expand_to_depth(tree, 100)
    ):
        return treescope.render_to_text(value)


def sized(values):
    """(element count, bytes) of arrays, from numpy."""
    arrays = [np.asarray(v) for v in values]
    return sum(a.size for a in arrays), sum(a.nbytes for a in arrays)


def first_lines(text, head):
    return [line.strip() for line in text.splitlines() if line.strip().startswith(head)]


@pytest.mark.torch
def test_print_model_stays_pytorch_text():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    torch_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    assert repr(model) == repr(torch_model)
    assert str(model) == str(torch_model)


def test_header_counts_and_sizes_match_the_arrays_and_flax_nnx():
    model = CNN()
    n_p, b_p = sized(model.parameters())
    n_b, b_b = sized(model.buffers())
    header = treescope.render_to_text(model).splitlines()[0]
    assert header.startswith("CNN(  # ")
    assert f"Parameter: {n_p:,} ({format_bytes(b_p)})" in header
    assert f"Buffer: {n_b:,} ({format_bytes(b_b)})" in header
    assert f"Total: {n_p + n_b:,} ({format_bytes(b_p + b_b)})" in header
    device = next(iter(model.fc.weight.sharding.device_set))
    assert header.endswith(f"on {device}")
    # The same network in NNX: the same parameter count and size, in the same words.
    nnx_header = treescope.render_to_text(NnxCNN(nnx.Rngs(0))).splitlines()[0]
    nnx_params = re.search(r"Param: ([\d,]+ \([^)]*\))", nnx_header).group(1)
    assert f"Parameter: {nnx_params}" in header
    # Every module heads its expanded node with its own totals.
    text = expanded_text(model)
    for name, module in model.named_children():
        n, b = sized(module.parameters())
        (line,) = first_lines(text, f"{name}={type(module).__name__}(")
        assert f"(  # Parameter: {n:,} ({format_bytes(b)})" in line


def test_counts_are_numbers_in_a_comment_not_quoted_strings():
    model = CNN()
    text = treescope.render_to_text(model)
    n_p, _ = sized(model.parameters())
    assert f"'{n_p:,}'" not in text and "n_params" not in text
    assert f"# Parameter: {n_p:,} " in text


@pytest.mark.parametrize("size", [0, 999, 1000, 36_456, 999_949, 999_950, 3 * 10**9])
def test_byte_sizes_read_like_nnx(size):
    # Decimal units, one decimal, as NNX's ``36.5 KB``; bytes below 1000.
    out = format_bytes(size)
    if size < 1000:
        assert out == f"{size} B"
    else:
        value, unit = out.split()
        scale = 1000 ** (["KB", "MB", "GB"].index(unit) + 1)
        assert abs(float(value) - size / scale) <= 0.05
        assert float(value) < 1000


def test_each_array_says_its_size_and_whether_parameter_or_buffer():
    model = CNN()
    model.conv1.weight.requires_grad_(False)
    model.register_buffer("steps", jnp.zeros((3,)), persistent=False)
    text = expanded_text(model)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        n, b = sized([p])
        assert f"{leaf}=Parameter(  # {n:,} ({format_bytes(b)})" in text, name
    for name, buf in model.named_buffers():
        leaf = name.rsplit(".", 1)[-1]
        n, b = sized([buf])
        assert f"{leaf}=Buffer(  # {n:,} ({format_bytes(b)})" in text, name
    assert text.count("requires_grad=False") == 1
    assert text.count("persistent=False") == 1
    frozen = model.conv1.weight.size
    assert f"{frozen:,} frozen" in text.splitlines()[0]
    # A gradient, once there, is shown with its parameter.
    model.fc.bias.grad = jnp.ones_like(model.fc.bias)
    assert "grad=" in expanded_text(model.fc.bias)


def test_settings_are_attributes_ahead_of_the_arrays():
    model = CNN()
    collapsed = treescope.render_to_text(model)
    text = expanded_text(model)
    assert "config=" not in text
    conv2 = model.conv2
    # Even collapsed, Conv2d's line starts with its settings, as values.
    (line,) = first_lines(collapsed, "conv2=Conv2d(")
    assert line.startswith(
        f"conv2=Conv2d(in_channels={conv2.in_channels}, out_channels={conv2.out_channels}, "
        f"kernel_size={conv2.kernel_size}, stride={conv2.stride}, padding={conv2.padding}, "
        "weight=Parameter("
    )
    for attr in ("in_features", "out_features"):
        assert f"{attr}={getattr(model.fc, attr)}," in text
    bn = model.bn
    assert f"eps={bn.eps}," in text and f"momentum={bn.momentum}," in text


def test_extra_repr_text_that_names_no_attribute_is_kept_as_a_comment():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = 3

        def extra_repr(self):
            return f"hidden={self.hidden}, fused kernel"

    text = expanded_text(Custom())
    assert "hidden=3" in text and "# fused kernel" in text

    class Plain(nn.Module):  # no extra_repr: its public plain attributes are its settings
        def __init__(self):
            super().__init__()
            self.hidden = 5
            self.act = "gelu"
            self._cache = 7

    text = expanded_text(Plain())
    assert "hidden=5" in text and "act='gelu'" in text and "_cache" not in text


def test_sequential_children_read_as_pytorch_prints_them():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    text = expanded_text(model)
    for i, child in enumerate(model):
        assert f"({i}): {type(child).__name__}(" in text
    html = treescope.render_to_html(model, compressed=False)
    assert "[0].weight" in html and ".0.weight" not in html


def test_eval_mode_is_said_where_it_applies():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    assert "eval mode" not in treescope.render_to_text(model)
    model.eval()
    text = expanded_text(model)
    assert text.splitlines()[0].endswith("eval mode") and text.count("eval mode") == 1
    model[1].train()
    assert "training mode" in expanded_text(model)


def test_jupyter_gets_one_tree_and_pytorch_text_without_an_empty_fold():
    model = CNN()
    data, _ = DisplayFormatter().format(model)
    assert data["text/plain"] == repr(model)
    html = data["text/html"]
    assert html.startswith("<") and "treescope" in html
    for rendering in (treescope.render_to_text(model), expanded_text(model)):
        assert "Rich HTML representation" not in rendering
    assert "Rich HTML representation" not in treescope.render_to_html(model, compressed=False)


def test_meta_modules_render_without_data():
    with jm.device("meta"):
        model = nn.Linear(3, 2)
    n, b = sized(np.zeros(p.shape, p.dtype) for p in model.parameters())
    text = treescope.render_to_text(model)
    assert f"Parameter: {n:,} ({format_bytes(b)}), on meta" in text
    assert DisplayFormatter().format(model)[0]["text/html"]
    model.to_empty(device="cpu")
    assert model(jnp.ones((1, 3))).shape == (1, 2)


def test_display_docstring_examples_run():
    import doctest

    import jmodule._display as display

    result = doctest.testmod(display, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0


def test_screenshot_script_builds_its_pages():
    # notebooks/screenshot_display.py photographs these pages in Chromium; here,
    # without a browser, the pages themselves: both trees and the summary table.
    import importlib.util

    path = ROOT / "notebooks" / "screenshot_display.py"
    spec = importlib.util.spec_from_file_location("screenshot_display", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    pages = script.pages()
    n_p, _ = sized(script.CNN().parameters())
    for stem in ("jmodule_treescope", "nnx_treescope", "jmodule_treescope_layers_open"):
        assert "treescope" in pages[stem], stem
    assert f"Parameter: {n_p:,}" in pages["jmodule_treescope_layers_open"]
    assert f"Total params: {n_p:,}" in pages["jmodule_summary_jupyterlab"]
