"""Build the notebooks from their sources and run them, keeping the outputs.

Each notebook is written as a plain Python file in ``notebooks/src/`` with
``# %%`` code cells and ``# %% [markdown]`` text cells (the "percent" format),
so it reads and diffs as code. This script turns each into an ``.ipynb`` next
to this file and executes it top to bottom with ``nbclient``, so the committed
notebooks carry the outputs of a clean run.

Run: ``python notebooks/build.py [name ...]``.
"""

from __future__ import annotations

import pathlib
import sys

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent
TIMEOUT_S = 600


def cells_from_percent(text: str) -> list:
    """Split percent-format source into notebook cells."""
    cells = []
    kind, lines = None, []

    def flush() -> None:
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(
                line[2:] if line.startswith("# ") else line.lstrip("#")
                for line in body.splitlines()
            )
            cells.append(nbformat.v4.new_markdown_cell(body))
        else:
            cells.append(nbformat.v4.new_code_cell(body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        else:
            lines.append(line)
    flush()
    return cells


def build(source: pathlib.Path) -> pathlib.Path:
    """Make ``notebooks/<name>.ipynb`` from ``source`` and execute it in place."""
    nb = nbformat.v4.new_notebook()
    nb.cells = cells_from_percent(source.read_text())
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    ).execute()
    target = HERE / f"{source.stem}.ipynb"
    nbformat.write(nb, target)
    return target


def main() -> None:
    names = sys.argv[1:]
    sources = sorted((HERE / "src").glob("*.py"))
    for source in sources:
        if names and source.stem not in names:
            continue
        print(f"building {source.stem} ...", flush=True)
        print(f"  wrote {build(source)}")


if __name__ == "__main__":
    main()
