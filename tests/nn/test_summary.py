"""jm.summary: per-layer table checked against the same model run in PyTorch."""

import itertools
import re
from html.parser import HTMLParser

import jax.numpy as jnp
import nbformat
import numpy as np
import pytest
from _torch import torch
from IPython.core.formatters import DisplayFormatter
from nbclient import NotebookClient

import jmodule as jm
from jmodule import nn


def _torch_rows(model, x):
    shapes = {}
    for name, m in model.named_modules():
        m.register_forward_hook(
            lambda mod, a, out, name=name: shapes.__setitem__(name, tuple(out.shape))
        )
    model(x)
    return {
        name: (shapes[name], sum(p.numel() for p in m.parameters()))
        for name, m in model.named_modules()
    }


@pytest.mark.torch
def test_summary_rows_match_pytorch_shapes_and_counts(capsys):
    torch_model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model[0].weight.requires_grad_(False)
    before = {k: np.asarray(v) for k, v in model.state_dict().items()}
    result = jm.summary(model, jnp.ones((3, 4)))
    want = _torch_rows(torch_model, torch.ones(3, 4))
    assert [r.path for r in result.rows] == list(want)
    for row in result.rows:
        assert row.output_shapes == (want[row.path][0],)
        assert row.params == want[row.path][1]
    assert result.total_params == sum(p.numel() for p in torch_model.parameters())
    assert result.trainable_params == result.total_params - 32
    assert result.flops and result.flops > 0
    assert result.memory["arguments"] > 0
    printed = capsys.readouterr().out
    assert printed.strip() == str(result).strip()
    assert "Trainable params: " in printed
    assert "<table" in result._repr_html_()
    # An abstract run: the model's buffers did not move.
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), before[k])


class _Table(HTMLParser):
    """The parts of an HTML table: rows per section, their cells' text and style."""

    def __init__(self):
        super().__init__()
        self.section = None
        self.rows = {"thead": [], "tbody": [], "tfoot": []}
        self.cell = None
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.rows:
            self.section = tag
        elif tag == "tr":
            self.rows[self.section].append([])
        elif tag in ("td", "th"):
            self.cell = {"style": dict(attrs).get("style", ""), "text": ""}
            self.rows[self.section][-1].append(self.cell)
        elif tag == "pre":
            self.pre += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell["text"] += data


def _style(cell, prop):
    found = re.findall(rf"(?:^|;)\s*{prop}\s*:\s*([^;]+)", cell["style"])
    return found[-1].strip() if found else None  # the last declaration wins


def _nested():
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Sequential(nn.ReLU(), nn.Linear(8, 2))
    )


def test_ipython_shows_one_table_that_keeps_the_nesting_and_footer(capsys):
    result = jm.summary(_nested(), jnp.ones((3, 4)))
    capsys.readouterr()
    data, _ = DisplayFormatter().format(result)
    # The plain-text form (frontends without HTML) is exactly what print shows.
    assert data["text/plain"] == str(result)
    assert "\n" not in repr(result) and "LayerRow" not in repr(result)
    table = _Table()
    table.feed(data["text/html"])
    assert data["text/html"].count("<table") == 1 and table.pre == 0
    body, foot = table.rows["tbody"], table.rows["tfoot"]
    assert len(body) == len(result.rows)
    footer = str(result).splitlines()[-1 - len(foot) : -1]  # between the last two rules
    assert [row[0]["text"] for row in foot] == footer
    html_text = re.sub(r"<[^>]+>", "\n", data["text/html"])
    for line in footer:
        assert html_text.count(line) == 1
    pads = []
    for row, layer in zip(body, result.rows):
        first = row[0]
        assert first["text"] == (f"{layer.path} ({layer.kind})" if layer.path else layer.kind)
        assert html_text.count(f"\n{first['text']}\n") == 1  # once: no repeat in a <pre>
        assert _style(first, "text-align") == "left"
        assert [_style(c, "text-align") for c in row[2:4]] == ["right", "right"]
        pads.append((layer.depth, float(_style(first, "padding-left").removesuffix("em"))))
    # Indentation survives HTML: padding grows with depth, equal at equal depth.
    by_depth = {}
    for depth, pad in pads:
        assert by_depth.setdefault(depth, pad) == pad
    depths = sorted(by_depth)
    assert len(depths) == 1 + max(r.depth for r in result.rows)
    assert all(by_depth[a] < by_depth[b] for a, b in itertools.pairwise(depths))
    assert all(_style(c, "text-align") == "left" for c in table.rows["thead"][0][:2])


@pytest.mark.slow
def test_summary_shows_once_per_cell_in_a_jupyter_kernel():
    cells = [
        "import jax.numpy as jnp\nimport jmodule as jm\nfrom jmodule import nn\n"
        "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
        "x = jnp.ones((3, 4))",
        "jm.summary(model, x)",
        "jm.summary(model, x);",
        "s = jm.summary(model, x)",
        "s",
        "print(s)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()

    def tables(output):
        texts = [output.get("text", ""), *output.get("data", {}).values()]
        return sum("Total params:" in t for t in texts) and 1

    shown = [[tables(o) for o in cell.outputs if tables(o)] for cell in nb.cells[1:]]
    assert shown == [[1]] * 5
    rich = [o for cell in nb.cells[1:5] for o in cell.outputs if "data" in o]
    assert len(rich) == 4 and all("text/html" in o["data"] for o in rich)
    streams = [o for cell in nb.cells[1:5] for o in cell.outputs if o.output_type == "stream"]
    assert not streams
