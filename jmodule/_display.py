"""Rich display of modules in Jupyter (``_repr_html_``)."""

from __future__ import annotations

import html
from typing import Any


def module_html(module: Any) -> str:
    """An HTML view: the PyTorch-style tree, then a table of parameters and buffers."""
    rows = []
    total = 0
    for kind, items in (
        ("parameter", module.named_parameters()),
        ("buffer", module.named_buffers()),
    ):
        for name, value in items:
            value = getattr(value, "data", value)
            count = int(getattr(value, "size", 0))
            if kind == "parameter":
                total += count
            devices = getattr(value, "sharding", None)
            where = html.escape(str(devices)) if devices is not None else "meta"
            rows.append(
                f"<tr><td>{html.escape(name)}</td><td>{kind}</td>"
                f"<td>{tuple(value.shape)}</td><td>{value.dtype}</td>"
                f"<td>{count:,}</td><td>{where}</td></tr>"
            )
    table = (
        "<table><thead><tr><th>name</th><th>kind</th><th>shape</th><th>dtype</th>"
        "<th>count</th><th>placement</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    return (
        f"<details open><summary><b>{html.escape(type(module).__name__)}</b> "
        f"({total:,} parameters)</summary><pre>{html.escape(repr(module))}</pre>{table}</details>"
    )
