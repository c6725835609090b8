"""Rich display of modules in Jupyter: an expandable treescope tree.

``repr(model)`` stays PyTorch's text. Jupyter shows the HTML of
``model._repr_mimebundle_()``: the module tree rendered with treescope, as
Flax NNX's ``nnx.display`` does, and point by point at least as informative:

* every module's first line says what it holds, counted and sized from its
  arrays: ``# Parameter: 9,114 (36.5 KB), Buffer: 17 (68 B), Total: ...``
  (frozen parameters counted apart; the root also says where the arrays live
  and whether the model is in eval mode);
* the layer's settings come first, as real attributes with their values
  (``in_channels=1, kernel_size=(3, 3)``: the ones PyTorch's ``extra_repr``
  names), so they are on screen before the arrays;
* parameters and buffers are told apart (``weight=Parameter(...)``,
  ``running_mean=Buffer(...)``), each with its size and, when they apply,
  ``requires_grad=False``, its ``grad`` and ``persistent=False``;
* ``Sequential`` children read as PyTorch prints them (``(0): Linear(...)``),
  and each node's copy-path button gives an expression that works
  (``[0].weight``).

Modules define ``_repr_mimebundle_`` rather than ``_repr_html_``: treescope
adds a "Rich HTML representation" fold under any object with a
``_repr_html_``, which would repeat (or, inside a rendering, leave empty)
under every module.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

_PLAIN = (bool, int, float, complex, str, type(None))
_UNITS = ("KB", "MB", "GB", "TB", "PB")


def _value(x: Any) -> Any:
    """The array (or ``ShapeDtypeStruct``) a Parameter holds, read without effects."""
    from jmodule._lowering import state

    return state.peek(x) if isinstance(x, state.Cell) else x


def _nbytes(x: Any) -> int:
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``'64 B'``, ``'36.5 KB'`` (powers of 1000).

    >>> format_bytes(64), format_bytes(36_456)
    ('64 B', '36.5 KB')
    """
    if n < 1000:
        return f"{n:,} B"
    size = float(n)
    for unit in _UNITS:
        size /= 1000
        if size < 999.95 or unit == _UNITS[-1]:
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def _count(values: Iterable[Any]) -> tuple[int, int]:
    values = [_value(v) for v in values]
    return sum(int(np.prod(v.shape)) for v in values), sum(_nbytes(v) for v in values)


def stats_line(module: Any) -> str:
    """What a module holds, as its treescope first-line comment (no leading ``#``).

    >>> from jmodule import nn
    >>> stats_line(nn.BatchNorm1d(8))
    'Parameter: 16 (64 B), Buffer: 17 (68 B), Total: 33 (132 B)'
    """
    params = list(module.parameters())
    buffers = list(module.buffers())
    n_p, b_p = _count(params)
    n_b, b_b = _count(buffers)
    parts = []
    if params:
        frozen = sum(int(np.prod(p.shape)) for p in params if not p.requires_grad)
        note = f", {frozen:,} frozen" if frozen else ""
        parts.append(f"Parameter: {n_p:,} ({format_bytes(b_p)}{note})")
    if buffers:
        parts.append(f"Buffer: {n_b:,} ({format_bytes(b_b)})")
    if params and buffers:
        parts.append(f"Total: {n_p + n_b:,} ({format_bytes(b_p + b_b)})")
    return ", ".join(parts)


def _placement(values: Iterable[Any]) -> str | None:
    """Where arrays live: ``'cpu:0'``, ``'meta'``, ``'sharded over 8 devices'``."""
    where = set()
    for v in values:
        sharding = getattr(_value(v), "sharding", None)
        if sharding is None:
            where.add("meta")
            continue
        devices = sharding.device_set
        where.add(
            str(next(iter(devices)))
            if len(devices) == 1
            else f"sharded over {len(devices)} devices"
        )
    return ", ".join(sorted(where)) or None


# --------------------------------------------------------------- settings


def _split_top_level(text: str) -> list[str]:
    """``extra_repr`` text cut at the commas (and newlines) outside brackets and quotes."""
    tokens, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in ",\n" and depth == 0:
            tokens.append(text[start:i])
            start = i + 1
    tokens.append(text[start:])
    return [t.strip() for t in tokens if t.strip()]


def _is_plain(v: Any) -> bool:
    if isinstance(v, _PLAIN) or isinstance(v, np.dtype):
        return True
    if isinstance(v, type) and issubclass(v, np.generic):
        return True
    return isinstance(v, tuple | list) and len(v) <= 16 and all(isinstance(x, _PLAIN) for x in v)


def _owned(module: Any) -> set[str]:
    return {*module._parameters, *module._buffers, *module._modules}


def settings(module: Any) -> tuple[dict[str, Any], list[str]]:
    """A module's settings as ``{attribute: value}``, and any ``extra_repr`` text left over.

    The settings are the attributes PyTorch's ``extra_repr`` shows, read from
    the module itself (so ``kernel_size`` is the tuple, not its text): a
    ``name=...`` item names its attribute; a positional one (``Conv2d``'s
    ``1, 8``) is the next public attribute whose repr it is. A module that
    does not override ``extra_repr`` shows its public plain attributes.

    >>> from jmodule import nn
    >>> settings(nn.Conv2d(1, 8, 3))
    ({'in_channels': 1, 'out_channels': 8, 'kernel_size': (3, 3), 'stride': (1, 1)}, [])
    """
    owned = _owned(module)
    public = [
        (k, v)
        for k, v in vars(module).items()
        if not k.startswith("_") and k != "training" and k not in owned and _is_plain(v)
    ]
    # Only the base class that introduced ``extra_repr`` defines it: not overridden.
    if sum("extra_repr" in vars(k) for k in type(module).__mro__) <= 1:
        return dict(public), []
    found: dict[str, Any] = {}
    left: list[str] = []
    scan = 0
    for token in _split_top_level(module.extra_repr()):
        name, eq, _ = token.partition("=")
        name = name.strip()
        if eq and name.isidentifier():
            if name in owned:
                continue  # ``bias=True``: the parameter itself is shown
            try:
                found[name] = getattr(module, name)
            except Exception:
                left.append(token)
            continue
        for i in range(scan, len(public)):
            k, v = public[i]
            if k not in found and token in (repr(v), str(v)):
                found[k] = v
                scan = i + 1
                break
        else:
            left.append(token)
    return found, left


# --------------------------------------------------------------- treescope


class _Context(threading.local):
    def __init__(self) -> None:
        self.parents: list[tuple[str | None, bool]] = []


_context = _Context()


@contextlib.contextmanager
def _inside(placement: str | None, training: bool) -> Iterator[None]:
    _context.parents.append((placement, training))
    try:
        yield
    finally:
        _context.parents.pop()


def _child_path(module: Any, path: str | None, name: str) -> str | None:
    if path is None:
        return None
    if name.isidentifier():
        return f"{path}.{name}"
    if name.isdigit() and hasattr(type(module), "__getitem__"):
        return f"{path}[{name}]"
    return f"{path}._modules[{name!r}]"


def _line(label: str, rendering: Any, last: bool) -> Any:
    from treescope import rendering_parts as rp

    comma = (
        rp.fold_condition(expanded=rp.text(","))
        if last
        else rp.siblings(",", rp.fold_condition(collapsed=rp.text(" ")))
    )
    return rp.build_full_line_with_annotations(
        rp.siblings_with_annotations(label, rendering), comma
    )


def _node(
    prefix: Any,
    items: list[tuple[str, Any]],
    path: str | None,
    comment: str | None,
    color: str | None = None,
    extra_lines: Iterable[Any] = (),
) -> Any:
    from treescope import rendering_parts as rp

    children = [_line(label, r, i == len(items) - 1) for i, (label, r) in enumerate(items)]
    children += list(extra_lines)
    return rp.build_foldable_tree_node_from_children(
        prefix=prefix,
        children=children,
        suffix=")",
        path=path,
        background_color=color,
        first_line_annotation=None if not comment else rp.comment_color(rp.text(f"  # {comment}")),
    )


def _array_node(
    kind: type | str,
    value: Any,
    path: str | None,
    subtree_renderer: Any,
    *,
    value_path: str | None,
    options: dict[str, Any],
) -> Any:
    from treescope import rendering_parts as rp

    items = [("", subtree_renderer(value, path=value_path))]
    for name, v in options.items():
        # A Parameter's options are its attributes; a buffer is a bare array.
        option_path = None if path is None or isinstance(kind, str) else f"{path}.{name}"
        items.append((f"{name}=", subtree_renderer(v, path=option_path)))
    n = int(np.prod(value.shape))
    comment = f"{n:,} ({format_bytes(_nbytes(value))})"
    name = rp.text(kind) if isinstance(kind, str) else rp.maybe_qualified_type_name(kind)
    return _node(rp.siblings(name, "("), items, path, comment)


def parameter_repr(param: Any, path: str | None, subtree_renderer: Any) -> Any:
    """``__treescope_repr__`` of a Parameter: ``Parameter(<array>)`` with its size."""
    options: dict[str, Any] = {}
    if not param.requires_grad:
        options["requires_grad"] = False
    grad = param.__dict__.get("grad")
    if grad is not None:
        options["grad"] = grad
    value_path = None if path is None else f"{path}.data"
    return _array_node(
        type(param), _value(param), path, subtree_renderer, value_path=value_path, options=options
    )


def treescope_repr(module: Any, path: str | None, subtree_renderer: Any) -> Any:
    """``__treescope_repr__`` of a Module: stats, settings, parameters, buffers, children."""
    from treescope import formatting_util
    from treescope import rendering_parts as rp

    own = [p for p in module._parameters.values() if p is not None]
    own += [b for b in module._buffers.values() if b is not None]
    root = not _context.parents
    if root:
        placement = _placement([*module.parameters(), *module.buffers()])
        shown_place, shown_mode = placement, not module.training
    else:
        parent_place, parent_training = _context.parents[-1]
        placement = _placement(own) if own else parent_place
        shown_place = placement if placement != parent_place else None
        shown_mode = module.training != parent_training
    comment = [stats_line(module)]
    if shown_place:
        comment.append(f"on {shown_place}")
    if shown_mode:
        comment.append("training mode" if module.training else "eval mode")

    found, left = settings(module)
    items: list[tuple[str, Any]] = []
    for name, v in found.items():
        items.append((f"{name}=", subtree_renderer(v, path=_child_path(module, path, name))))
    for name, p in module._parameters.items():
        items.append((f"{name}=", subtree_renderer(p, path=_child_path(module, path, name))))
    for name, b in module._buffers.items():
        child = _child_path(module, path, name)
        if b is None:
            items.append((f"{name}=", subtree_renderer(None, path=child)))
            continue
        options = {"persistent": False} if name in module._non_persistent_buffers_set else {}
        node = _array_node("Buffer", b, child, subtree_renderer, value_path=child, options=options)
        items.append((f"{name}=", node))
    with _inside(placement, module.training):
        for name, m in module._modules.items():
            label = f"{name}=" if name.isidentifier() else f"({name}): "
            items.append((label, subtree_renderer(m, path=_child_path(module, path, name))))
    notes = [rp.comment_color(rp.text(f"# {t}")) for t in left]
    prefix = rp.siblings(rp.maybe_qualified_type_name(type(module)), "(")
    color = formatting_util.color_from_string(type(module).__qualname__)
    return _node(prefix, items, path, ", ".join(c for c in comment if c), color, notes)


def module_html(module: Any) -> str:
    """Jupyter's HTML for a module: its treescope tree."""
    import treescope

    return treescope.render_to_html(module, compressed=True)
