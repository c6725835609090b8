"""The committed notebooks are built from ``notebooks/src`` and run top to bottom.

``notebooks/build.py`` makes each ``.ipynb`` from its percent-format source;
a committed notebook whose cells differ from its source's (an edit to one and
not the other) fails here: rebuild with ``python notebooks/build.py NAME``.
"""

import importlib.util

import nbformat
import pytest
from _paths import ROOT
from nbclient import NotebookClient

HERE = ROOT / "notebooks"
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))
SOURCES = sorted((HERE / "src").glob("*.py"))


def _build_module():
    spec = importlib.util.spec_from_file_location("notebooks_build", HERE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"porting_pytorch", "quickstart"}


def test_every_notebook_has_a_source_and_every_source_a_notebook():
    assert {p.stem for p in NOTEBOOKS} == {p.stem for p in SOURCES}


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_is_built_from_its_source(source):
    built = _build_module().cells_from_percent(source.read_text())
    committed = nbformat.read(HERE / f"{source.stem}.ipynb", as_version=4).cells
    assert [(c.cell_type, c.source) for c in committed] == [
        (c.cell_type, c.source) for c in built
    ], f"notebooks/{source.stem}.ipynb is out of date: run python notebooks/build.py {source.stem}"


#: Notebooks that compare with PyTorch (porting_pytorch runs sentence-transformers).
NEEDS_TORCH = {"porting_pytorch"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=[pytest.mark.torch] if p.stem in NEEDS_TORCH else [])
        for p in NOTEBOOKS
    ],
    ids=[p.stem for p in NOTEBOOKS],
)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    # Executes every cell in a fresh kernel; a cell error raises CellExecutionError.
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # Nothing warned on stderr (e.g. tqdm's "IProgress not found" without ipywidgets).
    warned = [o["text"] for o in outputs if o.get("name") == "stderr" and "Warning" in o["text"]]
    assert not warned, warned
