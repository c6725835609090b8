"""``jm.summary``: a per-layer table of a model, like torchinfo or ``nnx.tabulate``.

Output shapes come from one abstract run (``jax.eval_shape``: nothing is
computed, no buffer changes); FLOPs and memory come from XLA's cost and
memory analysis of the compiled forward.
"""

from __future__ import annotations

import dis
import html
import sys
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from jmodule import func

__all__ = ["LayerRow", "Summary", "summary"]


@dataclass(frozen=True)
class LayerRow:
    """One module of the tree."""

    path: str
    kind: str
    depth: int
    output_shapes: tuple[tuple[int, ...], ...]
    params: int
    trainable: int
    bytes: int
    dtypes: tuple[str, ...]


_HEADER = ("Layer (type)", "Output shape", "Param #", "Bytes", "Dtype")
_LEFT = (0, 1, 4)  # text columns; the others are numbers, right-aligned


@dataclass
class Summary:
    """The table ``jm.summary`` prints.

    ``str()`` is the text table. In Jupyter the summary shows once, as an HTML
    table (its plain-text form, for frontends without HTML, is the same text
    as ``print``); ``repr()`` is one line.
    """

    model_name: str
    rows: list[LayerRow]
    total_params: int
    trainable_params: int
    param_bytes: int
    buffer_bytes: int
    flops: float | None = None
    memory: dict[str, int] = field(default_factory=dict)

    def _cells(self, r: LayerRow) -> list[str]:
        shapes = ", ".join(str(list(s)) for s in r.output_shapes) or "-"
        label = f"{r.path} ({r.kind})" if r.path else r.kind
        return [label, shapes, f"{r.params:,}", f"{r.bytes:,}", ",".join(r.dtypes) or "-"]

    def _footer(self) -> list[str]:
        text = [
            f"Total params: {self.total_params:,}",
            f"Trainable params: {self.trainable_params:,}",
            f"Non-trainable params: {self.total_params - self.trainable_params:,}",
            f"Params size: {self.param_bytes:,} bytes; buffers: {self.buffer_bytes:,} bytes",
        ]
        if self.flops is not None:
            text.append(f"Compiled forward: {self.flops:,.0f} FLOPs (XLA cost analysis)")
        if self.memory:
            parts = ", ".join(f"{k} {v:,} B" for k, v in self.memory.items())
            text.append(f"Compiled forward memory: {parts}")
        return text

    def __str__(self) -> str:
        lines = []
        for r in self.rows:
            cells = self._cells(r)
            lines.append(["  " * r.depth + cells[0], *cells[1:]])
        widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(_HEADER)]
        rule = "=" * (sum(widths) + 2 * (len(widths) - 1))

        def fmt(row: list[str] | tuple[str, ...]) -> str:
            return "  ".join(
                c.ljust(w) if i in _LEFT else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths))
            )

        text = [rule, fmt(_HEADER), rule, *(fmt(r) for r in lines), rule]
        return "\n".join([*text, *self._footer(), rule])

    def __repr__(self) -> str:
        return (
            f"<Summary of {self.model_name}: {len(self.rows)} modules, "
            f"{self.total_params:,} parameters>"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        """One HTML table: a row per module, indented by depth, the totals in its footer."""
        cell = "padding:0.15em 0.6em;border:none;"

        def align(i: int) -> str:
            return "text-align:left;" if i in _LEFT else "text-align:right;"

        head = "".join(
            f'<th style="{cell}{align(i)}border-bottom:1px solid currentColor;">{h}</th>'
            for i, h in enumerate(_HEADER)
        )
        body = []
        for r in self.rows:
            cells = self._cells(r)
            tds = [
                f'<td style="{cell}text-align:left;white-space:pre;'
                f'padding-left:{0.6 + 1.5 * r.depth:g}em;">{html.escape(cells[0])}</td>'
            ]
            tds += [
                f'<td style="{cell}{align(i)}white-space:pre;">{html.escape(c)}</td>'
                for i, c in enumerate(cells[1:], start=1)
            ]
            body.append(f"<tr>{''.join(tds)}</tr>")
        foot = "".join(
            f'<tr><td colspan="{len(_HEADER)}" style="{cell}text-align:left;">'
            f"{html.escape(line)}</td></tr>"
            for line in self._footer()
        )
        return (
            '<table class="jm-summary" style="border-collapse:collapse;'
            'font-family:monospace;margin-left:0;margin-right:auto;">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
            f'<tfoot style="border-top:1px solid currentColor;">{foot}</tfoot></table>'
        )


def _ipython_shell() -> Any:
    """The running IPython shell (Jupyter kernel or terminal), or None."""
    ipython = sys.modules.get("IPython")  # never import IPython for a script
    return None if ipython is None else ipython.get_ipython()


_pending: list[Summary] = []
_hooked: set[int] = set()


def _show_after_cell(exec_result: Any) -> None:
    """``post_run_cell``: display the summaries the cell did not already show."""
    from IPython.display import display

    shown = getattr(exec_result, "result", None)
    pending = _pending[:]
    _pending.clear()
    for s in pending:
        if s is not shown:
            display(s)


def _show(result: Summary) -> None:
    """Print the summary, or in IPython show it exactly once per cell.

    A cell ending in ``jm.summary(...)`` displays the returned table itself;
    printing it too would show it twice. So in IPython the summary is
    displayed when the cell ends, unless it was the cell's result (as
    matplotlib's inline backend shows figures): ``jm.summary(...);`` and
    ``s = jm.summary(...)`` show it once as well.
    """
    if _passed_on(sys._getframe(2)):
        return  # print(jm.summary(...)), display(jm.summary(...)): the caller shows it
    shell = _ipython_shell()
    if shell is None:
        print(result)
        return
    if id(shell) not in _hooked:
        shell.events.register("post_run_cell", _show_after_cell)
        _hooked.add(id(shell))
    _pending.append(result)


_CALLS = frozenset({"CALL", "PRECALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_KW"})
_FORMATS = frozenset({"FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE"})


def _passed_on(frame: Any) -> bool:
    """Whether ``frame``'s current call hands its result straight to another call or an
    f-string (``print(jm.summary(...))``), which shows it: then showing it too doubles it.

    Read from the frame's bytecode: the instruction after the current call. Unknown
    bytecode (another Python) reads as not passed on: the summary is shown.
    """
    try:
        for ins in dis.get_instructions(frame.f_code):
            if ins.offset > frame.f_lasti:  # (3.11's f_lasti is the call's last cache entry)
                return ins.opname in _CALLS or ins.opname in _FORMATS
    except Exception:
        return False
    return False


def _nbytes(x: Any) -> int:
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def summary(model: Any, *example_inputs: Any, compiled: bool = True, **kwargs: Any) -> Summary:
    """Print and return a per-layer table of ``model`` run on ``example_inputs``.

    In Jupyter (or any IPython shell) the table is not printed but displayed
    once, as HTML, whether or not the cell ends with the call.

    Args:
        model: the module.
        *example_inputs: positional inputs (arrays or ``jax.ShapeDtypeStruct``).
        compiled: also report the compiled forward's FLOPs and memory.
        **kwargs: keyword inputs of the forward.

    Returns:
        The :class:`Summary` (its ``str`` is what was printed).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.ReLU(), jm.nn.Linear(8, 2))
    >>> s = jm.summary(model, jnp.ones((3, 4)), compiled=False)  # doctest: +ELLIPSIS
    ===...
    >>> s.total_params, s.rows[-1].output_shapes
    (58, ((3, 2),))
    """
    shapes: dict[int, tuple] = {}
    handles = []
    named = list(model.named_modules())
    for _, m in named:

        def hook(mod: Any, args: Any, out: Any) -> None:
            leaves = jax.tree_util.tree_leaves(out)
            shapes[id(mod)] = tuple(tuple(x.shape) for x in leaves if hasattr(x, "shape"))

        handles.append(m.register_forward_hook(hook))
    state = {k: v for k, v in func.state_slots(model).items()}
    values = {k: c[n] for k, (c, n) in state.items()}
    try:
        jax.eval_shape(
            lambda s, a, k: func.functional_call(model, s, a, k, rng_key=jax.random.PRNGKey(0)),
            values,
            example_inputs,
            kwargs,
        )
    finally:
        for h in handles:
            h.remove()
    rows = []
    for path, m in named:
        own = list(m.parameters())
        dtypes = sorted({str(p.dtype) for p in own})
        rows.append(
            LayerRow(
                path=path,
                kind=type(m).__name__,
                depth=path.count(".") + (1 if path else 0),
                output_shapes=shapes.get(id(m), ()),
                params=sum(int(np.prod(p.shape)) for p in own),
                trainable=sum(int(np.prod(p.shape)) for p in own if p.requires_grad),
                bytes=sum(_nbytes(p) for p in own),
                dtypes=tuple(dtypes),
            )
        )
    params = list(model.parameters())
    result = Summary(
        model_name=type(model).__name__,
        rows=rows,
        total_params=sum(int(np.prod(p.shape)) for p in params),
        trainable_params=sum(int(np.prod(p.shape)) for p in params if p.requires_grad),
        param_bytes=sum(_nbytes(p) for p in params),
        buffer_bytes=sum(_nbytes(b) for b in model.buffers()),
    )
    if compiled:
        lowered = jax.jit(
            lambda s, a, k: func.functional_call(model, s, a, k, rng_key=jax.random.PRNGKey(0))
        ).lower(values, example_inputs, kwargs)
        exe = lowered.compile()
        cost = exe.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        result.flops = float(cost.get("flops", 0.0)) if cost else None
        mem = exe.memory_analysis()
        if mem is not None:
            result.memory = {
                "arguments": int(mem.argument_size_in_bytes),
                "outputs": int(mem.output_size_in_bytes),
                "temporaries": int(mem.temp_size_in_bytes),
            }
    _show(result)
    return result
