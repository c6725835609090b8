"""Rich display of modules in Jupyter: an expandable treescope tree.

``repr(model)`` stays PyTorch's text; ``model._repr_html_()`` (what Jupyter
shows) renders the module tree with treescope, as Flax NNX does: each module
folds open to its parameters (shape, dtype, placement), buffers and children,
with parameter counts.
"""

from __future__ import annotations

import html
import threading
from typing import Any

import numpy as np


def _count(module: Any) -> int:
    return sum(int(np.prod(p.shape)) for p in module.parameters())


def _placement(value: Any) -> str:
    sharding = getattr(value, "sharding", None)
    if sharding is None:
        return "meta"
    devices = sorted(str(d) for d in sharding.device_set)
    return devices[0] if len(devices) == 1 else f"{type(sharding).__name__} over {len(devices)}"


def treescope_repr(module: Any, path: str | None, subtree_renderer: Any) -> Any:
    """``__treescope_repr__`` of a Module: its parameters, buffers and children."""
    from treescope import repr_lib

    attributes: dict[str, Any] = {"n_params": f"{_count(module):,}"}
    own = [p for p in module._parameters.values() if p is not None]
    if own:
        attributes["placement"] = _placement(own[0].data)
    for name, p in module._parameters.items():
        attributes[name] = None if p is None else p.data
    for name, b in module._buffers.items():
        attributes[name] = b
    for name, child in module._modules.items():
        attributes[name] = child
    extra = module.extra_repr()
    if extra:
        attributes["config"] = extra
    return repr_lib.render_object_constructor(
        object_type=type(module),
        attributes=attributes,
        path=path,
        subtree_renderer=subtree_renderer,
        roundtrippable=False,
    )


_rendering = threading.local()


def module_html(module: Any) -> str:
    """Jupyter's HTML for a module: treescope when available, else a table.

    Treescope asks objects for their own ``_repr_html_`` while it renders
    them; inside a rendering already under way the answer is empty, so the
    tree is drawn once.
    """
    if getattr(_rendering, "active", False):
        return ""
    try:
        import treescope
    except ImportError:  # pragma: no cover - treescope ships with flax, a dependency
        return _table_html(module)
    _rendering.active = True
    try:
        return treescope.render_to_html(module, compressed=True)
    finally:
        _rendering.active = False


def _table_html(module: Any) -> str:
    rows = []
    for kind, items in (
        ("parameter", module.named_parameters()),
        ("buffer", module.named_buffers()),
    ):
        for name, value in items:
            value = getattr(value, "data", value)
            rows.append(
                f"<tr><td>{html.escape(name)}</td><td>{kind}</td><td>{tuple(value.shape)}</td>"
                f"<td>{value.dtype}</td><td>{html.escape(_placement(value))}</td></tr>"
            )
    return (
        f"<details open><summary><b>{html.escape(type(module).__name__)}</b> "
        f"({_count(module):,} parameters)</summary><pre>{html.escape(repr(module))}</pre>"
        "<table><tr><th>name</th><th>kind</th><th>shape</th><th>dtype</th><th>placement</th>"
        f"</tr>{''.join(rows)}</table></details>"
    )
