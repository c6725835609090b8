"""Screenshots of what Jupyter shows for a model, next to Flax NNX's, in a real browser.

Renders the same small CNN with jmodule and with Flax NNX to the HTML that
Jupyter displays (treescope for both; ``jm.summary``'s table inside
JupyterLab's table rules), then photographs each page with headless
Chromium at 1200 px wide.

    python notebooks/screenshot_display.py [OUT_DIR]   # default: notebooks/screenshots

Needs a ``chromium`` (or ``chromium-browser`` / ``google-chrome``) binary on
PATH: ``apt-get install chromium`` on Debian.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

import jax.numpy as jnp
import treescope
from flax import nnx
from treescope import layout_algorithms

import jmodule as jm
from jmodule import nn

WIDTH = 1200
HEIGHTS = {
    "jmodule_summary_jupyterlab": 300,
    "jmodule_treescope_layers_open": 1000,
    "nnx_treescope_layers_open": 1000,
}

# The rules JupyterLab's stylesheet applies to HTML outputs' tables (written
# out here: a notebook's output area is where our table has to hold up):
# centred, fixed layout, cells right-aligned with collapsing white space.
JUPYTERLAB_TABLE_RULES = """
.jp-RenderedHTMLCommon { font-family: sans-serif; font-size: 13px; }
.jp-RenderedHTMLCommon table { border-collapse: collapse; border: none;
  table-layout: fixed; margin-left: auto; margin-right: auto; }
.jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th, .jp-RenderedHTMLCommon tr {
  text-align: right; vertical-align: middle; padding: 0.5em; line-height: normal;
  white-space: normal; max-width: none; border: none; }
.jp-RenderedHTMLCommon tbody tr:nth-child(even) { background: #f5f5f5; }
"""


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = jm.nn.functional.relu(self.bn(self.conv1(x)))
        return self.fc(self.conv2(x).reshape(x.shape[0], -1))


class NnxCNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, (3, 3), strides=2, rngs=rngs)
        self.fc = nnx.Linear(16 * 7 * 7, 10, rngs=rngs)


def _page(title: str, body: str, style: str = "") -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>body {{ margin: 16px; background: white; }} {style}</style></head>"
        f"<body>{body}</body></html>"
    )


def _uncompressed(value) -> str:
    """Treescope's HTML as Jupyter gets it, less the zlib wrapper (which the browser
    unpacks asynchronously, sometimes after a headless screenshot is taken)."""
    if isinstance(value, nn.Module):
        # What jmodule hands Jupyter, the same renderer.
        assert "treescope" in value._repr_mimebundle_()["text/html"]
    return treescope.render_to_html(value, compressed=False)


def _modules_open(value) -> str:
    """Treescope's HTML with the model and its layers open, their arrays folded."""
    with treescope.active_expansion_strategy.set_scoped(
        lambda tree: layout_algorithms.expand_to_depth(tree, 2)
    ):
        return treescope.render_to_html(value, compressed=False)


def pages() -> dict[str, str]:
    """The HTML pages to photograph, by file stem."""
    model = CNN()
    flax_model = NnxCNN(nnx.Rngs(0))
    summary_html = jm.summary(model, jnp.ones((2, 1, 14, 14)))._repr_html_()
    return {
        # What a cell ending in ``model`` shows (treescope's default layout) ...
        "jmodule_treescope": _page("jmodule", _uncompressed(model)),
        "nnx_treescope": _page("nnx", _uncompressed(flax_model)),
        # ... and after opening every layer (one click each).
        "jmodule_treescope_layers_open": _page("jmodule", _modules_open(model)),
        "nnx_treescope_layers_open": _page("nnx", _modules_open(flax_model)),
        "jmodule_summary_jupyterlab": _page(
            "summary",
            f"<div class='jp-RenderedHTMLCommon'>{summary_html}</div>",
            JUPYTERLAB_TABLE_RULES,
        ),
    }


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("no chromium on PATH (apt-get install chromium)")


def screenshot(browser: str, html_path: pathlib.Path, png: pathlib.Path, height: int) -> None:
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=10000",
            f"--window-size={WIDTH},{height}",
            f"--screenshot={png}",
            html_path.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def main(out: pathlib.Path) -> list[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    browser = chromium()
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for stem, html in pages().items():
            page = pathlib.Path(tmp) / f"{stem}.html"
            page.write_text(html, encoding="utf-8")
            (out / f"{stem}.html").write_text(html, encoding="utf-8")
            png = out / f"{stem}.png"
            screenshot(browser, page, png, height=HEIGHTS.get(stem, 700))
            written.append(png)
    return written


if __name__ == "__main__":
    target = (
        pathlib.Path(sys.argv[1])
        if len(sys.argv) > 1
        else pathlib.Path(__file__).parent / "screenshots"
    )
    for path in main(target):
        print(path)
